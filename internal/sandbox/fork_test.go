package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// A fork that works leaves its image for the background to delete: gone
// once the manager closes, and the children keep what it held.
func TestForkImageRemoved(t *testing.T) {
	h := newHarness(t)
	parent := h.create()
	h.exec(parent.ID, "set v=parent")
	kids, err := h.m.Fork(context.Background(), project, parent.ID, 3, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		if out, err := h.exec(k.ID, "get v"); err != nil || out != "parent" {
			t.Fatalf("child %s: %q %v", k.ID, out, err)
		}
	}
	h.m.Close()
	if ents, _ := os.ReadDir(h.m.cfg.SnapshotDir); len(ents) != 0 {
		t.Fatalf("fork left %v in the snapshot dir", ents)
	}
}

// dirSize adds up the files of a flat image directory, and says -1 when
// the directory cannot be read (the fork line then leaves image_mb out).
func TestDirSize(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(dir+"/pages.bin", make([]byte, 3000), 0o600)
	os.WriteFile(dir+"/checkpoint.img", make([]byte, 500), 0o600)
	os.Mkdir(dir+"/sub", 0o700)
	if got := dirSize(dir); got != 3500 {
		t.Fatalf("dirSize = %d, want 3500", got)
	}
	if got := dirSize(dir + "/missing"); got != -1 {
		t.Fatalf("dirSize of a missing dir = %d, want -1", got)
	}
}

// A fork holds the parent's spare kernels across its checkpoint (the agent
// gives up a start in flight, waiting up to 5 s for that, and shuts the
// ready ones down) and, where refills are not paced, ends its hold once
// its children run.
func TestForkHoldsTheParentsSpares(t *testing.T) {
	h := newHarness(t)
	h.m.cfg.UnpacedRefills = true
	parent := h.create()
	h.rt.takeSuspendLog()
	for _, count := range []int{3, 1} {
		if _, err := h.m.Fork(context.Background(), project, parent.ID, count, nil, nil); err != nil {
			t.Fatal(err)
		}
		want := []string{"hold " + parent.ID + " wait_ms=5000 release=1", "checkpoint " + parent.ID, "unhold " + parent.ID}
		var got []string
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			// The unhold is sent in the background after the answer.
			if got = append(got, h.rt.takeSuspendLog()...); len(got) >= len(want) {
				break
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("fork of %d: the parent's agent saw %q, want %q", count, got, want)
		}
	}
}

