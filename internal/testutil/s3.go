//go:build unix

package testutil

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/paths"
)

// VersityGWVersion is the S3-compatible server the tests run (versitygw,
// Apache-2.0), built from the Go module proxy by scripts/setup.sh into
// <cache>/versitygw/<version>/versitygw.
const VersityGWVersion = "v1.8.0"

// S3Server is a throwaway S3-compatible server: versitygw's posix backend
// on a temp dir (each bucket a directory, each object a file under it),
// listening on a free loopback port.
type S3Server struct {
	Endpoint  string // http://127.0.0.1:port
	AccessKey string
	SecretKey string
	Root      string // the backend's directory: <Root>/<bucket>/<key>

	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	n    int
}

// VersityGW returns the versitygw binary: $PANDASTACK_VERSITYGW, else the
// pinned build in the cache.
func VersityGW(t testing.TB) string {
	t.Helper()
	p := versityGWPath()
	if !isExecutable(p) {
		missing(t, "the S3-compatible test server versitygw "+VersityGWVersion+" is not at "+p, "run ./scripts/setup.sh, which builds it from the Go module proxy into the cache, or point PANDASTACK_VERSITYGW at one")
	}
	return p
}

// StartS3 starts a server and stops it and removes its files when t ends.
func StartS3(t testing.TB) *S3Server {
	t.Helper()
	s, err := startS3(VersityGW(t))
	if s != nil {
		t.Cleanup(func() {
			if err := s.Stop(); err != nil {
				t.Errorf("stop versitygw: %v", err)
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func versityGWPath() string {
	if p := os.Getenv("PANDASTACK_VERSITYGW"); p != "" {
		return p
	}
	return filepath.Join(paths.CacheDir(), "versitygw", VersityGWVersion, "versitygw")
}

// NewS3 starts a server for a program that is no test (the benchmark);
// the caller stops it.
func NewS3() (*S3Server, error) {
	bin := versityGWPath()
	if !isExecutable(bin) {
		return nil, fmt.Errorf("versitygw %s is not at %s: run ./scripts/setup.sh", VersityGWVersion, bin)
	}
	s, err := startS3(bin)
	if err != nil && s != nil {
		s.Stop()
	}
	return s, err
}

// startS3 starts versitygw; on error the returned server (if any) still
// needs its Stop.
func startS3(bin string) (*S3Server, error) {
	root, err := os.MkdirTemp("", "pandastack-s3-")
	if err != nil {
		return nil, err
	}
	s := &S3Server{AccessKey: "AK" + pandastack.NewID("t"), SecretKey: "SK" + pandastack.NewID("s"), Root: root, done: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return s, err
	}
	addr := ln.Addr().String()
	ln.Close()
	s.Endpoint = "http://" + addr
	logf, err := os.Create(filepath.Join(root, ".log"))
	if err != nil {
		return s, err
	}
	defer logf.Close()
	// Credentials through the environment, not argv (ps shows argv).
	s.cmd = exec.Command(bin, "--port", addr, "--quiet", "posix", root)
	s.cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY_ID="+s.AccessKey, "ROOT_SECRET_ACCESS_KEY="+s.SecretKey)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		s.cmd = nil
		return s, fmt.Errorf("start versitygw: %w", err)
	}
	go func() { s.cmd.Wait(); close(s.done) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return s, nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(root, ".log"))
			return s, fmt.Errorf("versitygw exited at start:\n%s", log)
		default:
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("versitygw did not listen on %s: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// NewBucket makes an empty bucket and returns its name.
func (s *S3Server) NewBucket(t testing.TB) string {
	t.Helper()
	name, err := s.CreateBucket()
	if err != nil {
		t.Fatal(err)
	}
	return name
}

// CreateBucket is NewBucket without a test.
func (s *S3Server) CreateBucket() (string, error) {
	s.mu.Lock()
	s.n++
	name := "bucket-" + strconv.Itoa(s.n)
	s.mu.Unlock()
	return name, os.Mkdir(filepath.Join(s.Root, name), 0o755)
}

// Env is what serve needs to reach the server.
func (s *S3Server) Env() []string {
	return []string{"PANDASTACK_S3_ENDPOINT=" + s.Endpoint, "AWS_ACCESS_KEY_ID=" + s.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s.SecretKey}
}

// Stop ends the server and removes its files; safe to call twice.
func (s *S3Server) Stop() error {
	if s.cmd != nil && s.cmd.Process != nil {
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-s.done:
		// It waits for idle keep-alive connections of clients that are
		// gone; nothing of a throwaway server needs that.
		case <-time.After(2 * time.Second):
			syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
			<-s.done
		}
	}
	if s.Root == "" {
		return nil
	}
	err := os.RemoveAll(s.Root)
	if err != nil {
		err = fmt.Errorf("remove %s: %w", s.Root, err)
	}
	s.Root = ""
	return err
}
