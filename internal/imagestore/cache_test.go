package imagestore

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// A restore that opens a cached copy while the sweep takes it away either
// holds it first, and it stays, or finds none and fetches it again: a copy
// on its way out is not handed out, and one handed out stays whole.
func TestCacheOpenDuringADrop(t *testing.T) {
	c, root := cacheOf(t, "snap_a")
	past := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(root, "snap_a"), past, past)

	var got []string
	beforeRemove = func(id string) {
		if o, ok, _ := c.Open(id, "snapshot "+id); ok {
			defer o.Close()
			if _, err := Verify(o.Dir(), "snapshot "+id); err != nil {
				t.Errorf("a copy handed out while the sweep removed it: %v", err)
			}
			got = append(got, id)
		}
	}
	defer func() { beforeRemove = nil }()
	c.Sweep(func(string) bool { return false }, time.Minute)
	if len(got) != 0 {
		t.Errorf("a copy on its way out was handed out: %v", got)
	}
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Errorf("the cache holds %d entries after the sweep", len(ents))
	}
	// Held first, it stays.
	o, err := c.Admit("snap_b", sealedImage(t))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	os.Chtimes(filepath.Join(root, "snap_b"), past, past)
	if gone := c.Sweep(func(string) bool { return false }, time.Minute); len(gone) != 0 {
		t.Errorf("swept %v, open", gone)
	}
}

// cacheOf is a new cache holding a copy of each of ids, none open.
func cacheOf(t *testing.T, ids ...string) (*Cache, string) {
	t.Helper()
	root := t.TempDir()
	c, err := NewCache(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		o, err := c.Admit(id, sealedImage(t))
		if err != nil {
			t.Fatal(err)
		}
		o.Close()
	}
	return c, root
}

// sealedImage is a sealed image of one file, made afresh.
func sealedImage(t *testing.T) string {
	tmp := filepath.Join(t.TempDir(), "tmp")
	os.MkdirAll(filepath.Join(tmp, FilesDir), 0o700)
	os.WriteFile(filepath.Join(tmp, FilesDir, "f"), []byte("x"), 0o600)
	img := filepath.Join(t.TempDir(), "img")
	if _, err := Seal(tmp, img, Manifest{Template: "base"}); err != nil {
		t.Fatal(err)
	}
	return img
}

// A cached copy that cannot be read for want of file descriptors is kept,
// and Open says why, rather than send its caller to fetch it again (which
// would fail alike, or replace a copy another restore holds).
func TestCacheOpenOutOfDescriptorsKeepsTheCopy(t *testing.T) {
	c, _ := cacheOf(t, "snap_a")
	var ok bool
	var err error
	withNoDescriptors(t, func() { _, ok, err = c.Open("snap_a", "snapshot snap_a") })
	if ok || !pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Fatalf("Open with no descriptor free: ok %v, %v; want unavailable", ok, err)
	}
	o, ok, err := c.Open("snap_a", "snapshot snap_a")
	if !ok || err != nil {
		t.Fatalf("Open once descriptors are back: ok %v, %v; want the copy kept", ok, err)
	}
	o.Close()
}
