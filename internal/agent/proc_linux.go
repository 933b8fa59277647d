//go:build linux

package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// Reaper starts the agent's commands and waits for them to exit.
//
// As PID 1 the agent must also reap orphans that the kernel re-parents to it,
// which takes a wait4(-1) loop; such a loop would steal the status of a child
// that something else waits for by pid. So in central mode one goroutine does
// all the waiting and hands each status to whoever started that pid. Every
// child of the agent must then be started through the Reaper (never os/exec).
// A nil *Reaper waits for each child by pid, for processes that are not PID 1.
type Reaper struct {
	log *slog.Logger
	// mu is held across each fork and its registration, and across each
	// reaping pass, so a child is never reaped before it is registered: no
	// status has to be kept for a late registration, and a recycled pid can
	// never pick up a dead process's status.
	mu      sync.Mutex
	waiters map[int]chan ExitStatus
}

// StartReaper starts the central reaper. Call it once, early, when running as
// PID 1; it runs for the life of the process.
func StartReaper(log *slog.Logger) *Reaper {
	if log == nil {
		log = discardLogger()
	}
	r := &Reaper{log: log, waiters: make(map[int]chan ExitStatus)}
	markReaper = r
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		r.reap() // children that exited before Notify took effect
		for range sigs {
			r.reap()
		}
	}()
	return r
}

// reap collects every exited child. SIGCHLDs coalesce, so it loops until
// none is left.
func (r *Reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- statusOf(ws)
		} else {
			r.log.Debug("reaped orphan", "pid", pid, "status", statusOf(ws).String())
		}
	}
}

// Start starts a process like os.StartProcess. Its exit status arrives on
// the returned Process's Done channel.
func (r *Reaper) Start(path string, argv []string, attr *os.ProcAttr) (*Process, error) {
	mark := newTreeMark()
	a := *attr
	if a.Env == nil {
		a.Env = os.Environ()
	}
	a.Env = append(a.Env[:len(a.Env):len(a.Env)], TreeMarkEnv+"="+mark)
	attr = &a
	if r == nil {
		p, err := os.StartProcess(path, argv, attr)
		if err != nil {
			return nil, err
		}
		done := make(chan ExitStatus, 1)
		go func() {
			st, err := p.Wait()
			if err != nil {
				done <- ExitStatus{Code: -1}
				return
			}
			done <- statusOf(st.Sys().(syscall.WaitStatus))
		}()
		return &Process{Pid: p.Pid, Done: done, Mark: mark}, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := os.StartProcess(path, argv, attr)
	if err != nil {
		return nil, err
	}
	pid := p.Pid
	p.Release()
	ch := make(chan ExitStatus, 1)
	r.waiters[pid] = ch
	return &Process{Pid: pid, Done: ch, Mark: mark}, nil
}

func statusOf(ws syscall.WaitStatus) ExitStatus {
	if ws.Signaled() {
		return ExitStatus{Code: -1, Signal: signalName(ws.Signal())}
	}
	return ExitStatus{Code: ws.ExitStatus()}
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
	syscall.SIGILL: "SIGILL", syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT",
	syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE", syscall.SIGKILL: "SIGKILL",
	syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
	syscall.SIGXCPU: "SIGXCPU", syscall.SIGXFSZ: "SIGXFSZ", syscall.SIGSYS: "SIGSYS",
}

func signalName(s syscall.Signal) string {
	if n, ok := signalNames[s]; ok {
		return n
	}
	return "SIG" + strconv.Itoa(int(s))
}

// procAttr puts the command in its own process group and, when the agent is
// root, drops to the sandbox user unless asRoot.
func procAttr(asRoot bool) *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setpgid: true}
	if runningAsRoot() && !asRoot {
		a.Credential = &syscall.Credential{Uid: agentproto.UserUID, Gid: agentproto.UserGID, Groups: []uint32{}}
	}
	return a
}

