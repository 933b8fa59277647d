package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/agent/jupyter"
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

// primeCheck runs a spare's prime after the template's warm-up in a real
// IPython shell with the inline backend (stdin: the prime, a separator
// line, the touch), touches twice, and prints what a user could tell.
const primeCheck = `import os, sys
os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
from IPython.core.interactiveshell import InteractiveShell
ip = InteractiveShell.instance()
prime, touch = sys.stdin.read().split("\n#----\n")
def run(code):
    ip.run_cell(code, silent=True).raise_error()
run("import numpy, pandas, matplotlib.pyplot")
import numpy as np
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
import pandas.plotting._core as core
before = set(ip.user_ns)
state = np.random.get_state()[1].copy()
run(prime)
print("pandas plotted", "matplotlib" in core._backends)
run(touch)
run(touch)
print("figures", plt.get_fignums())
print("names", sorted(set(ip.user_ns) - before))
print("random state kept", bool((np.random.get_state()[1] == state).all()))
fmt = ip.display_formatter.formatters["image/png"].lookup_by_type(Figure)
print("single draw", getattr(fmt, "_pandastack", False))
fig = plt.figure()
plt.plot([1, 3, 2])
data, md = ip.display_formatter.format(fig)
print("user's figure", fig.number, "png", data.get("image/png", "")[:4] == "iVBO")
`

const primeCheckWant = `pandas plotted True
figures []
names []
random state kept True
single draw True
user's figure 1 png True
`

// TestSparePrimeAndTouch: the prime draws a pandas plot through the
// display formatter (the path of a user's first plot), and it and the
// touch leave nothing a user could see: no figure open, no name, the same
// random state, the first figure of the user still number 1 with its PNG.
func TestSparePrimeAndTouch(t *testing.T) {
	py := pythonWith(t, "IPython, matplotlib_inline, matplotlib, pandas")
	cmd := exec.Command(py, "-c", primeCheck)
	cmd.Stdin = strings.NewReader(sparePrimeCode() + "\n#----\n" + spareTouchCode())
	cmd.Env = append(os.Environ(), "MPLCONFIGDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// Matplotlib says so when building its font cache (a new
	// MPLCONFIGDIR) takes long, as it does on a loaded host.
	got := strings.Replace(string(out), "Matplotlib is building the font cache; this may take a moment.\n", "", 1)
	if got != primeCheckWant {
		t.Fatalf("got:\n%s\nwant:\n%s", out, primeCheckWant)
	}
}

// pythonWith returns a python3 that imports modules: PANDASTACK_TEST_PYTHON
// (scripts/test-python-env.sh makes one), or the one on PATH. Without one
// the test skips, and fails under CI=true.
func pythonWith(t *testing.T, modules string) string {
	t.Helper()
	for _, p := range []string{os.Getenv("PANDASTACK_TEST_PYTHON"), "python3"} {
		if p == "" {
			continue
		}
		if path, err := exec.LookPath(p); err == nil && exec.Command(path, "-c", "import "+modules).Run() == nil {
			return path
		}
	}
	msg := "no python3 that imports " + modules + "; fix: export PANDASTACK_TEST_PYTHON=$(scripts/test-python-env.sh)"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// A hand-out queues the cell that sets PANDASTACK_SANDBOX_ID only in a
// spare whose kernel has another id than the agent's: one that started
// with it (or got it from a hello) is handed out as it is, and one that
// died while it waited not at all. The kernels here have no process, so a
// hand-out that must queue the cell fails.
func TestSpareHandOutSetsTheIDOnlyWhenStale(t *testing.T) {
	t.Setenv("PANDASTACK_SANDBOX_ID", "sbx_now")
	cs := NewContexts()
	sp := &cs.spares
	current, stale := &jupyter.Kernel{}, &jupyter.Kernel{}
	sp.want = map[string]int{"python": 2}
	sp.ready = map[string][]*jupyter.Kernel{"python": {stale, current}} // the last one goes first
	sp.log = func(msg string, args ...any) { t.Log(append([]any{msg}, args...)...) }
	sp.startedWith(stale, "sbx_warm")
	sp.startedWith(current, "sbx_now")

	// A spare that died while it waited is not handed out: the next is.
	dead := &jupyter.Kernel{}
	dead.Close()
	sp.mu.Lock()
	sp.ready["python"] = append(sp.ready["python"], dead)
	sp.mu.Unlock()
	sp.startedWith(dead, "sbx_now")
	if k := cs.takeSpare(context.Background(), "python", true); k != current {
		t.Fatalf("the spare with the present id: handed out %p, want %p (%p died)", k, current, dead)
	}
	if k := cs.takeSpare(context.Background(), "python", true); k != nil {
		t.Fatal("the spare with an old id was handed out without its variable set")
	}
	// A hello's id reaches only spares it can queue the cell in.
	sp.mu.Lock()
	sp.ready["python"] = []*jupyter.Kernel{stale}
	sp.mu.Unlock()
	sp.startedWith(stale, "sbx_warm")
	for _, reseed := range []bool{false, true} {
		sp.restored("sbx_now", reseed)
		if got := sp.ids[stale]; got != "sbx_warm" {
			t.Fatalf("reseed %v: a spare the cell could not reach is recorded with %q", reseed, got)
		}
	}
	if len(sp.ids) != 1 {
		t.Fatalf("ids kept for kernels handed out: %v", sp.ids)
	}
}
