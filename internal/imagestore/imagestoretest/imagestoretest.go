// Package imagestoretest is the suite every pandastack.ImageStore passes:
// the local directory and S3-compatible object storage run the same tests.
// Only _test.go files import it.
package imagestoretest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/imagestore"
)

// Harness gives the suite stores on one backing (a directory, a bucket).
type Harness struct {
	// New returns a store on the backing as another server would open it:
	// with its own local cache, if it has one. Each test gets a fresh backing
	// from the first call to New in it.
	New func(t *testing.T) pandastack.ImageStore
	// Corrupt replaces the bytes of one file of image id in the backing
	// (not in any server's cache); data nil removes the file.
	Corrupt func(t *testing.T, id, name string, data []byte)
	// BigFile is a size that takes the store's large-file path (multipart).
	BigFile int
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"PutOpenRoundTrip", testRoundTrip},
		{"AnotherServerOpens", testAnotherServer},
		{"BigFile", testBigFile},
		{"Unknown", testUnknown},
		{"Duplicate", testDuplicate},
		{"BadInput", testBadInput},
		{"Delete", testDelete},
		{"Altered", testAltered},
		{"Truncated", testTruncated},
		{"Missing", testMissing},
		{"ConcurrentOpens", testConcurrentOpens},
		{"CancelledPut", testCancelledPut},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, h) })
	}
}

