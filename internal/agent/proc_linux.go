//go:build linux

package agent

import (
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
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
	// wait4, so a child is never reaped before it is registered: no
	// status has to be kept for a late registration, and a recycled pid can
	// never pick up a dead process's status.
	mu      sync.Mutex
	waiters map[int]chan ExitStatus
	wait4   func(pid int, ws *syscall.WaitStatus, options int, ru *syscall.Rusage) (int, error) // syscall.Wait4; a test's fake
}

// StartReaper starts the central reaper. Call it once, early, when running as
// PID 1; it runs for the life of the process.
func StartReaper(log *slog.Logger) *Reaper {
	if log == nil {
		log = discardLogger()
	}
	r := &Reaper{log: log, waiters: make(map[int]chan ExitStatus), wait4: syscall.Wait4}
	treeLog = log
	reapsOrphans.Store(true)
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
// none is left. It lets go of mu between two children: the orphans of a
// fork bomb die as fast as they are reaped, and a pass holding mu
// throughout never ended, so no command could start (Go's mutex hands
// itself to a waiter that waited for a millisecond).
func (r *Reaper) reap() {
	for r.reapOne() {
	}
}

// reapOne reaps one exited child, if any; false when none is left.
func (r *Reaper) reapOne() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ws syscall.WaitStatus
	pid, err := r.wait4(-1, &ws, syscall.WNOHANG, nil)
	if err == syscall.EINTR {
		return true
	}
	if err != nil || pid <= 0 {
		return false
	}
	if ch, ok := r.waiters[pid]; ok {
		delete(r.waiters, pid)
		ch <- statusOf(ws)
	} else {
		r.log.Debug("reaped orphan", "pid", pid, "status", statusOf(ws).String())
	}
	return true
}

