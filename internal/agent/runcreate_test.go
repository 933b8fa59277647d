package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agent/jupyter"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// withASpare makes an agent whose python spare k is a kernel without a
// process, and returns its contexts and handler.
func withASpare(t *testing.T) (*Contexts, *jupyter.Kernel, http.Handler) {
	t.Helper()
	t.Setenv("PANDASTACK_SANDBOX_ID", "sbx_now")
	home, err := os.MkdirTemp("", "agent-home-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(home) })
	os.Chmod(home, 0o755) // the sandbox user enters it
	cs := NewContexts()
	k := &jupyter.Kernel{}
	cs.spares.want = map[string]int{"python": 1}
	cs.spares.ready = map[string][]*jupyter.Kernel{"python": {k}}
	cs.spares.startedWith(k, "sbx_now")
	return cs, k, NewServer(Config{Home: home, Contexts: cs}, 1).Handler()
}

// TestRunCreatesItsContext: a run with Create makes its missing context
// (here from a spare, a kernel without a process) before it runs, which
// then fails as a dead kernel's run does, not as a missing context's; a
// second such run uses the context made; a run without Create, or one
// whose Create names another id, creates nothing.
func TestRunCreatesItsContext(t *testing.T) {
	cs, k, h := withASpare(t)
	run := func(id string, req agentproto.RunRequest) (int, string) {
		t.Helper()
		b, _ := json.Marshal(req)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/contexts/"+id+"/run", strings.NewReader(string(b))))
		return rec.Code, rec.Body.String()
	}
	ids := func() []string { return cs.readyIDs() }
	no := false
	create := &agentproto.ContextRequest{ID: "ctx_default_python", Language: "python", AutoRestart: &no}

	if code, body := run("ctx_default_python", agentproto.RunRequest{Code: "1"}); code != http.StatusNotFound {
		t.Fatalf("run without create in a missing context: %d %s, want 404", code, body)
	}
	other := *create
	other.ID = "ctx_other"
	if code, body := run("ctx_default_python", agentproto.RunRequest{Code: "1", Create: &other}); code != http.StatusBadRequest || len(ids()) != 0 {
		t.Fatalf("run whose create names another context: %d %s, contexts %q", code, body, ids())
	}
	for i := range 2 {
		code, body := run("ctx_default_python", agentproto.RunRequest{Code: "1", Create: create})
		if code != http.StatusConflict || !strings.Contains(body, "has died") {
			t.Fatalf("run %d with create: %d %s, want the dead kernel's 409", i, code, body)
		}
		if got := ids(); !slices.Equal(got, []string{"ctx_default_python"}) {
			t.Fatalf("after run %d with create: contexts %q", i, got)
		}
	}
	if cc, err := (&Server{cfg: Config{Contexts: cs}}).context(t.Context(), "ctx_default_python"); err != nil || cc.kernel != k {
		t.Fatalf("the context's kernel is not the spare: %v", err)
	}
}

// TestContextWaitsForItsStart: a request naming a context whose kernel is
// still starting (a second first run racing the one that creates it) waits
// for the start and gets its kernel, or the error the start ended with;
// only a request that gives up first hears "still starting".
func TestContextWaitsForItsStart(t *testing.T) {
	cs := NewContexts()
	s := &Server{cfg: Config{Contexts: cs}}
	starting := func(id string) *codeContext {
		cc := &codeContext{info: agentproto.Context{ID: id}, started: make(chan struct{})}
		cs.mu.Lock()
		cs.ctxs[id] = cc
		cs.mu.Unlock()
		return cc
	}
	type answer struct {
		cc  *codeContext
		err error
	}
	ask := func(ctx context.Context, id string) chan answer {
		ch := make(chan answer, 1)
		go func() {
			cc, err := s.context(ctx, id)
			ch <- answer{cc, err}
		}()
		return ch
	}

	up := starting("ctx_up")
	got := ask(t.Context(), "ctx_up")
	time.Sleep(20 * time.Millisecond)
	select {
	case a := <-got:
		t.Fatalf("answered before the kernel started: %+v", a)
	default:
	}
	k := &jupyter.Kernel{}
	cs.mu.Lock()
	up.kernel = k
	cs.mu.Unlock()
	close(up.started)
	if a := <-got; a.err != nil || a.cc.kernel != k {
		t.Fatalf("after the start: %+v, want the started kernel", a)
	}

	failed := starting("ctx_failed")
	got = ask(t.Context(), "ctx_failed")
	waitParkedIn(t, ".(*Server).context(") // the request is waiting before the start fails
	cs.mu.Lock()
	delete(cs.ctxs, "ctx_failed")
	failed.startErr = pandastack.Errorf(pandastack.EInvalid, "no kernel for language cobol")
	cs.mu.Unlock()
	close(failed.started)
	if a := <-got; !pandastack.IsCode(a.err, pandastack.EInvalid) || !strings.Contains(a.err.Error(), "cobol") {
		t.Fatalf("after a failed start: %+v, want its error", a)
	}

	starting("ctx_slow")
	// An interrupt does not wait: it would reach the new kernel before the
	// first cell and be lost.
	rec := httptest.NewRecorder()
	NewServer(Config{Home: t.TempDir(), Contexts: cs}, 1).Handler().ServeHTTP(rec, httptest.NewRequest("POST", "/v1/contexts/ctx_slow/interrupt", nil))
	if rec.Code != http.StatusConflict || !strings.Contains(rec.Body.String(), "still starting") {
		t.Fatalf("interrupt of a context still starting: %d %s, want 409 at once", rec.Code, rec.Body)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	if a := <-ask(ctx, "ctx_slow"); !pandastack.IsCode(a.err, pandastack.EConflict) || !strings.Contains(a.err.Error(), "still starting") {
		t.Fatalf("a request that gives up: %+v, want 409 still starting", a)
	}
}

// TestRestartOfAContextBeingDeleted: a restart or an interrupt that finds
// its context's kernel closed (the context deleted meanwhile) answers 404,
// not 500.
func TestRestartOfAContextBeingDeleted(t *testing.T) {
	_, k, h := withASpare(t)
	post := func(path, body string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", path, strings.NewReader(body)))
		return rec.Code, rec.Body.String()
	}
	no := false
	b, _ := json.Marshal(agentproto.RunRequest{Code: "1", Create: &agentproto.ContextRequest{ID: "ctx_a", Language: "python", AutoRestart: &no}})
	if code, body := post("/v1/contexts/ctx_a/run", string(b)); code != http.StatusConflict {
		t.Fatalf("the run that makes the context: %d %s", code, body)
	}
	k.Close() // as a delete does, before the context leaves the list
	for _, op := range []string{"restart", "interrupt"} {
		if code, body := post("/v1/contexts/ctx_a/"+op, ""); code != http.StatusNotFound || !strings.Contains(body, "deleted") {
			t.Errorf("%s of a context being deleted: %d %s, want 404", op, code, body)
		}
	}
}

// waitParkedIn waits until a goroutine is blocked in a select within the
// function fn names (as it appears in a stack trace).
func waitParkedIn(t *testing.T, fn string) {
	t.Helper()
	buf := make([]byte, 1<<20)
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		n := runtime.Stack(buf, true)
		for _, g := range strings.Split(string(buf[:n]), "\n\n") {
			if header, _, _ := strings.Cut(g, "\n"); strings.Contains(header, "[select") && strings.Contains(g, fn) {
				return
			}
		}
		if time.Now().After(end) {
			t.Fatalf("no goroutine waits in %s", fn)
		}
	}
}
