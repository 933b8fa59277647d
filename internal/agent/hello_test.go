package agent

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"

	"github.com/pandastack/pandastack/internal/agent/jupyter"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// TestHelloListsReadyContexts: the hello names the contexts whose kernel
// has started, oldest first, so the host can run in them without asking;
// one still starting is left out (a run in it would be refused).
func TestHelloListsReadyContexts(t *testing.T) {
	cs := NewContexts()
	cs.ctxs["ctx_default_python"] = &codeContext{info: agentproto.Context{ID: "ctx_default_python"}, kernel: &jupyter.Kernel{}, created: 1}
	cs.ctxs["ctx_b"] = &codeContext{info: agentproto.Context{ID: "ctx_b"}, kernel: &jupyter.Kernel{}, created: 3}
	cs.ctxs["ctx_a"] = &codeContext{info: agentproto.Context{ID: "ctx_a"}, kernel: &jupyter.Kernel{}, created: 2}
	cs.ctxs["ctx_starting"] = &codeContext{info: agentproto.Context{ID: "ctx_starting"}, created: 4}
	h := NewServer(Config{Home: t.TempDir(), Contexts: cs}, 1).Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/hello", nil))
	var out agentproto.Hello
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &out) != nil {
		t.Fatalf("hello: %d %s", rec.Code, rec.Body)
	}
	if want := []string{"ctx_default_python", "ctx_a", "ctx_b"}; !slices.Equal(out.Contexts, want) {
		t.Fatalf("hello lists contexts %q, want %q", out.Contexts, want)
	}

	// No context: the field is left out, as an older agent's.
	h = NewServer(Config{Home: t.TempDir()}, 1).Handler()
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/hello", nil))
	var raw map[string]any
	if json.Unmarshal(rec.Body.Bytes(), &raw) != nil || raw["contexts"] != nil {
		t.Fatalf("hello of an agent without contexts: %s", rec.Body)
	}
}

// TestHelloHoldsSpares: a hello with hold_spares=1 ends every hold (and a
// release for a suspend) and leaves one, which one DELETE ends; a hello
// without it leaves none.
func TestHelloHoldsSpares(t *testing.T) {
	cs := NewContexts()
	sp := &cs.spares
	sp.kick = make(chan struct{}, 1)
	sp.held, sp.released = 3, true
	h := NewServer(Config{Home: t.TempDir(), Contexts: cs}, 1).Handler()
	call := func(method, path string, want int) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		if rec.Code != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, rec.Code, rec.Body, want)
		}
	}
	state := func() (int, bool, int) {
		sp.mu.Lock()
		defer sp.mu.Unlock()
		return sp.held, sp.released, len(sp.kick)
	}
	call("GET", "/v1/hello?hold_spares=1", http.StatusOK)
	if held, released, kicks := state(); held != 1 || released || kicks != 0 {
		t.Fatalf("after a hello with hold_spares: held %d, released %v, %d wake-ups; want 1, false, 0", held, released, kicks)
	}
	call("DELETE", "/v1/contexts/spares/hold", http.StatusNoContent)
	if held, _, kicks := state(); held != 0 || kicks != 1 {
		t.Fatalf("after the host's DELETE: held %d, %d wake-ups; want 0 and 1", held, kicks)
	}
	<-sp.kick
	sp.mu.Lock()
	sp.held = 2
	sp.mu.Unlock()
	call("GET", "/v1/hello", http.StatusOK)
	if held, _, kicks := state(); held != 0 || kicks != 1 {
		t.Fatalf("after a plain hello: held %d, %d wake-ups; want 0 and 1", held, kicks)
	}
}
