//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// rlimitNProc is RLIMIT_NPROC on Linux (the syscall package lacks it).
const rlimitNProc = 6

// nprocLimit is the processes the sandbox user may have (RLIMIT_NPROC,
// which the agent's children inherit), 0 if unknown or unlimited.
func nprocLimit() uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(rlimitNProc, &l); err != nil || l.Cur == ^uint64(0) {
		return 0
	}
	return l.Cur
}

// LimitProcesses sets the agent's RLIMIT_NPROC from agentproto.NProcEnv
// if the runtime set it (gVisor enforces it per user, and everything the
// agent starts inherits it), and removes the variable so that user
// processes do not see it. It logs what it did.
func LimitProcesses(log *slog.Logger) {
	v, ok := os.LookupEnv(agentproto.NProcEnv)
	if !ok {
		return
	}
	os.Unsetenv(agentproto.NProcEnv)
	n, err := strconv.ParseUint(v, 10, 64)
	if err == nil {
		err = syscall.Setrlimit(rlimitNProc, &syscall.Rlimit{Cur: n, Max: n})
	}
	if err != nil {
		log.Warn("cannot limit processes", "limit", v, "err", err)
		return
	}
	log.Info("processes limited", "rlimit_nproc", n)
}

// userCanEnter says why the user uid:gid (with no other groups, as the
// agent starts its processes) could not make dir its working directory:
// every directory on the way needs its search (x) bit for that user.
func userCanEnter(dir string, uid, gid int) error {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	p := "/"
	for _, part := range append([]string{""}, strings.Split(strings.Trim(real, "/"), "/")...) {
		p = filepath.Join(p, part)
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			return err
		}
		mode := st.Mode & 0o777
		var ok bool
		switch {
		case int(st.Uid) == uid:
			ok = mode&0o100 != 0
		case int(st.Gid) == gid:
			ok = mode&0o010 != 0
		default:
			ok = mode&0o001 != 0
		}
		if !ok {
			return fmt.Errorf("permission denied: uid %d cannot enter %s (mode %s, owner uid %d gid %d)", uid, p, os.FileMode(mode)|os.ModeDir, st.Uid, st.Gid)
		}
	}
	return nil
}

// The memory watch gives each kernel a memory limit below the sandbox's:
// gVisor enforces the sandbox's limit from the host by killing the whole
// sandbox, so a cell that allocates without end would take every context
// (and the agent) with it. The watch reads the sandbox's memory from
// /proc/meminfo (gVisor reports the sandbox's limit as MemTotal) and
// SIGKILLs a kernel whose resident memory passes its limit, or the largest
// kernel when the sandbox as a whole comes close to its own. At the rates
// this machine allocates (about 1.2 GB/s in gVisor) a 25 ms period
// overshoots by some 30 MB. The reserve is large because the host counts
// more than the sandbox sees: gVisor gives memory that was freed inside
// back to the host only later, and has its own overhead.
const memWatchPeriod = 25 * time.Millisecond

// memWatchIdlePeriod is the watch's period while no cell runs.
const memWatchIdlePeriod = time.Second

// memLimits derives the limits from the sandbox's memory: a kernel may use
// all but a reserve of a quarter (at least 192 MiB), and the sandbox all
// but half that reserve. Sandboxes too small for such a reserve get none.
func memLimits(total int64) (perKernel, pressure int64, ok bool) {
	reserve := max(total/4, 192<<20)
	if total < 2*reserve {
		return 0, 0, false
	}
	return total - reserve, total - reserve/2, true
}

// memInfo is what the watch reads of /proc/meminfo, in bytes.
type memInfo struct {
	total int64 // MemTotal: gVisor reports the sandbox's limit
	avail int64 // MemAvailable: gVisor counts its file cache as used
	// anon is AnonPages: in gVisor the processes' own memory and the files
	// that live in memory, which it cannot give back. Its file cache
	// (Cached) it can: gVisor reports that cache as used (MemAvailable is
	// MemFree), and sandboxes whose cache filled all of their memory (used
	// 1024 MiB of 1024, kernels of several languages started) lived on.
	anon int64
	// shmem is Shmem: the files in memory alone (tmpfs, shared memory;
	// files written to the root filesystem raised it as much as
	// AnonPages), which no kill frees.
	shmem int64
}

