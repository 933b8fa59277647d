//go:build linux

package agent

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// A group that keeps forking has no living member once killGroup returns
// (its dead may wait a while for init, here not PID 1, to reap them).
func TestKillGroupEndsAForkingGroup(t *testing.T) {
	cmd := exec.Command("sh", "-c", "for i in 1 2 3 4; do sleep 30 & done; while :; do sleep 0.2 & sleep 0.01; done")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait()
	pgid := cmd.Process.Pid
	t.Cleanup(func() { syscall.Kill(-pgid, syscall.SIGKILL) }) // whatever fails
	for end := time.Now().Add(5 * time.Second); livingInGroup(t, pgid) < 5; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d living processes in the group before killGroup, want the shell and its children", livingInGroup(t, pgid))
		}
	}
	killGroup(pgid)
	if n := livingInGroup(t, pgid); n > 0 {
		t.Fatalf("%d processes of the group live after killGroup", n)
	}
}

// livingInGroup counts the processes of group pgid that are not zombies.
func livingInGroup(t *testing.T, pgid int) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // state ppid pgrp ...
		if len(f) > 2 && f[0] != "Z" && f[2] == strconv.Itoa(pgid) {
			n++
		}
	}
	return n
}

func TestDescendantsGivesUpAtItsDeadline(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	found, whole := descendants(os.Getpid(), time.Now().Add(time.Minute))
	if !whole || !slices.Contains(found, cmd.Process.Pid) {
		t.Errorf("descendants = %v (whole %v), want the child %d in a whole scan", found, whole, cmd.Process.Pid)
	}
	if found, whole := descendants(os.Getpid(), time.Now().Add(-time.Second)); whole || len(found) > 0 {
		t.Errorf("past its deadline descendants = %v (whole %v), want nothing and not whole", found, whole)
	}
}

// Every process the agent starts carries a mark of its own, a
// supplementary group, which what it starts inherits whatever it does to
// its environment and session, and which the user may not drop.
func TestMarkFollowsWhatLeavesTheTree(t *testing.T) {
	needRoot(t)
	drop := "import os, time\ntry:\n    os.setgroups([])\nexcept PermissionError:\n    pass\ntime.sleep(33)\n"
	p, err := (*Reaper)(nil).Start("/bin/sh", []string{"sh", "-c", `env -i setsid sleep 31 & python3 -c "$DROP" & sleep 32`},
		&os.ProcAttr{Env: []string{"PATH=/usr/bin:/bin", "DROP=" + drop}, Sys: procAttr(false)})
	if err != nil {
		t.Fatal(err)
	}
	defer KillTree(p.Pid, p.Mark)
	if p.Mark <= markBase {
		t.Fatalf("mark %d, want a gid above %d", p.Mark, markBase)
	}
	var got []int
	for end := time.Now().Add(5 * time.Second); len(got) < 4; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("marked %v, want the shell, its two sleeps and python, which may not drop its groups", got)
		}
		got, _ = marked(p.Mark, time.Time{})
	}
	for _, pid := range got {
		st, _ := readStatus(strconv.Itoa(pid))
		if st.ruid != strconv.Itoa(agentproto.UserUID) || strings.Fields(st.groups)[0] != strconv.FormatUint(uint64(p.Mark), 10) {
			t.Errorf("marked process %d: uid %s, groups %q, want the user's with the mark alone", pid, st.ruid, st.groups)
		}
	}
	KillTree(p.Pid, p.Mark)
	for end := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) { // the kills land
		if left, _ := marked(p.Mark, time.Time{}); len(living(left)) == 0 {
			break
		} else if time.Now().After(end) {
			t.Fatalf("marked processes %v live after KillTree", living(left))
		}
	}
}

// living keeps the pids of processes that are not zombies.
func living(pids []int) []int {
	return slices.DeleteFunc(slices.Clone(pids), func(p int) bool {
		st, ok := readStatus(strconv.Itoa(p))
		return !ok || !st.living()
	})
}

// needRoot fails a test that must set processes' ids and groups.
func needRoot(t *testing.T) {
	t.Helper()
	if !runningAsRoot() {
		t.Fatal("needs root, to set the ids and groups of processes")
	}
}

