//go:build linux

package agent

import (
	"os"
	"path/filepath"
	"runtime"
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
	var pf procFiles
	defer pf.close()
	// Its limit far above it: untouched.
	cs.checkMemory(&pf, 1<<40, 1<<39, 1<<40, discardLogger())
	select {
	case <-k.Done():
		t.Fatalf("a kernel within its limit was killed: %s", k.ExitReason())
	case <-time.After(200 * time.Millisecond):
	}
	cs.checkMemory(&pf, 1<<40, 1, 1<<40, discardLogger())
	select {
	case <-k.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a kernel over its limit was not killed")
	}
	if r := k.ExitReason(); !strings.HasPrefix(r, "out_of_memory: ") {
		t.Fatalf("exit reason %q, want out_of_memory", r)
	}
}

// TestProcFiles: the watch's kept-open /proc files give fresh values on
// every read, are closed once their kernel is gone from the watch, and a
// kernel that exited reads as an error, not as another process.
func TestProcFiles(t *testing.T) {
	var pf procFiles
	defer pf.close()
	var self *os.File
	defer func() {
		if self != nil {
			self.Close()
		}
	}()
	resident := func() int64 {
		b, err := pf.read("/proc/self/statm", &self)
		if err != nil {
			t.Fatal(err)
		}
		n, err := parseStatm(os.Getpid(), b)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := resident()
	grow := make([]byte, 64<<20)
	for i := range grow {
		grow[i] = 1
	}
	if after := resident(); after < before+32<<20 {
		t.Fatalf("resident memory read through the same file: %d then %d after touching 64 MiB", before, after)
	}
	runtime.KeepAlive(grow)
	if total, avail, err := pf.readMeminfo(); err != nil || total <= 0 || avail <= 0 || avail > total {
		t.Fatalf("meminfo: %d %d %v", total, avail, err)
	}

	p, err := (*Reaper)(nil).Start("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{Sys: procAttr(true)})
	if err != nil {
		t.Fatal(err)
	}
	k := newKernelProc(p)
	defer k.Kill()
	if n, err := pf.rss(k); err != nil || n <= 0 {
		t.Fatalf("rss of a live kernel: %d %v", n, err)
	}
	if len(pf.statm) != 1 {
		t.Fatalf("%d statm files open, want 1", len(pf.statm))
	}
	pf.keep([]*kernelProc{k})
	if len(pf.statm) != 1 {
		t.Fatal("keep closed the file of a live kernel")
	}
	k.Kill()
	<-k.Done()
	if n, err := pf.rss(k); err == nil {
		t.Fatalf("rss of an exited kernel: %d, want an error", n)
	}
	pf.rss(k) // reopens nothing: the pid is gone
	pf.keep(nil)
	if len(pf.statm) != 0 {
		t.Fatalf("%d statm files open after keep(nil)", len(pf.statm))
	}
}