// A fork refused for work in flight (a command, a cell) leaves the
// parent's spares alone: no hold, which would shut the ready ones down.
func TestForkRefusedForWorkKeepsTheSpares(t *testing.T) {
	h := newHarness(t)
	h.m.cfg.UnpacedRefills = true
	parent := h.create()
	h.rt.takeSuspendLog()
	_, done, err := h.m.Acquire(context.Background(), project, parent.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Fork(context.Background(), project, parent.ID, 1, nil, nil); !pandastack.IsCode(err, pandastack.EConflict) || !strings.Contains(err.Error(), "running") {
		t.Fatalf("fork with a command under way: %v, want conflict", err)
	}
	time.Sleep(50 * time.Millisecond)
	if got := h.rt.takeSuspendLog(); len(got) != 0 {
		t.Fatalf("a refused fork: the parent's agent saw %q, want nothing", got)
	}
	done()
	if _, err := h.m.Fork(context.Background(), project, parent.ID, 1, nil, nil); err != nil {
		t.Fatalf("fork once the command ended: %v", err)
	}
	if got := h.rt.takeSuspendLog(); len(got) == 0 || got[0] != "hold "+parent.ID+" wait_ms=5000 release=1" {
		t.Fatalf("the fork after: the parent's agent saw %q, want a hold first", got)
	}
}

// Where refills are paced, a fork hands its hold of the parent's spares to
// the pacer, which ends it in its turn, before the children's holds (their
// hellos', taken after it), once the host is quiet; the fork's log line
// says how many ready spares were shut down.
func TestForkPacesTheParentsRefill(t *testing.T) {
	setFor(t, &refillSpacing, 20*time.Millisecond)
	setFor(t, &refillLook, 5*time.Millisecond)
	h := newHarness(t)
	clk := &clock{t: time.Now()}
	// Every reading a microsecond on: holds taken one after the other
	// are ordered.
	h.m.now = func() time.Time { clk.advance(time.Microsecond); return clk.now() }
	h.m.idleCPUs = func(context.Context, time.Duration) (float64, error) { return 2, nil }
	h.tpls.tpl = h.warmBase()
	parent := h.create()
	unholds := func(n int) []string {
		var got []string
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline) && len(got) < n; time.Sleep(5 * time.Millisecond) {
			for _, e := range h.rt.takeSuspendLog() {
				if strings.HasPrefix(e, "unhold ") {
					got = append(got, e)
				}
			}
		}
		return got
	}
	clk.advance(refillCalm)
	if got := unholds(1); !slices.Equal(got, []string{"unhold " + parent.ID}) {
		t.Fatalf("the parent's create: the pacer ended %q, want its hello's hold", got)
	}
	kids, err := h.m.Fork(context.Background(), project, parent.ID, 2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if l := h.logs.with("sandbox forked"); len(l) != 1 || !strings.Contains(l[0], "spares_released=1") {
		t.Errorf("the fork's log lines %q do not say one spare was shut down", l)
	}
	time.Sleep(50 * time.Millisecond)
	if got := unholds(0); len(got) != 0 {
		t.Fatalf("holds ended before the host was quiet: %q", got)
	}
	clk.advance(refillCalm)
	want := []string{"unhold " + parent.ID, "unhold " + kids[0].ID, "unhold " + kids[1].ID}
	got := unholds(len(want))
	// The children's in either order: their hellos ran at once.
	if len(got) == len(want) {
		slices.Sort(got[1:])
		slices.Sort(want[1:])
	}
	if !slices.Equal(got, want) {
		t.Fatalf("the pacer ended %q, want the parent's hold, then each child's: %q", got, want)
	}
}

// A paused sandbox forks from its paused image: the children have its
// state, the parent is neither resumed nor checkpointed and stays paused
// with its image, and resumes later with its state; a second fork works
// as well.
func TestForkOfAPausedSandbox(t *testing.T) {
	h := newHarness(t)
	parent := h.pausedWith("k=v1")
	h.rt.takeSuspendLog()
	for round := range 2 {
		restores := h.rt.restores
		kids, err := h.m.Fork(context.Background(), project, parent.ID, 2, nil, map[string]string{"round": "x"})
		if err != nil {
			t.Fatalf("fork %d of the paused sandbox: %v", round, err)
		}
		for _, k := range kids {
			if got, err := h.exec(k.ID, "get k"); err != nil || got != "v1" {
				t.Fatalf("child %s: get k = %q, %v; want v1", k.ID, got, err)
			}
			if r := h.record(k.ID); r.State != pandastack.StateRunning || r.Metadata["round"] != "x" {
				t.Fatalf("child record: %+v", r)
			}
		}
		if n := h.rt.restores - restores; n != 2 {
			t.Errorf("fork %d: %d restores, want the children's 2 (the parent not resumed)", round, n)
		}
		if log := h.rt.takeSuspendLog(); len(log) != 0 {
			t.Errorf("fork %d of a paused sandbox reached its agent or checkpointed: %q", round, log)
		}
		if r := h.record(parent.ID); r.State != pandastack.StatePaused {
			t.Fatalf("fork %d: the parent is %s, want paused", round, r.State)
		}
		if l := h.logs.with("sandbox forked"); len(l) != round+1 || !strings.Contains(l[round], "paused=true") {
			t.Errorf("fork %d: the log's fork lines %q do not say the parent was paused", round, l)
		}
	}
	if _, err := h.m.Resume(context.Background(), project, parent.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := h.exec(parent.ID, "get k"); err != nil || got != "v1" {
		t.Fatalf("the parent after its resume: get k = %q, %v", got, err)
	}
}

// While a paused sandbox's children restore from its image, its resume
// and its kill wait for them (the image must stay until runsc has opened
// it); then both go ahead, and the fork has succeeded.
func TestForkOfAPausedSandboxHoldsOffResumeAndKill(t *testing.T) {
	for _, then := range []string{"resume", "kill"} {
		t.Run(then, func(t *testing.T) {
			h := newHarness(t)
			parent := h.pausedWith("k=v1")
			inRestore, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			h.rt.restoreErr = func(spec pandastack.RuntimeSpec) error {
				if spec.ID == parent.ID {
					return nil
				}
				once.Do(func() { close(inRestore) })
				h.rt.mu.Unlock()
				<-release
				h.rt.mu.Lock()
				return nil
			}
			forked := make(chan error, 1)
			go func() {
				_, err := h.m.Fork(context.Background(), project, parent.ID, 1, nil, nil)
				forked <- err
			}()
			<-inRestore
			other := make(chan error, 1)
			go func() {
				var err error
				if then == "resume" {
					_, err = h.m.Resume(context.Background(), project, parent.ID)
				} else {
					err = h.m.Kill(context.Background(), project, parent.ID)
				}
				other <- err
			}()
			select {
			case err := <-other:
				t.Fatalf("the %s did not wait for the fork's children (%v)", then, err)
			case <-time.After(100 * time.Millisecond):
			}
			if _, err := os.Stat(filepath.Join(h.m.pausedPath(parent.ID), "image")); err != nil {
				t.Fatalf("the paused image went during the fork: %v", err)
			}
			close(release)
			if err := <-forked; err != nil {
				t.Fatalf("fork: %v", err)
			}
			if err := <-other; err != nil {
				t.Fatalf("%s after the fork: %v", then, err)
			}
		})
	}
}

// pausedWith creates a sandbox, sets the variable kv ("k=v") in it and
// pauses it.
func (h *harness) pausedWith(kv string) pandastack.Sandbox {
	h.t.Helper()
	sb := h.create()
	if _, err := h.exec(sb.ID, "set "+kv); err != nil {
		h.t.Fatal(err)
	}
	if _, err := h.m.Pause(context.Background(), project, sb.ID); err != nil {
		h.t.Fatal(err)
	}
	return sb
}

// A paused sandbox past its TTL is neither forked nor snapshotted from
// its image: the reaper stops it, and reads of it back to back kept it from
// that stop (a claim the reaper met lost its mark with the claim).
func TestPausedSandboxPastItsTTLIsNotRead(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.pausedWith("k=v")
	h.store.SetSandboxExpiry(ctx, sb.ID, time.Now().Add(-time.Second))
	if _, err := h.m.ForkWith(ctx, project, sb.ID, ForkOptions{Count: 1}); !pandastack.IsCode(err, pandastack.EConflict) || !strings.Contains(err.Error(), "being stopped") {
		t.Fatalf("fork of a paused sandbox past its TTL: %v, want conflict, being stopped", err)
	}
	if _, err := h.m.Snapshot(ctx, project, sb.ID, nil); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("snapshot of a paused sandbox past its TTL: %v, want conflict", err)
	}
	h.m.reapOnce()
	h.wantStopped(sb.ID, pandastack.StopExpired)
}

// A pause whose record was written though the store's answer was lost
// goes on: the record says paused, so the image stays, the sandbox stops,
// and a resume brings its state back.
func TestPauseWhoseRecordWasMadeThoughItsAnswerWasLost(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create()
	if _, err := h.exec(sb.ID, "set k=v"); err != nil {
		t.Fatal(err)
	}
	h.store.set(func(s *hookStore) {
		s.lostAnswer = func(id string, state pandastack.SandboxState) bool {
			return id == sb.ID && state == pandastack.StatePaused
		}
	})
	_, err := h.m.Pause(ctx, project, sb.ID)
	h.store.set(func(s *hookStore) { s.lostAnswer = nil })
	if err != nil {
		t.Fatalf("pause: %v", err)
	}
	if rec := h.record(sb.ID); rec.State != pandastack.StatePaused {
		t.Fatalf("after the pause: %s", rec.State)
	}
	if h.rt.Alive(sb.ID) {
		t.Fatal("the paused sandbox still runs")
	}
	if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if got, err := h.exec(sb.ID, "get k"); err != nil || got != "v" {
		t.Fatalf("after the resume: %q %v, want the state kept", got, err)
	}
}

// A snapshot whose record was written though the store's answer was lost
// keeps its image: it is listed, and a sandbox restores from it. When the
// store answers neither the write nor the read after it, the snapshot
// answers an error but keeps its image and pending file, and the next
// start settles it, keeping the image of a record that was made.
func TestSnapshotWhoseRecordWasMadeThoughItsAnswerWasLost(t *testing.T) {
	for _, unread := range []bool{false, true} {
		t.Run(fmt.Sprintf("unread=%v", unread), func(t *testing.T) {
			h := newHarness(t)
			ctx := context.Background()
			sb := h.create()
			if _, err := h.exec(sb.ID, "set k=v"); err != nil {
				t.Fatal(err)
			}
			h.store.set(func(s *hookStore) {
				s.lostSnapshot = true
				if unread {
					s.getSnapshotErr = errInjected
				}
			})
			_, err := h.m.Snapshot(ctx, project, sb.ID, nil)
			h.store.set(func(s *hookStore) { s.lostSnapshot, s.getSnapshotErr = false, nil })
			if (err != nil) != unread {
				t.Fatalf("snapshot: %v, want an error only when its record cannot be read", err)
			}
			snaps, err := h.m.ListSnapshots(ctx, project, nil)
			if err != nil || len(snaps) != 1 {
				t.Fatalf("listed: %v %v", snaps, err)
			}
			if unread {
				h.m.Close()
				h.m = h.newManager() // its start settles what was left
			}
			kid, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snaps[0].ID})
			if err != nil {
				t.Fatalf("restore from the snapshot: %v", err)
			}
			if got, err := h.exec(kid.ID, "get k"); err != nil || got != "v" {
				t.Fatalf("restored: %q %v, want the state kept", got, err)
			}
		})
	}
}