func statusField(t *testing.T, path, key string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key); ok {
			return strings.Join(strings.Fields(rest), " ")
		}
	}
	t.Fatalf("%s has no %s", path, key)
	return ""
}

// A bomb whose every process leaves its group (setsid) is found only by
// its mark; killMarkedFrozen stops every process of the user first, so
// the bomb cannot churn while the marked are looked for, and lets the user's
// other processes go on after. The test's processes run as a uid of its
// own (a test killed before its cleanups, by -timeout say, leaves them
// behind, stopped perhaps: the next run kills them first, and by hand
// "pkill -KILL -U 4242" does).
func TestKillMarkedFrozenEndsASetsidBomb(t *testing.T) {
	needRoot(t)
	const uid, gid = 4242, 4242 // this test's alone: every one of its processes is stopped
	killAllOf(t, uid, gid)      // an earlier run's, killed before its cleanups
	// And their zombies reaped (by host init: a second or two), which the
	// bomb's process limit counts.
	for end := time.Now().Add(20 * time.Second); tasksOf(uid) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("uid %d still has %d processes (zombies counted) on this host", uid, tasksOf(uid))
		}
	}
	t.Cleanup(func() { killAllOf(t, uid, gid) }) // whatever fails
	prev := freezeIDs
	freezeIDs = &[2]int{uid, gid}
	t.Cleanup(func() { freezeIDs = prev })
	as := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}, Setsid: true}

	bystander := exec.Command("sleep", "60") // the user's, unmarked
	bystander.SysProcAttr = as
	if err := bystander.Start(); err != nil {
		t.Fatal(err)
	}
	go bystander.Wait()
	// Another user's process in the test's session, stopped: a SIGCONT to
	// the session (kill -1 reaches it) would continue it.
	other := exec.Command("sleep", "60")
	other.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid + 1, Gid: gid + 1}}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	other.Process.Signal(syscall.SIGSTOP)
	mark := newTreeMark()
	// prlimit fails rather than run the bomb without its process limit,
	// which counts the zombies of an earlier run that host init has yet
	// to reap.
	bomb := exec.Command("prlimit", "--nproc=160", "sh", "-c", `sh -c "$BOMB"; sleep 60`)
	bomb.Env = []string{"PATH=/usr/bin:/bin", `BOMB=setsid sh -c "$BOMB" & setsid sh -c "$BOMB" & sleep 60`}
	bomb.SysProcAttr = withMark(as, mark)
	var bombOut bytes.Buffer
	bomb.Stdout, bomb.Stderr = &bombOut, &bombOut
	if err := bomb.Start(); err != nil {
		t.Fatal(err)
	}
	go bomb.Wait()
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if pids := processesOf(uid); len(pids) >= 30 {
			break
		} else if time.Now().After(end) {
			t.Fatalf("%d processes of the bomb's user after 5 s, want a bomb (it said %q)", len(pids), bombOut.String())
		}
	}

	firstAs := -1
	froze, clean := killMarkedFrozen(mark, nil, func() { firstAs = syscall.Getuid() })
	if !froze {
		t.Fatal("killMarkedFrozen did nothing")
	}
	if u := userProcesses(uid, mark, time.Time{}); clean && (len(u.found) > 0 || u.others > 0) {
		t.Errorf("killMarkedFrozen says nothing of the tree is left, but %v (and %d of other users) carry its mark, living", u.found, u.others)
	}
	if firstAs != 0 {
		t.Errorf("first ran as uid %d, want root's", firstAs)
	}
	time.Sleep(100 * time.Millisecond) // the kills land
	if left, running := processesOf(uid), runningOf(uid); len(left) != 1 || left[0] != bystander.Process.Pid || running != 1 {
		t.Fatalf("processes of the user after killMarkedFrozen: %v (%d running), want the bystander %d alone, running", left, running, bystander.Process.Pid)
	}
	if f, ok := statFields(other.Process.Pid); !ok || f[0] != "T" {
		t.Errorf("another user's stopped process in the session: %v, want it left stopped", f)
	}
	for _, task := range mustReadDir(t, "/proc/self/task") {
		if ids := statusField(t, "/proc/self/task/"+task.Name()+"/status", "Uid:"); ids != "0 0 0 0" {
			t.Errorf("thread %s: Uid %s, want root's", task.Name(), ids)
		}
	}
}