// used is what the sandbox uses of its memory, its file cache included.
func (mi memInfo) used() int64 { return mi.total - mi.avail }

// meminfo reads /proc/meminfo.
func meminfo() (memInfo, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return memInfo{}, err
	}
	return parseMeminfo(b)
}

func parseMeminfo(b []byte) (memInfo, error) {
	var mi memInfo
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		n, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "MemTotal:":
			mi.total = n << 10
		case "MemAvailable:":
			mi.avail = n << 10
		case "AnonPages:":
			mi.anon = n << 10
		case "Shmem:":
			mi.shmem = n << 10
		}
	}
	if mi.total == 0 {
		return memInfo{}, fmt.Errorf("/proc/meminfo has no MemTotal")
	}
	return mi, nil
}

// rss returns a process's resident memory in bytes.
func rss(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/statm")
	if err != nil {
		return 0, err
	}
	return parseStatm(pid, b)
}

func parseStatm(pid int, b []byte) (int64, error) {
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("statm of %d: %q", pid, b)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, err
	}
	return pages * int64(os.Getpagesize()), nil
}

// procFiles keeps the /proc files the memory watch reads on every pass
// open, and reads them with one pread each: os.ReadFile costs five
// syscalls or more (open, fstat, read, read, close), and in gVisor a pass
// over /proc/meminfo and one kernel's statm took ~270 µs that way against
// ~40 µs with the files kept open (a /proc file read at offset 0 is made
// afresh). A kernel's statm stays open until the kernel is gone, so it
// never reads another process that got the same pid. Only the watch's
// goroutine uses it.
type procFiles struct {
	meminfo *os.File
	statm   map[*kernelProc]*os.File
	buf     [4096]byte
}

// read reads *fp (opening path first if nil) from its start; on an error
// it closes the file so the next read opens it again.
func (pf *procFiles) read(path string, fp **os.File) ([]byte, error) {
	if *fp == nil {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		*fp = f
	}
	n, err := (*fp).ReadAt(pf.buf[:], 0)
	if err != nil && !(errors.Is(err, io.EOF) && n > 0) {
		(*fp).Close()
		*fp = nil
		return nil, err
	}
	return pf.buf[:n], nil
}

func (pf *procFiles) readMeminfo() (memInfo, error) {
	b, err := pf.read("/proc/meminfo", &pf.meminfo)
	if err != nil {
		return memInfo{}, err
	}
	return parseMeminfo(b)
}

// rss is the resident memory of k's process.
func (pf *procFiles) rss(k *kernelProc) (int64, error) {
	if pf.statm == nil {
		pf.statm = map[*kernelProc]*os.File{}
	}
	f := pf.statm[k]
	b, err := pf.read("/proc/"+strconv.Itoa(k.Pid())+"/statm", &f)
	if f != nil {
		pf.statm[k] = f
	} else {
		delete(pf.statm, k)
	}
	if err != nil {
		return 0, err
	}
	return parseStatm(k.Pid(), b)
}

// keep closes the statm files of kernels not in live.
func (pf *procFiles) keep(live []*kernelProc) {
	for k, f := range pf.statm {
		if !slices.Contains(live, k) {
			f.Close()
			delete(pf.statm, k)
		}
	}
}

// close closes every file.
func (pf *procFiles) close() {
	pf.keep(nil)
	if pf.meminfo != nil {
		pf.meminfo.Close()
		pf.meminfo = nil
	}
}

// memWatch is the state of the watch's goroutine across its looks.
type memWatch struct {
	pf procFiles
	// killedAt is when the watch last killed a tree for the sandbox's
	// memory: it waits memKillGrace for that memory to be given back
	// before it picks another.
	killedAt time.Time
	// used and at are the sandbox's memory at the last look, and when.
	used int64
	at   time.Time
	// looks are the trees' sizes at the looks of the last memGrowWindow
	// with what the sandbox cannot give back near a kernel's limit (see
	// checkMemory), oldest first.
	looks []unitLook
	// meminfo replaces the reads of /proc/meminfo in tests.
	meminfo func() (memInfo, error)
}