// Two forks of one paused sandbox at once: the second waits for the
// first's read of the image, then reads it too; neither resumes it.
func TestConcurrentForksOfAPausedSandbox(t *testing.T) {
	h := newHarness(t)
	parent := h.pausedWith("k=v1")
	inRestore, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.rt.restoreErr = func(spec pandastack.RuntimeSpec) error {
		first := false
		once.Do(func() { first = true; close(inRestore) })
		if first {
			h.rt.mu.Unlock()
			<-release
			h.rt.mu.Lock()
		}
		return nil
	}
	errs := make(chan error, 2)
	fork := func() {
		_, err := h.m.Fork(context.Background(), project, parent.ID, 1, nil, nil)
		errs <- err
	}
	go fork()
	<-inRestore
	go fork()
	time.Sleep(50 * time.Millisecond)
	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if r := h.record(parent.ID); r.State != pandastack.StatePaused {
		t.Fatalf("the parent after two forks is %s, want paused", r.State)
	}
	l := h.logs.with("sandbox forked")
	if len(l) != 2 || !strings.Contains(l[0], "paused=true") || !strings.Contains(l[1], "paused=true") {
		t.Fatalf("fork log lines %q, want two forks of the paused image", l)
	}
}

// A fork or a restore from a snapshot keeps the size of what it copies:
// over limits lowered since (a server restarted with a smaller
// --max-memory-mb), it is refused, not made.
func TestForkAndRestoreKeepToTheLimits(t *testing.T) {
	h := newHarness(t)
	parent := h.create() // 1 CPU, 256 MiB
	snap := h.snapshot(parent.ID)
	h.m.cfg.MaxMemoryMB = 128
	if _, err := h.m.Fork(context.Background(), project, parent.ID, 1, nil, nil); !pandastack.IsCode(err, pandastack.EInvalid) || !strings.Contains(err.Error(), "--max-memory-mb 128") {
		t.Fatalf("fork over the lowered limit: %v, want invalid_request naming it", err)
	}
	if _, err := h.m.Create(context.Background(), project, CreateRequest{SnapshotID: snap.ID}); !pandastack.IsCode(err, pandastack.EInvalid) || !strings.Contains(err.Error(), "--max-memory-mb 128") {
		t.Fatalf("restore over the lowered limit: %v, want invalid_request naming it", err)
	}
	h.m.cfg.MaxMemoryMB = 256
	if _, err := h.m.Fork(context.Background(), project, parent.ID, 1, nil, nil); err != nil {
		t.Fatalf("fork within the limit: %v", err)
	}
}

