package gvisor

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// TestNProcBelowPIDs: a sandbox with a pids limit gets RLIMIT_NPROC below
// it, so a fork bomb meets EAGAIN before the host limit kills the sandbox.
func TestNProcBelowPIDs(t *testing.T) {
	spec := (&Runtime{}).ociSpec(pandastack.RuntimeSpec{ID: "sbx_a", RootFS: "/", PIDs: 1536}, false, capsRevision, "")
	if !slices.Contains(spec.Process.Env, agentproto.NProcEnv+"=384") {
		t.Fatalf("env %v, want %s=384", spec.Process.Env, agentproto.NProcEnv)
	}
	if spec.Linux.Resources == nil || spec.Linux.Resources.Pids == nil || spec.Linux.Resources.Pids.Limit != 1536 {
		t.Fatalf("pids resources %+v", spec.Linux.Resources)
	}
	// Not in the rlimits: they must match across checkpoint and restore.
	for _, rl := range spec.Process.Rlimits {
		if rl.Type == "RLIMIT_NPROC" {
			t.Fatalf("RLIMIT_NPROC in the spec's rlimits: %+v", rl)
		}
	}
	none := (&Runtime{}).ociSpec(pandastack.RuntimeSpec{ID: "sbx_b", RootFS: "/"}, false, capsRevision, "")
	for _, e := range none.Process.Env {
		if strings.HasPrefix(e, agentproto.NProcEnv+"=") {
			t.Fatalf("%s without a pids limit", e)
		}
	}
}

func TestCgroupEvent(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	hit := write("pids.events", "max 3\n")
	miss := write("pids.events.0", "max 0\n")
	oom := write("memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
	for _, c := range []struct {
		key   string
		files []string
		want  bool
	}{
		{"max", []string{hit}, true},
		{"max", []string{miss}, false},
		{"max", []string{filepath.Join(dir, "absent"), hit}, true},
		{"oom_kill", []string{oom}, true},
		{"max", []string{oom}, false},
	} {
		if got := cgroupEvent(c.key, c.files...); got != c.want {
			t.Errorf("cgroupEvent(%s, %v) = %v, want %v", c.key, c.files, got, c.want)
		}
	}
	// The count itself (OOMKills), -1 when no file names the key.
	bad := write("memory.events", "oom_kill many\n")
	for _, c := range []struct {
		key   string
		files []string
		want  int64
	}{
		{"oom_kill", []string{oom}, 1},
		{"oom_kill", []string{filepath.Join(dir, "absent"), write("memory.events.2", "low 0\noom 4\noom_kill 3\n")}, 3},
		{"under_oom", []string{oom}, 0},
		{"oom_kill", []string{hit}, -1},
		{"oom_kill", []string{bad}, -1},
		{"oom_kill", nil, -1},
	} {
		if got := cgroupCount(c.key, c.files...); got != c.want {
			t.Errorf("cgroupCount(%s, %v) = %d, want %d", c.key, c.files, got, c.want)
		}
	}
}

// TestCPUQuotaPeriod: cpu × the period per period, with the long period
// that lets a restore's short burst over the quota run unthrottled.
func TestCPUQuotaPeriod(t *testing.T) {
	spec := (&Runtime{}).ociSpec(pandastack.RuntimeSpec{ID: "sbx_a", RootFS: "/", CPU: 2}, false, capsRevision, "")
	cpu := spec.Linux.Resources.CPU
	if cpu == nil || cpu.Period != 1_000_000 || cpu.Quota != 2_000_000 {
		t.Fatalf("cpu resources %+v, want 2 s of CPU per 1 s period", cpu)
	}
	none := (&Runtime{}).ociSpec(pandastack.RuntimeSpec{ID: "sbx_b", RootFS: "/", MemoryMB: 256}, false, capsRevision, "")
	if none.Linux.Resources.CPU != nil {
		t.Fatalf("a CPU quota without cpu: %+v", none.Linux.Resources.CPU)
	}
}

// TestRemoveCgroupsWaitsForExit: a cgroup whose last process is still
// exiting when the removal starts is removed once that process is gone,
// as after a SIGKILL to a sentry with much memory to free.
func TestRemoveCgroupsWaitsForExit(t *testing.T) {
	root := "/sys/fs/cgroup/pids"
	if _, err := os.Stat(root); err != nil {
		root = "/sys/fs/cgroup" // the v2 unified hierarchy
	}
	rel := fmt.Sprintf("/pandastack/test_%d", os.Getpid())
	dir := filepath.Join(root, rel)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("cannot make a cgroup (run as root): %v", err)
		}
		t.Skipf("cannot make a cgroup (run as root): %v", err)
	}
	t.Cleanup(func() { syscall.Rmdir(dir) })
	// A shell that takes 300 ms to exit after SIGTERM.
	cmd := exec.Command("sh", "-c", `trap 'sleep 0.3; exit 0' TERM; echo ready; while :; do sleep 0.05; done`)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() { cmd.Process.Kill(); <-exited })
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Rmdir(dir); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("rmdir of a cgroup with a process in it: %v, want EBUSY", err)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	if err := removeCgroups(rel); err != nil {
		t.Fatalf("removeCgroups: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s is still there: %v", dir, err)
	}
}

// TestShmSized: /dev/shm holds at most half the sandbox's memory from
// spec revision 3 on; an image of an older revision restores with the
// unsized mount it was taken with (runsc compares the mounts).
func TestShmSized(t *testing.T) {
	shm := func(rev int) []string {
		spec := (&Runtime{}).ociSpec(pandastack.RuntimeSpec{ID: "sbx_a", RootFS: "/", MemoryMB: 512}, false, rev, "")
		for _, m := range spec.Mounts {
			if m.Destination == "/dev/shm" {
				return m.Options
			}
		}
		t.Fatalf("revision %d: no /dev/shm mount", rev)
		return nil
	}
	if o := shm(capsRevision); !slices.Contains(o, "size=256m") {
		t.Errorf("current revision: /dev/shm options %v, want size=256m", o)
	}
	for _, rev := range []int{1, 2} {
		for _, o := range shm(rev) {
			if strings.HasPrefix(o, "size=") {
				t.Errorf("revision %d: /dev/shm options %v, want no size", rev, shm(rev))
			}
		}
	}
}
