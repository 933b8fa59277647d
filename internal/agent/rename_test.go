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
		{"dir onto dir", link(syscall.EEXIST), sub, sub, pandastack.EConflict, "only an empty one"},
		{"not empty", link(syscall.ENOTEMPTY), sub, full, pandastack.EConflict, "not empty"},
		{"file onto dir", link(syscall.EISDIR), file, sub, pandastack.EConflict, "is a directory"},
		{"dir onto file", link(syscall.ENOTDIR), sub, file, pandastack.EConflict, "is not a directory"},
		{"parent a file", link(syscall.ENOTDIR), sub, filepath.Join(file, "x"), pandastack.EConflict, "a parent"},
		{"permission", link(syscall.EACCES), file, "/x", pandastack.EPermission, "permission denied"},
	} {
		err := renameError(c.err, c.from, c.to)
		if !pandastack.IsCode(err, c.code) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want code %s with %q", c.name, err, c.code, c.want)
		}
	}
	if renameError(nil, file, sub) != nil {
		t.Error("no failure made an error")
	}
}
