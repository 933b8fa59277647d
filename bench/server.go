package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/testutil"
)

// Templates the servers must have; a missing one is built on start (minutes,
// once per machine: later runs find it in the shared cache).
const buildOnStart = "base,code-interpreter"

// sandboxTTL outlives the whole run, so nothing expires while measured.
const sandboxTTL = 3600

// server is one `pandastack serve` under test, with its own data dir and
// runsc root, and the sandboxes the benchmark made on it.
type server struct {
	name      string
	poolSize  int
	cmd       *exec.Cmd
	url, key  string
	dataDir   string
	runscRoot string
	runsc     string
	log       *logBuffer
	c         *client.Client
	exited    chan struct{}

	mu   sync.Mutex
	live map[string]bool // sandboxes made here and not yet killed
	seen map[string]bool // every sandbox id ever made here, for the cgroup sweep
}

// logBuffer keeps a server's output for error messages and the report.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) tail(n int) string {
	lines := strings.Split(strings.TrimRight(l.String(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// problems returns the WARN and ERROR lines the server logged.
func (l *logBuffer) problems() []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(l.String()))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if t := sc.Text(); strings.Contains(t, "level=WARN") || strings.Contains(t, "level=ERROR") {
			out = append(out, t)
		}
	}
	return out
}

// buildBinaries builds pandastack and the agent into a temp dir.
func buildBinaries() (string, error) {
	dir, err := os.MkdirTemp("", "pandastack-bench-bin-")
	if err != nil {
		return "", err
	}
	build := exec.Command("go", "build", "-o", dir, "./cmd/pandastack", "./cmd/pandastack-agent")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("build: %w", err)
	}
	return dir, nil
}

