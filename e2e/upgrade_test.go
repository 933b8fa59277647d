package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/testutil"
)

// TestUpgradeKeepsTheAgentBuild: what a server checkpointed restores after
// the server is upgraded to a build with another agent. A restored process
// maps its binary again, so each image must be restored with the agent
// build it was taken with (before, the old agent crashed and every resume,
// snapshot restore and fork of an adopted sandbox timed out). The "old"
// agent here is the same source built without optimisations: another
// layout of the same program, as an upgrade gives.
func TestUpgradeKeepsTheAgentBuild(t *testing.T) {
	oldAgent := filepath.Join(t.TempDir(), "pandastack-agent")
	build := exec.Command("go", "build", "-gcflags=all=-N -l", "-o", oldAgent, "./cmd/pandastack-agent")
	build.Dir = testutil.RepoRoot(t)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the old agent: %v\n%s", err, out)
	}
	s := newServer(t, "", "PANDASTACK_KILL_ON_EXIT=0", "PANDASTACK_POOL_SIZE=0", "PANDASTACK_PREPARED_RESUMES=0", "PANDASTACK_WARM=0")
	defer func() {
		// Sandboxes outlive this serve (no --kill-on-exit): a test that
		// failed half-way kills what it made first.
		killEverything(s)
		s.stop()
		os.RemoveAll(s.dataDir)
	}()
	newEnv := s.env
	s.env = append(append([]string(nil), newEnv...), "PANDASTACK_AGENT="+oldAgent)
	s.start()
	ctx := context.Background()
	c := s.client()
	create := func() *client.Sandbox {
		t.Helper()
		sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{TTLSeconds: 600, IdleTimeoutSeconds: idleSeconds(0)})
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	paused, running := create(), create()
	mustExec(t, s, paused.ID, "echo paused-state > state.txt")
	mustExec(t, s, running.ID, "echo running-state > state.txt")
	snap, err := c.CreateSnapshot(ctx, paused.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx, paused.ID); err != nil {
		t.Fatal(err)
	}

	// The upgrade: serve stops (its sandboxes stay) and the new build starts.
	s.stop()
	s.env = newEnv
	s.start()
	c = s.client()
	if _, err := c.Resume(ctx, paused.ID); err != nil {
		t.Fatalf("resume of a sandbox the old build paused: %v\n%s", err, tail(s.out.String(), 30))
	}
	if out := mustExec(t, s, paused.ID, "cat state.txt"); out != "paused-state\n" {
		t.Fatalf("after the resume: %q", out)
	}
	restored, err := c.CreateSandboxFromSnapshot(ctx, client.RestoreRequest{SnapshotID: snap.ID, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("restore of a snapshot the old build took: %v\n%s", err, tail(s.out.String(), 30))
	}
	if out := mustExec(t, s, restored.ID, "cat state.txt"); out != "paused-state\n" {
		t.Fatalf("the restored snapshot: %q", out)
	}
	// An adopted sandbox still runs the old agent: its fork, pause and
	// resume work, and so does a snapshot of it, restored.
	kids, err := c.Fork(ctx, running.ID, client.ForkRequest{Count: 1, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("fork of an adopted sandbox: %v\n%s", err, tail(s.out.String(), 30))
	}
	if _, err := c.Pause(ctx, running.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(ctx, running.ID); err != nil {
		t.Fatalf("resume of an adopted sandbox: %v\n%s", err, tail(s.out.String(), 30))
	}
	for _, id := range []string{kids[0].ID, running.ID} {
		if out := mustExec(t, s, id, "cat state.txt"); out != "running-state\n" {
			t.Fatalf("%s: %q", id, out)
		}
	}
	// A sandbox the new build made runs the new agent, and so does its fork.
	fresh := create()
	mustExec(t, s, fresh.ID, "true")
	for _, id := range []string{paused.ID, restored.ID, running.ID, kids[0].ID, fresh.ID} {
		if err := c.KillSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
		s.assertGone(t, id)
	}
}