// Start starts a process like os.StartProcess. Its exit status arrives on
// the returned Process's Done channel.
func (r *Reaper) Start(path string, argv []string, attr *os.ProcAttr) (*Process, error) {
	var mark uint32
	if runningAsRoot() {
		mark = newTreeMark()
		a := *attr
		a.Sys = withMark(a.Sys, mark)
		attr = &a
	}
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
// mark (Process.Mark, a supplementary group): those re-parented to PID 1
// (a daemon's double fork, the jobs of a shell that exited), which no
// parent link leads to. It stops them first and looks again until no new
// process shows up, so nothing can fork its way out. pid 0 (a process
// already reaped, whose pid may be reused) kills by mark alone.
//
// A tree that outruns the search (a fork bomb: under gVisor a stop sent to
// a group misses the children of clones under way, and a scan of /proc
// takes seconds while hundreds of processes fork; the search has
// treeSearchBudget) is killed instead. In a sandbox every process of the
// sandbox user is stopped first, then what was found, the group and what
// carries the mark are killed, and the user's other processes go on
// (killMarkedFrozen): a bomb whose processes each leave the group, by
// setsid, forks too fast to be found otherwise. Then, and on a host
// instead, the group is killed until none of it is left (killGroupFor at
// most), and on a host then by mark until no process has it (20 rounds at
// most).
func KillTree(pid int, mark uint32) { killTree(pid, mark, nil) }

// KillGroupNow SIGKILLs process group pgid once, without KillTree's stop
// and search: for a process known to have started nothing that could
// outrun it, whose death a caller waits on (a spare kernel shut down for a
// fork), before the KillTree that still follows.
func KillGroupNow(pgid int) {
	if pgid > 0 {
		syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

// KillDescendants is KillTree for what pid started (its descendants and
// the other processes that carry mark), pid itself left running: for a
// kernel whose cell its children hold up (a fork bomb that starves it).
// pid's process group, which it leads, is neither stopped nor killed:
// what is in it is found one by one. spareChildren spares pid's own
// children too (a shell's kernel: the shell that runs its cells, whose
// variables are the context's), and kills what they started.
func KillDescendants(pid int, mark uint32, spareChildren bool) {
	keep := []int{pid}
	if spareChildren {
		// Stopped meanwhile: a shell with job control would see its job
		// stopped and report it so, where it should see it killed.
		kids := childrenOf(pid)
		for _, k := range kids {
			syscall.Kill(k, syscall.SIGSTOP)
		}
		// A stop takes effect a moment after it is sent: a shell still
		// running when its job was stopped reported "Stopped" (seen
		// under the load of a full test run).
		waitStopped(kids, kidsStopWait)
		defer func() {
			for _, k := range kids {
				syscall.Kill(k, syscall.SIGCONT)
			}
		}()
		keep = append(keep, kids...)
	}
	killTree(pid, mark, keep)
}

// kidsStopWait bounds KillDescendants' wait for the children it stops (a
// wait that ends as soon as they are; 200 ms was too short under the load
// of a full test run, and a shell's "[1]+ Stopped" came through).
const kidsStopWait = time.Second

// waitStopped waits until each of pids is stopped or gone, for limit at
// most.
func waitStopped(pids []int, limit time.Duration) {
	end := time.Now().Add(limit)
	for _, p := range pids {
		for {
			st, ok := readStatus(strconv.Itoa(p))
			if !ok || st.stopped() || !st.living() || time.Now().After(end) {
				break
			}
			time.Sleep(200 * time.Microsecond)
		}
	}
}

// reapsOrphans says that the central reaper runs (StartReaper): the
// orphans of a killed tree come to this process to be reaped. Elsewhere
// (the agent's tests on a host) whoever they come to may leave them.
var reapsOrphans atomic.Bool

// awaitReaped waits, for limit at most, until no process that carries
// mark is left: for after a KillTree of mark's tree. Killed processes stay
// zombies until the reaper has them, a fork bomb's for a moment: listed
// by ps, and counted against the user's process limit, so the command
// after a timed-out one saw a hundred of them, or failed to fork. Only
// with the central reaper (reapsOrphans); call it holding no lock, since
// a tree that outlived its kill makes it wait its whole limit.
func awaitReaped(mark uint32, limit time.Duration) {
	if mark == 0 || !reapsOrphans.Load() {
		return
	}
	end := time.Now().Add(limit)
	for {
		left := false
		whole := scanStatus(end, func(pid int, st procStatus) {
			if st.has(mark) {
				left = true
			}
		})
		if whole && !left || time.Now().After(end) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// killTree is KillTree, sparing keep (then pid's group is not killed).
func killTree(pid int, mark uint32, keep []int) {
	// A freeze's SIGCONT would let a tree stopped here go on before its kill.
	treeKills.RLock()
	locked := true
	defer func() {
		if locked {
			treeKills.RUnlock()
		}
	}()
	group := pid > 0 && len(keep) == 0
	seen := map[int]bool{}
	if group {
		syscall.Kill(pid, syscall.SIGSTOP)
		seen[pid] = true
	}
	start := time.Now()
	searchEnd := start.Add(treeSearchBudget)
	outrun := true
	for range 20 {
		if group {
			stopGroup(pid)
		}
		found, whole := searchRound(pid, mark, searchEnd)
		if !whole {
			break
		}
		added := false
		for _, p := range found {
			if !slices.Contains(keep, p) && !seen[p] {
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
		if group {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
		for p := range seen {
			syscall.Kill(p, syscall.SIGKILL)
		}
		return
	}
	// The parents first: a member of the group whose parent left it and
	// was only stopped stays a zombie, and in the group, until it dies.
	killFound := func() {
		for p := range seen {
			syscall.Kill(p, syscall.SIGKILL)
		}
		if group {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
	}
	treeKills.RUnlock()
	locked = false
	searched := time.Now()
	defer func() {
		treeLog.Info("tree outran its search", "pid", pid, "found", len(seen),
			"search_ms", searched.Sub(start).Milliseconds(), "kill_ms", time.Since(searched).Milliseconds())
	}()
	if froze, clean := killMarkedFrozen(mark, keep, killFound); froze {
		if group {
			killGroup(pid) // root's processes, which no freeze stops, and the dead
		}
		// Root's processes that carry the mark (a root exec's daemon),
		// which the freeze does not stop, and any of the user's it may
		// have missed: unless its last look saw none of either.
		if !clean {
			killMarkedUntil(mark, keep, time.Now().Add(afterFreezeBudget))
		}
		return
	}
	killFound()
	if group {
		killGroup(pid)
	}
	killMarkedUntil(mark, keep, time.Time{})
}

// killMarkedUntil kills the processes that carry mark, but keep, until
// none is left (20 rounds at most) or end (never for a zero end).
func killMarkedUntil(mark uint32, keep []int, end time.Time) {
	for range markRounds {
		left, whole := marked(mark, end)
		left = slices.DeleteFunc(left, func(p int) bool { return slices.Contains(keep, p) })
		for _, p := range left {
			syscall.Kill(p, syscall.SIGKILL)
		}
		if len(left) == 0 || !whole {
			return
		}
	}
}

// treeLog logs a tree kill that outran its search: the agent's log in
// central mode (StartReaper).
var treeLog = discardLogger()

// treeKills is held for reading by KillTree from the first stop of a tree
// to its kill, and for writing by a freeze (killMarkedFrozen): a freeze's
// SIGCONT would let a tree stopped meanwhile fork before its kill, and one
// freeze's would undo another's.
var treeKills sync.RWMutex

// markRounds bounds the rounds of killMarked and killMarkedFrozen.
const markRounds = 20

// freezeIDs are the uid and gid whose processes killMarkedFrozen stops:
// the sandbox user's in a sandbox's agent (FreezeUserOnKill); none on a
// host (the agent's tests), where other processes may have that uid.
// Tests set it.
var freezeIDs *[2]int

// FreezeUserOnKill lets KillTree stop every process of the sandbox user
// while it kills a tree that outran its search (killMarkedFrozen). For
// the agent of a sandbox (PID 1) alone: on a host other processes may have
// that uid.
func FreezeUserOnKill() { freezeIDs = &[2]int{agentproto.UserUID, agentproto.UserGID} }

// killMarkedFrozen stops every process of the user freezeIDs names, runs
// first (on a thread with this process's own ids: a tree may hold root's
// processes too), kills the user's processes that carry mark (but keep),
// and then lets the user's other processes go on (SIGCONT to each): the
// user's other commands, kernels and terminals stand still for that while
// (a job stopped on purpose, as by ^Z in a terminal, is continued too, and
// a terminal's shell continued before its foreground job may report that
// job stopped). Every round stops them all a few times over (as stopGroup
// does a group: a clone under way when one stop went out gives a child
// that runs on) until all are, then reads the status of each; 20 rounds
// and freezeBudget at most. The stops are sent from a thread that is the
// user for the while (asRealUser): kill(-1) from there reaches the user's
// processes alone; the continues come from this process's own thread
// after, by pid. It reports false when it could not (no freezeIDs, or the
// ids could not be taken) and did nothing. clean is true when its last
// look at every process was whole and saw every process of the user
// stopped, each status read, none of them carrying mark (but keep), and
// no process of another user (root's) carrying it: then nothing of the
// tree is left.
func killMarkedFrozen(mark uint32, keep []int, first func()) (froze, clean bool) {
	ids := freezeIDs
	if ids == nil {
		return false, false
	}
	treeKills.Lock()
	defer treeKills.Unlock()
	start := time.Now()
	end := start.Add(freezeBudget)
	rounds, killed := 0, 0
	lastClean := false // the last look's
	err := asRealUser(ids[0], ids[1], func() {
		// stopAll stops them and lists those that carry mark; left is
		// false when no process of the user is left.
		stopAll := func() (found []int, left bool) {
			for stopEnd := time.Now().Add(stopFor); ; {
				for range groupStops {
					if syscall.Kill(-1, syscall.SIGSTOP) != nil {
						lastClean = false // not looked at: root's may carry it
						return nil, false
					}
					time.Sleep(time.Millisecond)
				}
				// A process in the middle of a fork, an exec or its exit
				// stops only once out of it, and a bomb has some there at
				// any time: past stopFor the kill goes ahead all the same.
				u := userProcesses(ids[0], mark, end)
				lastClean = u.whole && u.running == 0 && u.unread == 0 && u.others == 0
				if u.running == 0 || !u.whole || time.Now().After(stopEnd) {
					return u.found, true
				}
			}
		}
		stopAll()
		done := make(chan struct{})
		go func() { // never on this locked thread
			first()
			close(done)
		}()
		<-done
		for range markRounds {
			rounds++
			found, left := stopAll()
			found = slices.DeleteFunc(found, func(p int) bool { return slices.Contains(keep, p) })
			if !left || len(found) == 0 {
				clean = lastClean
				return
			}
			for _, p := range found {
				syscall.Kill(p, syscall.SIGKILL)
			}
			killed += len(found)
			if time.Now().After(end) {
				return
			}
		}
	})
	if err != nil {
		return false, false
	}
	frozen := time.Now()
	continueAll(ids[0])
	treeLog.Info("froze the user to kill a tree", "rounds", rounds, "killed", killed, "clean", clean,
		"freeze_ms", frozen.Sub(start).Milliseconds(), "continue_ms", time.Since(frozen).Milliseconds())
	return true, clean
}

// KillUser SIGKILLs every process of the sandbox user (freezeIDs) but
// keep (the code contexts' kernels, say) and the children of
// keepChildrenOf (a shell kernel's shell), until no other is left. Like a
// freeze (killMarkedFrozen), each round first stops every process of the
// user from a thread that is the user (kill(-1), a few times over: a
// clone under way may give a child that runs on), then looks at them all
// while they stand still and kills those not kept. It ends after a clean
// look: whole, every status read, every process of the user stopped, none
// but the kept; a process caught in a fork or an exec, which stops only
// once out of it, makes another round. So a fork bomb cannot outrun it.
// The kept are continued after, by pid (and the children of
// keepChildrenOf, as /proc/<pid>/task/*/children lists them): not the
// user's other processes, which a freeze (continueAll) looks for in a
// scan of /proc that a bomb it could not stop in time starves for
// minutes; such a leftover stays stopped, counted in left, for the next
// kill. It gives up after markRounds rounds or freezeBudget. It answers
// the pids it killed and how many processes not kept it could still not
// rule out at its last look (those found were each sent a kill then; 0
// after a clean look), once the reaper has their zombies (killAnswerWait
// at most); ok is false when it could not (no freezeIDs, or the ids could
// not be taken) and did nothing.
func KillUser(keep, keepChildrenOf []int) (killed []int, left int, ok bool) {
	ids := freezeIDs
	if ids == nil {
		return nil, 0, false
	}
	spare := func(pid, ppid int) bool { return slices.Contains(keep, pid) || slices.Contains(keepChildrenOf, ppid) }
	dead := map[int]bool{}
	want := strconv.Itoa(ids[0])
	err := func() error {
		treeKills.Lock()
		defer treeKills.Unlock()
		end := time.Now().Add(freezeBudget)
		err := asRealUser(ids[0], ids[1], func() {
			for range markRounds {
				for range groupStops {
					if syscall.Kill(-1, syscall.SIGSTOP) != nil {
						left = 0 // none of the user's is left
						return
					}
					time.Sleep(time.Millisecond)
				}
				var victims []int
				running := 0
				whole, unread := scanStatusUnread(end, func(pid int, st procStatus) {
					if st.ruid != want || !st.living() {
						return
					}
					if !st.stopped() {
						running++
					}
					if !spare(pid, st.ppid) {
						victims = append(victims, pid)
					}
				})
				left = len(victims) + unread
				if !whole {
					left = max(left, 1)
				}
				if len(victims) == 0 && whole && unread == 0 && running == 0 {
					return // a clean look: none but the kept
				}
				for _, p := range victims {
					syscall.Kill(p, syscall.SIGKILL)
					dead[p] = true
				}
				if time.Now().After(end) {
					return
				}
			}
		})
		for _, pid := range keep {
			syscall.Kill(pid, syscall.SIGCONT)
		}
		for _, pid := range keepChildrenOf {
			for _, c := range childrenOf(pid) {
				syscall.Kill(c, syscall.SIGCONT)
			}
		}
		return err
	}()
	if err != nil {
		return nil, 0, false
	}
	// Their zombies count against the user's process limit until the
	// reaper has them: a command started right after the answer would
	// fail to fork. (A zombie whose parent is kept, a cell's child say,
	// is its parent's to collect.) Waited for without the lock, which
	// other kills take.
	for reaped := time.Now().Add(killAnswerWait); time.Now().Before(reaped); time.Sleep(5 * time.Millisecond) {
		kept, parents := map[int]bool{}, []int{}
		scanStatus(reaped, func(pid int, st procStatus) {
			if st.ruid != want {
				return
			}
			if spare(pid, st.ppid) {
				kept[pid] = true
			} else {
				parents = append(parents, st.ppid)
			}
		})
		if !slices.ContainsFunc(parents, func(pp int) bool { return !kept[pp] }) {
			break
		}
	}
	treeLog.Info("killed the sandbox user's processes", "killed", len(dead), "left", left)
	for p := range dead {
		killed = append(killed, p)
	}
	slices.Sort(killed)
	return killed, left, true
}

// continueAll sends SIGCONT to each living process whose real uid is uid:
// not to every process the caller may signal (kill -1), which for SIGCONT
// is also every process of its session, root's included. It lists them
// first, while they are all still stopped (a scan of /proc then takes
// milliseconds; one that continued each process as it went took a minute
// while a fork bomb of the user's ran on, each continued process forking
// beside the scan), and continues each. A process whose status could not
// be read (in the middle of an exec, say: its stop is pending, and comes
// once the exec is done) is read again a few times. Then it continues,
// whatever their state, the processes it did not know of: a child whose
// fork overlapped the freeze may have got the stop too (Linux gives it
// since 5.3), and a SIGCONT also clears a stop still pending in one it
// still could not read.
func continueAll(uid int) {
	want := strconv.Itoa(uid)
	known := map[int]bool{} // read: continued if the user's
	ents, _ := os.ReadDir("/proc")
	var missed []string
	var cont []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		st, ok := readStatus(e.Name())
		if !ok {
			missed = append(missed, e.Name())
			continue
		}
		known[pid] = true
		if st.ruid == want && st.living() {
			cont = append(cont, pid)
		}
	}
	for _, pid := range cont {
		syscall.Kill(pid, syscall.SIGCONT)
	}
	for range continueRetries {
		if len(missed) == 0 {
			break
		}
		time.Sleep(time.Millisecond)
		var still []string
		for _, name := range missed {
			st, ok := readStatus(name)
			if !ok {
				if _, err := os.Stat("/proc/" + name); err == nil {
					still = append(still, name)
				}
				continue
			}
			pid, _ := strconv.Atoi(name)
			known[pid] = true
			if st.ruid == want && st.living() {
				syscall.Kill(pid, syscall.SIGCONT)
			}
		}
		missed = still
	}
	// Those not known are continued without a look at their status (a
	// bomb's, continued, fork by the hundred meanwhile): a process that
	// appeared since the listing, or was still unread, was stopped by the
	// freeze if at all, and a SIGCONT does nothing to one that runs.
	ents, _ = os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || known[pid] {
			continue
		}
		syscall.Kill(pid, syscall.SIGCONT)
	}
}

// continueRetries bounds continueAll's reads again of a status it could
// not read.
const continueRetries = 5

// afterFreezeBudget bounds the search for root's processes that carry the
// mark after a freeze: without a bomb running it takes milliseconds; with
// one, a scan of /proc may never end, and the caller waits for the kill.
// Such a process (a root exec's daemon) may then be missed while a bomb of
// the user's runs on; the 10 s of before came on top of a command's
// timeout each time.
const afterFreezeBudget = 2 * time.Second

// freezeBudget bounds a freeze (killMarkedFrozen): its stops until every
// process of the user is and its kills of those that carry the mark.
const freezeBudget = 10 * time.Second

// stopFor bounds each round's stops of the user's processes in a freeze.
const stopFor = time.Second

// userLook is what userProcesses saw.
type userLook struct {
	running int   // the user's living processes not stopped
	found   []int // the user's living processes that carry mark
	others  int   // living processes of other users that carry mark
	unread  int   // processes whose status could not be read
	whole   bool  // false when it gave up at end
}

// userProcesses looks at the living processes (not zombies, not this
// one) whose real uid is uid: how many of them are not stopped, and which
// carry mark (none for 0); and counts the living processes of other users
// that carry mark, and the processes whose status it could not read.
func userProcesses(uid int, mark uint32, end time.Time) (u userLook) {
	want := strconv.Itoa(uid)
	u.whole, u.unread = scanStatusUnread(end, func(pid int, st procStatus) {
		if !st.living() {
			return
		}
		if st.ruid != want {
			if mark != 0 && st.has(mark) {
				u.others++
			}
			return
		}
		if !st.stopped() {
			u.running++
		}
		if mark != 0 && st.has(mark) {
			u.found = append(u.found, pid)
		}
	})
	return u
}

// searchRound is one round of KillTree's search: the descendants of pid
// (none for 0) and the processes that carry mark. whole is false when the
// search was given up at end: a scan of /proc checks end between its
// reads, but while hundreds of processes fork one read may take seconds,
// so the round is left to finish on its own then.
func searchRound(pid int, mark uint32, end time.Time) (found []int, whole bool) {
	type result struct {
		found []int
		whole bool
	}
	done := make(chan result, 1)
	go func() {
		var r result
		if pid > 0 {
			if r.found, r.whole = descendants(pid, end); !r.whole {
				done <- r
				return
			}
		}
		more, whole := marked(mark, end)
		done <- result{append(r.found, more...), whole}
	}()
	select {
	case r := <-done:
		return r.found, r.whole
	case <-time.After(time.Until(end) + searchGrace):
		return nil, false
	}
}

// searchGrace is how long past its end searchRound waits for a scan to see
// that it is over.
const searchGrace = 100 * time.Millisecond

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

// markBase is one below the first mark (Process.Mark): the gids from
// markBase+1 up are no one's in a template, and count up from there.
const markBase = 2_000_000_000

var treeMarks atomic.Uint32

// newTreeMark returns a mark no other process of this agent has had (a
// restored sandbox's agent goes on counting from its checkpoint).
func newTreeMark() uint32 { return markBase + treeMarks.Add(1) }

// withMark returns a copy of sys whose process gets mark as its only
// supplementary group, with the ids sys gives it (this process's when it
// gives none). Only root may set groups.
func withMark(sys *syscall.SysProcAttr, mark uint32) *syscall.SysProcAttr {
	var a syscall.SysProcAttr
	if sys != nil {
		a = *sys
	}
	c := syscall.Credential{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid())}
	if a.Credential != nil {
		c = *a.Credential
	}
	c.Groups, c.NoSetGroups = []uint32{mark}, false
	a.Credential = &c
	return &a
}

// marked lists the processes, but this one, whose supplementary groups
// hold mark; none for 0. Any process may read another's groups
// (/proc/<pid>/status), and only root may change its own, so the user's
// code can neither hide from the search nor take another tree's mark.
// whole is false when the scan was given up at end (never for a zero end).
func marked(mark uint32, end time.Time) (_ []int, whole bool) {
	if mark == 0 {
		return nil, true
	}
	var out []int
	whole = scanStatus(end, func(pid int, st procStatus) {
		if st.has(mark) {
			out = append(out, pid)
		}
	})
	return out, whole
}

// procStatus is what /proc/<pid>/status says of a process that KillTree
// needs.
type procStatus struct {
	state  string // "S (sleeping)"
	ruid   string // the real uid
	groups string // the supplementary groups, separated by white space
	rss    int64  // resident memory in bytes (VmRSS)
	ppid   int    // the parent's pid
}

// mark returns the process's mark (Process.Mark): its supplementary group
// among those this agent gave; 0 for none.
func (st procStatus) mark() uint32 {
	last := uint64(markBase) + uint64(treeMarks.Load())
	for _, g := range strings.Fields(st.groups) {
		if n, err := strconv.ParseUint(g, 10, 32); err == nil && n > markBase && n <= last {
			return uint32(n)
		}
	}
	return 0
}

// has reports whether gid is among the process's supplementary groups.
func (st procStatus) has(gid uint32) bool {
	return slices.Contains(strings.Fields(st.groups), strconv.FormatUint(uint64(gid), 10))
}

// living reports whether the process has not exited (not a zombie).
func (st procStatus) living() bool {
	return st.state != "" && !strings.ContainsAny(st.state[:1], "ZX")
}

// stopped reports whether the process is stopped (by a signal or a tracer).
func (st procStatus) stopped() bool {
	return st.state != "" && strings.ContainsAny(st.state[:1], "Tt")
}

// readStatus reads process pid's status; ok is false when it cannot be
// read (the process is gone).
func readStatus(pid string) (st procStatus, ok bool) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return st, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		key, v, _ := strings.Cut(line, ":")
		switch key {
		case "State":
			st.state = strings.TrimSpace(v)
		case "Uid":
			if f := strings.Fields(v); len(f) > 0 {
				st.ruid = f[0]
			}
		case "Groups":
			st.groups = v
		case "PPid":
			st.ppid, _ = strconv.Atoi(strings.TrimSpace(v))
		case "VmRSS":
			if f := strings.Fields(v); len(f) > 0 {
				kib, _ := strconv.ParseInt(f[0], 10, 64)
				st.rss = kib << 10
			}
		}
	}
	return st, true
}

// scanStatus calls f with the status of every process but this one; false
// when it gave up at end (never for a zero end).
func scanStatus(end time.Time, f func(pid int, st procStatus)) bool {
	whole, _ := scanStatusUnread(end, f)
	return whole
}

// scanStatusUnread is scanStatus that also counts the processes whose
// status could not be read though they are still there.
func scanStatusUnread(end time.Time, f func(pid int, st procStatus)) (whole bool, unread int) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return true, 0
	}
	for _, e := range ents {
		if !end.IsZero() && time.Now().After(end) {
			return false, unread
		}
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if st, ok := readStatus(e.Name()); ok {
			f(pid, st)
		} else if _, err := os.Stat("/proc/" + e.Name()); err == nil {
			unread++
		}
	}
	return true, unread
}

// asRealUser runs f on a thread of this process that has uid and gid as
// its real and effective ids for the while, the saved ones staying root's
// to take back (asUser changes the effective ones alone); an error when
// the ids could not be taken, and f did not run. The thread is never the
// main thread. While it runs, processes of uid may signal that thread:
// at worst the user's code then stops or kills its own sandbox's agent,
// as filling the sandbox's memory does.
func asRealUser(uid, gid int, f func()) error {
	done := make(chan error, 1)
	go func() {
		// Locked, the thread never runs other goroutines; the runtime
		// makes new threads from one of its own, not from this one. A
		// thread whose ids could not be set back ends with this goroutine.
		runtime.LockOSThread()
		if syscall.Gettid() == os.Getpid() {
			// Held here, the main thread cannot run the next try.
			done <- asRealUser(uid, gid, f)
			runtime.UnlockOSThread()
			return
		}
		if err := setThreadIDs(uid, gid); err != nil {
			if setThreadIDs(0, 0) == nil {
				runtime.UnlockOSThread()
			}
			done <- err
			return
		}
		f()
		if setThreadIDs(0, 0) == nil {
			runtime.UnlockOSThread()
		}
		done <- nil
	}()
	return <-done
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
		if err := set(syscall.SYS_SETRESGID, gid); err != nil {
			return err
		}
		return setAdminHere(false) // root again: CAP_SYS_ADMIN effective again
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

// childrenOf lists pid's children, those of each of its threads, from
// /proc/<pid>/task/<tid>/children: a few reads, where parent links take
// one per process, slow beside a fork bomb.
func childrenOf(pid int) []int {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, _ := os.ReadDir(dir)
	var out []int
	for _, t := range tasks {
		b, _ := os.ReadFile(dir + "/" + t.Name() + "/children")
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
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

// atProcessLimit reports whether the sandbox user has nearly as many
// processes as RLIMIT_NPROC lets it have (nine tenths; threads, which also
// count, are not seen here): then a start that failed vaguely (a kernel
// whose own child could not start) most likely failed for that.
func atProcessLimit() bool {
	limit := nprocLimit()
	if limit == 0 {
		return false
	}
	want := strconv.Itoa(agentproto.UserUID)
	var n uint64
	scanStatus(time.Now().Add(time.Second), func(pid int, st procStatus) {
		if st.ruid == want && st.living() {
			n++
		}
	})
	return n >= limit*9/10
}
