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

// meminfo returns MemTotal and MemAvailable in bytes.
func meminfo() (total, avail int64, err error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	return parseMeminfo(b)
}

func parseMeminfo(b []byte) (total, avail int64, err error) {
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
			total = n << 10
		case "MemAvailable:":
			avail = n << 10
		}
	}
	if total == 0 {
		return 0, 0, fmt.Errorf("/proc/meminfo has no MemTotal")
	}
	return total, avail, nil
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

func (pf *procFiles) readMeminfo() (total, avail int64, err error) {
	b, err := pf.read("/proc/meminfo", &pf.meminfo)
	if err != nil {
		return 0, 0, err
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

// watchMemory runs the memory watch for the life of the agent.
func (cs *Contexts) watchMemory(log *slog.Logger) {
	total, _, err := meminfo()
	if err != nil {
		log.Warn("no memory watch for kernels", "err", err)
		return
	}
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
		cs.checkMemory(&w, total, perKernel, pressure, log)
		if kicked || w.hot {
			t.Reset(memWatchPeriod)
		} else {
			t.Reset(cs.memWatchPace())
		}
	}
}

// memWatchPace is how long the watch waits for its next look: the busy
// pace while a cell runs, a slow one otherwise. Polling /proc every 25 ms
// cost an idle sandbox about 8 % of a CPU in gVisor, which kept it from
// ever counting as idle (idle suspend wants under 5 %). A cell's start
// wakes the watch at once (wakeMemoryWatch), so a fast allocation is seen
// at the busy pace from its first moment; memory grown with no cell
// running (a thread a cell left behind, an exec) is seen within the slow
// period.
func (cs *Contexts) memWatchPace() time.Duration {
	if cs.anyBusy() {
		return memWatchPeriod
	}
	return memWatchIdlePeriod
}

// memGrowthMin is how much a kernel must have grown since the watch's
// previous look to count as one filling the sandbox (pressureLook). At the
// busy pace a fast allocation grows by some 30 MiB between looks.
const memGrowthMin = 8 << 20

// pressureGrace bounds how long the watch waits for a kernel it killed for
// the sandbox's pressure to exit: until then its memory is still used, and
// only another kernel seen filling the sandbox is killed, not one for
// being the largest.
const pressureGrace = time.Second

// memWatch is the watch's state between its looks; only its goroutine
// uses it.
type memWatch struct {
	pf  procFiles
	own map[*kernelProc]int64 // each kernel's resident memory at the previous look
	// tree holds, when the previous look found the sandbox near its limit
	// (used past a kernel's limit), the resident memory of each kernel with
	// what it started: near the limit the watch reads it on every look, so
	// that a process a cell started is seen growing too.
	tree map[*kernelProc]int64
	// hot: at the previous look the sandbox was near its limit and had
	// grown since the look before: the watch looks at the busy pace, a cell
	// running or not.
	hot bool
	// used is what the sandbox used at the previous look, if usedOK.
	used   int64
	usedOK bool
	// dying is the kernel killed by a pressure look, until it exits or
	// pressureGrace has passed since dyingAt.
	dying   *kernelProc
	dyingAt time.Time
}

// kernelUse is what a kernel holds when the sandbox is nearly out.
type kernelUse struct {
	k    *kernelProc
	tree int64 // resident memory of the kernel and what it started
	grew int64 // growth since the watch's previous look (of its tree when both looks read it)
}

// pressureLook is what the watch knows when the sandbox as a whole has
// used nearly all its memory.
type pressureLook struct {
	uses       []kernelUse
	used       int64 // the sandbox's used memory
	grown      int64 // how much that grew since the previous look
	grownKnown bool
	dying      *kernelProc // killed by an earlier look, not yet gone
}

// victim picks the kernel to kill: the one filling the sandbox (of those
// that grew by memGrowthMin or more since the previous look, and by at
// least half of what the sandbox grew, the one that grew most), else,
// with no kernel dying already, the largest if it holds at least half of
// what is used. Memory held or filled elsewhere (an exec) is no kernel's
// fault; a kernel that only holds its state is not killed for another's
// allocation (the largest was, before the first rule, and a second kernel
// holding less than half while it allocated was left to take the whole
// sandbox past its limit). ok is false when no kernel is to blame.
func (l pressureLook) victim() (v kernelUse, filling, ok bool) {
	for _, u := range l.uses {
		if u.k == l.dying || u.grew < memGrowthMin || (l.grownKnown && 2*u.grew < l.grown) {
			continue
		}
		if !filling || u.grew > v.grew {
			v, filling = u, true
		}
	}
	if filling || l.dying != nil {
		return v, filling, filling
	}
	for _, u := range l.uses {
		if u.tree > v.tree {
			v = u
		}
	}
	return v, false, v.k != nil && v.tree >= l.used/2
}

// treeRSS is the resident memory of k's process (own) and of what it
// started.
func treeRSS(k *kernelProc, own int64) int64 {
	below, _ := descendants(k.Pid(), time.Time{})
	for _, d := range below {
		m, _ := rss(d)
		own += m
	}
	return own
}

// checkMemory is one look of the watch.
func (cs *Contexts) checkMemory(w *memWatch, total, perKernel, pressure int64, log *slog.Logger) {
	cs.mu.Lock()
	procs := make([]*kernelProc, 0, len(cs.procs))
	for k := range cs.procs {
		procs = append(procs, k)
	}
	cs.mu.Unlock()
	pf := &w.pf
	pf.keep(procs)
	prevOwn, prevTree := w.own, w.tree
	w.own, w.tree = make(map[*kernelProc]int64, len(procs)), nil
	if len(procs) == 0 {
		w.hot, w.usedOK, w.dying = false, false, nil
		return
	}
	var over *kernelProc
	for _, k := range procs {
		n, err := pf.rss(k)
		if err != nil {
			continue
		}
		w.own[k] = n
		if n > perKernel && over == nil {
			over = k
		}
	}
	if over != nil {
		n := w.own[over]
		w.usedOK = false
		log.Warn("kernel over its memory limit; killing it", "pid", over.Pid(), "rss_mib", n>>20, "limit_mib", perKernel>>20)
		over.killForMemory(fmt.Sprintf("out_of_memory: the kernel used %d MiB, more than its limit of %d MiB in this %d MiB sandbox, and was killed", n>>20, perKernel>>20, total>>20))
		return
	}
	_, avail, err := pf.readMeminfo()
	if err != nil {
		w.hot, w.usedOK = false, false
		return
	}
	used := total - avail
	look := pressureLook{used: used, grown: used - w.used, grownKnown: w.usedOK}
	w.used, w.usedOK = used, true
	near := used > perKernel
	w.hot = near && (!look.grownKnown || look.grown >= memGrowthMin)
	if !near {
		w.dying = nil
		return
	}
	w.tree = make(map[*kernelProc]int64, len(w.own))
	for _, k := range procs {
		n, ok := w.own[k]
		if !ok {
			continue
		}
		u := kernelUse{k: k, tree: treeRSS(k, n)}
		w.tree[k] = u.tree
		if before, ok := prevTree[k]; ok {
			u.grew = u.tree - before
		} else if before, ok := prevOwn[k]; ok {
			u.grew = n - before
		}
		look.uses = append(look.uses, u)
	}
	if used <= pressure {
		return
	}
	if w.dying != nil {
		select {
		case <-w.dying.Done():
			w.dying = nil
		default:
			if time.Since(w.dyingAt) >= pressureGrace {
				w.dying = nil
			}
		}
	}
	look.dying = w.dying
	v, filling, ok := look.victim()
	if !ok {
		return
	}
	w.dying, w.dyingAt = v.k, time.Now()
	if filling {
		log.Warn("sandbox nearly out of memory; killing the kernel filling it", "pid", v.k.Pid(), "rss_mib", v.tree>>20, "grew_mib", v.grew>>20, "used_mib", used>>20)
		v.k.killForMemory(fmt.Sprintf("out_of_memory: the sandbox's %d MiB were nearly used up (%d MiB), and this kernel, which was filling it (%d MiB with what it started), was killed", total>>20, used>>20, v.tree>>20))
		return
	}
	log.Warn("sandbox nearly out of memory; killing its largest kernel", "pid", v.k.Pid(), "rss_mib", v.tree>>20, "used_mib", used>>20)
	v.k.killForMemory(fmt.Sprintf("out_of_memory: the sandbox's %d MiB were nearly used up (%d MiB), and this kernel, with what it started the largest user (%d MiB), was killed", total>>20, used>>20, v.tree>>20))
}
