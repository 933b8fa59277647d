//go:build linux

package agent

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
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
	var w memWatch
	defer w.pf.close()
	// Its limit far above it: untouched.
	cs.checkMemory(&w, 1<<40, 1<<39, 1<<40, discardLogger())
	select {
	case <-k.Done():
		t.Fatalf("a kernel within its limit was killed: %s", k.ExitReason())
	case <-time.After(200 * time.Millisecond):
	}
	cs.checkMemory(&w, 1<<40, 1, 1<<40, discardLogger())
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
	if mi, err := pf.readMeminfo(); err != nil || mi.total <= 0 || mi.avail <= 0 || mi.avail > mi.total || mi.anon <= 0 || mi.anon > mi.total {
		t.Fatalf("meminfo: %+v %v", mi, err)
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

func TestMemVictim(t *testing.T) {
	const mib = 1 << 20
	units := []memUnit{{what: "kernel", rss: 300 * mib}, {what: "command", rss: 500 * mib}, {what: "process tree", rss: 20 * mib}}
	const floor, pressure = 768 * mib, 896 * mib
	for _, c := range []struct {
		units             []memUnit
		used, anon, shmem int64
		want              string // "" for none
	}{
		{units, 900 * mib, 800 * mib, 0, "command"}, // holds half of what is used
		{units, 900 * mib, 600 * mib, 0, ""},        // half, but most of it file cache
		{units, 1100 * mib, 800 * mib, 0, ""},       // none holds half, little is held
		{units, 1100 * mib, 1000 * mib, 0, "command"},
		{[]memUnit{{what: "a", rss: 100 * mib}, {what: "b", rss: 90 * mib}}, 1100 * mib, 1000 * mib, 0, ""}, // many small trees
		// Files in memory: a quarter of what a kill could free is enough.
		{[]memUnit{{what: "a", rss: 100 * mib}, {what: "b", rss: 90 * mib}}, 1100 * mib, 1000 * mib, 700 * mib, "a"},
		{nil, 1100 * mib, 1000 * mib, 0, ""},
		// When one must go, a tree that grows (rates in MiB/s) goes before
		// a larger one that holds still, if it holds a quarter of what a
		// kill could free; the growth never makes it time to kill.
		{[]memUnit{{what: "kernel", rss: 500 * mib}, {what: "command", rss: 300 * mib, rate: 200 * mib}}, 900 * mib, 850 * mib, 0, "command"},
		{[]memUnit{{what: "kernel", rss: 500 * mib, rate: 2 * mib}, {what: "command", rss: 300 * mib, rate: 40 * mib}, {what: "terminal", rss: 50 * mib, rate: 30 * mib}}, 900 * mib, 850 * mib, 0, "command"},
		{[]memUnit{{what: "kernel", rss: 500 * mib}, {what: "command", rss: 300 * mib, rate: 200 * mib}}, 900 * mib, 600 * mib, 0, ""},     // file cache
		{[]memUnit{{what: "kernel", rss: 500 * mib}, {what: "command", rss: 300 * mib, rate: 8 * mib}}, 900 * mib, 850 * mib, 0, "kernel"}, // noise: the largest
		{[]memUnit{{what: "kernel", rss: 300 * mib}, {what: "command", rss: 300 * mib, rate: 100 * mib}}, 1000 * mib, 850 * mib, 0, ""},    // not yet time
		{[]memUnit{{what: "kernel", rss: 300 * mib}, {what: "command", rss: 280 * mib, rate: 100 * mib}}, 1000 * mib, 950 * mib, 0, "command"},
		// A kernel just started (its start counts as growth) is too small a
		// part to be worth the kill: the largest goes.
		{[]memUnit{{what: "command", rss: 600 * mib, rate: 10 * mib}, {what: "kernel", rss: 100 * mib, rate: 100 * mib}}, 900 * mib, 850 * mib, 0, "command"},
		{[]memUnit{{what: "background process", rss: 600 * mib, rate: 10 * mib}, {what: "kernel", rss: 100 * mib, rate: 100 * mib}}, 900 * mib, 850 * mib, 0, "background process"},
		// Files in /dev/shm fill the sandbox: killing a small command (a
		// few MiB, growing as it starts) would free nothing.
		{[]memUnit{{what: "command", rss: 3 * mib, rate: 20 * mib}, {what: "process tree", rss: 14 * mib}}, 1000 * mib, 950 * mib, 900 * mib, ""},
		{[]memUnit{{what: "command", rss: 40 * mib, rate: 20 * mib}, {what: "process tree", rss: 12 * mib}}, 1000 * mib, 950 * mib, 900 * mib, "command"},
	} {
		v := memVictim(c.units, c.used, c.anon, c.shmem, floor, pressure)
		if got := ""; v != nil {
			got = v.what
			if got != c.want {
				t.Errorf("victim with %d MiB used, %d MiB held (%d in files): %s, want %q", c.used/mib, c.anon/mib, c.shmem/mib, got, c.want)
			}
		} else if c.want != "" {
			t.Errorf("victim with %d MiB used, %d MiB held (%d in files): none, want %s", c.used/mib, c.anon/mib, c.shmem/mib, c.want)
		}
	}
}

// growth measures each tree against the earliest look of the last
// second, or the last look when none is that recent; a tree not seen
// before grew by all it holds.
func TestMemGrowth(t *testing.T) {
	const mib = 1 << 20
	var w memWatch
	t0 := time.Now()
	units := func(rss ...int64) []memUnit {
		var us []memUnit
		for i, n := range rss {
			us = append(us, memUnit{key: int64(i + 1), rss: n})
		}
		return us
	}
	if _, seen := w.growth(units(100*mib), t0); seen {
		t.Fatal("the first look saw an earlier one")
	}
	if u := units(150 * mib); !must(w.growth(u, t0.Add(500*time.Millisecond))).Equal(t0) || u[0].grew != 50*mib || u[0].rate != 100*mib {
		t.Fatalf("second look: %+v", u)
	}
	// The first look is now past the window: measured from the second.
	if u := units(200*mib, 50*mib); !must(w.growth(u, t0.Add(1500*time.Millisecond))).Equal(t0.Add(500*time.Millisecond)) || u[0].grew != 50*mib || u[1].grew != 50*mib || u[1].rate != 50*mib {
		t.Fatalf("third look: %+v", u)
	}
	// Every look past the window: the last one is kept to measure from.
	if u := units(260*mib, 40*mib); !must(w.growth(u, t0.Add(5500*time.Millisecond))).Equal(t0.Add(1500*time.Millisecond)) || u[0].grew != 60*mib || u[1].grew != -10*mib {
		t.Fatalf("a look seconds later: %+v", u)
	}
	if len(w.looks) != 2 {
		t.Fatalf("%d looks kept, want the last one and this one", len(w.looks))
	}
	// A look right after another: its rate as if over memGrowSample.
	if u := units(270*mib, 40*mib); !must(w.growth(u, t0.Add(5510*time.Millisecond))).Equal(t0.Add(5500*time.Millisecond)) || u[0].grew != 10*mib || u[0].rate != 100*mib {
		t.Fatalf("a look 10 ms later: %+v", u)
	}
}

// must returns since, failing on a look that saw no earlier one.
func must(since time.Time, seen bool) time.Time {
	if !seen {
		return time.Time{}
	}
	return since
}

// testContexts returns Contexts whose memory watch never starts: the
// tests call its parts themselves.
func testContexts() *Contexts {
	cs := NewContexts()
	cs.watch.Do(func() {})
	return cs
}

func TestMemWatchPace(t *testing.T) {
	cs := testContexts()
	if got := cs.memWatchPace(0); got != memWatchIdlePeriod {
		t.Errorf("pace of a quiet sandbox: %v, want %v", got, memWatchIdlePeriod)
	}
	if got := cs.memWatchPace(memWatchGrowth); got != memWatchPeriod {
		t.Errorf("pace of a sandbox growing by %d B/s: %v, want %v", memWatchGrowth, got, memWatchPeriod)
	}
	release := cs.guardMemory(markBase+1, "background process", false, discardLogger(), func(string) {}, func() {})
	if got := cs.memWatchPace(0); got != memWatchPeriod {
		t.Errorf("pace right after a background process started: %v, want %v", got, memWatchPeriod)
	}
	cs.mu.Lock()
	cs.owners[markBase+1].young = time.Now()
	cs.mu.Unlock()
	if got := cs.memWatchPace(0); got != memWatchIdlePeriod {
		t.Errorf("pace with a background process past its start: %v, want %v", got, memWatchIdlePeriod)
	}
	release()
	release = cs.guardMemory(markBase+2, "command", true, discardLogger(), func(string) {}, func() {})
	if got := cs.memWatchPace(0); got != memWatchPeriod {
		t.Errorf("pace while a command runs: %v, want %v", got, memWatchPeriod)
	}
	release()
	if got := cs.memWatchPace(0); got != memWatchIdlePeriod {
		t.Errorf("pace after the command: %v, want %v", got, memWatchIdlePeriod)
	}
}

func TestProcStatusMarkAndRSS(t *testing.T) {
	st, ok := readStatus(strconv.Itoa(os.Getpid()))
	if !ok || st.rss <= 0 {
		t.Fatalf("own status: %+v %v, want a resident size", st, ok)
	}
	m := newTreeMark()
	for groups, want := range map[string]uint32{
		"": 0, "1000 ": 0, "27 " + strconv.FormatUint(uint64(m), 10) + " ": m, strconv.Itoa(markBase): 0,
		strconv.FormatUint(uint64(m)+1000, 10): 0, // not given by this agent
	} {
		if got := (procStatus{groups: groups}).mark(); got != want {
			t.Errorf("mark of groups %q: %d, want %d", groups, got, want)
		}
	}
}

// memWatchTrees returns Contexts whose watch the test drives, and start,
// which runs Python code as a marked tree under that watch (guardMemory)
// as what, and returns the process and what it was told when killed.
func memWatchTrees(t *testing.T) (*Contexts, func(what, code string) (*Process, *atomic.Pointer[string])) {
	t.Helper()
	if !runningAsRoot() {
		t.Skip("needs root: only root marks the trees it starts")
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("needs python3 to hold memory")
	}
	cs := testContexts()
	return cs, func(what, code string) (*Process, *atomic.Pointer[string]) {
		p, err := (*Reaper)(nil).Start(py, []string{"python3", "-c", code}, &os.ProcAttr{Sys: procAttr(true)})
		if err != nil {
			t.Fatal(err)
		}
		var why atomic.Pointer[string]
		release := cs.guardMemory(p.Mark, what, false, discardLogger(), func(w string) { why.Store(&w) }, func() { KillTree(p.Pid, p.Mark) })
		t.Cleanup(func() { release(); KillTree(p.Pid, p.Mark) })
		return p, &why
	}
}

// watchLooks returns a memory watch of cs whose reads of /proc/meminfo say
// what look is given (the sandbox's memory as the test says: 256 MiB, a
// kernel's limit, the first rule's floor, at 120 and the pressure level
// at 160), and look, one look of the watch with used and anon.
func watchLooks(t *testing.T, cs *Contexts) (*memWatch, func(used, anon int64)) {
	const total, floor, pressure = 256 << 20, 120 << 20, 160 << 20
	var mi memInfo
	w := &memWatch{meminfo: func() (memInfo, error) { return mi, nil }}
	t.Cleanup(w.pf.close)
	return w, func(used, anon int64) {
		mi = memInfo{total: total, avail: total - used, anon: anon}
		cs.checkMemory(w, total, floor, pressure, discardLogger())
	}
}

// waitHolding waits until process p holds more than n bytes (20 s at most).
func waitHolding(t *testing.T, p *Process, n int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, _ := readStatus(strconv.Itoa(p.Pid))
		if st.rss > n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never held %d MiB: %+v", p.Pid, n>>20, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestMemoryWatchKillsTheLargestTree: when the sandbox nearly runs out and
// what it holds is past the pressure level, the largest tree, a command,
// is killed and told why, and a smaller one lives; nothing is killed below
// the level, nor while what is held is under the floor (file cache), nor
// within the grace after a kill.
func TestMemoryWatchKillsTheLargestTree(t *testing.T) {
	cs, start := memWatchTrees(t)
	big, bigWhy := start("command", "import sys, time\nx = b'a' * (96 << 20)\nprint(1, flush=True)\ntime.sleep(120)")
	small, smallWhy := start("background process", "import time\ntime.sleep(120)")
	waitHolding(t, big, 90<<20) // until the big one holds its memory
	w, look := watchLooks(t, cs)
	// Below the pressure level, nothing is killed; above it, nothing while
	// the command holds half of what is used but little is held (file
	// cache), nor within the grace after a kill.
	look(140<<20, 140<<20)
	look(180<<20, 100<<20)
	w.killedAt = time.Now()
	look(250<<20, 170<<20)
	select {
	case st := <-big.Done:
		t.Fatalf("the command was killed while the watch should wait: %v", st)
	case <-time.After(300 * time.Millisecond):
	}
	// Held past the level, the command holding more than a quarter of it:
	// the largest tree, the command, goes, and only it.
	w.killedAt = time.Time{}
	look(250<<20, 170<<20)
	select {
	case <-big.Done:
	case <-time.After(10 * time.Second):
		t.Fatal("the largest tree was not killed")
	}
	if w := bigWhy.Load(); w == nil || !strings.HasPrefix(*w, "out_of_memory: ") || !strings.Contains(*w, "this command") {
		t.Fatalf("the command was told %v, want out_of_memory naming it", w)
	}
	select {
	case st := <-small.Done:
		t.Fatalf("the smaller process was killed too: %v", st)
	case <-time.After(300 * time.Millisecond):
	}
	if w := smallWhy.Load(); w != nil {
		t.Fatalf("the smaller process was told %q", *w)
	}
}

// TestMemoryWatchKillsTheTreeThatGrows: a smaller tree that grew since
// the watch's earlier look is killed, and told why, before a larger one
// that held still (a kernel with its variables, say); with no earlier look
// just past the level, the watch waits one look to tell.
func TestMemoryWatchKillsTheTreeThatGrows(t *testing.T) {
	cs, start := memWatchTrees(t)
	big, bigWhy := start("background process", "import time\nx = b'a' * (96 << 20)\ntime.sleep(120)")
	// It takes 64 MiB when told (SIGUSR1).
	grower, growerWhy := start("command", "import signal, time\nx = []\nsignal.signal(signal.SIGUSR1, lambda *a: x.append(b'a' * (64 << 20)))\nwhile True:\n    time.sleep(0.01)")
	waitHolding(t, big, 90<<20)
	waitCatching(t, grower.Pid, syscall.SIGUSR1) // the grower's Python up and holding still
	_, look := watchLooks(t, cs)
	// Just past the level, no earlier look: nothing is killed yet.
	look(170<<20, 170<<20)
	select {
	case st := <-big.Done:
		t.Fatalf("the larger process was killed at the first look: %v", st)
	case st := <-grower.Done:
		t.Fatalf("the command was killed at the first look: %v", st)
	case <-time.After(300 * time.Millisecond):
	}
	syscall.Kill(grower.Pid, syscall.SIGUSR1)
	waitHolding(t, grower, 64<<20)
	look(200<<20, 200<<20)
	select {
	case <-grower.Done:
	case <-time.After(10 * time.Second):
		t.Fatal("the tree that grew was not killed")
	}
	if w := growerWhy.Load(); w == nil || !strings.HasPrefix(*w, "out_of_memory: ") || !strings.Contains(*w, "this command") || !strings.Contains(*w, "the one growing") {
		t.Fatalf("the command was told %v, want out_of_memory naming it as the one growing", w)
	}
	select {
	case st := <-big.Done:
		t.Fatalf("the larger process that held still was killed too: %v", st)
	case <-time.After(300 * time.Millisecond):
	}
	if w := bigWhy.Load(); w != nil {
		t.Fatalf("the larger process was told %q", *w)
	}
}

// TestMemoryWatchTellsTheGrowerByAnEarlyLook: a look taken while what is
// held is still under the level where the watch follows the trees closely
// (from half a kernel's limit) tells the tree that grows, when the next
// look comes late, past the middle between the level and the sandbox's
// memory (a watch starved of CPU): the grower goes, not the larger tree
// that held still.
func TestMemoryWatchTellsTheGrowerByAnEarlyLook(t *testing.T) {
	cs, start := memWatchTrees(t)
	big, bigWhy := start("background process", "import time\nx = b'a' * (96 << 20)\ntime.sleep(120)")
	grower, growerWhy := start("command", "import signal, time\nx = []\nsignal.signal(signal.SIGUSR1, lambda *a: x.append(b'a' * (64 << 20)))\nwhile True:\n    time.sleep(0.01)")
	waitHolding(t, big, 90<<20)
	waitCatching(t, grower.Pid, syscall.SIGUSR1)
	_, look := watchLooks(t, cs)
	look(120<<20, 70<<20) // over half the floor of 120, under 80 where close looks start
	syscall.Kill(grower.Pid, syscall.SIGUSR1)
	waitHolding(t, grower, 64<<20)
	look(250<<20, 240<<20) // past the middle, 208
	select {
	case <-grower.Done:
	case st := <-big.Done:
		t.Fatalf("the larger process that held still was killed: %v", st)
	case <-time.After(10 * time.Second):
		t.Fatal("nothing was killed")
	}
	if w := growerWhy.Load(); w == nil || !strings.Contains(*w, "the one growing") {
		t.Fatalf("the command was told %v, want out_of_memory naming it as the one growing", w)
	}
	if w := bigWhy.Load(); w != nil {
		t.Fatalf("the larger process was told %q", *w)
	}
}

// TestMemoryWatchTakesNoEarlyLookWhenIdle: under the level where the watch
// follows the trees closely, it takes their sizes (a scan of /proc) only
// while something runs or is young, or the memory grows: an idle sandbox
// holding that much is not scanned every second.
func TestMemoryWatchTakesNoEarlyLookWhenIdle(t *testing.T) {
	cs, start := memWatchTrees(t)
	p, _ := start("background process", "import time\ntime.sleep(120)")
	setYoung := func(at time.Time) {
		cs.mu.Lock()
		cs.owners[p.Mark].young = at
		cs.mu.Unlock()
	}
	setYoung(time.Time{}) // started long ago
	w, look := watchLooks(t, cs)
	look(120<<20, 70<<20)
	look(120<<20, 70<<20) // the same: the memory does not grow
	if len(w.looks) != 0 {
		t.Fatalf("an idle sandbox under the level had %d looks taken, want none", len(w.looks))
	}
	setYoung(time.Now().Add(time.Minute))
	look(120<<20, 70<<20)
	if len(w.looks) != 1 {
		t.Fatalf("with a young process: %d looks, want 1", len(w.looks))
	}
	// Idle again: the look is dropped, not kept to measure a later
	// growth against (over minutes, it would seem slow).
	setYoung(time.Time{})
	look(120<<20, 70<<20)
	if len(w.looks) != 0 {
		t.Fatalf("idle again: %d looks kept, want none", len(w.looks))
	}
}

func TestParseMeminfo(t *testing.T) {
	// As gVisor writes it: MemAvailable is MemFree, the file cache counted
	// as used.
	mi, err := parseMeminfo([]byte("MemTotal:        1048576 kB\nMemFree:          905864 kB\nMemAvailable:     905864 kB\nCached:            31556 kB\nAnonPages:        112308 kB\nShmem:              1164 kB\n"))
	if err != nil || mi.total != 1048576<<10 || mi.avail != 905864<<10 || mi.anon != 112308<<10 || mi.shmem != 1164<<10 || mi.used() != (1048576-905864)<<10 {
		t.Fatalf("parseMeminfo: %+v %v", mi, err)
	}
	if _, err := parseMeminfo([]byte("MemFree: 1 kB\n")); err == nil {
		t.Fatal("meminfo without MemTotal parsed")
	}
}

// TestMemoryWatchKillsWhatAKernelStarted: a kernel whose tree must go but
// whose children hold most of it (a plotly figure's Chromium, a
// subprocess) loses those, and its running cell is told; the kernel
// process lives on. A kernel that holds most of its tree itself is killed
// as before.
func TestMemoryWatchKillsWhatAKernelStarted(t *testing.T) {
	if !runningAsRoot() {
		t.Skip("needs root: only root marks the trees it starts")
	}
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("needs python3 to hold memory")
	}
	kernel := func(code string) *kernelProc {
		p, err := (*Reaper)(nil).Start(py, []string{"python3", "-c", code}, &os.ProcAttr{Sys: procAttr(true)})
		if err != nil {
			t.Fatal(err)
		}
		k := newKernelProc(p)
		t.Cleanup(k.Kill)
		return k
	}
	// The "kernel" starts a child that takes 96 MiB, and holds still.
	const withChild = "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', \"import time\\nx = b'a' * (96 << 20)\\ntime.sleep(120)\"])\ntime.sleep(120)"
	k := kernel(withChild)
	cs := testContexts()
	cs.procs[k] = true
	var child int
	deadline := time.Now().Add(20 * time.Second)
	for child == 0 {
		for _, c := range childrenOf(k.Pid()) {
			if st, _ := readStatus(strconv.Itoa(c)); st.rss > 90<<20 {
				child = c
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("the kernel's child never held its memory")
		}
		time.Sleep(10 * time.Millisecond)
	}
	_, look := watchLooks(t, cs)
	look(250<<20, 170<<20)
	deadline = time.Now().Add(10 * time.Second)
	for syscall.Kill(child, 0) == nil {
		if st, ok := readStatus(strconv.Itoa(child)); ok && !st.living() {
			break // a zombie, its parent's to reap
		}
		if time.Now().After(deadline) {
			t.Fatal("the kernel's child was not killed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-k.Done():
		t.Fatalf("the kernel was killed with its child: %s", k.ExitReason())
	case <-time.After(300 * time.Millisecond):
	}
	if n := k.TakeNote(); !strings.HasPrefix(n, "pandastack: out_of_memory: ") || !strings.Contains(n, "the kernel and its variables live on") {
		t.Fatalf("the cell would be told %q", n)
	}
	if n := k.TakeNote(); n != "" {
		t.Fatalf("the note was taken twice: %q", n)
	}

	// A kernel holding the memory itself goes.
	big := kernel("import time\nx = b'a' * (96 << 20)\ntime.sleep(120)")
	cs = testContexts()
	cs.procs[big] = true
	p := &Process{Pid: big.Pid()}
	waitHolding(t, p, 90<<20)
	_, look = watchLooks(t, cs)
	look(250<<20, 170<<20)
	select {
	case <-big.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the kernel holding the memory was not killed")
	}
	if r := big.ExitReason(); !strings.Contains(r, "out_of_memory") {
		t.Fatalf("the kernel's exit reason %q", r)
	}
}

// What a kernel's tree loses: its children when they hold most of it,
// unless the kernel process itself is what grew.
func TestMemUnitChildren(t *testing.T) {
	const mib = 1 << 20
	k := &kernelProc{}
	for _, c := range []struct {
		u    memUnit
		want bool
	}{
		{memUnit{kernel: k, rss: 500 * mib, own: 100 * mib}, true},
		{memUnit{kernel: k, rss: 500 * mib, own: 300 * mib}, false},
		{memUnit{kernel: k, rss: 500 * mib, own: 100 * mib, grew: 80 * mib, ownGrew: 10 * mib}, true},
		{memUnit{kernel: k, rss: 500 * mib, own: 100 * mib, grew: 80 * mib, ownGrew: 70 * mib}, false},
		{memUnit{rss: 500 * mib}, false}, // not a kernel's
	} {
		if got := c.u.children(); got != c.want {
			t.Errorf("%+v: children %v, want %v", c.u, got, c.want)
		}
	}
}

// waitCatching waits until process pid catches sig (its handler is set:
// the signal's default would kill it).
func waitCatching(t *testing.T, pid int, sig syscall.Signal) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "SigCgt:"); ok {
				if mask, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil && mask&(1<<(uint(sig)-1)) != 0 {
					return
				}
			}
		}
		if time.Now().After(end) {
			t.Fatalf("process %d never set its handler of %v", pid, sig)
		}
	}
}