// KillTree SIGKILLs pid's process group, every descendant of pid, also
// those that left the group with setsid, and every process that carries
// mark (Process.Mark) in its environment: those re-parented to PID 1 (a
// daemon's double fork, the jobs of a shell that exited), which no parent
// link leads to. It stops them first and looks again until no new process
// shows up, so nothing can fork its way out. pid 0 (a process already
// reaped, whose pid may be reused) kills by mark alone. A process that
// clears its environment and leaves the tree escapes.
//
// A tree that outruns the search (a fork bomb: under gVisor a stop sent to
// a group misses the children of clones under way, and a scan of /proc
// takes seconds while hundreds of processes fork; the search has
// treeSearchBudget) is killed instead: what was found, then the group until
// none of it is left (killGroupFor at most), then by mark until no process
// has it (20 rounds at most). Only a process that left both the group and
// the marked environment, and whose parents live, then escapes too.
func KillTree(pid int, mark string) {
	seen := map[int]bool{}
	if pid > 0 {
		syscall.Kill(pid, syscall.SIGSTOP)
		seen[pid] = true
	}
	searchEnd := time.Now().Add(treeSearchBudget)
	outrun := true
	for range 20 {
		if pid > 0 {
			stopGroup(pid)
		}
		var found []int
		if pid > 0 {
			var whole bool
			if found, whole = descendants(pid, searchEnd); !whole {
				break
			}
		}
		added := false
		for _, p := range append(found, marked(mark)...) {
			if !seen[p] {
				seen[p] = true
				syscall.Kill(p, syscall.SIGSTOP)
				added = true
			}
		}
		if !added {
			outrun = false
			break
		}
		if time.Now().After(searchEnd) {
			break
		}
	}
	if !outrun {
		// Everything is stopped: no clone is under way.
		if pid > 0 {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
		for p := range seen {
			syscall.Kill(p, syscall.SIGKILL)
		}
		return
	}
	// The parents first: a member of the group whose parent left it and
	// was only stopped stays a zombie, and in the group, until it dies.
	for p := range seen {
		syscall.Kill(p, syscall.SIGKILL)
	}
	if pid > 0 {
		killGroup(pid)
	}
	for i := 0; i < 20; i++ {
		left := marked(mark)
		for _, p := range left {
			syscall.Kill(p, syscall.SIGKILL)
		}
		if len(left) == 0 {
			return
		}
	}
}

// treeSearchBudget bounds KillTree's search of the tree before it kills
// what it found and goes on by group and mark: one search takes 10-50 ms.
const treeSearchBudget = time.Second

// groupStops is how many times stopGroup stops a process group.
const groupStops = 5

// stopGroup stops pid's process group, a few times over: a member that was
// forking while one stop went out can give a child that escapes it.
func stopGroup(pid int) {
	for range groupStops {
		if syscall.Kill(-pid, syscall.SIGSTOP) != nil {
			return // no such group
		}
		time.Sleep(time.Millisecond)
	}
}

// killGroup SIGKILLs pid's process group until none of it is left: a
// child that a clone under way gave after one kill is in the group, and
// the next kills it. It gives up after killGroupFor.
func killGroup(pid int) {
	end := time.Now().Add(killGroupFor)
	look := time.Now().Add(groupLookAfter)
	for time.Now().Before(end) {
		if syscall.Kill(-pid, syscall.SIGKILL) != nil {
			return // none left
		}
		if time.Now().After(look) {
			if !groupLives(pid) {
				return // only its dead, whom their reaper has yet to collect
			}
			look = time.Now().Add(groupLookAfter)
		}
		time.Sleep(time.Millisecond)
	}
}

// groupLookAfter is how often killGroup looks whether the group still has
// a living member: a zombie also answers a kill.
const groupLookAfter = 100 * time.Millisecond

// groupLives reports whether a process of group pgid is alive (not a
// zombie).
func groupLives(pgid int) bool {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true
	}
	want := strconv.Itoa(pgid)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f, ok := statFields(pid); ok && len(f) > 2 && f[0] != "Z" && f[0] != "X" && f[2] == want {
			return true
		}
	}
	return false
}

// killGroupFor bounds killGroup.
const killGroupFor = 5 * time.Second

// TreeMarkEnv names the variable Reaper.Start puts in every process it
// starts (Process.Mark).
const TreeMarkEnv = "PANDASTACK_TREE"

// MarkedArg makes the agent binary print the pids of the processes that
// carry the mark given after it, one per line, and exit: run as the
// sandbox user, for an agent that may not read that user's environ
// (inside gVisor root has no CAP_SYS_PTRACE).
const MarkedArg = "--pandastack-marked"

var treeMarks atomic.Uint64

// markReaper starts the helper of marked in central mode (StartReaper).
var markReaper *Reaper

// newTreeMark returns a mark no other process of this agent has had (a
// restored sandbox's agent goes on counting from its checkpoint).
func newTreeMark() string { return strconv.FormatUint(treeMarks.Add(1), 36) }

// marked lists the processes whose environment holds mark, as
// TreeMarkEnv=mark; none for "". Those whose environment this process may
// not read (the sandbox user's: inside gVisor root has no CAP_SYS_PTRACE)
// are asked of a helper running as that user or, when the helper cannot
// run (the user's processes fill the process table), read on a thread of
// this process that is that user for the while.
func marked(mark string) []int {
	if mark == "" {
		return nil
	}
	out, denied := scanMarked(mark)
	if denied && runningAsRoot() {
		more, ok := markedAsUser(mark)
		if !ok {
			more = scanMarkedAsUser(mark)
		}
		out = append(out, more...)
	}
	return out
}

// PrintMarked is the helper's work (MarkedArg).
func PrintMarked(w io.Writer, mark string) {
	pids, _ := scanMarked(mark)
	for _, p := range pids {
		fmt.Fprintln(w, p)
	}
}

