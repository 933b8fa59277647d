package mcpserver_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/paths"
	"github.com/pandastack/pandastack/internal/testutil"
)

// apiServer is one real `pandastack serve` on a loopback port with its own
// data directory; the MCP server under test talks to it.
type apiServer struct {
	bin, dataDir, url, key string
	cmd                    *exec.Cmd
	exited                 chan struct{} // closed when serve has exited
	out                    *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *apiServer) client() *client.Client { return client.New(s.url, s.key) }

// tail is the end of the server's log, for failure messages.
func (s *apiServer) tail() string {
	lines := strings.Split(s.out.String(), "\n")
	return strings.Join(lines[max(0, len(lines)-40):], "\n")
}

var (
	shared     *apiServer
	sharedErr  string
	sharedOnce sync.Once
)

// server starts the shared API server on first use. It needs root, runsc
// and the templates, so it skips (or fails under CI=true) without them.
func server(t *testing.T) *apiServer {
	t.Helper()
	testutil.Runsc(t)
	testutil.RequireDebootstrap(t)
	bin := testutil.Binaries(t)
	sharedOnce.Do(func() {
		// The port is free when picked and bound by serve only later:
		// another process may take it in between, and serve exits on it.
		for attempt := 1; ; attempt++ {
			shared, sharedErr = startServer(bin)
			if shared != nil || attempt == 3 || !strings.Contains(sharedErr, "address already in use") {
				break
			}
		}
	})
	if shared == nil {
		t.Fatal(sharedErr)
	}
	return shared
}

func startServer(bin string) (*apiServer, string) {
	dataDir, err := os.MkdirTemp("", "pandastack-mcp-test-")
	if err != nil {
		return nil, err.Error()
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err.Error()
	}
	addr := ln.Addr().String()
	ln.Close()
	s := &apiServer{bin: bin, dataDir: dataDir, url: "http://" + addr, out: &syncBuffer{}}
	s.cmd = exec.Command(filepath.Join(bin, "pandastack"), "serve")
	s.cmd.Env = append(os.Environ(),
		"PANDASTACK_LISTEN="+addr,
		"PANDASTACK_DATA_DIR="+dataDir,
		"PANDASTACK_CACHE_DIR="+paths.CacheDir(),
		"PANDASTACK_BUILD_ON_START=base,code-interpreter",
		"PANDASTACK_LOG_LEVEL=debug",
		"PANDASTACK_KILL_ON_EXIT=1",
	)
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	if err := testutil.StartWithParent(s.cmd); err != nil {
		os.RemoveAll(dataDir)
		return nil, err.Error()
	}
	s.exited = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.exited) }()
	// A first start on a fresh cache builds the templates: give it time.
	deadline := time.Now().Add(30 * time.Minute)
	hc := &http.Client{Timeout: 5 * time.Second} // whatever else holds the port may never answer
	for {
		resp, err := hc.Get(s.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		select {
		case <-s.exited:
			os.RemoveAll(dataDir)
			return nil, "server exited:\n" + s.tail()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, "server did not come up:\n" + s.tail()
		}
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "api-key"))
	if err != nil {
		s.stop()
		return nil, "api-key file: " + err.Error()
	}
	s.key = strings.TrimSpace(string(b))
	return s, ""
}

// stop kills what is left, ends serve with SIGTERM and removes its data.
func (s *apiServer) stop() {
	c := s.client()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	if list, err := c.ListSandboxes(ctx, nil, ""); err == nil {
		for _, sb := range list {
			c.KillSandbox(ctx, sb.ID)
		}
	}
	cancel()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		<-s.exited
	}
	os.RemoveAll(s.dataDir)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		shared.stop()
	}
	testutil.RemoveBinaries()
	os.Exit(code)
}
