package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/pagecache"
)

// dropAndCount asks the host to drop path from its page cache
// (POSIX_FADV_DONTNEED: pages in use or locked stay), then counts its pages
// still cached (mincore) and all of them.
func dropAndCount(t *testing.T, path string) (cached, total int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := pagecache.Drop(f); err != nil {
		t.Fatal(err)
	}
	n, size, err := pagecache.Resident(f)
	if err != nil {
		t.Fatal(err)
	}
	if size == 0 {
		t.Fatalf("%s is empty", path)
	}
	page := int64(os.Getpagesize())
	return int((n + page - 1) / page), int((size + page - 1) / page)
}

// waitState polls the sandbox until pred holds and returns it.
func waitState(t *testing.T, s *server, id string, what string, pred func(*client.Sandbox) bool) *client.Sandbox {
	t.Helper()
	var last *client.Sandbox
	eventually(t, "sandbox "+id+" to be "+what, func() bool {
		sb, err := s.client().GetSandbox(context.Background(), id)
		last = sb
		return err == nil && pred(sb)
	})
	return last
}

// eventually polls cond until it holds, or fails after a generous deadline
// (no timing assertion: the machine is shared).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited in vain for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// linesWith returns the lines of log that contain any of words.
func linesWith(log string, words ...string) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		for _, w := range words {
			if strings.Contains(l, w) {
				out = append(out, l)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

func suspended(sb *client.Sandbox) bool { return sb.State == "paused" && sb.PauseReason == "idle" }

func idleSeconds(n int64) *int64 { return &n }

// An idle sandbox suspends itself to disk and the next request of any kind
// resumes it with its state; concurrent requests during the resume all
// succeed; TTL expiry of a suspended sandbox deletes its image.
func TestIdleSuspend(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 900, IdleTimeoutSeconds: idleSeconds(2)})
	if sb.IdleTimeoutSeconds != 2 {
		t.Fatalf("idle_timeout_seconds = %d", sb.IdleTimeoutSeconds)
	}
	t.Cleanup(func() {
		if t.Failed() { // what the server said of it, and of idle suspends
			t.Log(linesWith(s.out.String(), sb.ID, "idle", "suspend"))
		}
	})
	if _, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "secret = 'kept'"}); err != nil {
		t.Fatal(err)
	}
	image := filepath.Join(s.dataDir, "paused", sb.ID)

	t.Run("resumes with its variables", func(t *testing.T) {
		waitState(t, s, sb.ID, "suspended", suspended)
		if _, err := os.Stat(filepath.Join(image, "manifest.json")); err != nil {
			t.Fatalf("suspended without an image: %v", err)
		}
		// The record says paused just before the sandbox stops; then its
		// resume is prepared (--prepared-resumes): a runsc container
		// created, waiting for the image.
		eventually(t, "the suspended sandbox's resume to be prepared", func() bool { return s.runscStatus(sb.ID) == "created" })
		// And its image is held in the page cache for it: pages the host
		// drops (here: the test asks it to) the restore would read from disk.
		pages := filepath.Join(image, "image", "pages.img")
		eventually(t, "the prepared resume's image to stay in the page cache when dropped", func() bool {
			cached, total := dropAndCount(t, pages)
			return cached == total
		})
		ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "secret"})
		if err != nil || ex.Text != "'kept'" {
			t.Fatalf("run after suspend: %+v %v", ex, err)
		}
		if got, _ := c.GetSandbox(ctx, sb.ID); got.State != "running" || got.PauseReason != "" {
			t.Fatalf("after resume: %+v", got)
		}
	})

	t.Run("concurrent requests during the resume", func(t *testing.T) {
		waitState(t, s, sb.ID, "suspended", suspended)
		const n = 6
		var wg sync.WaitGroup
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i == 0 { // one cell: a kernel runs one at a time
					ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "secret"})
					if err == nil && ex.Text != "'kept'" {
						err = &client.Error{Code: "wrong", Message: ex.Text}
					}
					errs[i] = err
					return
				}
				res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo hi"})
				if err == nil && res.Stdout != "hi\n" {
					err = &client.Error{Code: "wrong", Message: res.Stdout}
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Errorf("request %d during the resume: %v", i, err)
			}
		}
	})

	t.Run("expiry deletes the image", func(t *testing.T) {
		waitState(t, s, sb.ID, "suspended", suspended)
		if _, err := c.SetTTL(ctx, sb.ID, time.Second); err != nil {
			t.Fatal(err)
		}
		waitState(t, s, sb.ID, "stopped (expired)", func(sb *client.Sandbox) bool { return sb.State == "stopped" && sb.StopReason == "expired" })
		s.assertGone(t, sb.ID) // its image included
	})
}

