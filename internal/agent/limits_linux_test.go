//go:build linux

package agent

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
		total int64
		want  memLimit
		ok    bool
	}{
		{1024 * mib, memLimit{1024 * mib, 768 * mib, 896 * mib, 64 * mib}, true},
		{512 * mib, memLimit{512 * mib, 320 * mib, 416 * mib, 48 * mib}, true},
		{4096 * mib, memLimit{4096 * mib, 3072 * mib, 3584 * mib, 256 * mib}, true},
		{300 * mib, memLimit{}, false},
	} {
		l, ok := memLimits(c.total)
		if l != c.want || ok != c.ok {
			t.Errorf("memLimits(%d MiB) = %+v, %v; want %+v, %v", c.total/mib, l, ok, c.want, c.ok)
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
	cs.checkMemory(&pf, memLimit{total: 1 << 40, perKernel: 1 << 39, pressure: 1 << 40}, discardLogger())
	select {
	case <-k.Done():
		t.Fatalf("a kernel within its limit was killed: %s", k.ExitReason())
	case <-time.After(200 * time.Millisecond):
	}
	cs.checkMemory(&pf, memLimit{total: 1 << 40, perKernel: 1, pressure: 1 << 40}, discardLogger())
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
		_, n, err := parseStatm(os.Getpid(), b)
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
	if len(pf.statmFiles) != 1 {
		t.Fatalf("%d statm files open, want 1", len(pf.statmFiles))
	}
	pf.keep([]*kernelProc{k})
	if len(pf.statmFiles) != 1 {
		t.Fatal("keep closed the file of a live kernel")
	}
	k.Kill()
	<-k.Done()
	if n, err := pf.rss(k); err == nil {
		t.Fatalf("rss of an exited kernel: %d, want an error", n)
	}
	pf.rss(k) // reopens nothing: the pid is gone
	pf.keep(nil)
	if len(pf.statmFiles) != 0 {
		t.Fatalf("%d statm files open after keep(nil)", len(pf.statmFiles))
	}
}

// softAS is pid's soft RLIMIT_AS, and whether that is its hard limit.
// It reads them as the watch does, as the process's owner: even root needs
// CAP_SYS_RESOURCE for another's, and the host may not give it (this one's
// root lacks it).
func softAS(t *testing.T, pid int) (uint64, bool) {
	t.Helper()
	var cur unix.Rlimit
	if err := asOwner(func() error { return unix.Prlimit(pid, unix.RLIMIT_AS, nil, &cur) }); err != nil {
		t.Fatal(err)
	}
	return cur.Cur, cur.Cur == cur.Max
}

// TestMemoryWatchLimitsAddressSpace: a look of the watch at a kernel that
// holds half its limit gives it an address-space limit, so that what it
// allocates past its limit (and margin) fails even if the watch never
// looks again; a look once it holds less lifts the limit. The kernel is a
// python3 running as the sandbox user, as kernels do.
func TestMemoryWatchLimitsAddressSpace(t *testing.T) {
	py := pythonWith(t, "sys")
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdinW.Close()
	defer stdoutR.Close()
	// "grow N" adds N MiB (written, so resident) and says how many MiB it
	// holds, or that it got a MemoryError; "free" lets go of them all.
	const script = `import sys
blocks = []
print('ready', flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == 'free':
        blocks.clear()
        print('freed', flush=True)
        continue
    try:
        for _ in range(int(cmd[1])):
            blocks.append(b'x' * (1 << 20))
        print('held', len(blocks), flush=True)
    except MemoryError:
        print('MemoryError', len(blocks), flush=True)
`
	p, err := (*Reaper)(nil).Start(py, []string{py, "-c", script}, &os.ProcAttr{
		Dir: "/", Files: []*os.File{stdinR, stdoutW, os.Stderr}, Sys: procAttr(false),
	})
	stdinR.Close()
	stdoutW.Close()
	if err != nil {
		t.Fatalf("start %s as the sandbox user: %v (scripts/test-python-env.sh makes a python3 any user can run: export PANDASTACK_TEST_PYTHON)", py, err)
	}
	k := newKernelProc(p)
	defer k.Kill()
	cs := NewContexts()
	cs.procs[k] = true
	k.cs = cs
	lines := bufio.NewScanner(stdoutR)
	say := func(cmd string) string {
		t.Helper()
		if cmd != "" {
			fmt.Fprintln(stdinW, cmd)
		}
		if !lines.Scan() {
			t.Fatalf("%q: no answer (%v)", cmd, lines.Err())
		}
		return lines.Text()
	}
	if got := say(""); got != "ready" {
		t.Fatalf("start: %q", got)
	}
	const mib = 1 << 20
	// The sandbox's room is never the smaller one here.
	l := memLimit{total: 1 << 50, perKernel: 128 * mib, pressure: 1 << 51, margin: 32 * mib}
	var pf procFiles
	defer pf.close()
	look := func() {
		t.Helper()
		cs.checkMemory(&pf, l, discardLogger())
		select {
		case <-k.Done():
			t.Fatalf("the watch killed the kernel: %s", k.ExitReason())
		default:
		}
	}

	look()
	if _, none := softAS(t, k.Pid()); !none || k.asCap != 0 {
		t.Fatalf("a small kernel got an address-space limit (%d)", k.asCap)
	}
	if got := say("grow 80"); got != "held 80" {
		t.Fatalf("grow 80: %q", got)
	}
	look()
	if soft, none := softAS(t, k.Pid()); none || int64(soft) != k.asCap {
		t.Fatalf("a kernel holding over half its limit: soft limit %d, watch says %d", soft, k.asCap)
	}
	got := say("grow 400")
	var held int
	if _, err := fmt.Sscanf(got, "MemoryError %d", &held); err != nil {
		t.Fatalf("grow 400 past the limit with no look in between: %q, want a MemoryError", got)
	}
	// What it held at the start (python itself, some MiB) and the 80 MiB,
	// plus what it got before the error: within the limit and margin.
	if held < 80 || held > int((l.perKernel+l.margin)/mib) {
		t.Fatalf("MemoryError with %d MiB held; the room was up to %d MiB", held, (l.perKernel+l.margin)/mib)
	}
	t.Logf("MemoryError with %d MiB held", held)
	if got := say("free"); got != "freed" {
		t.Fatalf("free: %q", got)
	}
	look()
	if _, none := softAS(t, k.Pid()); !none || k.asCap != 0 {
		t.Fatalf("the limit stayed on a kernel back to a small size (%d)", k.asCap)
	}
	if got := say("grow 300"); got != "held 300" {
		t.Fatalf("grow 300 with the limit lifted: %q", got)
	}
}

// TestKillIfOverMemory: a kernel asked after a MemoryError is killed, with
// the watch's reason, only if it is over a limit; with no watch, never.
func TestKillIfOverMemory(t *testing.T) {
	start := func() *kernelProc {
		p, err := (*Reaper)(nil).Start("/bin/sleep", []string{"sleep", "60"}, &os.ProcAttr{Sys: procAttr(false)})
		if err != nil {
			t.Fatal(err)
		}
		k := newKernelProc(p)
		t.Cleanup(k.Kill)
		return k
	}
	cs := NewContexts()
	k := start()
	k.cs = cs
	cs.procs[k] = true
	if k.KillIfOverMemory() {
		t.Fatal("killed with no memory watch")
	}
	cs.mem.Store(&memWatch{limit: memLimit{total: 1 << 50, perKernel: 1 << 40, pressure: 1 << 51}, log: discardLogger()})
	if k.KillIfOverMemory() {
		t.Fatal("a kernel within its limit was killed")
	}
	cs.mem.Store(&memWatch{limit: memLimit{total: 1 << 50, perKernel: 1, pressure: 1 << 51}, log: discardLogger()})
	if !k.KillIfOverMemory() {
		t.Fatal("a kernel over its limit was not killed")
	}
	select {
	case <-k.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a kernel over its limit did not die")
	}
	if r := k.ExitReason(); !strings.HasPrefix(r, "out_of_memory: the kernel used ") {
		t.Fatalf("exit reason %q, want out_of_memory", r)
	}
}
