package agent

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack"
)

// What a failed rename says, for the failures a test cannot make happen
// in a temp directory (another filesystem) and for each refusal.
func TestRenameError(t *testing.T) {
	dir := t.TempDir()
	file, sub, full := filepath.Join(dir, "f"), filepath.Join(dir, "d"), filepath.Join(dir, "full")
	os.WriteFile(file, nil, 0o644)
	os.Mkdir(sub, 0o755)
	os.MkdirAll(filepath.Join(full, "x"), 0o755)
	link := func(errno syscall.Errno) error { return &os.LinkError{Op: "rename", Old: "a", New: "b", Err: errno} }
	for _, c := range []struct {
		name     string
		err      error
		from, to string
		code     string
		want     string
	}{
		{"other filesystem", link(syscall.EXDEV), file, "/mnt/x", pandastack.EInvalid, "different filesystems"},
		{"file there", link(syscall.EEXIST), file, file, pandastack.EConflict, "overwrite=true"},
		{"file onto a dir, no overwrite", link(syscall.EEXIST), file, sub, pandastack.EConflict, "a file cannot replace it"},
		{"dir onto dir", link(syscall.EEXIST), sub, sub, pandastack.EConflict, "only an empty one"},
		{"not empty", link(syscall.ENOTEMPTY), sub, full, pandastack.EConflict, "not empty"},
		{"file onto dir", link(syscall.EISDIR), file, sub, pandastack.EConflict, "is a directory"},
		{"dir onto file", link(syscall.ENOTDIR), sub, file, pandastack.EConflict, "is not a directory"},
		{"parent a file", link(syscall.ENOTDIR), sub, filepath.Join(file, "x"), pandastack.EConflict, "a parent"},
		{"permission", link(syscall.EACCES), file, "/x", pandastack.EPermission, "permission denied"},
	} {
		err := renameError(c.err, c.from, c.to, c.from, c.to)
		if !pandastack.IsCode(err, c.code) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want code %s with %q", c.name, err, c.code, c.want)
		}
	}
	if renameError(nil, file, sub, file, sub) != nil {
		t.Error("no failure made an error")
	}
}

// A directory swapped for a symlink between the delete's look and its
// walk is not followed: what the link points to stays.
func TestRemoveTreeRefusesASwap(t *testing.T) {
	base := t.TempDir()
	dir, other := filepath.Join(base, "build"), filepath.Join(base, "etc")
	os.Mkdir(dir, 0o755)
	os.Mkdir(other, 0o755)
	os.WriteFile(filepath.Join(other, "passwd"), []byte("x"), 0o644)
	fi, err := os.Lstat(dir)
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(dir)
	if err := os.Symlink(other, dir); err != nil {
		t.Fatal(err)
	}
	if err := removeTree(t.Context(), dir, dir, fi); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("delete of a directory swapped for a link: %v, want conflict", err)
	}
	if _, err := os.Stat(filepath.Join(other, "passwd")); err != nil {
		t.Fatalf("the link's target lost its file: %v", err)
	}
}