// memKillGrace is how long the watch gives a tree it killed for the
// sandbox's memory to end and free it before it picks another.
const memKillGrace = 500 * time.Millisecond

// memWatchGrowth is the growth of the sandbox's memory, in bytes per
// second, that makes the watch look at its busy pace: something
// allocates.
const memWatchGrowth = 64 << 20

func (w *memWatch) readMeminfo() (memInfo, error) {
	if w.meminfo != nil {
		return w.meminfo()
	}
	return w.pf.readMeminfo()
}

// watchMemory runs the memory watch for the life of the agent.
func (cs *Contexts) watchMemory(log *slog.Logger) {
	mi, err := meminfo()
	if err != nil {
		log.Warn("no memory watch for kernels", "err", err)
		return
	}
	total := mi.total
	perKernel, pressure, ok := memLimits(total)
	if !ok {
		log.Info("no memory watch for kernels: the sandbox is too small", "mib", total>>20)
		return
	}
	log.Info("kernel memory watch", "kernel_limit_mib", perKernel>>20, "sandbox_mib", total>>20)
	t := time.NewTimer(memWatchPeriod)
	defer t.Stop()
	var w memWatch
	defer w.pf.close()
	for {
		kicked := false
		select {
		case <-t.C:
		case <-cs.memKick:
			kicked = true // the cell may not count as busy yet
		}
		grew := cs.checkMemory(&w, total, perKernel, pressure, log)
		if kicked {
			t.Reset(memWatchPeriod)
		} else {
			t.Reset(cs.memWatchPace(grew))
		}
	}
}

// memWatchPace is how long the watch waits for its next look: the busy
// pace while a cell or a command runs (memOwner.busy), for the first
// seconds of a background process or a terminal, or while the
// sandbox's memory grows by memWatchGrowth or faster (grew, in bytes per
// second: a background process, a thread a cell left behind); a slow one
// otherwise. Polling /proc every 25 ms cost an idle sandbox about 8 % of
// a CPU in gVisor, which kept it from ever counting as idle (idle suspend
// wants under 5 %). A cell's or a command's start wakes the watch at once
// (wakeMemoryWatch), so a fast allocation is seen at the busy pace from
// its first moment; one that starts later in a background process is
// seen within the slow period.
func (cs *Contexts) memWatchPace(grew float64) time.Duration {
	if grew >= memWatchGrowth || cs.busyForMemory() {
		return memWatchPeriod
	}
	return memWatchIdlePeriod
}

// busyForMemory reports whether a cell or a command someone waits for
// runs, or another tree under the watch started less than memWatchYoung
// ago.
func (cs *Contexts) busyForMemory() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	now := time.Now()
	for _, o := range cs.owners {
		if o.busy || now.Before(o.young) {
			return true
		}
	}
	return cs.anyBusyLocked()
}