// standbyOf is the container the server last logged as prepared for creates
// of template and that is still waiting (runsc: created), or "".
func (s *server) standbyOf(template string) string {
	lines := strings.Split(s.out.String(), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		if !strings.Contains(l, `msg="container prepared for creates"`) || !strings.Contains(l, "template="+template+" ") {
			continue
		}
		if m := logSandbox.FindStringSubmatch(l); m != nil && s.runscStatus(m[1]) == "created" {
			return m[1]
		}
	}
	return ""
}

// A suspended sandbox whose own resume is no longer prepared (newer
// suspends took the --prepared-resumes places) resumes into a container
// prepared for its template's creates: with its state, under its own
// hostname (gVisor would name it after that container; its agent sets the
// name back), and its kill leaves nothing of either id. The agent keeps
// the CAP_SYS_ADMIN that takes out of every process it starts.
func TestIdleResumeIntoContainerPreparedForCreates(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 900, IdleTimeoutSeconds: idleSeconds(2)})
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(linesWith(s.out.String(), sb.ID, "prepared", "suspend"))
		}
	})
	if _, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "secret = 'kept'"}); err != nil {
		t.Fatal(err)
	}
	waitState(t, s, sb.ID, "suspended", suspended)
	eventually(t, "the suspended sandbox's resume to be prepared", func() bool { return s.runscStatus(sb.ID) == "created" })
	// Four more suspends (PANDASTACK_PREPARED_RESUMES=4) drop its prepared
	// resume.
	for range 4 {
		o := newSandbox(t, s, client.CreateSandboxRequest{TTLSeconds: 600, IdleTimeoutSeconds: idleSeconds(1)})
		waitState(t, s, o.ID, "suspended", suspended)
	}
	eventually(t, "its prepared resume to be dropped", func() bool { return s.runscStatus(sb.ID) == "" })
	var standby string
	eventually(t, "a container prepared for creates of code-interpreter", func() bool {
		standby = s.standbyOf("code-interpreter")
		return standby != ""
	})

	ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "import socket\nprint(secret, socket.gethostname(), open('/etc/hostname').read().strip())"})
	want := "kept " + strings.ReplaceAll(sb.ID, "_", "-") + " " + strings.ReplaceAll(sb.ID, "_", "-") + "\n"
	if err != nil || ex.Stdout != want {
		t.Fatalf("after the resume: %+v %v; want stdout %q", ex, err, want)
	}
	resumed := linesWith(s.out.String(), `msg="sandbox resumed" sandbox=`+sb.ID)
	if !strings.Contains(resumed, "standby="+standby) {
		t.Fatalf("the resume did not take the prepared container %s:\n%s", standby, resumed)
	}
	if st := s.runscStatus(standby); st != "running" {
		t.Fatalf("the container it took is %q, want running", st)
	}
	if pids := processesMentioning(standby); len(pids) == 0 {
		t.Fatal("no host process of the container it took")
	}
	// The agent (PID 1) holds CAP_SYS_ADMIN (bit 21) to set the name, in
	// its permitted set only: no thread of it has it effective once the
	// name is set, file requests (whose threads act as the user and go
	// back to root) included, and its bounding set, which every process
	// it starts inherits, does not have it at all.
	for i := range 4 {
		if _, err := c.WriteFile(ctx, sb.ID, fmt.Sprintf("/home/user/caps-%d.txt", i), strings.NewReader("x")); err != nil {
			t.Fatal(err)
		}
	}
	out := mustExec(t, s, sb.ID, "grep -E '^Cap(Eff|Prm|Bnd)' /proc/1/task/*/status /proc/self/status")
	const sysAdmin = 1 << 21
	var threads int
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(strings.ReplaceAll(l, ":", " "))
		var v uint64
		if len(f) != 3 {
			t.Fatalf("capabilities: line %q", l)
		}
		if _, err := fmt.Sscanf(f[2], "%x", &v); err != nil {
			t.Fatalf("capabilities: line %q: %v", l, err)
		}
		agent := strings.HasPrefix(f[0], "/proc/1/task/")
		if agent && f[1] == "CapPrm" {
			threads++
		}
		if want := agent && f[1] == "CapPrm"; (v&sysAdmin != 0) != want {
			t.Fatalf("capabilities of the agent's threads and of a command, %s %s has CAP_SYS_ADMIN: %v:\n%s", f[0], f[1], !want, out)
		}
	}
	if threads < 2 {
		t.Fatalf("capabilities of %d agent threads:\n%s", threads, out)
	}

	if err := c.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s.assertGone(t, sb.ID)
	s.assertGone(t, standby)
	if left := networkLeft(s.dataDir, sb.ID, standby); left != "" {
		t.Fatalf("network left: %s", left)
	}
}

