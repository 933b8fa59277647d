package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// TestSparesRequestValidation: bad spare requests are refused with a clear
// invalid error, and no spares are listed until some are asked for.
func TestSparesRequestValidation(t *testing.T) {
	h := NewServer(Config{Home: t.TempDir()}, 1).Handler()
	do := func(method, body string) (int, string) {
		req := httptest.NewRequest(method, "/v1/contexts/spares", strings.NewReader(body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec.Code, rec.Body.String()
	}
	for _, body := range []string{`{"language":"bash","count":1}`, `{"language":"python","count":99}`, `{"language":"python","count":-1}`, `{`} {
		code, out := do("POST", body)
		if code != http.StatusBadRequest || !strings.Contains(out, `"invalid_request"`) {
			t.Errorf("POST %s: %d %s, want 400 invalid_request", body, code, out)
		}
	}
	code, out := do("GET", "")
	var list []agentproto.Spares
	if code != 200 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 0 {
		t.Errorf("GET: %d %s, want an empty list", code, out)
	}
}

// TestTakeSpareWithoutSpares: with none ready, or for a context that does
// not fit a spare, the caller starts its own kernel.
func TestTakeSpareWithoutSpares(t *testing.T) {
	cs := NewContexts()
	if k := cs.takeSpare(context.Background(), "python", true); k != nil {
		t.Fatal("a spare out of nothing")
	}
	if k := cs.takeSpare(context.Background(), "python", false); k != nil {
		t.Fatal("a spare for a context that does not fit one")
	}
}

// TestPythonSetEnv runs the hand-out code in a real Python: it sets the
// variables, whatever their characters, and leaves no name behind.
func TestPythonSetEnv(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on this machine")
	}
	code := "before = set(globals())\n" + pythonSetEnv(map[string]string{"A": `quote ' " \ and ünïcode`, "B": "2"}) +
		"\nimport os\nprint(sorted(set(globals()) - before - {'before', 'os'}), os.environ['A'], os.environ['B'])"
	out, err := exec.Command(py, "-c", code).CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), `[] quote ' " \ and ünïcode 2`; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
}

// TestSparePrimeCodeCompiles: the pieces a spare runs after its warm-up
// make one valid cell (a silent cell that does not compile fails whole,
// and the spare is then not primed at all).
func TestSparePrimeCodeCompiles(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3 on this machine")
	}
	cmd := exec.Command(py, "-c", "import sys; compile(sys.stdin.read(), 'prime', 'exec')")
	cmd.Stdin = strings.NewReader(sparePrimeCode())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}