// killAllOf SIGKILLs every process of uid until none is left living (10
// s at most), from a thread that is that user. Fit for a cleanup: it
// reports what fails and goes on.
func killAllOf(t *testing.T, uid, gid int) {
	t.Helper()
	err := asRealUser(uid, gid, func() {
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			pids := processesOf(uid)
			if len(pids) == 0 {
				return
			}
			for _, p := range pids {
				syscall.Kill(p, syscall.SIGKILL)
			}
		}
	})
	if err != nil {
		t.Errorf("kill the processes of uid %d: %v", uid, err)
	}
}

// tasksOf counts the processes whose real uid is uid, zombies too.
func tasksOf(uid int) int {
	n := 0
	scanStatus(time.Time{}, func(_ int, st procStatus) {
		if st.ruid == strconv.Itoa(uid) {
			n++
		}
	})
	return n
}

// processesOf lists the living processes whose real uid is uid.
func processesOf(uid int) []int {
	var pids []int
	scanStatus(time.Time{}, func(pid int, st procStatus) {
		if st.ruid == strconv.Itoa(uid) && st.living() {
			pids = append(pids, pid)
		}
	})
	return pids
}

// runningOf counts the living processes of uid that are not stopped.
func runningOf(uid int) int {
	return userProcesses(uid, 0, time.Time{}).running
}

func mustReadDir(t *testing.T, dir string) []os.DirEntry {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ents
}

// A scan of marks given a deadline gives up at it, and says so.
func TestMarkedGivesUpAtItsDeadline(t *testing.T) {
	needRoot(t)
	mark := newTreeMark()
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = withMark(nil, mark)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if got, whole := marked(mark, time.Now().Add(time.Minute)); !whole || !slices.Equal(got, []int{cmd.Process.Pid}) {
		t.Errorf("marked = %v (whole %v), want [%d] in a whole scan", got, whole, cmd.Process.Pid)
	}
	if got, whole := marked(mark, time.Now().Add(-time.Second)); whole || len(got) > 0 {
		t.Errorf("past its deadline marked = %v (whole %v), want nothing and not whole", got, whole)
	}
}

// KillDescendants kills what a process started, also what left its tree
// (setsid) but carries its mark, and leaves the process itself running,
// and with spareChildren its children too (a shell's kernel's shell),
// whose own children die.
func TestKillDescendantsSparesTheParent(t *testing.T) {
	needRoot(t)
	for _, spareChildren := range []bool{false, true} {
		t.Run(fmt.Sprint("spareChildren=", spareChildren), func(t *testing.T) {
			mark := newTreeMark()
			parent := exec.Command("sh", "-c", `sh -c "sleep 61 & setsid sleep 62 & sleep 63; sleep 64"; sleep 65`)
			parent.Env = []string{"PATH=/usr/bin:/bin"}
			parent.SysProcAttr = withMark(&syscall.SysProcAttr{Setpgid: true}, mark)
			if err := parent.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan struct{})
			go func() { parent.Wait(); close(done) }()
			t.Cleanup(func() { KillTree(parent.Process.Pid, mark) })
			for end := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if got, _ := marked(mark, time.Time{}); len(got) >= 5 {
					break
				} else if time.Now().After(end) {
					t.Fatalf("marked processes %v, want the shell, its shell and three sleeps", got)
				}
			}
			shell := childrenOf(parent.Process.Pid)
			if len(shell) != 1 {
				t.Fatalf("the parent's children: %v, want its shell", shell)
			}
			KillDescendants(parent.Process.Pid, mark, spareChildren)
			// The spared shell goes on to its next command, sleep 64, and
			// else the parent to its own, sleep 65: both new.
			next := "65"
			if spareChildren {
				next = "64"
			}
			// outlived lists the killed that still live: the kills land
			// in their time on a loaded host.
			outlived := func() []string {
				var out []string
				if !spareChildren && len(living(shell)) == 1 {
					out = append(out, fmt.Sprintf("the parent's shell %d", shell[0]))
				}
				left, _ := marked(mark, time.Time{})
				for _, p := range living(left) {
					if p == parent.Process.Pid || spareChildren && p == shell[0] {
						continue
					}
					if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p)); !strings.Contains(string(b), next) {
						out = append(out, fmt.Sprintf("process %d (%q)", p, b))
					}
				}
				return out
			}
			for end := time.Now().Add(5 * time.Second); len(outlived()) > 0; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatalf("%v outlived KillDescendants", outlived())
				}
			}
			select {
			case <-done:
				t.Fatal("the parent was killed")
			default:
			}
			if spareChildren && len(living(shell)) != 1 {
				t.Error("the parent's spared shell was killed")
			}
		})
	}
}