// markedAsUser runs this binary with MarkedArg as the sandbox user; ok is
// false when it could not start or did not finish its work (a Go program
// that may not start a thread dies).
func markedAsUser(mark string) (_ []int, ok bool) {
	exe, err := os.Executable()
	if err != nil {
		return nil, false
	}
	rd, wr, err := os.Pipe()
	if err != nil {
		return nil, false
	}
	defer rd.Close()
	p, err := markReaper.Start(exe, []string{exe, MarkedArg, mark}, &os.ProcAttr{Files: []*os.File{nil, wr, nil}, Sys: procAttr(false)})
	wr.Close()
	if err != nil {
		return nil, false
	}
	b, _ := io.ReadAll(io.LimitReader(rd, 1<<20))
	if st := <-p.Done; st.Code != 0 {
		return nil, false
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != p.Pid {
			out = append(out, pid)
		}
	}
	return out, true
}

// scanMarked reads every process's environ, but this one's; denied says
// some could not be read.
func scanMarked(mark string) (out []int, denied bool) {
	want := []byte(TreeMarkEnv + "=" + mark + "\x00")
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, false
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			denied = denied || errors.Is(err, os.ErrPermission)
			continue
		}
		if bytes.HasPrefix(env, want) || bytes.Contains(env, append([]byte{0}, want...)) {
			out = append(out, pid)
		}
	}
	return out, denied
}

// scanMarkedAsUser is scanMarked on a thread of this process that takes
// the sandbox user's real and effective ids meanwhile (the saved ones stay
// root's, to take back), for when a tree that forks without end holds
// every process the user may have and the helper cannot start its
// threads. The real uid is what lets it read their environ, and it also
// lets the user's processes signal that one thread meanwhile: never the
// main thread, whose ids a signal to PID 1 is checked against, so at worst
// the user's code stops or kills its own sandbox's agent, as filling the
// sandbox's memory does.
func scanMarkedAsUser(mark string) []int {
	out := make(chan []int, 1)
	go func() {
		// Locked, the thread never runs other goroutines; the runtime
		// makes new threads from one of its own, not from this one. A
		// thread whose ids could not be set back ends with this goroutine.
		runtime.LockOSThread()
		if syscall.Gettid() == os.Getpid() {
			// Held here, the main thread cannot run the next try.
			out <- scanMarkedAsUser(mark)
			runtime.UnlockOSThread()
			return
		}
		if setThreadIDs(agentproto.UserUID, agentproto.UserGID) != nil {
			if setThreadIDs(0, 0) == nil {
				runtime.UnlockOSThread()
			}
			out <- nil
			return
		}
		pids, _ := scanMarked(mark)
		if setThreadIDs(0, 0) == nil {
			runtime.UnlockOSThread()
		}
		out <- pids
	}()
	return <-out
}

// setThreadIDs sets the real and effective uid and gid of the calling
// thread alone (the syscall package's Setresuid sets every thread's),
// keeping the saved ones, which are root's. Leaving root the gid goes
// first, while the thread still has the capability to set it.
func setThreadIDs(uid, gid int) error {
	set := func(nr uintptr, id int) error {
		if _, _, e := syscall.RawSyscall(nr, uintptr(id), uintptr(id), ^uintptr(0)); e != 0 {
			return e
		}
		return nil
	}
	if uid == 0 {
		if err := set(syscall.SYS_SETRESUID, uid); err != nil {
			return err
		}
		return set(syscall.SYS_SETRESGID, gid)
	}
	if err := set(syscall.SYS_SETRESGID, gid); err != nil {
		return err
	}
	return set(syscall.SYS_SETRESUID, uid)
}

// descendants lists the processes below root by their /proc parent links.
// whole is false when the scan was given up at end (never for a zero end).
func descendants(root int, end time.Time) (_ []int, whole bool) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, true
	}
	kids := make(map[int][]int)
	for i, e := range ents {
		if i%32 == 0 && !end.IsZero() && time.Now().After(end) {
			return nil, false
		}
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(pid); ok {
			kids[ppid] = append(kids[ppid], pid)
		}
	}
	// Parent links read while processes come and go, their pids reused,
	// can form a loop: each pid is taken once.
	var out []int
	seen := map[int]bool{root: true}
	queue := []int{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, k := range kids[p] {
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
				queue = append(queue, k)
			}
		}
	}
	return out, true
}

// statFields reads /proc/<pid>/stat, "pid (comm) state ppid pgrp ...",
// and returns the fields after comm (state first). comm may hold spaces
// and parentheses, so they start after the last ')'.
func statFields(pid int) ([]string, bool) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, false
	}
	return strings.Fields(s[i+1:]), true
}

// parentOf reads pid's ppid.
func parentOf(pid int) (int, bool) {
	f, ok := statFields(pid)
	if !ok || len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(f[1])
	return ppid, err == nil
}