// sealed makes a sealed image directory holding files and returns it.
func sealed(t *testing.T, files map[string][]byte) string {
	t.Helper()
	root := t.TempDir()
	tmp := filepath.Join(root, ".tmp-img")
	for name, data := range files {
		p := filepath.Join(tmp, imagestore.FilesDir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	final := filepath.Join(root, "img")
	if _, err := imagestore.Seal(tmp, final, imagestore.Manifest{SandboxID: "sbx_1", Template: "base", RootFS: "/rootfs", CPU: 1, MemoryMB: 512, CreatedAt: time.Unix(1700000000, 0).UTC()}); err != nil {
		t.Fatal(err)
	}
	return final
}

func sample() map[string][]byte {
	return map[string][]byte{
		"checkpoint.img": bytes.Repeat([]byte("state"), 1000),
		"pages.img":      randomBytes(100 << 10),
		"sub/empty":      {},
	}
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

var idn = 0
var idMu sync.Mutex

func newID() string {
	idMu.Lock()
	defer idMu.Unlock()
	idn++
	return fmt.Sprintf("snap_t%d_%s", idn, pandastack.NewID("x"))
}

func put(t *testing.T, s pandastack.ImageStore, files map[string][]byte) string {
	t.Helper()
	id := newID()
	dir := sealed(t, files)
	size, err := s.Put(t.Context(), id, dir)
	if err != nil {
		t.Fatalf("Put %s: %v", id, err)
	}
	var want int64
	for _, b := range files {
		want += int64(len(b))
	}
	if size != want {
		t.Errorf("Put returned size %d, want %d", size, want)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Put left its input directory %s (stat: %v)", dir, err)
	}
	return id
}

// checkOpen opens id and compares its files with want.
func checkOpen(t *testing.T, s pandastack.ImageStore, id string, want map[string][]byte) {
	t.Helper()
	img, err := s.Open(t.Context(), id)
	if err != nil {
		t.Fatalf("Open %s: %v", id, err)
	}
	defer img.Close()
	man, err := imagestore.Verify(img.Dir(), id)
	if err != nil {
		t.Fatalf("the opened directory does not verify: %v", err)
	}
	if man.SandboxID != "sbx_1" || man.Template != "base" || man.RootFS != "/rootfs" || man.MemoryMB != 512 {
		t.Errorf("manifest facts not kept: %+v", man)
	}
	if len(man.Files) != len(want) {
		t.Errorf("image has %d files, want %d", len(man.Files), len(want))
	}
	for name, data := range want {
		got, err := os.ReadFile(filepath.Join(img.Dir(), imagestore.FilesDir, filepath.FromSlash(name)))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("file %s: %d bytes (err %v), want the %d bytes put", name, len(got), err, len(data))
		}
	}
}

func wantCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	if !pandastack.IsCode(err, code) {
		t.Errorf("%s: err = %v, want %s", what, err, code)
	}
}

func testRoundTrip(t *testing.T, h Harness) {
	s := h.New(t)
	files := sample()
	id := put(t, s, files)
	checkOpen(t, s, id, files)
	checkOpen(t, s, id, files) // again: from the cache, if any
}

// A second server on the same backing with a fresh cache opens what the
// first put.
func testAnotherServer(t *testing.T, h Harness) {
	a := h.New(t)
	b := h.New(t)
	files := sample()
	id := put(t, a, files)
	checkOpen(t, b, id, files)
	if err := b.Delete(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	_, err := a.Open(t.Context(), id)
	if err == nil {
		// a may still hold a cached copy of an image deleted elsewhere;
		// that is allowed only while it verifies (it does: same bytes).
		t.Log("the first server still opens its cached copy after a delete elsewhere")
	} else {
		wantCode(t, "Open on A after Delete on B", err, pandastack.ENotFound)
	}
}

func testBigFile(t *testing.T, h Harness) {
	s := h.New(t)
	files := map[string][]byte{"pages.img": randomBytes(h.BigFile), "small": []byte("x")}
	id := put(t, s, files)
	checkOpen(t, h.New(t), id, files)
}

func testUnknown(t *testing.T, h Harness) {
	s := h.New(t)
	_, err := s.Open(t.Context(), "snap_nothere")
	wantCode(t, "Open of an unknown id", err, pandastack.ENotFound)
	if err := s.Delete(t.Context(), "snap_nothere"); err != nil {
		t.Errorf("Delete of an unknown id: %v", err)
	}
	for _, bad := range []string{"", "../x", "a/b", ".hidden"} {
		_, err := s.Open(t.Context(), bad)
		wantCode(t, fmt.Sprintf("Open(%q)", bad), err, pandastack.ENotFound)
	}
}

func testDuplicate(t *testing.T, h Harness) {
	s := h.New(t)
	files := sample()
	id := put(t, s, files)
	dir := sealed(t, map[string][]byte{"other": []byte("other")})
	_, err := s.Put(t.Context(), id, dir)
	wantCode(t, "Put of an existing id", err, pandastack.EConflict)
	if _, serr := os.Stat(dir); !errors.Is(serr, fs.ErrNotExist) {
		t.Errorf("a refused Put left its input directory")
	}
	checkOpen(t, h.New(t), id, files)
}

func testBadInput(t *testing.T, h Harness) {
	s := h.New(t)
	dir := sealed(t, sample())
	_, err := s.Put(t.Context(), "../escape", dir)
	wantCode(t, "Put with a path as id", err, pandastack.EInvalid)
	if _, serr := os.Stat(dir); !errors.Is(serr, fs.ErrNotExist) {
		t.Errorf("a refused Put left its input directory")
	}
	// An image altered after sealing is refused by Put (ESnapshotCorrupt),
	// or stored and then refused by every Open: it never restores.
	dir = sealed(t, sample())
	os.WriteFile(filepath.Join(dir, imagestore.FilesDir, "checkpoint.img"), []byte("changed"), 0o600)
	id := newID()
	_, err = s.Put(t.Context(), id, dir)
	_, oerr := h.New(t).Open(t.Context(), id)
	if err != nil {
		wantCode(t, "Put of an image that fails its manifest", err, pandastack.ESnapshotCorrupt)
		wantCode(t, "Open of a refused image", oerr, pandastack.ENotFound)
	} else {
		wantCode(t, "Open of an image stored damaged", oerr, pandastack.ESnapshotCorrupt)
	}
	// A directory without a manifest is no image.
	dir = t.TempDir()
	os.MkdirAll(filepath.Join(dir, imagestore.FilesDir), 0o700)
	_, err = s.Put(t.Context(), newID(), dir)
	wantCode(t, "Put of a directory without a manifest", err, pandastack.ESnapshotCorrupt)
	if _, serr := os.Stat(dir); !errors.Is(serr, fs.ErrNotExist) {
		t.Errorf("a refused Put left its input directory")
	}
}

func testDelete(t *testing.T, h Harness) {
	s := h.New(t)
	id := put(t, s, sample())
	files := sample()
	other := put(t, s, files)
	if err := s.Delete(t.Context(), id); err != nil {
		t.Fatal(err)
	}
	for i, st := range []pandastack.ImageStore{s, h.New(t)} {
		_, err := st.Open(t.Context(), id)
		wantCode(t, fmt.Sprintf("Open after Delete (server %d)", i), err, pandastack.ENotFound)
	}
	checkOpen(t, h.New(t), other, files)
	if err := s.Delete(t.Context(), id); err != nil {
		t.Errorf("second Delete: %v", err)
	}
}

// corrupted puts an image, changes one file in the backing, and checks
// that a server without a copy refuses it with ESnapshotCorrupt, and
// keeps refusing (nothing bad is cached).
func corrupted(t *testing.T, h Harness, data []byte, wantIn string) {
	s := h.New(t)
	id := put(t, s, sample())
	h.Corrupt(t, id, "pages.img", data)
	b := h.New(t)
	for i := range 2 {
		_, err := b.Open(t.Context(), id)
		wantCode(t, fmt.Sprintf("Open #%d of a damaged image", i+1), err, pandastack.ESnapshotCorrupt)
		if err != nil && !bytes.Contains([]byte(err.Error()), []byte(wantIn)) {
			t.Errorf("error %q does not say %q", err, wantIn)
		}
	}
}

func testAltered(t *testing.T, h Harness) {
	b := randomBytes(100 << 10)
	corrupted(t, h, b, "checksum")
}

func testTruncated(t *testing.T, h Harness) {
	corrupted(t, h, randomBytes(10), "truncated")
}

func testMissing(t *testing.T, h Harness) {
	corrupted(t, h, nil, "missing")
}

func testConcurrentOpens(t *testing.T, h Harness) {
	a := h.New(t)
	files := sample()
	id := put(t, a, files)
	b := h.New(t)
	var wg sync.WaitGroup
	errs := make([]error, 6)
	imgs := make([]pandastack.OpenImage, 6)
	for i := range errs {
		wg.Go(func() { imgs[i], errs[i] = b.Open(t.Context(), id) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("concurrent Open %d: %v", i, err)
		}
		got, _ := os.ReadFile(filepath.Join(imgs[i].Dir(), imagestore.FilesDir, "pages.img"))
		if !bytes.Equal(got, files["pages.img"]) {
			t.Errorf("concurrent Open %d: wrong bytes", i)
		}
	}
	for _, img := range imgs {
		img.Close()
	}
}

// A Put whose context is already cancelled either fails and stores
// nothing, or (a store with nothing to abort, such as a rename) succeeds
// whole; its input is gone either way.
func testCancelledPut(t *testing.T, h Harness) {
	s := h.New(t)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	id := newID()
	dir := sealed(t, sample())
	_, err := s.Put(ctx, id, dir)
	if _, serr := os.Stat(dir); !errors.Is(serr, fs.ErrNotExist) {
		t.Errorf("Put left its input directory")
	}
	_, oerr := h.New(t).Open(t.Context(), id)
	switch {
	case err == nil && oerr != nil:
		t.Errorf("Put succeeded but Open says %v", oerr)
	case err != nil && !pandastack.IsCode(oerr, pandastack.ENotFound):
		t.Errorf("Put failed (%v) but Open says %v, want %s", err, oerr, pandastack.ENotFound)
	}
}
