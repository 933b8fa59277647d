package imagestore

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack"
)

// A manifest from a bucket is input: one naming files outside the image
// (which a download would write there) is refused.
func TestParseManifestRefusesPathsOutside(t *testing.T) {
	for _, name := range []string{"../escape", "/etc/passwd", "a/../../b", `a\..\b`, ""} {
		b := []byte(`{"version":1,"files":{"` + jsonEscape(name) + `":{"size":1,"crc32c":1}}}`)
		if _, err := ParseManifest(b, "x"); !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
			t.Errorf("manifest naming %q: err = %v, want %s", name, err, pandastack.ESnapshotCorrupt)
		}
	}
	for _, bad := range []string{``, `{}`, `{"version":2,"files":{"a":{}}}`, `{"version":1,"files":{}}`, `not json`} {
		if _, err := ParseManifest([]byte(bad), "x"); !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
			t.Errorf("manifest %q: err = %v, want %s", bad, err, pandastack.ESnapshotCorrupt)
		}
	}
	man, err := ParseManifest([]byte(`{"version":1,"template":"base","files":{"a":{"size":3,"crc32c":7},"sub/b":{"size":4,"crc32c":8}}}`), "x")
	if err != nil || man.Template != "base" || man.Size() != 7 {
		t.Errorf("good manifest: %+v, %v", man, err)
	}
}

func jsonEscape(s string) string {
	out := ""
	for _, r := range s {
		if r == '\\' || r == '"' {
			out += `\`
		}
		out += string(r)
	}
	return out
}

func TestValidID(t *testing.T) {
	for _, id := range []string{"snap_abc", "x"} {
		if err := ValidID(id); err != nil {
			t.Errorf("ValidID(%q) = %v", id, err)
		}
	}
	for _, id := range []string{"", ".tmp-x", "a/b", `a\b`, "..", "a\x00b", string(make([]byte, 129))} {
		if err := ValidID(id); !pandastack.IsCode(err, pandastack.EInvalid) {
			t.Errorf("ValidID(%q) = %v, want %s", id, err, pandastack.EInvalid)
		}
	}
}

// LinkTree gives dst the same files as src, sharing their bytes (hard
// links, on one filesystem); removing src leaves dst whole; a dst that
// exists is refused rather than mixed.
func TestLinkTree(t *testing.T) {
	src, dst := filepath.Join(t.TempDir(), "src"), filepath.Join(t.TempDir(), "dst")
	if err := os.MkdirAll(filepath.Join(src, "image"), 0o700); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"manifest.json": "{}", "image/pages.img": "pages", "image/checkpoint.img": "state"}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := LinkTree(src, dst); err != nil {
		t.Fatal(err)
	}
	a, _ := os.Stat(filepath.Join(src, "image/pages.img"))
	b, _ := os.Stat(filepath.Join(dst, "image/pages.img"))
	if !os.SameFile(a, b) {
		t.Error("pages.img was copied, not linked, within one filesystem")
	}
	if err := os.RemoveAll(src); err != nil {
		t.Fatal(err)
	}
	for name, body := range files {
		if got, err := os.ReadFile(filepath.Join(dst, name)); err != nil || string(got) != body {
			t.Errorf("%s after src went: %q %v, want %q", name, got, err, body)
		}
	}
	if err := LinkTree(dst, dst+"2"); err != nil {
		t.Fatal(err)
	}
	if err := LinkTree(dst, dst+"2"); err == nil {
		t.Error("a second LinkTree into the same dst did not fail")
	}
}

// A Seal that fails leaves nothing at final, also when only the sync of
// final's directory failed after the rename (the caller removes tmp, and a
// whole image at final refused every later seal there).
func TestSealFailingAfterTheRenameLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	tmp, final := filepath.Join(dir, ".tmp-x"), filepath.Join(dir, "x")
	if err := os.MkdirAll(filepath.Join(tmp, FilesDir), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tmp, FilesDir, "pages.img"), []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	defer func(f func(string) error) { syncDir = f }(syncDir)
	sync := syncDir
	syncDir = func(d string) error {
		if d == dir {
			return os.ErrDeadlineExceeded // final's directory, after the rename
		}
		return sync(d)
	}
	if _, err := Seal(tmp, final, Manifest{Template: "base"}); err == nil {
		t.Fatal("Seal succeeded with its directory's sync failing")
	}
	for _, p := range []string{tmp, final} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after the failed seal: %v, want it gone", filepath.Base(p), err)
		}
	}
}

// An image the server cannot read for want of file descriptors is not
// called corrupt (the user would be told to delete a whole snapshot): it
// answers unavailable, to retry; once descriptors are back it verifies.
func TestVerifyOutOfDescriptorsIsNotCorrupt(t *testing.T) {
	final := sealedImage(t)
	var err error
	withNoDescriptors(t, func() { _, err = Verify(final, "snapshot x") })
	if pandastack.IsCode(err, pandastack.ESnapshotCorrupt) || !pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Fatalf("Verify with no descriptor free: %v, want unavailable, not corrupt", err)
	}
	if _, err := Verify(final, "snapshot x"); err != nil {
		t.Fatalf("Verify once descriptors are back: %v", err)
	}
}

// withNoDescriptors runs f with no file descriptor free to the process.
func withNoDescriptors(t *testing.T, f func()) {
	t.Helper()
	var was syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &was); err != nil {
		t.Fatal(err)
	}
	free, err := syscall.Dup(0) // the lowest descriptor free
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(free)
	short := was
	short.Cur = uint64(free) // none free below the limit
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &short); err != nil {
		t.Fatal(err)
	}
	f()
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &was); err != nil {
		t.Fatal(err)
	}
}
