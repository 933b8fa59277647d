package sandbox

import (
	"context"
	"os"
	"testing"
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
