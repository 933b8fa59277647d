// Package e2e drives the real pandastack binary, with real gVisor sandboxes,
// through the Go client, the CLI and raw HTTP. Nothing here is mocked.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/network"
	"github.com/pandastack/pandastack/internal/paths"
	"github.com/pandastack/pandastack/internal/testutil"
)

// server is one running `pandastack serve`.
type server struct {
	t       testing.TB
	bin     string
	dataDir string
	url     string
	key     string
	cmd     *exec.Cmd
	out     *serveLog
	env     []string
	logTo   *os.File // serve's stdout and stderr instead of out, if set
}

// serveLog is what serve writes to its stdout and stderr: a file unlinked
// as soon as it is made, so that nothing of it outlives the processes
// that hold it, whose writes never fail for want of a reader (a pipe to a
// test binary that died would lose what serve logs while it stops).
type serveLog struct{ f *os.File }

func newServeLog(t testing.TB) *serveLog {
	f, err := os.CreateTemp("", "pandastack-e2e-log-")
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(f.Name())
	// Left open: the shared server outlives the test that started it, and
	// its log is read until the end.
	return &serveLog{f: f}
}

func (l *serveLog) String() string {
	var b bytes.Buffer
	io.Copy(&b, io.NewSectionReader(l.f, 0, 1<<62))
	return b.String()
}

// syncBuffer collects a command's output for the tests that read it.
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

