package agent

import (
	"testing"
)

// What `deno fmt` says of a cell it cannot parse becomes a SyntaxError
// with its message, and its line and caret as the traceback, naming the
// cell rather than deno's stdin file; anything else is not explained.
func TestDenoSyntaxError(t *testing.T) {
	out := "error: SyntaxError: Expression expected\n  |\n1 | let q = ;\n  |         ~\n    at file:///home/user/_stdin.ts:1:9\n"
	e := denoSyntaxError(out)
	if e == nil || e.Name != "SyntaxError" || e.Value != "Expression expected" {
		t.Fatalf("explained as %+v", e)
	}
	if want := "SyntaxError: Expression expected\n  |\n1 | let q = ;\n  |         ~\n    at cell:1:9"; e.Traceback != want {
		t.Errorf("traceback %q, want %q", e.Traceback, want)
	}
	for _, s := range []string{"", "error: Found 1 not formatted file", "Warning something"} {
		if e := denoSyntaxError(s); e != nil {
			t.Errorf("%q explained as %+v", s, e)
		}
	}
}