// A fork or snapshot asked for while a pause is under way waits for it
// and reads the paused image, leaving the sandbox paused (it answered
// "paused; resume it first", or resumed a sandbox with auto_resume).
func TestForkAndSnapshotDuringAPause(t *testing.T) {
	for _, op := range []string{"fork", "snapshot"} {
		for _, autoResume := range []bool{false, true} {
			h := newHarness(t)
			ctx := context.Background()
			sb, err := h.m.Create(ctx, project, CreateRequest{Template: "base", AutoResume: autoResume})
			if err != nil {
				t.Fatal(err)
			}
			h.exec(sb.ID, "set k=v1")
			inCheckpoint, release := h.holdCheckpoint()
			paused := make(chan error, 1)
			go func() { _, err := h.m.Pause(ctx, project, sb.ID); paused <- err }()
			<-inCheckpoint
			done := make(chan error, 1)
			go func() {
				var err error
				if op == "fork" {
					_, err = h.m.Fork(ctx, project, sb.ID, 1, nil, nil)
				} else {
					_, err = h.m.Snapshot(ctx, project, sb.ID, nil)
				}
				done <- err
			}()
			time.Sleep(50 * time.Millisecond) // the fork or snapshot waits for the pause
			close(release)
			if err := <-paused; err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatalf("%s during a pause (auto_resume %v): %v", op, autoResume, err)
			}
			if r := h.record(sb.ID); r.State != pandastack.StatePaused {
				t.Fatalf("%s during a pause (auto_resume %v): the sandbox is %s, want paused", op, autoResume, r.State)
			}
		}
	}
}