// A sandbox whose processes keep working in the background is not idle, and
// idle_timeout_seconds 0 (set with PATCH) never suspends.
func TestIdleBusyIsNotSuspended(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	busy := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 600, IdleTimeoutSeconds: idleSeconds(1)})
	spin := "import threading\ndef spin():\n    while True:\n        pass\nthreading.Thread(target=spin, daemon=True).start()"
	if _, err := c.RunCode(ctx, busy.ID, client.RunRequest{Code: spin}); err != nil {
		t.Fatal(err)
	}
	// Long enough not to suspend before the PATCH on a loaded host.
	off := newSandbox(t, s, client.CreateSandboxRequest{IdleTimeoutSeconds: idleSeconds(60)})
	if got, err := c.SetIdleTimeout(ctx, off.ID, 0); err != nil || got.IdleTimeoutSeconds != 0 {
		t.Fatalf("PATCH idle_timeout_seconds 0: %+v %v", got, err)
	}
	// A control that does go idle in the same time shows the reaper ran.
	control := newSandbox(t, s, client.CreateSandboxRequest{IdleTimeoutSeconds: idleSeconds(1)})
	waitState(t, s, control.ID, "suspended", suspended)
	time.Sleep(3 * time.Second) // several more idle windows
	for _, id := range []string{busy.ID, off.ID} {
		if got, _ := c.GetSandbox(ctx, id); got.State != "running" {
			t.Errorf("%s was suspended: %+v", id, got)
		}
	}
}

// A pause (asked for, or for idleness) on a full disk answers 507 with a
// short message and leaves the sandbox running with its state.
func TestPauseDiskFull(t *testing.T) {
	s, pausedDir := serverWithSmallDisk(t, "paused")
	ctx := context.Background()
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 300, IdleTimeoutSeconds: idleSeconds(0)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.KillSandbox(ctx, sb.ID)
	c.RunCode(ctx, sb.ID, client.RunRequest{Code: "v = 'alive'"})
	status, code, msg := api(t, s, s.key, "POST", "/v1/sandboxes/"+sb.ID+"/pause", "")
	if status != 507 || code != "insufficient_storage" {
		t.Fatalf("pause on a full disk: %d %s %s", status, code, msg)
	}
	if len(msg) > 200 || strings.Contains(msg, s.dataDir) || strings.Contains(msg, "goroutine") {
		t.Errorf("the 507 message is long or shows host details: %q", msg)
	}
	checkAlive := func(when string) {
		t.Helper()
		if got, _ := c.GetSandbox(ctx, sb.ID); got.State != "running" {
			t.Fatalf("%s: %+v", when, got)
		}
		ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "v"})
		if err != nil || ex.Text != "'alive'" {
			t.Fatalf("%s: %+v %v", when, ex, err)
		}
		if ents, _ := os.ReadDir(pausedDir); len(ents) != 0 {
			t.Fatalf("%s: partial image left behind: %v", when, ents)
		}
	}
	checkAlive("after a pause on a full disk")

	// An idle suspend on the full disk fails the same way, and the sandbox
	// stays up. The server log shows it tried.
	if _, err := c.SetIdleTimeout(ctx, sb.ID, time.Second); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for !strings.Contains(s.out.String(), "idle suspend failed") {
		if time.Now().After(deadline) {
			t.Fatalf("no idle suspend was tried:\n%s", tail(s.out.String(), 30))
		}
		time.Sleep(200 * time.Millisecond)
	}
	c.SetIdleTimeout(ctx, sb.ID, 0)
	checkAlive("after an idle suspend on a full disk")
}

// serverWithSmallDisk starts a server of its own whose data subdirectory
// sub is a 20 MiB disk (a code-interpreter image is ~100 MB). The test's
// cleanup stops it, unmounts the disk and removes the data dir.
func serverWithSmallDisk(t *testing.T, sub string) (*server, string) {
	t.Helper()
	s := startServer(t, "")
	dir := filepath.Join(s.dataDir, sub)
	t.Cleanup(func() {
		s.stop()
		syscall.Unmount(dir, syscall.MNT_DETACH)
		os.RemoveAll(s.dataDir)
	})
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=20m"); err != nil {
		t.Fatalf("mount a small tmpfs: %v", err)
	}
	return s, dir
}

