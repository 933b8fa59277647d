package gvisor_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/runtime/gvisor"
	"github.com/pandastack/pandastack/internal/runtime/runtimetest"
	"github.com/pandastack/pandastack/internal/sandbox"
	"github.com/pandastack/pandastack/internal/testutil"
)

// busyboxRootFS makes a tiny root filesystem from Debian's busybox-static.
func busyboxRootFS(t *testing.T) string {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("busybox not found (fix: apt-get install busybox-static; ./scripts/setup.sh does it)")
		}
		t.Skip("busybox not found (fix: apt-get install busybox-static)")
	}
	root := t.TempDir()
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "etc", "home/user"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chown(filepath.Join(root, "home/user"), 1000, 1000)
	// As in a template: a non-empty /tmp, which runsc leaves on the sandbox's disk.
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	if err := os.WriteFile(filepath.Join(root, "tmp/.pandastack-disk"), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"sh", "echo", "cat", "head", "tail", "wc", "sleep", "id", "ps", "md5sum"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", app)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBinaries()
	os.Exit(code)
}

func TestConformance(t *testing.T) {
	runsc := testutil.Runsc(t)
	agent := filepath.Join(testutil.Binaries(t), "pandastack-agent")
	before := conformanceCgroups()
	defer func() {
		// Every sandbox the suite made is gone; so are its cgroups.
		for _, d := range conformanceCgroups() {
			if !slices.Contains(before, d) {
				t.Errorf("cgroup left behind: %s", d)
			}
		}
	}()
	runtimetest.Run(t, runtimetest.Env{
		RootFS: busyboxRootFS(t),
		New: func(t *testing.T) pandastack.Runtime {
			rt, err := gvisor.New(gvisor.Config{Runsc: runsc, StateDir: t.TempDir(), AgentPath: agent})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rt.Close() })
			return rt
		},
	})
}

// conformanceID matches the ids the conformance suite gives its sandboxes
// (runtimetest's sbx_rt and 8 hex digits), and not the server's (sbx_ and
// 16 letters and digits, which may begin with "rt" too): the e2e tests run
// beside this package and their sandboxes come and go meanwhile.
var conformanceID = regexp.MustCompile(`^sbx_rt[0-9a-f]{8}$`)

// conformanceCgroups lists the cgroup directories of the conformance
// suite's sandboxes, wherever runsc may have made them.
func conformanceCgroups() []string {
	var dirs []string
	for _, pat := range []string{"/sys/fs/cgroup/*/pandastack/sbx_rt*", "/sys/fs/cgroup/*/sbx_rt*", "/sys/fs/cgroup/pandastack/sbx_rt*", "/sys/fs/cgroup/sbx_rt*"} {
		m, _ := filepath.Glob(pat)
		for _, d := range m {
			if conformanceID.MatchString(filepath.Base(d)) {
				dirs = append(dirs, d)
			}
		}
	}
	return dirs
}

