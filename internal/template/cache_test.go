package template

import (
	"testing"
	"time"
)

// A build's identity tells a --force rebuild from the build before it
// (same name, hash and directory). A template.json written before build
// ids still reads as built, its identity its build time's.
func TestBuildIdentity(t *testing.T) {
	cache := t.TempDir()
	at := time.Date(2026, 11, 29, 11, 50, 6, 123456789, time.UTC)
	before := fakeBuild(t, cache, "base", "aaaaaaaaaaaaaaaa", at) // no build_id
	read, err := readBuilt(before.Dir)
	if err != nil {
		t.Fatalf("a template.json without a build id: %v", err)
	}
	if read.ID() == "" || read.ID() != before.ID() {
		t.Errorf("identity of an old build: %q, read again %q", before.ID(), read.ID())
	}
	rebuilt := before
	rebuilt.BuiltAt = at.Add(time.Minute)
	if rebuilt.ID() == before.ID() {
		t.Errorf("two old builds of one spec made at other times share the identity %q", before.ID())
	}
	if a, b := newBuildID(), newBuildID(); a == b || len(a) != 16 {
		t.Errorf("build ids %q and %q", a, b)
	}
	withID := Built{BuildID: "0123456789abcdef", BuiltAt: at}
	if withID.ID() != "0123456789abcdef" {
		t.Errorf("a build's identity is %q, not its build id", withID.ID())
	}
}