// A fork's children are recorded running together, once every one runs:
// until then a child that is up says starting, so that a server that dies
// before the fork answers stops it on its next start (start_failed) rather
// than take back a sandbox its caller never learned of; a start does so.
func TestForkChildrenRecordedRunningTogether(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	parent := h.create()
	up, release, forked := h.forkOfTwoHalfDone(parent.ID)
	if rec := h.record(up); rec.State != pandastack.StateStarting {
		t.Errorf("a child up while its sibling restores is recorded %s, want starting", rec.State)
	}
	// The server dies here: its next start stops the child.
	h.m.Close()
	h.m = h.newManager()
	if rec := h.record(up); rec.State != pandastack.StateStopped || rec.StopReason != pandastack.StopFailed {
		t.Errorf("after a restart, the child of a fork that never answered is %s %s, want stopped %s", rec.State, rec.StopReason, pandastack.StopFailed)
	}
	close(release)
	<-forked

	// A fork that answers: every child running.
	h.rt.restoreErr = nil
	kids, err := h.m.Fork(ctx, project, parent.ID, 3, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		if rec := h.record(k.ID); rec.State != pandastack.StateRunning || k.State != pandastack.StateRunning {
			t.Errorf("child %s after the fork: recorded %s, answered %s", k.ID, rec.State, k.State)
		}
	}
}

// childUp waits for a sandbox other than parent to have said hello and
// returns its id.
func (h *harness) childUp(parent string) string {
	h.t.Helper()
	var up string
	waitFor(h.t, func() bool {
		h.rt.mu.Lock()
		defer h.rt.mu.Unlock()
		for id, n := range h.rt.hellos {
			if id != parent && n > 0 {
				up = id
				return true
			}
		}
		return false
	})
	return up
}

// A kill of a fork's child by id while its siblings restore (the id is in
// the list already) waits for the fork, and the child stays killed: the
// fork's recording of its children running does not bring it back.
func TestForkChildKilledDuringTheFork(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	parent := h.create()
	up, release, forked := h.forkOfTwoHalfDone(parent.ID)
	killed := make(chan error, 1)
	go func() { killed <- h.m.Kill(ctx, project, up) }()
	select {
	case err := <-killed:
		t.Fatalf("the kill of a child being forked ended before the fork: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-forked; err != nil {
		t.Fatalf("fork: %v", err)
	}
	if err := <-killed; err != nil {
		t.Fatalf("kill: %v", err)
	}
	if _, err := h.store.GetSandbox(ctx, "", up); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Errorf("the killed child's record after the fork: %v, want it gone", err)
	}
}

// forkOfTwoHalfDone forks parent into two children and returns once one
// child has said hello while the other's restore waits: the child that is
// up, a release for the other, and the fork's outcome to come.
func (h *harness) forkOfTwoHalfDone(parent string) (up string, release chan struct{}, forked chan error) {
	h.t.Helper()
	restores := 0 // under h.rt.mu, which the hook is called with
	second := make(chan struct{})
	release, forked = make(chan struct{}), make(chan error, 1)
	h.rt.restoreErr = func(pandastack.RuntimeSpec) error {
		if restores++; restores == 2 {
			close(second)
			h.rt.mu.Unlock()
			<-release
			h.rt.mu.Lock()
		}
		return nil
	}
	go func() {
		_, err := h.m.Fork(context.Background(), project, parent, 2, nil, nil)
		forked <- err
	}()
	<-second
	return h.childUp(parent), release, forked
}

// Another project's sandbox is not found by a fork or a snapshot at once,
// as a missing one, even while it pauses: a snapshot waited out the pause
// first, and its late 404 told the caller the sandbox was there.
func TestForkAndSnapshotOfAnotherProjectsPausingSandbox(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create()
	inCheckpoint, release := h.holdCheckpoint()
	paused := make(chan error, 1)
	go func() { _, err := h.m.Pause(ctx, project, sb.ID); paused <- err }()
	<-inCheckpoint
	for _, op := range []string{"fork", "snapshot"} {
		done := make(chan error, 1)
		go func() {
			var err error
			if op == "fork" {
				_, err = h.m.Fork(ctx, "prj_other", sb.ID, 1, nil, nil)
			} else {
				_, err = h.m.Snapshot(ctx, "prj_other", sb.ID, nil)
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !pandastack.IsCode(err, pandastack.ENotFound) {
				t.Errorf("%s of another project's sandbox: %v, want not_found", op, err)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("%s of another project's sandbox waits for its pause", op)
			close(release)
			<-done
			release = nil
		}
	}
	if release != nil {
		close(release)
	}
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
}
