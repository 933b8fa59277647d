package mountinfo

import (
	"os"
	"runtime"
	"slices"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack/internal/testutil"
)

func TestUnescape(t *testing.T) {
	if got := Unescape(`/a\040b\134c\011`); got != "/a b\\c\t" {
		t.Errorf("got %q", got)
	}
	if got := Unescape(`/plain\04`); got != `/plain\04` {
		t.Errorf("a cut escape: got %q, want it kept", got)
	}
}

func TestUnder(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("mountinfo is Linux's")
	}
	testutil.RequireRoot(t)
	dir := t.TempDir()
	sub := dir + "/with space"
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := Under(dir); err != nil || len(got) != 0 {
		t.Fatalf("Under(%s) before any mount = %v, %v", dir, got, err)
	}
	if err := syscall.Mount("tmpfs", sub, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer syscall.Unmount(sub, syscall.MNT_DETACH)
	got, err := Under(dir)
	if err != nil || !slices.Equal(got, []string{sub}) {
		t.Errorf("Under(%s) = %v, %v; want [%s]", dir, got, err, sub)
	}
}
