//go:build linux

package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// centralReaperEnv makes the test binary run as the agent does as PID 1: a
// child subreaper with one central reaper. TestCentralReaper sets it for a
// second run of the exec tests.
const centralReaperEnv = "PANDASTACK_AGENT_TEST_CENTRAL_REAPER"

var testReaper *agent.Reaper

func TestMain(m *testing.M) {
	if os.Getenv(centralReaperEnv) == "1" {
		// PR_SET_CHILD_SUBREAPER: orphans come to us, as they come to PID 1.
		if _, _, e := syscall.RawSyscall(syscall.SYS_PRCTL, 36, 1, 0); e != 0 {
			fmt.Fprintln(os.Stderr, "prctl(PR_SET_CHILD_SUBREAPER):", e)
			os.Exit(2)
		}
		testReaper = agent.StartReaper(nil)
	}
	os.Exit(m.Run())
}

// logWriter sends the agent's log to t.Log while the test runs.
type logWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (l *logWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

func testLogger(t testing.TB) *slog.Logger {
	w := &logWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newHome makes a home directory the sandbox user can use: when the tests
// run as root, commands run as uid 1000, as in a sandbox.
func newHome(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "agent-home-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Chown(dir, agentproto.UserUID, agentproto.UserGID); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func testConfig(t testing.TB) agent.Config {
	return agent.Config{
		Version:  "test",
		BootedAt: time.Now().UTC(),
		Home:     newHome(t),
		Reaper:   testReaper,
		Log:      testLogger(t),
	}
}

// stack is a client of the agent API over some transport.
type stack struct {
	base string
	hc   *http.Client
}

// directStack serves the handler with httptest.
func directStack(t testing.TB, cfg agent.Config, epoch uint32) *stack {
	srv := httptest.NewServer(agent.NewServer(cfg, epoch).Handler())
	t.Cleanup(srv.Close)
	return &stack{base: srv.URL, hc: srv.Client()}
}

// hostPipes plays the host: the two pipes of a sandbox's stdin and stdout,
// with the agent's agentproto.Serve at the other end.
type hostPipes struct {
	toAgent *io.PipeWriter
	chunks  chan []byte // the agent's stdout
	stop    chan struct{}
}

func newHostPipes(t testing.TB, cfg agent.Config) *hostPipes {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	h := &hostPipes{toAgent: inW, chunks: make(chan []byte), stop: make(chan struct{})}
	served := make(chan error, 1)
	go func() {
		served <- agentproto.Serve(inR, outW, func(epoch uint32, conn io.ReadWriteCloser) {
			agent.ServeSession(cfg, epoch, conn)
		})
	}()
	go func() {
		for {
			buf := make([]byte, 64<<10)
			n, err := outR.Read(buf)
			if n > 0 {
				select {
				case h.chunks <- buf[:n]:
				case <-h.stop:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(h.stop)
		inW.Close() // stdin EOF: Serve returns
		outR.Close()
		select {
		case err := <-served:
			if err != io.EOF {
				t.Errorf("Serve returned %v, want io.EOF", err)
			}
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after stdin EOF")
		}
	})
	return h
}

// hostEnd is one host session's view of the pipes; closing it lets a later
// session take over, as after a server restart.
type hostEnd struct {
	h    *hostPipes
	done chan struct{}
	once sync.Once
	rest []byte
}

func (e *hostEnd) Read(p []byte) (int, error) {
	for len(e.rest) == 0 {
		select {
		case b := <-e.h.chunks:
			e.rest = b
		case <-e.done:
			return 0, io.EOF
		case <-e.h.stop:
			return 0, io.EOF
		}
	}
	n := copy(p, e.rest)
	e.rest = e.rest[n:]
	return n, nil
}

func (e *hostEnd) Write(p []byte) (int, error) { return e.h.toAgent.Write(p) }
func (e *hostEnd) Close() error {
	e.once.Do(func() { close(e.done) })
	return nil
}

// connect opens a host session of the given epoch; close ends it.
func (h *hostPipes) connect(t testing.TB, epoch uint32) (st *stack, close func()) {
	end := &hostEnd{h: h, done: make(chan struct{})}
	sess, err := yamux.Client(agentproto.HostConn(end, epoch), agentproto.MuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) { return sess.Open() },
	}
	close = func() {
		tr.CloseIdleConnections()
		sess.Close()
	}
	t.Cleanup(close)
	return &stack{base: "http://agent", hc: &http.Client{Transport: tr}}, close
}

// forEachStack runs f against the handler directly and through the whole
// channel: framing, yamux and HTTP over two pipes.
func forEachStack(t *testing.T, f func(t *testing.T, cfg agent.Config, st *stack)) {
	t.Run("direct", func(t *testing.T) {
		cfg := testConfig(t)
		f(t, cfg, directStack(t, cfg, 1))
	})
	t.Run("channel", func(t *testing.T) {
		cfg := testConfig(t)
		st, _ := newHostPipes(t, cfg).connect(t, 1)
		f(t, cfg, st)
	})
}

func (st *stack) request(t testing.TB, ctx context.Context, method, path string, q url.Values, body io.Reader) *http.Response {
	t.Helper()
	u := st.base + path
	if q != nil {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := st.hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return resp
}

// call sends a request, checks the status and decodes a JSON answer into out.
func (st *stack) call(t testing.TB, method, path string, q url.Values, body io.Reader, wantStatus int, out any) {
	t.Helper()
	resp := st.request(t, context.Background(), method, path, q, body)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading answer: %v", method, path, err)
	}
	if resp.StatusCode != wantStatus {
		t.Fatalf("%s %s?%s: status %d, want %d; body: %s", method, path, q.Encode(), resp.StatusCode, wantStatus, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: answer %q: %v", method, path, b, err)
		}
	}
}

// callError expects an error answer with the given status and code and
// returns its message.
func (st *stack) callError(t testing.TB, method, path string, q url.Values, body io.Reader, wantStatus int, wantCode string) string {
	t.Helper()
	resp := st.request(t, context.Background(), method, path, q, body)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	var eb agentproto.ErrorBody
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &eb); err != nil {
		t.Fatalf("%s %s: error body %q: %v", method, path, b, err)
	}
	if resp.StatusCode != wantStatus || eb.Error.Code != wantCode {
		t.Fatalf("%s %s: status %d code %q (%s), want %d %q", method, path, resp.StatusCode, eb.Error.Code, eb.Error.Message, wantStatus, wantCode)
	}
	if eb.Error.Message == "" {
		t.Errorf("%s %s: empty error message", method, path)
	}
	return eb.Error.Message
}

func jsonBody(t testing.TB, v any) io.Reader {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.NewReader(b)
}

// execResult is what a caller of exec saw.
type execResult struct {
	stdout, stderr bytes.Buffer
	chunks         int       // stdout and stderr events
	firstOutput    time.Time // arrival of the first stdout or stderr event
	exit           agentproto.ExecEvent
	exitAt         time.Time
}

// execStream runs req and calls onEvent (if non-nil) for each event as it
// arrives; it fails the test unless the stream is well formed.
func (st *stack) execStream(t testing.TB, ctx context.Context, req agentproto.ExecRequest, onEvent func(agentproto.ExecEvent)) *execResult {
	t.Helper()
	resp := st.request(t, ctx, http.MethodPost, "/v1/exec", nil, jsonBody(t, req))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("exec: status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Errorf("exec: Content-Type %q, want application/x-ndjson", ct)
	}
	res := &execResult{}
	dec := json.NewDecoder(resp.Body)
	exits := 0
	for {
		var ev agentproto.ExecEvent
		err := dec.Decode(&ev)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("exec stream: %v", err)
		}
		if exits > 0 {
			t.Fatalf("exec stream: event %q after the exit event", ev.Type)
		}
		if onEvent != nil {
			onEvent(ev)
		}
		switch ev.Type {
		case "stdout", "stderr":
			if res.chunks == 0 {
				res.firstOutput = time.Now()
			}
			res.chunks++
			if ev.Type == "stdout" {
				res.stdout.Write(ev.Data)
			} else {
				res.stderr.Write(ev.Data)
			}
		case "exit":
			exits++
			res.exit, res.exitAt = ev, time.Now()
		default:
			t.Fatalf("exec stream: unknown event type %q", ev.Type)
		}
	}
	if exits != 1 {
		t.Fatalf("exec stream ended with %d exit events, want 1 (stdout %q)", exits, res.stdout.String())
	}
	return res
}

func (st *stack) exec(t testing.TB, req agentproto.ExecRequest) *execResult {
	t.Helper()
	return st.execStream(t, context.Background(), req, nil)
}

// processGone reports whether pid has exited; a zombie counts as gone when
// someone else (not the agent) is its parent and may never reap it.
func processGone(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && len(s) > i+2 && s[i+2] == 'Z' && testReaper == nil
}

// waitGone fails unless every pid is gone within a few seconds.
func waitGone(t testing.TB, pids []int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for _, pid := range pids {
		for !processGone(pid) {
			if time.Now().After(deadline) {
				b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
				t.Fatalf("process %d still there: %s", pid, b)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func parsePids(t testing.TB, out string, want int) []int {
	t.Helper()
	var pids []int
	for _, f := range strings.Fields(out) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("output %q: %v", out, err)
		}
		pids = append(pids, pid)
	}
	if len(pids) != want {
		t.Fatalf("output %q: got %d pids, want %d", out, len(pids), want)
	}
	return pids
}
