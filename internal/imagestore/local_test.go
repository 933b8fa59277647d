package imagestore_test

import (
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/imagestore"
	"github.com/pandastack/pandastack/internal/imagestore/imagestoretest"
)

// Two Locals on one directory are two servers sharing it (e.g. over NFS).
func TestLocal(t *testing.T) {
	var mu sync.Mutex
	roots := map[*testing.T]string{}
	root := func(t *testing.T) string {
		mu.Lock()
		defer mu.Unlock()
		if roots[t] == "" {
			roots[t] = t.TempDir()
		}
		return roots[t]
	}
	imagestoretest.Run(t, imagestoretest.Harness{
		New: func(t *testing.T) pandastack.ImageStore {
			return imagestore.NewLocal(root(t))
		},
		Corrupt: func(t *testing.T, id, name string, data []byte) {
			p := filepath.Join(root(t), id, imagestore.FilesDir, name)
			if data == nil {
				os.Remove(p)
				return
			}
			if err := os.WriteFile(p, data, 0o600); err != nil {
				t.Fatal(err)
			}
		},
		BigFile: 12 << 20,
	})
}

// A copy a dead server left in a shared store goes once nothing in it was
// written for the age given; a fresh one (another server's, under way)
// and the images stay.
func TestSweepCopies(t *testing.T) {
	root := t.TempDir()
	old := filepath.Join(root, ".tmp-copy-snap_a-c_1")
	fresh := filepath.Join(root, ".tmp-copy-snap_b-c_2")
	image := filepath.Join(root, "snap_c")
	for _, d := range []string{old, fresh, image} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(d, "pages.img"), []byte("x"), 0o600)
	}
	past := time.Now().Add(-2 * time.Hour)
	os.Chtimes(filepath.Join(old, "pages.img"), past, past)
	os.Chtimes(old, past, past)
	if n := imagestore.SweepCopies(root, time.Hour); n != 1 {
		t.Errorf("removed %d, want 1", n)
	}
	for d, want := range map[string]bool{old: false, fresh: true, image: true} {
		if _, err := os.Stat(d); (err == nil) != want {
			t.Errorf("%s exists: %v, want %v", filepath.Base(d), err == nil, want)
		}
	}
}

// Sweep drops the cached images keep refuses, but not one open or used
// within the age given.
func TestCacheSweep(t *testing.T) {
	root := t.TempDir()
	c, err := imagestore.NewCache(root, 0)
	if err != nil {
		t.Fatal(err)
	}
	admit := func(id string) {
		tmp := filepath.Join(t.TempDir(), "tmp")
		os.MkdirAll(filepath.Join(tmp, imagestore.FilesDir), 0o700)
		os.WriteFile(filepath.Join(tmp, imagestore.FilesDir, "f"), []byte(id), 0o600)
		img := filepath.Join(t.TempDir(), "img")
		if _, err := imagestore.Seal(tmp, img, imagestore.Manifest{Template: "base"}); err != nil {
			t.Fatal(err)
		}
		o, err := c.Admit(id, img)
		if err != nil {
			t.Fatal(err)
		}
		o.Close()
	}
	for _, id := range []string{"snap_deleted", "snap_kept", "snap_open", "snap_fresh"} {
		admit(id)
	}
	past := time.Now().Add(-time.Hour)
	for _, id := range []string{"snap_deleted", "snap_kept", "snap_open"} {
		os.Chtimes(filepath.Join(root, id), past, past)
	}
	open, ok, _ := c.Open("snap_open", "snapshot snap_open")
	if !ok {
		t.Fatal("snap_open is not cached")
	}
	defer open.Close()
	os.Chtimes(filepath.Join(root, "snap_open"), past, past)
	gone := c.Sweep(func(id string) bool { return id == "snap_kept" }, 10*time.Minute)
	if len(gone) != 1 || gone[0] != "snap_deleted" {
		t.Errorf("swept %v, want [snap_deleted]", gone)
	}
	for id, want := range map[string]bool{"snap_deleted": false, "snap_kept": true, "snap_open": true, "snap_fresh": true} {
		if _, err := os.Stat(filepath.Join(root, id)); (err == nil) != want {
			t.Errorf("%s cached: %v, want %v", id, err == nil, want)
		}
	}
}
