//go:build linux

package agent

import (
	"bufio"
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
	time.Sleep(200 * time.Millisecond)
	if n := livingInGroup(t, pgid); n < 5 {
		t.Fatalf("%d living processes in the group before killGroup, want the shell and its children", n)
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

// The agent reads the environment of the user's processes on a thread
// that is the user for the while, and every thread is root again after.
func TestScanMarkedAsUser(t *testing.T) {
	if !runningAsRoot() {
		t.Skip("needs root to run a process as the sandbox user")
	}
	mark := "test" + newTreeMark()
	cmd := exec.Command("sleep", "30")
	cmd.Env = []string{TreeMarkEnv + "=" + mark}
	cmd.SysProcAttr = procAttr(false)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	if got := scanMarkedAsUser(mark); !slices.Equal(got, []int{cmd.Process.Pid}) {
		t.Errorf("scanMarkedAsUser = %v, want [%d]", got, cmd.Process.Pid)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		for _, key := range []string{"Uid:", "Gid:"} {
			if ids := statusField(t, "/proc/self/task/"+task.Name()+"/status", key); ids != "0 0 0 0" {
				t.Errorf("thread %s: %s %s, want root's", task.Name(), key, ids)
			}
		}
	}
	if agentproto.UserUID == 0 {
		t.Fatal("the sandbox user is root")
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
