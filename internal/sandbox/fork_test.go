package sandbox

import (
	"context"
	"os"
	"slices"
	"testing"
	"time"
)

// A fork that works leaves its image for the background to delete: gone
// once the manager closes, and the children keep what it held.
func TestForkImageRemoved(t *testing.T) {
	h := newHarness(t)
	parent := h.create()
	h.exec(parent.ID, "set v=parent")
	kids, err := h.m.Fork(context.Background(), project, parent.ID, 3, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		if out, err := h.exec(k.ID, "get v"); err != nil || out != "parent" {
			t.Fatalf("child %s: %q %v", k.ID, out, err)
		}
	}
	h.m.Close()
	if ents, _ := os.ReadDir(h.m.cfg.SnapshotDir); len(ents) != 0 {
		t.Fatalf("fork left %v in the snapshot dir", ents)
	}
}

// dirSize adds up the files of a flat image directory, and says -1 when
// the directory cannot be read (the fork line then leaves image_mb out).
func TestDirSize(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(dir+"/pages.bin", make([]byte, 3000), 0o600)
	os.WriteFile(dir+"/checkpoint.img", make([]byte, 500), 0o600)
	os.Mkdir(dir+"/sub", 0o700)
	if got := dirSize(dir); got != 3500 {
		t.Fatalf("dirSize = %d, want 3500", got)
	}
	if got := dirSize(dir + "/missing"); got != -1 {
		t.Fatalf("dirSize of a missing dir = %d, want -1", got)
	}
}

// A fork holds the parent's spare kernels across its checkpoint (the agent
// gives up a start in flight, waiting up to 5 s for that) and ends its
// hold once its children run.
func TestForkHoldsTheParentsSpares(t *testing.T) {
	h := newHarness(t)
	parent := h.create()
	h.rt.takeSuspendLog()
	for _, count := range []int{3, 1} {
		if _, err := h.m.Fork(context.Background(), project, parent.ID, count, nil, nil); err != nil {
			t.Fatal(err)
		}
		want := []string{"hold " + parent.ID + " wait_ms=5000", "checkpoint " + parent.ID, "unhold " + parent.ID}
		var got []string
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			// The unhold is sent in the background after the answer.
			if got = append(got, h.rt.takeSuspendLog()...); len(got) >= len(want) {
				break
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("fork of %d: the parent's agent saw %q, want %q", count, got, want)
		}
	}
}