// withMark gives a copy the mark as its only supplementary group and
// leaves what it was given as it was.
func TestWithMarkCopies(t *testing.T) {
	in := &syscall.SysProcAttr{Setpgid: true, Credential: &syscall.Credential{Uid: 1000, Gid: 1000, Groups: []uint32{}, NoSetGroups: true}}
	out := withMark(in, markBase+7)
	if c := out.Credential; !out.Setpgid || c.Uid != 1000 || c.Gid != 1000 || !slices.Equal(c.Groups, []uint32{markBase + 7}) || c.NoSetGroups {
		t.Errorf("withMark = %+v, credential %+v", out, out.Credential)
	}
	if c := in.Credential; len(c.Groups) != 0 || !c.NoSetGroups || out.Credential == c {
		t.Errorf("the given credential changed: %+v", c)
	}
	if c := withMark(nil, markBase+8).Credential; c.Uid != uint32(os.Getuid()) || c.Gid != uint32(os.Getgid()) || !slices.Equal(c.Groups, []uint32{markBase + 8}) {
		t.Errorf("withMark(nil) credential %+v, want this process's ids and the mark", c)
	}
	st := procStatus{groups: "\t1000 2000000007 "}
	if !st.has(markBase+7) || st.has(markBase+70) || st.has(1) {
		t.Errorf("has on %q is wrong", st.groups)
	}
}

// userProcesses counts the processes of other users that carry the mark
// (a root exec's daemon, which a freeze does not stop), apart from the
// user's it lists: none once that process is gone.
func TestUserProcessesCountsOthersMarked(t *testing.T) {
	needRoot(t)
	const uid = 4243 // no process of this uid
	mark := newTreeMark()
	daemon := exec.Command("sleep", "60")
	daemon.SysProcAttr = withMark(&syscall.SysProcAttr{}, mark)
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { daemon.Process.Kill(); daemon.Wait() })
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		u := userProcesses(uid, mark, time.Time{})
		if len(u.found) != 0 || !u.whole {
			t.Fatalf("userProcesses: found %v, whole %v; want none of the user's, whole", u.found, u.whole)
		}
		if u.others == 1 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("root's process with the mark: %d others counted, want 1", u.others)
		}
	}
	daemon.Process.Kill()
	daemon.Wait()
	if u := userProcesses(uid, mark, time.Time{}); u.others != 0 {
		t.Fatalf("after its end: %d others counted, want 0", u.others)
	}
}

// waitStopped returns once a process sent SIGSTOP is stopped, and at once
// for one that is gone.
func TestWaitStopped(t *testing.T) {
	p := exec.Command("sleep", "60")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Process.Kill(); p.Wait() })
	p.Process.Signal(syscall.SIGSTOP)
	waitStopped([]int{p.Process.Pid}, 5*time.Second)
	if st, ok := readStatus(strconv.Itoa(p.Process.Pid)); !ok || !st.stopped() {
		t.Fatalf("after waitStopped: %+v %v, want stopped", st, ok)
	}
	p.Process.Kill()
	p.Wait()
	start := time.Now()
	waitStopped([]int{p.Process.Pid}, 5*time.Second)
	if time.Since(start) > 4*time.Second {
		t.Fatal("waitStopped waited for a process that is gone")
	}
}