// startServer starts `pandastack serve` on a free loopback port with a new
// temp data dir. The server gets its own process group, so a Ctrl-C at the
// terminal reaches only the benchmark, which then cleans up in order. On
// error the data dir is removed and nothing is left running.
func startServer(ctx context.Context, name, binDir, runsc string, poolSize int, extra ...string) (_ *server, err error) {
	dataDir, err := os.MkdirTemp("", "pandastack-bench-data-")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dataDir)
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	s := &server{
		name: name, poolSize: poolSize, url: "http://" + addr, dataDir: dataDir,
		runscRoot: filepath.Join(dataDir, "runtime", "runsc"), runsc: runsc,
		log: &logBuffer{}, exited: make(chan struct{}), live: map[string]bool{}, seen: map[string]bool{},
	}
	args := []string{"serve", "--listen", addr, "--data-dir", dataDir,
		"--pool-size", strconv.Itoa(poolSize), "--build-on-start", buildOnStart, "--runsc", runsc, "--kill-on-exit",
		// Sandboxes that wait between measurements must not suspend
		// themselves; the idle section sets its own idle timeout.
		"--idle-timeout", "0",
		// Debug: the breakdowns the server logs, such as each run's
		// ("code run", section runcode).
		"--log-level", "debug"}
	s.cmd = exec.Command(filepath.Join(binDir, "pandastack"), append(args, extra...)...)
	// No memory reserve (an environment variable, which a baseline too
	// old to know it ignores): the density sections fill the host on
	// purpose, and every revision must measure the same thing.
	s.cmd.Env = append(os.Environ(), "PANDASTACK_MEMORY_RESERVE_MB=0")
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Also if the benchmark is killed: serve ends with it.
	if err := testutil.StartWithParent(s.cmd); err != nil {
		os.RemoveAll(dataDir)
		return nil, err
	}
	go func() { s.cmd.Wait(); close(s.exited) }()
	defer func() {
		if err != nil {
			s.stop()
		}
	}()
	// A first start on a machine may build the templates: allow for it.
	start, lastNote := time.Now(), time.Now()
	for {
		if resp, err := http.Get(s.url + "/healthz"); err == nil {
			resp.Body.Close()
			break
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("server %s exited while starting:\n%s", name, s.log.tail(30))
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Since(start) > 45*time.Minute {
			return nil, fmt.Errorf("server %s did not answer within 45 min:\n%s", name, s.log.tail(30))
		}
		if time.Since(lastNote) > 30*time.Second {
			lastNote = time.Now()
			fmt.Fprintf(os.Stderr, "  still starting (%s): %s\n", time.Since(start).Round(time.Second), lastLine(s.log.String()))
		}
	}
	b, err := os.ReadFile(filepath.Join(dataDir, "api-key"))
	if err != nil && !(errors.Is(err, os.ErrNotExist) && slices.Contains(extra, "--store")) {
		return nil, err // (a node on a shared store that has keys writes none: the caller sets one)
	}
	s.key = strings.TrimSpace(string(b))
	s.c = client.New(s.url, s.key)
	s.c.HTTP = &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	return s, nil
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// templateInfo is the part of GET /v1/templates the benchmark reads (the
// Go client's Template has no warm or pool fields).
type templateInfo struct {
	Name string `json:"name"`
	Warm bool   `json:"warm"`
	Pool *struct {
		Ready    int   `json:"ready"`
		Size     int   `json:"size"`
		PSSBytes int64 `json:"pss_bytes"`
	} `json:"pool"`
}

func (s *server) template(ctx context.Context, name string) (templateInfo, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url+"/v1/templates", nil)
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := s.c.HTTP.Do(req)
	if err != nil {
		return templateInfo{}, err
	}
	defer resp.Body.Close()
	var out struct {
		Templates []templateInfo `json:"templates"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return templateInfo{}, err
	}
	for _, t := range out.Templates {
		if t.Name == name {
			return t, nil
		}
	}
	return templateInfo{}, fmt.Errorf("server %s has no template %q built", s.name, name)
}

// waitWarm waits until the template's warm snapshot exists and, with a
// pool, every pool sandbox is restored and waiting.
func (s *server) waitWarm(ctx context.Context, name string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	var last templateInfo
	for {
		t, err := s.template(ctx, name)
		if err == nil {
			last = t
			if t.Warm && (s.poolSize == 0 || (t.Pool != nil && t.Pool.Ready >= t.Pool.Size)) {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("server %s: template %s not warm with a full pool after %s (last: %+v, err %v):\n%s", s.name, name, limit, last, err, s.log.tail(20))
		}
		select {
		case <-s.exited:
			return fmt.Errorf("server %s exited:\n%s", s.name, s.log.tail(30))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// settle waits (up to limit) for the pool to refill, so a measurement does
// not share the CPU with pool restores left over from the one before.
func (s *server) settle(ctx context.Context, limit time.Duration) {
	if s.poolSize > 0 {
		s.waitWarm(ctx, "code-interpreter", limit)
	}
}

func (s *server) track(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		s.live[id], s.seen[id] = true, true
	}
}

// create makes a sandbox with a TTL that outlives the run.
func (s *server) create(ctx context.Context, template string) (*client.Sandbox, error) {
	sb, err := s.c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: template, TTLSeconds: sandboxTTL})
	if err != nil {
		return nil, err
	}
	s.track(sb.ID)
	return sb, nil
}

func (s *server) restore(ctx context.Context, snapshotID string) (*client.Sandbox, error) {
	sb, err := s.c.CreateSandboxFromSnapshot(ctx, client.RestoreRequest{SnapshotID: snapshotID, TTLSeconds: sandboxTTL})
	if err != nil {
		return nil, err
	}
	s.track(sb.ID)
	return sb, nil
}

func (s *server) fork(ctx context.Context, id string, count int) ([]client.Sandbox, error) {
	kids, err := s.c.Fork(ctx, id, client.ForkRequest{Count: count, TTLSeconds: sandboxTTL})
	if err != nil {
		return nil, err
	}
	for _, k := range kids {
		s.track(k.ID)
	}
	return kids, nil
}

// kill deletes a sandbox; it runs outside the caller's context so a
// cancelled run still cleans up.
func (s *server) kill(id string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := s.c.KillSandbox(ctx, id)
	// A sandbox being suspended for idleness answers conflict until the
	// pause is done.
	for client.IsCode(err, "conflict") && ctx.Err() == nil {
		time.Sleep(200 * time.Millisecond)
		err = s.c.KillSandbox(ctx, id)
	}
	if err == nil || client.IsCode(err, "not_found") {
		s.mu.Lock()
		delete(s.live, id)
		s.mu.Unlock()
		return nil
	}
	return err
}

// killAll kills the given sandboxes, four at a time.
func (s *server) killAll(ids []string) {
	sem := make(chan struct{}, 4)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := s.kill(id); err != nil {
				fmt.Fprintf(os.Stderr, "  kill %s on %s: %v\n", id, s.name, err)
			}
		}()
	}
	wg.Wait()
}

func (s *server) liveIDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.live))
	for id := range s.live {
		ids = append(ids, id)
	}
	return ids
}

// stop kills what the benchmark left on the server, stops the server (its
// pool sandboxes go with it), removes whatever runsc state is still there,
// and deletes the data dir.
func (s *server) stop() {
	if s.c != nil {
		if ids := s.liveIDs(); len(ids) > 0 {
			s.killAll(ids)
		}
	}
	select {
	case <-s.exited:
	default:
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(60 * time.Second):
			s.cmd.Process.Kill()
			<-s.exited
		}
	}
	s.sweep()
	os.RemoveAll(s.dataDir)
	if dir := os.Getenv("BENCH_SERVER_LOGS"); dir != "" {
		// For reading the servers' own timings afterwards (with
		// PANDASTACK_LOG_LEVEL=debug, the network's too).
		os.MkdirAll(dir, 0o755)
		os.WriteFile(filepath.Join(dir, s.name+".log"), []byte(s.log.String()), 0o644)
	}
}

// sweep is the last resort after the server is gone: it deletes every
// container still under this server's runsc root, kills any process left
// with that root on its command line (only this run's servers use it), and
// removes the cgroups of the sandboxes it saw.
func (s *server) sweep() {
	out, _ := exec.Command(s.runsc, "--root="+s.runscRoot, "list", "--quiet").Output()
	ids := strings.Fields(string(out))
	for _, id := range ids {
		exec.Command(s.runsc, "--root="+s.runscRoot, "delete", "--force", id).Run()
	}
	left := sandboxPIDs(s.runscRoot)
	for id, pids := range left {
		ids = append(ids, id)
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
	if len(ids) > 0 {
		fmt.Fprintf(os.Stderr, "  %s: removed %d sandbox(es) the server left behind: %v\n", s.name, len(ids), ids)
	}
	s.mu.Lock()
	for id := range s.seen {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	roots, _ := filepath.Glob("/sys/fs/cgroup/*")
	roots = append(roots, "/sys/fs/cgroup")
	for _, id := range ids {
		for _, r := range roots {
			os.Remove(filepath.Join(r, "pandastack", id)) // rmdir; fails harmlessly when absent
		}
	}
}

var errNotRoot = errors.New("the benchmark needs root (gVisor's runsc creates namespaces and cgroups): run it with sudo")
