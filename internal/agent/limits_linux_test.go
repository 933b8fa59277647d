//go:build linux

package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestUserCanEnter(t *testing.T) {
	if !runningAsRoot() {
		t.Skip("needs root to make directories of other owners")
	}
	// Not t.TempDir: its parent is closed to other users.
	root, err := os.MkdirTemp("", "enter-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	os.Chmod(root, 0o755)
	open := filepath.Join(root, "open")
	closed := filepath.Join(root, "closed")
	below := filepath.Join(closed, "below")
	mine := filepath.Join(root, "mine")
	for _, d := range []string{open, closed, below, mine} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(closed, 0o700)
	os.Chown(mine, 1000, 1000)
	os.Chmod(mine, 0o700)
	link := filepath.Join(root, "link")
	os.Symlink(below, link)
	for dir, ok := range map[string]bool{open: true, mine: true, closed: false, below: false, link: false} {
		err := userCanEnter(dir, 1000, 1000)
		if (err == nil) != ok {
			t.Errorf("userCanEnter(%s) = %v, want allowed %v", dir, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), closed) {
			t.Errorf("userCanEnter(%s) = %v; the error should name %s", dir, err, closed)
		}
	}
}

func TestMemLimits(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		total, perKernel, pressure int64
		ok                         bool
	}{
		{1024 * mib, 768 * mib, 896 * mib, true},
		{512 * mib, 320 * mib, 416 * mib, true},
		{4096 * mib, 3072 * mib, 3584 * mib, true},
		{300 * mib, 0, 0, false},
	} {
		k, p, ok := memLimits(c.total)
		if k != c.perKernel || p != c.pressure || ok != c.ok {
			t.Errorf("memLimits(%d MiB) = %d, %d, %v; want %d, %d, %v", c.total/mib, k, p, ok, c.perKernel, c.pressure, c.ok)
		}
	}
}

// TestMemoryWatchKillsAKernelOverItsLimit: a kernel past its limit is
// killed, and its exit reason says out_of_memory.
func TestMemoryWatchKillsAKernelOverItsLimit(t *testing.T) {
	p, err := (*Reaper)(nil).Start("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{Sys: procAttr(true)})
	if err != nil {
		t.Fatal(err)
	}
	k := newKernelProc(p)
	defer k.Kill()
	cs := NewContexts()
	cs.procs[k] = true
	// Its limit far above it: untouched.
	cs.checkMemory(1<<40, 1<<39, 1<<40, discardLogger())
	select {
	case <-k.Done():
		t.Fatalf("a kernel within its limit was killed: %s", k.ExitReason())
	case <-time.After(200 * time.Millisecond):
	}
	cs.checkMemory(1<<40, 1, 1<<40, discardLogger())
	select {
	case <-k.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a kernel over its limit was not killed")
	}
	if r := k.ExitReason(); !strings.HasPrefix(r, "out_of_memory: ") {
		t.Fatalf("exit reason %q, want out_of_memory", r)
	}
}