// checkMemory is one look of the watch. It returns how fast the sandbox's
// memory grew since the look before, in bytes per second.
func (cs *Contexts) checkMemory(w *memWatch, total, perKernel, pressure int64, log *slog.Logger) (grew float64) {
	cs.mu.Lock()
	procs := make([]*kernelProc, 0, len(cs.procs))
	for k := range cs.procs {
		procs = append(procs, k)
	}
	cs.mu.Unlock()
	pf := &w.pf
	pf.keep(procs)
	for _, k := range procs {
		n, err := pf.rss(k)
		if err != nil {
			continue
		}
		if n > perKernel {
			log.Warn("kernel over its memory limit; killing it", "pid", k.Pid(), "rss_mib", n>>20, "limit_mib", perKernel>>20)
			k.killForMemory(fmt.Sprintf("out_of_memory: the kernel used %d MiB, more than its limit of %d MiB in this %d MiB sandbox, and was killed", n>>20, perKernel>>20, total>>20))
			w.killedAt = time.Now() // its memory is not back yet either
			return 0
		}
	}
	mi, err := w.readMeminfo()
	if err != nil {
		return 0
	}
	used := total - mi.avail
	now := time.Now()
	if !w.at.IsZero() {
		if dt := now.Sub(w.at).Seconds(); dt > 0 {
			grew = float64(used-w.used) / dt
		}
	}
	w.used, w.at = used, now
	// Close to a kernel's limit in what gVisor cannot give back (anon, see
	// memInfo), below which none of memVictim's rules kills, the trees'
	// sizes are kept for a while, to see which one grows (growth). A scan
	// of /proc costs, so at most one every memGrowSample below the level,
	// and none while what is used is file cache. Lower, from half a
	// kernel's limit, where a tree may hold so much that it is the larger
	// one when the level is reached, a look every memEarlyLook while
	// something runs or the sandbox's memory grows (not in an idle
	// sandbox, which a scan a second would cost CPU for nothing): a
	// command filling the sandbox at a GiB a second crosses from there to
	// the level in a few of the busy pace's looks, and a watch starved of
	// CPU on a busy host first looked when it was full (a CI run killed
	// that command as the largest, by luck the right one, for want of a
	// look to tell it grew).
	if mi.anon <= perKernel/2 || now.Sub(w.killedAt) < memKillGrace {
		w.looks = nil // what grew before a kill, or long ago, says nothing now
		return grew
	}
	early, every := mi.anon <= perKernel-(pressure-perKernel), memGrowSample
	if early {
		if grew < memWatchGrowth && !cs.busyForMemory() {
			// Idle: no look, and none kept from before, against which a
			// tree that starts growing later would seem to grow slowly
			// (over minutes), and the largest go in its stead.
			w.looks = nil
			return grew
		}
		every = memEarlyLook // and no kill: memVictim's rules want more held
	}
	if (used <= pressure || early) && len(w.looks) > 0 && now.Sub(w.looks[len(w.looks)-1].at) < every {
		return grew
	}
	units := cs.memUnits(procs, pf)
	since, seen := w.growth(units, now)
	if used <= pressure || early {
		return grew
	}
	if (!seen || now.Sub(since) < memGrowSample) && used < pressure+(total-pressure)/2 {
		// Just past the level with no earlier look to tell the grower
		// by, or one too recent: the looks go on at the busy pace (the
		// sandbox's memory grew, see memWatchPace) until one is
		// memGrowSample old, short of the middle between the level and
		// the sandbox's memory.
		return memWatchGrowth
	}
	// Nearly out as a whole: gVisor's host would stop the whole sandbox
	// soon, every context with it, so the watch is the sandbox's
	// out-of-memory killer (memVictim).
	v := memVictim(units, used, mi.anon, mi.shmem, perKernel, pressure)
	if v == nil {
		return grew
	}
	if v.children() {
		log.Warn("sandbox nearly out of memory; killing what a kernel started", "pid", v.pid, "rss_mib", v.rss>>20, "kernel_mib", v.own>>20, "grew_mib", v.grew>>20, "used_mib", used>>20, "anon_mib", mi.anon>>20)
		v.kernel.killChildrenForMemory(fmt.Sprintf("pandastack: out_of_memory: the sandbox's %d MiB were nearly used up (%d MiB), and the processes this kernel had started (%d MiB) were killed; the kernel and its variables live on", total>>20, used>>20, min(v.rss-v.own, used)>>20))
	} else if v.grew > 0 {
		over := now.Sub(since).Round(time.Millisecond)
		log.Warn("sandbox nearly out of memory; killing the process tree that grows", "what", v.what, "pid", v.pid, "rss_mib", v.rss>>20, "grew_mib", v.grew>>20, "over_ms", over.Milliseconds(), "used_mib", used>>20, "anon_mib", mi.anon>>20)
		v.kill(fmt.Sprintf("out_of_memory: the sandbox's %d MiB were nearly used up (%d MiB), and this %s, with what it started the one growing (by %d MiB in %s, to %d MiB), was killed", total>>20, used>>20, v.what, min(v.grew, used)>>20, over, min(v.rss, used)>>20))
	} else {
		log.Warn("sandbox nearly out of memory; killing its largest process tree", "what", v.what, "pid", v.pid, "rss_mib", v.rss>>20, "used_mib", used>>20, "anon_mib", mi.anon>>20)
		v.kill(fmt.Sprintf("out_of_memory: the sandbox's %d MiB were nearly used up (%d MiB), and this %s, with what it started the largest user (%d MiB), was killed", total>>20, used>>20, v.what, min(v.rss, used)>>20))
	}
	w.killedAt = time.Now() // a kill can take a while: the grace starts after it
	w.looks = nil
	return grew
}

