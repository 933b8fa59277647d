package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fakeAPI answers what `pandastack mcp` asks of a server for one exec in
// its session's sandbox, and records the sandboxes killed.
type fakeAPI struct {
	*httptest.Server
	mu     sync.Mutex
	killed []string
}

func newFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{}
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter, v any) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /v1/templates", func(w http.ResponseWriter, r *http.Request) {
		reply(w, map[string]any{"templates": []map[string]any{{"name": "code-interpreter"}}})
	})
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		reply(w, map[string]any{"id": "sbx_mcp", "template": "code-interpreter", "state": "running", "expires_at": time.Now().Add(time.Hour)})
	})
	mux.HandleFunc("POST /v1/sandboxes/sbx_mcp/exec", func(w http.ResponseWriter, r *http.Request) {
		reply(w, map[string]any{"stdout": "ok\n", "exit_code": 0})
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.killed = append(f.killed, r.PathValue("id"))
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

func (f *fakeAPI) wasKilled(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.killed, id)
}

// TestMCPHelperProcess is `pandastack mcp` when this test binary is
// started by mcpProcess; otherwise it does nothing.
func TestMCPHelperProcess(t *testing.T) {
	if os.Getenv("PANDASTACK_TEST_MCP_HELPER") != "1" {
		return
	}
	if err := mcpCmd(nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// mcpProcess is `pandastack mcp` against api, as an MCP client starts it.
func mcpProcess(t *testing.T, api *fakeAPI) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestMCPHelperProcess$")
	cmd.Env = append(os.Environ(), "PANDASTACK_TEST_MCP_HELPER=1", "PANDASTACK_API="+api.URL, "PANDASTACK_API_KEY=pds_test")
	return cmd
}

// connectMCP starts cmd and runs one exec, which makes the session's sandbox.
func connectMCP(t *testing.T, cmd *exec.Cmd) *mcp.ClientSession {
	t.Helper()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "signal-test", Version: "0"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd, TerminateDuration: 30 * time.Second}, nil)
	if err != nil {
		t.Fatalf("initialize: %v", err)
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"cmd": "true"}})
	if err != nil || res.IsError {
		t.Fatalf("exec: %v %+v", err, res)
	}
	return cs
}

// A terminal closed under the client that started `pandastack mcp` sends
// it SIGHUP: it kills the session's sandbox and exits, as on SIGTERM,
// rather than dying and leaving the sandbox to its TTL.
func TestMCPSighupKillsTheSessionSandbox(t *testing.T) {
	// Under nohup this process ignores SIGHUP, and so would the one it
	// starts (which then rightly keeps running): caught here instead, the
	// signal is at its default in the child.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	api := newFakeAPI(t)
	cmd := mcpProcess(t, api)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	cs := connectMCP(t, cmd)
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	cs.Wait()
	cs.Close()
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Errorf("pandastack mcp ended %v on SIGHUP, want a clean exit\n%s", cmd.ProcessState, stderr.String())
	}
	if !api.wasKilled("sbx_mcp") {
		t.Errorf("the session's sandbox was not killed on SIGHUP\n%s", stderr.String())
	}
}

// A client that reads the server's stderr and goes away (it crashed, or
// was force-quit) leaves it no reader: the log line written as the
// session ends fails, and `pandastack mcp` goes on to kill the session's
// sandbox, where SIGPIPE killed it first.
func TestMCPClosedStderrKillsTheSessionSandbox(t *testing.T) {
	api := newFakeAPI(t)
	cmd := mcpProcess(t, api)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	cmd.Stderr = w
	var stderr lockedBuffer
	read := make(chan struct{})
	go func() {
		defer close(read)
		b := make([]byte, 4096)
		for {
			n, err := r.Read(b)
			stderr.Write(b[:n])
			if err != nil {
				return
			}
		}
	}()
	cs := connectMCP(t, cmd)
	w.Close() // the child's copy is its only writer
	r.Close() // and now it has no reader
	<-read
	cs.Close() // stdin reaches EOF: the session ends
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Errorf("pandastack mcp ended %v with its stderr closed, want a clean exit\n%s", cmd.ProcessState, stderr.String())
	}
	if !api.wasKilled("sbx_mcp") {
		t.Errorf("the session's sandbox was not killed with stderr closed\n%s", stderr.String())
	}
}

// lockedBuffer is a bytes.Buffer safe for a process's writes and a test's reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