// KillUser ends every process of the user, a bomb whose processes each
// leave their group included, but the kept (a kernel, and a shell
// kernel's shell, by its parent), which go on running with their state;
// what the kept shell started dies.
func TestKillUserSparesTheKept(t *testing.T) {
	needRoot(t)
	const uid, gid = 4243, 4243 // this test's alone
	killAllOf(t, uid, gid)
	for end := time.Now().Add(20 * time.Second); tasksOf(uid) > 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("uid %d still has %d processes (zombies counted) on this host", uid, tasksOf(uid))
		}
	}
	t.Cleanup(func() { killAllOf(t, uid, gid) })
	prev := freezeIDs
	freezeIDs = &[2]int{uid, gid}
	t.Cleanup(func() { freezeIDs = prev })
	as := &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}, Setsid: true}
	start := func(env string, name string, args ...string) *exec.Cmd {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.SysProcAttr = as
		cmd.Env = []string{"PATH=/usr/bin:/bin", env}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go cmd.Wait()
		return cmd
	}
	kernel := start("", "sleep", "60")
	// A shell kernel: its shell (a child) is kept, what the shell started
	// is not.
	shellKernel := start("", "sh", "-c", `sh -c 'sleep 61 & exec sleep 70'; :`)
	start("", "sleep", "62") // a stray
	start(`BOMB=setsid sh -c "$BOMB" & setsid sh -c "$BOMB" & sleep 60`, "prlimit", "--nproc=120", "sh", "-c", `sh -c "$BOMB"; sleep 60`)
	for end := time.Now().Add(5 * time.Second); len(processesOf(uid)) < 40; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d processes of the user after 5 s, want a bomb", len(processesOf(uid)))
		}
	}
	keep := map[int]bool{kernel.Process.Pid: true, shellKernel.Process.Pid: true}
	killed, left, ok := KillUser([]int{kernel.Process.Pid, shellKernel.Process.Pid}, []int{shellKernel.Process.Pid})
	if !ok || left != 0 || len(killed) < 40 {
		t.Fatalf("KillUser: killed %d, left %d, ok %v; want a bomb's worth killed, none left", len(killed), left, ok)
	}
	if slices.Contains(killed, kernel.Process.Pid) || slices.Contains(killed, shellKernel.Process.Pid) {
		t.Fatalf("KillUser killed a kept process: %v", killed)
	}
	time.Sleep(100 * time.Millisecond) // the kills land
	var shell int
	for _, p := range processesOf(uid) {
		if keep[p] {
			continue
		}
		if f, ok := statFields(p); ok && len(f) > 1 && f[1] == strconv.Itoa(shellKernel.Process.Pid) {
			shell = p
			continue
		}
		cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
		t.Errorf("process %d (%q) of the user is left", p, cmdline)
	}
	if shell == 0 {
		t.Errorf("the shell kernel's shell was killed")
	}
	for _, p := range []int{kernel.Process.Pid, shellKernel.Process.Pid, shell} {
		if f, ok := statFields(p); !ok || f[0] == "T" {
			t.Errorf("kept process %d: %v, want it running (continued after the stops)", p, f)
		}
	}
}

// KillGroupNow kills every member of the group at once: the kernel and
// what its warm-up may have left running in its group.
func TestKillGroupNowKillsTheGroup(t *testing.T) {
	cmd := exec.Command("sh", "-c", "sleep 30 & sleep 30 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	pgid := cmd.Process.Pid
	t.Cleanup(func() { syscall.Kill(-pgid, syscall.SIGKILL) }) // whatever fails
	for deadline := time.Now().Add(5 * time.Second); livingInGroup(t, pgid) < 3; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d living processes in the group after 5 s, want the shell and its two sleeps", livingInGroup(t, pgid))
		}
	}
	KillGroupNow(pgid)
	select {
	case err := <-exited:
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("the group's leader ended with %v, want SIGKILL", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the group's leader lives 5 s after KillGroupNow")
	}
	deadline := time.Now().Add(5 * time.Second)
	for livingInGroup(t, pgid) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d processes of the group live 5 s after KillGroupNow", livingInGroup(t, pgid))
		}
		time.Sleep(10 * time.Millisecond)
	}
	KillGroupNow(0) // no group: nothing happens (not a kill of this process's own group)
}
