package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A spec written into the templates directory, or one changed there,
// changes its stamp; a directory that does not exist has none.
func TestDirStamp(t *testing.T) {
	dir := t.TempDir()
	if !dirStamp(filepath.Join(dir, "missing")).IsZero() {
		t.Error("a missing directory has a stamp")
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(dir, old, old)
	before := dirStamp(dir)
	spec := filepath.Join(dir, "late.yaml")
	os.WriteFile(spec, []byte("description: late\n"), 0o644)
	os.Chtimes(dir, old, old) // as if written in place
	after := dirStamp(dir)
	if !after.After(before) {
		t.Errorf("a new spec left the stamp at %v", after)
	}
	later := time.Now().Add(time.Hour)
	os.Chtimes(spec, later, later)
	if !dirStamp(dir).After(after) {
		t.Errorf("an edited spec left the stamp at %v", dirStamp(dir))
	}
}