// newRuntime is a driver with a state directory of its own, closed at the
// test's end.
func newRuntime(t *testing.T) *gvisor.Runtime {
	rt, err := gvisor.New(gvisor.Config{Runsc: testutil.Runsc(t), StateDir: t.TempDir(), AgentPath: filepath.Join(testutil.Binaries(t), "pandastack-agent")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	return rt
}

// startDialed starts a busybox sandbox of memMB with a client of its
// agent, both gone with the test.
func startDialed(t *testing.T, rt *gvisor.Runtime, memMB int) (string, *sandbox.AgentClient) {
	t.Helper()
	ctx := context.Background()
	id := fmt.Sprintf("sbx_rt%08x", rand.Uint32())
	rwc, err := rt.Start(ctx, pandastack.RuntimeSpec{ID: id, RootFS: busyboxRootFS(t), MemoryMB: memMB})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Stop(context.Background(), id) })
	c, err := sandbox.DialAgent(ctx, id, rwc, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return id, c
}

// memoryCgroup is sandbox id's memory cgroup directory on this host, in
// cgroup v1's memory hierarchy or v2's, and whether it is v1's.
func memoryCgroup(id string) (dir string, v1 bool) {
	if dir := filepath.Join("/sys/fs/cgroup/memory/pandastack", id); dirExists(dir) {
		return dir, true
	}
	return filepath.Join("/sys/fs/cgroup/pandastack", id), false
}

func dirExists(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

// TestHostMemoryHeadroom: the host lets a sandbox hold an eighth more than
// its memory (at least 64 MiB more), for gVisor's own; the sandbox still
// sees its memory (the conformance suite checks /proc/meminfo).
func TestHostMemoryHeadroom(t *testing.T) {
	rt := newRuntime(t)
	root := busyboxRootFS(t)
	for _, c := range []struct{ mb, wantMB int }{{128, 192}, {1024, 1152}} {
		id := fmt.Sprintf("sbx_rt%08x", rand.Uint32())
		rwc, err := rt.Start(context.Background(), pandastack.RuntimeSpec{ID: id, RootFS: root, MemoryMB: c.mb})
		if err != nil {
			t.Fatal(err)
		}
		rwc.Close()
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/pandastack", id, "memory.limit_in_bytes"))
		if errors.Is(err, fs.ErrNotExist) {
			b, err = os.ReadFile(filepath.Join("/sys/fs/cgroup/pandastack", id, "memory.max"))
		}
		rt.Stop(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(b)); got != strconv.Itoa(c.wantMB<<20) {
			t.Errorf("host memory limit of a %d MiB sandbox: %s bytes, want %d MiB", c.mb, got, c.wantMB)
		}
	}
}

// An image taken by a server from before the agent held CAP_SYS_ADMIN
// (another capability set in the spec, no record of it in the image)
// still restores, afresh and into a container prepared for it: runsc
// refuses a restore whose spec's capabilities differ from the image's.
func TestRestoreOfAnImageWithTheOldCapabilities(t *testing.T) {
	rt := newRuntime(t)
	ctx := context.Background()
	root := busyboxRootFS(t)
	gvisor.BootOldCaps(rt, true)
	id := fmt.Sprintf("sbx_rt%08x", rand.Uint32())
	rwc, err := rt.Start(ctx, pandastack.RuntimeSpec{ID: id, RootFS: root})
	if err != nil {
		t.Fatal(err)
	}
	rwc.Close()
	img := t.TempDir()
	if err := rt.Checkpoint(ctx, id, img, false); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(img, gvisor.ImageCapsFile)) // that server wrote none
	gvisor.BootOldCaps(rt, false)

	for _, prepared := range []bool{false, true} {
		kid := fmt.Sprintf("sbx_rt%08x", rand.Uint32())
		spec := pandastack.RuntimeSpec{ID: kid, RootFS: root}
		if prepared {
			if err := rt.Prepare(ctx, spec, img); err != nil {
				t.Fatalf("prepare from the old image: %v", err)
			}
		}
		rwc, err := rt.Restore(ctx, spec, img)
		if err != nil {
			t.Fatalf("restore of the old image (prepared: %v): %v", prepared, err)
		}
		rwc.Close()
		if st, err := rt.State(ctx, kid); err != nil || st != pandastack.RuntimeRunning {
			t.Fatalf("after the restore (prepared: %v): %v %v", prepared, st, err)
		}
		// Its own checkpoints keep the old set, so they restore too.
		again := t.TempDir()
		if err := rt.Checkpoint(ctx, kid, again, false); err != nil {
			t.Fatal(err)
		}
		rwc, err = rt.Restore(ctx, spec, again)
		if err != nil {
			t.Fatalf("restore of its checkpoint (prepared: %v): %v", prepared, err)
		}
		rwc.Close()
		if err := rt.Stop(ctx, kid); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCheckpointLeavesZeroedMemoryOut: memory the sandbox filled with
// zeroes stays out of its image (its children or its resume would load
// it in full, and it would take the disk).
func TestCheckpointLeavesZeroedMemoryOut(t *testing.T) {
	rt := newRuntime(t)
	ctx := context.Background()
	id, c := startDialed(t, rt, 512)
	pages := func() int64 {
		t.Helper()
		dir := t.TempDir()
		if err := rt.Checkpoint(ctx, id, dir, true); err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(filepath.Join(dir, "pages.img"))
		if err != nil {
			t.Fatal(err)
		}
		return fi.Size()
	}
	before := pages()
	// 64 MiB of zeroes in the sandbox's memory: a file in its tmpfs. A
	// read of /proc/meminfo has gVisor count them committed, as the
	// agent's memory watch does in larger sandboxes: only committed
	// pages need the search to stay out.
	ev, err := c.Exec(ctx, agentproto.ExecRequest{Cmd: "dd if=/dev/zero of=/dev/shm/zeroes bs=1M count=64 2>&1 && cat /proc/meminfo >/dev/null"}, nil)
	if err != nil || ev.ExitCode != 0 {
		t.Fatalf("filling memory with zeroes: %+v %v", ev, err)
	}
	// And 8 MiB of data, which goes into the image.
	ev, err = c.Exec(ctx, agentproto.ExecRequest{Cmd: "head -c 8388608 /dev/urandom > /dev/shm/data"}, nil)
	if err != nil || ev.ExitCode != 0 {
		t.Fatalf("filling memory with data: %+v %v", ev, err)
	}
	after := pages()
	t.Logf("pages: %d MiB, then %d MiB", before>>20, after>>20)
	if grew := after - before; grew < 6<<20 || grew > 24<<20 {
		t.Errorf("the image grew by %d MiB for 8 MiB of data and 64 MiB of zeroes, want about 8", grew>>20)
	}
}

// TestStubsGoFirst: the stub processes that run a sandbox's tasks score
// higher for the host's OOM killer than the sentry, the gofer and the
// agent's stub, so that the host, at the sandbox's limit, kills a task of
// its user rather than the whole sandbox (e2e TestHostOutOfMemory shows
// the outcome); in a sandbox started afresh, for a task started later,
// and in one restored.
func TestStubsGoFirst(t *testing.T) {
	rt := newRuntime(t)
	ctx := context.Background()
	b, err := os.ReadFile("/proc/self/oom_score_adj") // runsc's processes start with it
	if err != nil {
		t.Fatal(err)
	}
	host, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	raised := strconv.Itoa(min(host+1000, 1000))
	// check waits until the stubs but the agent's are raised, and fails
	// if one of the rest is.
	check := func(t *testing.T, id string) {
		t.Helper()
		var last string
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			dir, _ := memoryCgroup(id)
			b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			if err != nil {
				t.Fatal(err)
			}
			var up, agent int
			var wrong []string
			for _, p := range strings.Fields(string(b)) {
				cmd, err1 := os.ReadFile("/proc/" + p + "/cmdline")
				adj, err2 := os.ReadFile("/proc/" + p + "/oom_score_adj")
				maps, err3 := os.ReadFile("/proc/" + p + "/maps")
				if err1 != nil || err2 != nil || err3 != nil {
					continue // gone meanwhile
				}
				name, _, _ := strings.Cut(string(cmd), "\x00")
				got := strings.TrimSpace(string(adj))
				switch {
				case len(cmd) > 0 && got != strconv.Itoa(host):
					wrong = append(wrong, fmt.Sprintf("%s (%s) at %s", p, name, got))
				case len(cmd) > 0:
				case strings.Contains(string(maps), agentproto.AgentPath+"\n"):
					agent++
					if got != strconv.Itoa(host) {
						wrong = append(wrong, fmt.Sprintf("the agent's stub %s at %s", p, got))
					}
				case got == raised:
					up++
				default:
					wrong = append(wrong, fmt.Sprintf("stub %s at %s", p, got))
				}
			}
			last = fmt.Sprintf("%d stubs raised, %d of the agent, wrong: %v", up, agent, wrong)
			if agent > 0 && up > 0 && len(wrong) == 0 {
				return
			}
		}
		t.Fatalf("oom_score_adj of sandbox %s's processes (the host's: %d): %s", id, host, last)
	}
	id, c := startDialed(t, rt, 256)
	check(t, id)
	// A task started now gets a stub cloned from the raised first one:
	// nothing raises it any more (the driver's second look comes 50 ms
	// after its first raise).
	time.Sleep(300 * time.Millisecond)
	if _, err := c.StartProcess(ctx, agentproto.ExecRequest{Argv: []string{"sleep", "30"}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	check(t, id)
	c.Close()
	img := t.TempDir()
	if err := rt.Checkpoint(ctx, id, img, false); err != nil {
		t.Fatal(err)
	}
	id2 := fmt.Sprintf("sbx_rt%08x", rand.Uint32())
	rwc, err := rt.Restore(ctx, pandastack.RuntimeSpec{ID: id2, RootFS: busyboxRootFS(t), MemoryMB: 256}, img)
	if err != nil {
		t.Fatal(err)
	}
	rwc.Close()
	defer rt.Stop(ctx, id2)
	check(t, id2)
}

// TestDeathAfterASurvivedKill: a sandbox that outlived a kill of the host's
// OOM killer (a task taken, TestStubsGoFirst) and then dies of something
// else is not said to have died of memory; the kill is counted.
func TestDeathAfterASurvivedKill(t *testing.T) {
	rt := newRuntime(t)
	ctx := context.Background()
	id, c := startDialed(t, rt, 512)
	dir, v1 := memoryCgroup(id)
	testutil.WaitStubRaised(t, dir) // past the driver's first look (stubFirstLook)
	usageFile, limitFile := "memory.current", "memory.max"
	if v1 {
		usageFile, limitFile = "memory.usage_in_bytes", "memory.limit_in_bytes"
	}
	b, err := os.ReadFile(filepath.Join(dir, usageFile))
	if err != nil {
		t.Fatal(err)
	}
	usage, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	// 160 MiB over what it holds, far under the 512 MiB it sees: a task
	// doubling a string meets the host's limit.
	if err := os.WriteFile(filepath.Join(dir, limitFile), []byte(strconv.FormatInt(usage+160<<20, 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	ev, err := c.Exec(ctx, agentproto.ExecRequest{Cmd: "awk 'BEGIN { s = \"x\"; while (1) s = s s }'"}, nil)
	if err != nil {
		t.Fatalf("the sandbox died of a task's allocation: %v", err)
	}
	rt.Alive(id) // the first look counts a kill as seen, the next as survived
	if n := rt.OOMKills(id); n < 1 || !rt.Alive(id) {
		t.Fatalf("after the allocation (exit %+v): OOMKills %d, alive %v; want a kill counted, the sandbox alive", ev, n, rt.Alive(id))
	}
	// Now it dies of something else: its sentry is killed.
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range strings.Fields(string(procs)) {
		if cmd, _ := os.ReadFile("/proc/" + p + "/cmdline"); strings.HasPrefix(string(cmd), "runsc-sandbox\x00") {
			pid, _ := strconv.Atoi(p)
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	for deadline := time.Now().Add(10 * time.Second); rt.Alive(id) && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if rt.Alive(id) {
		t.Fatal("alive after its sentry was killed")
	}
	if r, n := rt.DeathReason(id), rt.OOMKills(id); r == pandastack.ReasonOutOfMemory || n < 1 {
		t.Fatalf("DeathReason = %q with OOMKills %d, after a kill the sandbox outlived and a death of another cause; want not out_of_memory, the kill still counted", r, n)
	}
}
