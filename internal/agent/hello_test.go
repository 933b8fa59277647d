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
