package jupyter

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestDenoReseedCode runs the code in V8 (node: Deno's kernel is V8 too)
// started with one fixed seed, as two copies of one image would be: after
// the reseed each draws its own numbers, all doubles in [0, 1).
func TestDenoReseedCode(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node not found; e2e's TestRandomStateAfterRestore runs this code in Deno's kernel")
	}
	draws := func(reseed bool) []float64 {
		t.Helper()
		code := "const xs = []; for (let i = 0; i < 1000; i++) xs.push(Math.random()); console.log(xs.join(' '));"
		if reseed {
			code = DenoReseedCode() + code
		}
		out, err := exec.Command(node, "--random-seed=42", "-e", code).CombinedOutput()
		if err != nil {
			t.Fatalf("node: %v\n%s", err, out)
		}
		var xs []float64
		for _, f := range strings.Fields(string(out)) {
			x, err := strconv.ParseFloat(f, 64)
			if err != nil || x < 0 || x >= 1 {
				t.Fatalf("Math.random gave %q", f)
			}
			xs = append(xs, x)
		}
		return xs
	}
	a, b := draws(false), draws(false)
	if a[0] != b[0] {
		t.Fatalf("V8 with one seed should repeat itself: %v %v", a[0], b[0])
	}
	a, b = draws(true), draws(true)
	if a[0] == b[0] || a[1] == b[1] {
		t.Fatalf("after the reseed two copies drew the same: %v %v", a[:2], b[:2])
	}
	var sum float64
	for _, x := range a {
		sum += x
	}
	if mean := sum / float64(len(a)); mean < 0.4 || mean > 0.6 {
		t.Errorf("mean of 1000 draws %v, want about 0.5", mean)
	}
}
