package agent

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/agent/jupyter"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// TestRunCreatesItsContext: a run with Create makes its missing context
// (here from a spare, a kernel without a process) before it runs, which
// then fails as a dead kernel's run does, not as a missing context's; a
// second such run uses the context made; a run without Create, or one
// whose Create names another id, creates nothing.
func TestRunCreatesItsContext(t *testing.T) {
	t.Setenv("PANDASTACK_SANDBOX_ID", "sbx_now")
	home, err := os.MkdirTemp("", "agent-home-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(home)
	os.Chmod(home, 0o755) // the sandbox user enters it
	cs := NewContexts()
	k := &jupyter.Kernel{}
	cs.spares.want = map[string]int{"python": 1}
	cs.spares.ready = map[string][]*jupyter.Kernel{"python": {k}}
	cs.spares.startedWith(k, "sbx_now")
	h := NewServer(Config{Home: home, Contexts: cs}, 1).Handler()
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
	if cc, err := (&Server{cfg: Config{Contexts: cs}}).context("ctx_default_python"); err != nil || cc.kernel != k {
		t.Fatalf("the context's kernel is not the spare: %v", err)
	}
}