// A create on a data disk that is 100% full answers 507, not 500.
func TestCreateDiskFull(t *testing.T) {
	dataDir, err := os.MkdirTemp("", "pandastack-e2e-full-")
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dataDir, "tmpfs", 0, "size=64m"); err != nil {
		t.Fatalf("mount a small tmpfs: %v", err)
	}
	s := startServer(t, dataDir, "PANDASTACK_POOL_SIZE=0")
	defer func() {
		s.stop()
		syscall.Unmount(dataDir, syscall.MNT_DETACH)
		os.RemoveAll(dataDir)
	}()
	before, err := s.client().CreateSandbox(context.Background(), client.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.client().KillSandbox(context.Background(), before.ID)
	filler := filepath.Join(dataDir, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	status, code, msg := api(t, s, s.key, "POST", "/v1/sandboxes", `{}`)
	if status != 507 || code != "insufficient_storage" {
		t.Fatalf("create on a full disk: %d %s %s\n%s", status, code, msg, tail(s.out.String(), 20))
	}
	if len(msg) > 200 || strings.Contains(msg, dataDir) {
		t.Errorf("the 507 message is long or shows host details: %q", msg)
	}
	// A sandbox that runs already keeps working on the full disk.
	if res, err := s.client().Exec(context.Background(), before.ID, client.ExecRequest{Cmd: "echo still here"}); err != nil || res.Stdout != "still here\n" {
		t.Errorf("exec on a full data disk: %+v %v", res, err)
	}
	os.Remove(filler)
	sb, err := s.client().CreateSandbox(context.Background(), client.CreateSandboxRequest{})
	if err != nil {
		t.Fatalf("create once there is room again: %v", err)
	}
	s.client().KillSandbox(context.Background(), sb.ID)
}

// A sandbox suspended for idleness forks straight from its paused image:
// the children run with its variables and files, each its own, while the
// parent stays suspended (not woken for the fork); a snapshot of it does
// not wake it either, and restores with its state; its next request
// resumes it with its own state. A sandbox paused as asked, without
// auto_resume, forks too, and stays paused.
func TestForkSuspended(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 900, IdleTimeoutSeconds: idleSeconds(2)})
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(linesWith(s.out.String(), sb.ID))
		}
	})
	if ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "secret = 41\nopen('note.txt', 'w').write('from the parent')"}); err != nil || ex.Error != nil {
		t.Fatalf("the parent's cell: %+v %v", ex, err)
	}
	waitState(t, s, sb.ID, "suspended", suspended)
	kids, err := c.Fork(ctx, sb.ID, client.ForkRequest{Count: 2, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("fork of the suspended sandbox: %v\n%s", err, tail(s.out.String(), 40))
	}
	for _, k := range kids {
		t.Cleanup(func() { c.KillSandbox(context.Background(), k.ID) })
	}
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || !suspended(got) {
		t.Fatalf("the parent after its fork: %+v %v, want still suspended", got, err)
	}
	for i, k := range kids {
		ex, err := c.RunCode(ctx, k.ID, client.RunRequest{Code: fmt.Sprintf("secret += %d\n(secret, open('note.txt').read())", i+1)})
		if err != nil || ex.Error != nil || ex.Text != fmt.Sprintf("(%d, 'from the parent')", 42+i) {
			t.Fatalf("fork child %d: %+v %v", i, ex, err)
		}
	}
	if !strings.Contains(linesWith(s.out.String(), `msg="sandbox forked" sandbox=`+sb.ID+" "), "paused=true") {
		t.Errorf("the fork's log line does not say it forked the paused image:\n%s", linesWith(s.out.String(), "sandbox forked"))
	}
	// A snapshot does not wake it either, and restores with its state.
	snap, err := c.CreateSnapshot(ctx, sb.ID, nil)
	if err != nil {
		t.Fatalf("snapshot of the suspended sandbox: %v", err)
	}
	t.Cleanup(func() { c.DeleteSnapshot(context.Background(), snap.ID) })
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || !suspended(got) {
		t.Fatalf("the parent after its snapshot: %+v %v, want still suspended", got, err)
	}
	restored, err := c.CreateSandboxFromSnapshot(ctx, client.RestoreRequest{SnapshotID: snap.ID, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("restore of the suspended sandbox's snapshot: %v", err)
	}
	t.Cleanup(func() { c.KillSandbox(context.Background(), restored.ID) })
	if ex, err := c.RunCode(ctx, restored.ID, client.RunRequest{Code: "(secret, open('note.txt').read())"}); err != nil || ex.Text != "(41, 'from the parent')" {
		t.Fatalf("the sandbox restored from the suspended one's snapshot: %+v %v", ex, err)
	}
	if ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "secret"}); err != nil || ex.Text != "41" {
		t.Fatalf("the parent's next request: %+v %v, want it resumed with its own 41", ex, err)
	}

	// Paused as asked, without auto_resume: forked, and still paused.
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	more, err := c.Fork(ctx, sb.ID, client.ForkRequest{Count: 1, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("fork of the sandbox paused as asked: %v", err)
	}
	t.Cleanup(func() { c.KillSandbox(context.Background(), more[0].ID) })
	if ex, err := c.RunCode(ctx, more[0].ID, client.RunRequest{Code: "secret"}); err != nil || ex.Text != "41" {
		t.Fatalf("the child of the paused sandbox: %+v %v", ex, err)
	}
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != "paused" || got.PauseReason != "" {
		t.Fatalf("the parent after a fork while paused as asked: %+v %v", got, err)
	}
}