// The watch tells which tree grows by its sizes over the last
// memGrowWindow (at least memGrowSample): when a tree must go, one that
// grows by memGrowerRate or faster goes before a larger one that holds
// still (memVictim), so a kernel holding a large frame survives the
// command that fills the rest of the sandbox.
const (
	memGrowWindow = time.Second
	memGrowSample = 100 * time.Millisecond
	memGrowerRate = 16 << 20 // bytes per second
	// memEarlyLook is how often the watch takes the trees' sizes while
	// what is held is high but not yet close to a kernel's limit.
	memEarlyLook = memGrowWindow / 2
	// memMinKill is the least a tree must hold to be killed: killing a
	// smaller one frees nothing that matters. A sandbox whose memory is
	// files in /dev/shm had small commands killed one after another (what
	// a kill could free was small, so a quarter of it was smaller still).
	memMinKill = 32 << 20
)

// unitLook is the size of each tree (by memUnit.key) at one look.
type unitLook struct {
	at  time.Time
	rss map[int64]int64
	own map[int64]int64 // a kernel's own process (memUnit.own)
}

// growth sets each unit's grew and rate, from the earliest look kept
// within memGrowWindow, or the last one when none is (at the watch's slow
// pace, a second ago; a tree not in it grew by all it holds), and keeps
// this look. since is when that earlier look was; seen is false when there
// was none.
func (w *memWatch) growth(units []memUnit, now time.Time) (since time.Time, seen bool) {
	if n := len(w.looks); n > 1 {
		last := w.looks[n-1]
		w.looks = slices.DeleteFunc(w.looks[:n-1], func(l unitLook) bool { return now.Sub(l.at) > memGrowWindow })
		w.looks = append(w.looks, last)
	}
	if len(w.looks) > 0 {
		seen = true
		first := w.looks[0]
		since = first.at
		dt := max(now.Sub(since), memGrowSample).Seconds()
		for i := range units {
			units[i].grew = units[i].rss - first.rss[units[i].key]
			units[i].rate = float64(units[i].grew) / dt
			if o, ok := first.own[units[i].key]; ok {
				units[i].ownGrew = units[i].own - o
			}
		}
	}
	l := unitLook{at: now, rss: make(map[int64]int64, len(units)), own: map[int64]int64{}}
	for _, u := range units {
		l.rss[u.key] = u.rss
		if u.kernel != nil {
			l.own[u.key] = u.own
		}
	}
	w.looks = append(w.looks, l)
	return since, seen
}

// memUnit is a process tree the watch may kill when the sandbox nearly
// runs out: a kernel or an owner (guardMemory) with what it started, or
// the processes of a mark whose owner is gone.
type memUnit struct {
	what string // "kernel", or the owner's kind
	pid  int    // the tree's first process, for the log
	key  int64  // the tree's mark, or minus its kernel's pid: the same from look to look
	rss  int64
	grew int64   // since the watch's earlier look (memWatch.growth)
	rate float64 // grew per second
	kill func(why string)
	// A kernel's tree: its kernel, and what the kernel process itself
	// holds (with its shell, for a shell's kernel); the rest is what its
	// cells started.
	kernel  *kernelProc
	own     int64
	ownGrew int64 // how much of grew is the kernel process's own
}

// children reports whether what u's kernel started, rather than the
// kernel, holds most of u: then those go, and the kernel with its
// variables lives on (a plotly figure's Chromium, a subprocess filling
// the sandbox). Should the kernel itself go on growing, the next kill
// takes it.
func (u *memUnit) children() bool {
	// Not while the kernel itself is what grows: killing what it holds
	// still would free little, and it would go on.
	return u.kernel != nil && u.rss-u.own > u.rss/2 && !(u.grew > 0 && u.ownGrew > u.grew/2)
}

