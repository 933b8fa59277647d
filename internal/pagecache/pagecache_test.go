package pagecache

import (
	"os"
	"path/filepath"
	"testing"
)

// cachedAfterDrop drops the file at path from the page cache and returns
// how many of its bytes are still there, and its size.
func cachedAfterDrop(t *testing.T, path string) (int64, int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := Drop(f); err != nil {
		t.Fatal(err)
	}
	n, size, err := Resident(f)
	if err != nil {
		t.Fatal(err)
	}
	return n, size
}

// A held file stays cached through a drop; once released, it goes as any
// other file does on this file system (a tmpfs keeps every page, so what
// an unheld file keeps is the reference).
func TestHoldKeepsFileThroughDrop(t *testing.T) {
	dir := t.TempDir()
	held, free := filepath.Join(dir, "held"), filepath.Join(dir, "free")
	data := make([]byte, 5*os.Getpagesize()+123)
	for _, p := range []string{held, free} {
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		f, _ := os.Open(p)
		f.Sync()
		f.Close()
	}
	h, err := Hold(held)
	if err != nil {
		t.Fatal(err)
	}
	if h.Bytes() != int64(len(data)) {
		t.Errorf("Bytes = %d, want %d", h.Bytes(), len(data))
	}
	if n, size := cachedAfterDrop(t, held); n != size || size != int64(len(data)) {
		t.Errorf("held file: %d of %d bytes cached after a drop, want all of %d", n, size, len(data))
	}
	ref, _ := cachedAfterDrop(t, free)
	h.Release()
	h.Release() // twice is fine
	if h.Bytes() != 0 {
		t.Errorf("Bytes after Release = %d", h.Bytes())
	}
	if n, _ := cachedAfterDrop(t, held); n != ref {
		t.Errorf("released file: %d bytes cached after a drop, an unheld one %d", n, ref)
	}
}

func TestHoldEdges(t *testing.T) {
	dir := t.TempDir()
	if _, err := Hold(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Errorf("Hold of a missing file: %v, want not exist", err)
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	h, err := Hold(empty)
	if err != nil || h.Bytes() != 0 {
		t.Errorf("Hold of an empty file: %v, %d bytes", err, h.Bytes())
	}
	h.Release()
	var nilHeld *Held
	nilHeld.Release()
	if nilHeld.Bytes() != 0 {
		t.Error("nil Held has bytes")
	}
	f, _ := os.Open(empty)
	defer f.Close()
	if n, size, err := Resident(f); n != 0 || size != 0 || err != nil {
		t.Errorf("Resident of an empty file: %d, %d, %v", n, size, err)
	}
}