func freePort(t testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startServer runs serve on a free loopback port with its own data dir
// (or dataDir, to restart on an existing one).
func startServer(t testing.TB, dataDir string, env ...string) *server {
	t.Helper()
	s := newServer(t, dataDir, env...)
	s.start()
	return s
}

// newServer is startServer's server before its start.
func newServer(t testing.TB, dataDir string, env ...string) *server {
	t.Helper()
	testutil.Runsc(t)
	testutil.RequireDebootstrap(t)
	bin := testutil.Binaries(t)
	s := &server{t: t, bin: bin, dataDir: dataDir, env: env}
	if dataDir == "" {
		var err error
		if s.dataDir, err = os.MkdirTemp("", "pandastack-e2e-"); err != nil {
			t.Fatal(err)
		}
		// A data directory made here goes with the test (each run left
		// one or two in /tmp): its server stopped if the test left it
		// running, and only once no process names the directory (a
		// server the test started again on it and left running).
		t.Cleanup(func() {
			s.stop()
			if len(processesMentioning(s.dataDir)) == 0 {
				os.RemoveAll(s.dataDir)
			}
		})
	}
	return s
}

func (s *server) start() {
	// The port is free when picked, and taken by serve only later: another
	// process may bind it in between (packages run side by side, and their
	// outgoing connections take ports of the same range). Then serve says
	// so and exits, and a start on another port is tried.
	for attempt := 1; ; attempt++ {
		if s.startOn(freePort(s.t), attempt < 3) {
			return
		}
		s.t.Logf("serve's port was taken before it bound it; starting it on another")
	}
}

// startOn starts serve on port; with retry, one that exits because the
// port was taken returns false rather than failing the test.
func (s *server) startOn(port int, retry bool) bool {
	t := s.t
	s.url = "http://127.0.0.1:" + strconv.Itoa(port)
	s.out = newServeLog(t)
	s.cmd = exec.Command(filepath.Join(s.bin, "pandastack"), "serve")
	s.cmd.Env = append(os.Environ(),
		"PANDASTACK_LISTEN=127.0.0.1:"+strconv.Itoa(port),
		"PANDASTACK_DATA_DIR="+s.dataDir,
		"PANDASTACK_CACHE_DIR="+paths.CacheDir(),
		"PANDASTACK_LOG_LEVEL=debug",
		"PANDASTACK_KILL_ON_EXIT=1", // a test that stops serve must not leave sandboxes behind
	)
	s.cmd.Env = append(s.cmd.Env, s.env...)
	s.cmd.Stdout, s.cmd.Stderr = s.out.f, s.out.f
	if s.logTo != nil {
		s.cmd.Stdout, s.cmd.Stderr = s.logTo, s.logTo
	}
	if err := testutil.StartWithParent(s.cmd); err != nil {
		t.Fatal(err)
	}
	// The first start may build the base template: give it time.
	deadline := time.Now().Add(15 * time.Minute)
	// Each look bounded: whatever else holds the port may never answer.
	hc := &http.Client{Timeout: 5 * time.Second}
	for {
		resp, err := hc.Get(s.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			break
		}
		if retry && strings.Contains(s.out.String(), "address already in use") {
			s.cmd.Wait() // it exits on it
			return false
		}
		if s.cmd.ProcessState != nil || time.Now().After(deadline) {
			t.Fatalf("server did not come up: %v\n%s", err, s.out.String())
		}
		if err := s.cmd.Process.Signal(syscall.Signal(0)); err != nil {
			t.Fatalf("server exited:\n%s", s.out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	b, err := os.ReadFile(filepath.Join(s.dataDir, "api-key"))
	if err != nil {
		t.Fatalf("api-key file: %v", err)
	}
	s.key = strings.TrimSpace(string(b))
	return true
}

// stop ends serve with SIGTERM, as an operator would; sandboxes live on.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		// serve's own shutdown waits 10 s for requests, then stops
		// sandboxes (--kill-on-exit), which a loaded host makes slow; a
		// kill before it is done would leave what the checks look for.
		fmt.Fprintf(os.Stderr, "serve (%s) did not stop within 2 minutes of SIGTERM; killing it\n", s.dataDir)
		s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

func (s *server) client() *client.Client { return client.New(s.url, s.key) }

// cli runs the pandastack binary as a user would, against this server.
func (s *server) cli(args ...string) (string, string, error) {
	return s.cliEnv(nil, args...)
}

// cliEnv is cli with env (NAME=value) after this server's settings.
func (s *server) cliEnv(env []string, args ...string) (string, string, error) {
	cmd := exec.Command(filepath.Join(s.bin, "pandastack"), args...)
	cmd.Env = append(os.Environ(), "PANDASTACK_API="+s.url, "PANDASTACK_API_KEY="+s.key, "PANDASTACK_DATA_DIR="+s.dataDir, "PANDASTACK_CACHE_DIR="+paths.CacheDir())
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	return out.String(), errb.String(), err
}

// newKey creates a key in another project with the CLI.
func (s *server) newKey(project string) string {
	out, errOut, err := s.cli("keys", "create", "--project", project)
	if err != nil {
		s.t.Fatalf("keys create: %v\n%s", err, errOut)
	}
	return strings.TrimSpace(out)
}

// containersSince lists the containers runsc knows now that were not in
// before, leaving out those the server logged as prepared ahead, for
// creates (--prepared-creates), for a suspended sandbox's resume or as a
// pool refill: it prepares them on its own, in the background. One it is
// preparing right now is listed by runsc before the server logs it, so a
// container not accounted for is given a while to be logged or removed
// before it counts.
func (s *server) containersSince(before []string) []string {
	return settled(30*time.Second, func() []string { return s.unexplainedContainers(before) })
}

// settled calls list until it returns nothing or d has passed, and
// returns its last answer: for leftovers that the server's or other
// packages' background work may still be removing.
func settled(d time.Duration, list func() []string) []string {
	deadline := time.Now().Add(d)
	for {
		left := list()
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// logSandbox finds the sandbox attribute of a server log line.
var logSandbox = regexp.MustCompile(` sandbox=(sbx_[a-z0-9]+)`)

func (s *server) unexplainedContainers(before []string) []string {
	prepared := map[string]bool{}
	for _, l := range strings.Split(s.out.String(), "\n") {
		if !strings.Contains(l, `msg="container prepared for creates"`) && !strings.Contains(l, `msg="resume prepared"`) && !strings.Contains(l, `msg="pool refilled"`) {
			continue
		}
		if m := logSandbox.FindStringSubmatch(l); m != nil {
			prepared[m[1]] = true
		}
	}
	var out []string
	for _, id := range s.runscList() {
		if !slices.Contains(before, id) && !prepared[id] {
			out = append(out, id)
		}
	}
	return out
}

// runscList lists the containers runsc knows in this server's state root.
func (s *server) runscList() []string {
	out, err := exec.Command(testutil.Runsc(s.t), "--root="+filepath.Join(s.dataDir, "runtime", "runsc"), "list", "--quiet").Output()
	if err != nil {
		s.t.Fatalf("runsc list: %v", err)
	}
	return strings.Fields(string(out))
}

// runscStatus is the status runsc gives sandbox id's container in this
// server's state root ("running", "created", ...), or "" if it has none.
func (s *server) runscStatus(id string) string {
	out, err := exec.Command(testutil.Runsc(s.t), "--root="+filepath.Join(s.dataDir, "runtime", "runsc"), "state", id).Output()
	if err != nil {
		return ""
	}
	var st struct {
		Status string `json:"status"`
	}
	json.Unmarshal(out, &st)
	return st.Status
}

// suspendedStopped reports whether a suspended sandbox stopped running: no
// host process of it is left, or only the two waiting ones of its resume
// prepared ahead (a runsc container created, not running).
func (s *server) suspendedStopped(id string) bool {
	return len(processesMentioning(id)) == 0 || s.runscStatus(id) == "created"
}

// assertGone checks that nothing of sandbox id is left on the host: no
// runsc container, no process, no state directory, no cgroup, no network
// namespace.
func (s *server) assertGone(t *testing.T, id string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var left []string
		for _, c := range s.runscList() {
			if c == id {
				left = append(left, "runsc container")
			}
		}
		if pids := processesMentioning(id); len(pids) > 0 {
			left = append(left, fmt.Sprintf("processes %v", pids))
		}
		if _, err := os.Lstat(filepath.Join(s.dataDir, "runtime", "sandboxes", id)); err == nil {
			left = append(left, "state directory")
		}
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory/pandastack", id)); err == nil {
			left = append(left, "memory cgroup")
		}
		if _, err := os.Stat(filepath.Join(s.dataDir, "paused", id)); err == nil {
			left = append(left, "paused image")
		}
		if _, err := os.Stat("/run/netns/pandastack-" + network.InstanceID(s.dataDir) + "-" + id); err == nil {
			left = append(left, "network namespace")
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s left behind: %s", id, strings.Join(left, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// processesMentioning returns host pids whose command line contains s.
func processesMentioning(s string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(b, []byte(s)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// emptyCgroups lists the sandboxes' cgroup directories (every hierarchy)
// that hold no process.
func emptyCgroups() []string {
	var dirs []string
	for _, pat := range []string{"/sys/fs/cgroup/*/pandastack/sbx_*", "/sys/fs/cgroup/pandastack/sbx_*"} {
		m, _ := filepath.Glob(pat)
		for _, d := range m {
			if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil && len(bytes.TrimSpace(b)) == 0 {
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}

// shared is the server most tests use; TestMain starts and stops it.
var shared *server

func sharedServer(t *testing.T) *server {
	t.Helper()
	if shared == nil {
		// Its own data directory, not one that goes with the first test
		// that asks for it: TestMain removes it.
		dir, err := os.MkdirTemp("", "pandastack-e2e-")
		if err != nil {
			t.Fatal(err)
		}
		// With prepared resumes (off by default), so that path is tested
		// end to end too.
		shared = startServer(t, dir, "PANDASTACK_PREPARED_RESUMES=4")
	}
	return shared
}

func TestMain(m *testing.M) {
	cgroupsBefore := emptyCgroups()
	code := m.Run()
	if shared != nil {
		// Kill what the tests left, then stop: a test that leaks is caught
		// by TestNoLeaks, this only keeps the machine clean.
		c := shared.client()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		if list, err := c.ListSandboxes(ctx, nil, ""); err == nil {
			for _, sb := range list {
				c.KillSandbox(ctx, sb.ID)
			}
		}
		cancel()
		shared.stop()
		// serve runs with --kill-on-exit here: nothing of it may be left.
		if pids := processesMentioning(shared.dataDir); len(pids) > 0 {
			fmt.Fprintf(os.Stderr, "FAIL: processes of the test server's sandboxes left after it stopped: %v\n", pids)
			code = 1
		}
		if left := networkLeft(shared.dataDir); left != "" {
			fmt.Fprintf(os.Stderr, "FAIL: network of the test server left after it stopped: %s\n", left)
			code = 1
		}
		os.RemoveAll(shared.dataDir)
	}
	// A stopped sandbox's cgroups go with it (the cgroups of sandboxes
	// still running, another server's perhaps, have processes in them).
	// Removal waits a few seconds for the last processes to leave, and
	// other packages' tests make and remove theirs meanwhile: an empty
	// cgroup counts only if it stays.
	left := settled(20*time.Second, func() []string {
		var left []string
		for _, d := range emptyCgroups() {
			if !slices.Contains(cgroupsBefore, d) {
				left = append(left, d)
			}
		}
		return left
	})
	for _, d := range left {
		fmt.Fprintf(os.Stderr, "FAIL: cgroup of a stopped sandbox left behind: %s\n", d)
		code = 1
	}
	testutil.RemoveBinaries()
	os.Exit(code)
}

// killEverything kills every sandbox of s's first key's project, for the
// clean-up of a test whose serve runs without --kill-on-exit.
func killEverything(s *server) {
	c := s.client()
	list, err := c.ListSandboxes(context.Background(), nil, "")
	if err != nil {
		s.t.Logf("listing the sandboxes to kill: %v", err)
		return
	}
	for _, sb := range list {
		if err := c.KillSandbox(context.Background(), sb.ID); err != nil && !client.IsCode(err, "not_found") {
			s.t.Logf("kill %s: %v", sb.ID, err)
		}
	}
}

func newSandbox(t *testing.T, s *server, req client.CreateSandboxRequest) *client.Sandbox {
	t.Helper()
	sb, err := s.client().CreateSandbox(context.Background(), req)
	if err != nil {
		t.Fatalf("create sandbox: %v\nserver log:\n%s", err, tail(s.out.String(), 40))
	}
	t.Cleanup(func() {
		err := s.client().KillSandbox(context.Background(), sb.ID)
		if err != nil && !client.IsCode(err, "not_found") {
			t.Errorf("kill %s: %v", sb.ID, err)
		}
	})
	return sb
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