// memVictim picks, in a sandbox past its pressure level, the process tree
// to kill, if it is time to kill one: when the largest (a kernel with what
// its cells started, an exec, a background process, a terminal, or what
// one of those left behind)
//   - holds at least half of what is used, and what gVisor cannot give
//     back (anon, see memInfo) is past floor (a kernel's limit): a kernel
//     reading a large file fills the file cache, which gVisor drops as it
//     needs room;
//   - or else once anon is past the pressure level too, if the tree holds
//     at least a quarter of what a kill could free (anon without the files
//     in memory, shmem): in a sandbox with several kernels (each a
//     warmed-up Python of 150 MiB or more) a command filling it holds less
//     than half of what is used when it reaches the level, and without
//     this rule went on until the whole sandbox was stopped.
//
// Short of that, what is used may be file cache, files in memory no kill
// would free, or many trees each holding a little, and the sandbox may
// level off below its limit: the watch waits. The tree killed is then the
// one that grows the fastest, by memGrowerRate or more, if it holds at
// least a quarter of what a kill could free: it is what brings the sandbox
// to its limit, and a larger tree that holds still (a kernel and its
// variables) lives on; a small one just started (a kernel, whose start
// counts as growth) is not worth a kill that would not free the sandbox.
// Otherwise the largest. A tree under memMinKill is never killed. The growth picks the tree only, never the
// moment: a rule that killed the tree growing fastest near the limit,
// whatever the rest held, killed a kernel starting in a sandbox whose file
// cache had filled it. grew is left zero in the tree returned when it is
// not the one growing.
func memVictim(units []memUnit, used, anon, shmem, floor, pressure int64) *memUnit {
	var v, g *memUnit
	for i := range units {
		if v == nil || units[i].rss > v.rss {
			v = &units[i]
		}
		if g == nil || units[i].rate > g.rate {
			g = &units[i]
		}
	}
	switch {
	case v == nil || v.rss < memMinKill:
		return nil
	case v.rss >= used/2 && anon > floor:
	case anon > pressure && v.rss >= (anon-shmem)/4:
	default:
		return nil
	}
	if g.rate >= memGrowerRate && g.rss >= (anon-shmem)/4 && g.rss >= memMinKill {
		return g
	}
	v.grew = 0
	return v
}

// memUnits sums the resident memory of each process tree (pages shared
// between its processes, as Chromium's are, count in each: gVisor tells
// no process's share, so a tree may seem larger than the sandbox, and the
// kill notes say no more than what is used): by mark (every
// process the agent started, and all that started, carries its tree's
// mark), or, for a kernel without one (an agent not running as root, in
// tests), by parent links.
func (cs *Contexts) memUnits(procs []*kernelProc, pf *procFiles) []memUnit {
	byMark := map[uint32]int64{}
	first := map[uint32]int{}
	scanStatus(time.Time{}, func(pid int, st procStatus) {
		if m := st.mark(); m != 0 {
			byMark[m] += st.rss
			if first[m] == 0 || pid < first[m] {
				first[m] = pid
			}
		}
	})
	var units []memUnit
	for _, k := range procs {
		u := memUnit{what: "kernel", pid: k.Pid(), key: -int64(k.Pid()), kill: k.killForMemory, kernel: k}
		u.own, _ = pf.rss(k)
		if k.shell {
			for _, c := range childrenOf(k.Pid()) {
				n, _ := rss(c)
				u.own += n
			}
		}
		if m := k.p.Mark; m != 0 {
			u.key = int64(m)
			u.rss = byMark[m]
			delete(byMark, m)
		} else {
			u.rss, _ = pf.rss(k)
			below, _ := descendants(k.Pid(), time.Time{})
			for _, d := range below {
				n, _ := rss(d)
				u.rss += n
			}
		}
		units = append(units, u)
	}
	cs.mu.Lock()
	for m, o := range cs.owners {
		if n, ok := byMark[m]; ok {
			units = append(units, memUnit{what: o.what, pid: first[m], key: int64(m), rss: n, kill: o.killForMemory})
			delete(byMark, m)
		}
	}
	cs.mu.Unlock()
	for m, n := range byMark {
		units = append(units, memUnit{what: "process tree", pid: first[m], key: int64(m), rss: n, kill: func(string) { KillTree(0, m) }})
	}
	return units
}
