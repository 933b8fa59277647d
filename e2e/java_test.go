package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/client"
)

// TestJava runs Java cells in the code-interpreter template's JJava kernel:
// state between cells, values, output, exceptions, env per run, a timeout,
// and fork children that draw their own Math.random.
func TestJava(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 900})
	run := func(t *testing.T, id, code string, env map[string]string) *client.Execution {
		t.Helper()
		ex, err := c.RunCode(ctx, id, client.RunRequest{Code: code, Language: "java", Env: env, TimeoutSeconds: 180})
		if err != nil {
			t.Fatalf("java %q: %v", code, err)
		}
		if ex.Error != nil {
			t.Fatalf("java %q: %+v (stderr %q)", code, ex.Error, ex.Stderr)
		}
		return ex
	}

	t.Run("state, values, output and exceptions", func(t *testing.T) {
		ex := run(t, sb.ID, `import java.util.*;
var xs = new ArrayList<Integer>(List.of(3, 1, 2));
Collections.sort(xs);
System.out.println("sorted " + xs);
int total = xs.stream().mapToInt(Integer::intValue).sum();`, nil)
		if ex.Stdout != "sorted [1, 2, 3]\n" {
			t.Fatalf("stdout %q", ex.Stdout)
		}
		if ex := run(t, sb.ID, "total * 7", nil); ex.Text != "42" {
			t.Fatalf("total * 7 = %q", ex.Text)
		}
		ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: `throw new IllegalStateException("bad state")`, Language: "java"})
		if err != nil || ex.Error == nil || !strings.Contains(ex.Error.Name+ex.Error.Value, "bad state") {
			t.Fatalf("throw: %+v %v", ex.Error, err)
		}
		// JJava shows a String value without quotes.
		if ex := run(t, sb.ID, "String.valueOf(total)", nil); ex.Text != "6" {
			t.Fatalf("after the exception: %q", ex.Text)
		}
	})
	t.Run("env per run", func(t *testing.T) {
		env := map[string]string{"PANDA_VAR": `a "quoted" <value>\u0041\`}
		if ex := run(t, sb.ID, `System.out.print(System.getenv("PANDA_VAR"))`, env); ex.Stdout != env["PANDA_VAR"] {
			t.Errorf("during the run: %q", ex.Stdout)
		}
		if ex := run(t, sb.ID, `System.out.print(System.getenv("PANDA_VAR"))`, nil); ex.Stdout != "null" {
			t.Errorf("after the run: %q", ex.Stdout)
		}
	})
	t.Run("a timeout stops the cell", func(t *testing.T) {
		ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "while (true) { Thread.onSpinWait(); }", Language: "java", TimeoutSeconds: 3})
		if err != nil || ex.Error == nil || ex.Error.Name != "TimeoutError" {
			t.Fatalf("busy loop: %+v %v", ex.Error, err)
		}
		// An interrupt_request stops the snippet; the state survives.
		if ex := run(t, sb.ID, "total + 1", nil); ex.Text != "7" {
			t.Fatalf("after the timeout: %q", ex.Text)
		}
	})
	t.Run("fork children draw their own Math.random", func(t *testing.T) {
		run(t, sb.ID, "int kept = 41;", nil)
		kids, err := c.Fork(ctx, sb.ID, client.ForkRequest{Count: 2, TTLSeconds: 900})
		if err != nil {
			t.Fatalf("fork: %v", err)
		}
		for _, k := range kids {
			t.Cleanup(func() { c.KillSandbox(context.Background(), k.ID) })
		}
		seen := map[string]bool{}
		for i, k := range kids {
			ex := run(t, k.ID, `System.out.println(kept + 1); System.out.println(Math.random());`, nil)
			kept, draw, _ := strings.Cut(strings.TrimSpace(ex.Stdout), "\n")
			if kept != "42" {
				t.Errorf("fork child %d lost its state: %q", i, ex.Stdout)
			}
			if seen[draw] {
				t.Errorf("fork child %d drew the same Math.random as another: %s", i, draw)
			}
			seen[draw] = true
		}
	})
}
