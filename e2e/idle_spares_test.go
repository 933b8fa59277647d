package e2e

import (
	"context"
	"fmt"
	"testing"

	"github.com/pandastack/pandastack/client"
)

// TestIdleSuspendSpares: an idle suspend shuts the sandbox's spare kernel
// down to keep its image small; after the resume the contexts it had keep
// their state, a new context works at once, and the spare is started
// again, so new contexts are warm (numpy, pandas, matplotlib imported)
// once more. Twice, so that a resumed sandbox suspends and resumes again.
func TestIdleSuspendSpares(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	waitWarmTemplate(t, s, "code-interpreter")
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 900, IdleTimeoutSeconds: idleSeconds(2)})
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(linesWith(s.out.String(), sb.ID, "spare"))
		}
	})
	kept, err := c.CreateContext(ctx, sb.ID, "python", "")
	if err != nil {
		t.Fatal(err)
	}
	if ex := run(t, c, sb, kept, "secret = 'kept'\nimport pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3]})", 60); ex.Error != nil {
		t.Fatalf("%+v", ex)
	}
	for round := range 2 {
		waitState(t, s, sb.ID, "suspended", suspended)
		eventually(t, "the suspended sandbox to stop running", func() bool { return s.suspendedStopped(sb.ID) })
		// The request that resumes it finds the context as it was.
		if ex := run(t, c, sb, kept, "secret, int(df.a.sum())", 60); ex.Error != nil || ex.Text != "('kept', 6)" {
			t.Fatalf("round %d: the context after the resume: %+v", round, ex)
		}
		// A new context at once: a working kernel, warm or not yet.
		fresh, err := c.CreateContext(ctx, sb.ID, "python", "")
		if err != nil {
			t.Fatalf("round %d: a context right after the resume: %v", round, err)
		}
		if ex := run(t, c, sb, fresh, "'secret' in globals(), 1 + 1", 120); ex.Error != nil || ex.Text != "(False, 2)" {
			t.Fatalf("round %d: a context right after the resume: %+v", round, ex)
		}
		if err := c.DeleteContext(ctx, sb.ID, fresh.ID); err != nil {
			t.Fatal(err)
		}
		// The spare comes back: a later new context is warm.
		untilWarmContext(t, c, sb, fmt.Sprintf("after resume %d", round+1), nil)
	}
}
