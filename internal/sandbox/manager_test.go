package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

func TestCreateExecKill(t *testing.T) {
	h := newHarness(t)
	sb := h.create()
	if sb.State != pandastack.StateRunning || h.record(sb.ID).State != pandastack.StateRunning {
		t.Fatalf("state %s, record %s", sb.State, h.record(sb.ID).State)
	}
	if _, err := h.exec(sb.ID, "set x=42"); err != nil {
		t.Fatal(err)
	}
	if out, err := h.exec(sb.ID, "get x"); err != nil || out != "42" {
		t.Fatalf("get x: %q %v", out, err)
	}
	if err := h.m.Kill(context.Background(), project, sb.ID); err != nil {
		t.Fatal(err)
	}
	if ids := h.rt.ids(); len(ids) != 0 {
		t.Fatalf("runtime still holds %v", ids)
	}
	if ids := h.m.entryIDs(); len(ids) != 0 {
		t.Fatalf("manager still holds %v", ids)
	}
	if _, err := h.store.GetSandbox(context.Background(), project, sb.ID); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Fatalf("record after kill: %v", err)
	}
}

// Work in flight and checkpoints exclude each other, both ways.
func TestExclusion(t *testing.T) {
	h := newHarness(t)
	sb := h.create()
	ctx := context.Background()

	// Work in flight: snapshot, fork and pause answer conflict; kill wins.
	_, done, err := h.m.Acquire(ctx, project, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.m.Snapshot(ctx, project, sb.ID, nil)
	wantCode(t, err, pandastack.EConflict)
	_, err = h.m.Fork(ctx, project, sb.ID, 1, nil, nil)
	wantCode(t, err, pandastack.EConflict)
	_, err = h.m.Pause(ctx, project, sb.ID)
	wantCode(t, err, pandastack.EConflict)
	done()
	done() // idempotent: one piece of work counts once

	// A checkpoint under way: new work and a pause wait for it; the work
	// then goes first (it came first, and the pause waits for it to start:
	// its acquire happens within answerGrace), and the pause answers
	// conflict for it or, once it ended, pauses.
	inCheckpoint, release := h.holdCheckpoint()
	snapErr := make(chan error, 1)
	go func() {
		_, err := h.m.Snapshot(ctx, project, sb.ID, nil)
		snapErr <- err
	}()
	<-inCheckpoint
	type acquired struct {
		done func()
		err  error
	}
	work := make(chan acquired, 1)
	go func() {
		_, done, err := h.m.Acquire(ctx, project, sb.ID)
		work <- acquired{done, err}
	}()
	for !h.m.sbx.waitingFor(sb.ID) {
		time.Sleep(time.Millisecond)
	}
	pauseErr := make(chan error, 1)
	go func() {
		_, err := h.m.Pause(ctx, project, sb.ID)
		pauseErr <- err
	}()
	time.Sleep(20 * time.Millisecond)
	select {
	case w := <-work:
		t.Fatalf("work during a checkpoint did not wait: %v", w.err)
	case err := <-pauseErr:
		t.Fatalf("a pause during a checkpoint did not wait: %v", err)
	default:
	}
	close(release)
	if err := <-snapErr; err != nil {
		t.Fatal(err)
	}
	w := <-work
	if w.err != nil {
		t.Fatalf("work after the checkpoint it waited for: %v", w.err)
	}
	wantCode(t, <-pauseErr, pandastack.EConflict) // the work still runs
	w.done()
	h.rt.mu.Lock()
	h.rt.checkpointErr = nil
	h.rt.mu.Unlock()

	// Afterwards everything works again.
	if _, err := h.exec(sb.ID, "set y=1"); err != nil {
		t.Fatal(err)
	}

	// A kill waits for a checkpoint under way, and no other begins meanwhile.
	inCheckpoint, release = h.holdCheckpoint()
	go func() {
		_, err := h.m.Snapshot(ctx, project, sb.ID, nil)
		snapErr <- err
	}()
	<-inCheckpoint
	killErr := make(chan error, 1)
	go func() { killErr <- h.m.Kill(ctx, project, sb.ID) }()
	for !h.m.sbx.stopWaiting(sb.ID) {
		time.Sleep(time.Millisecond)
	}
	close(release)
	if err := <-snapErr; err != nil {
		t.Fatal(err)
	}
	h.rt.mu.Lock()
	h.rt.checkpointErr = nil
	h.rt.mu.Unlock()
	_, err = h.m.Snapshot(ctx, project, sb.ID, nil) // between the checkpoint's end and the kill's turn, or after the kill
	if err == nil {
		t.Fatal("a snapshot began while a kill waited")
	}
	if err := <-killErr; err != nil {
		t.Fatalf("the kill after the checkpoint: %v", err)
	}
}

// Work waits for a checkpoint only so long (phaseWait): one that hangs
// answers conflict, as before work waited for checkpoints.
func TestWorkWaitsForACheckpointAWhile(t *testing.T) {
	setFor(t, &phaseWait, 200*time.Millisecond)
	h := newHarness(t)
	sb := h.create()
	inCheckpoint, release := h.holdCheckpoint()
	snapErr := make(chan error, 1)
	go func() {
		_, err := h.m.Snapshot(context.Background(), project, sb.ID, nil)
		snapErr <- err
	}()
	<-inCheckpoint
	start := time.Now()
	_, err := h.exec(sb.ID, "set a=1")
	wantCode(t, err, pandastack.EConflict)
	if took := time.Since(start); took < phaseWait || took > 10*phaseWait {
		t.Errorf("work refused after %s, want after about %s", took, phaseWait)
	}
	close(release)
	if err := <-snapErr; err != nil {
		t.Fatal(err)
	}
}

// Concurrent work and snapshots: each snapshot either succeeds with no
// work in flight or answers conflict; no work ever fails.
func TestExclusionRace(t *testing.T) {
	h := newHarness(t)
	sb := h.create()
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range 10 {
				if _, err := h.exec(sb.ID, "set a=1"); err != nil && !pandastack.IsCode(err, pandastack.EConflict) {
					t.Errorf("exec: %v", err)
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range 3 {
				if _, err := h.m.Snapshot(ctx, project, sb.ID, nil); err != nil && !pandastack.IsCode(err, pandastack.EConflict) {
					t.Errorf("snapshot: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	if n := h.m.sbx.entries[sb.ID].inflight; n != 0 {
		t.Fatalf("in flight after all work ended: %d", n)
	}
}

// A create that fails part-way leaves nothing behind and says why.
func TestCreateRollback(t *testing.T) {
	h := newHarness(t)
	var failedID string
	h.rt.startErr = func(spec pandastack.RuntimeSpec) error {
		failedID = spec.ID
		return errInjected
	}
	if _, err := h.m.Create(context.Background(), project, CreateRequest{Template: "base"}); err == nil {
		t.Fatal("create succeeded")
	}
	if rec := h.record(failedID); rec.State != pandastack.StateStopped || rec.StopReason != pandastack.StopFailed {
		t.Fatalf("record after a failed create: %s %s", rec.State, rec.StopReason)
	}
	if ids := h.rt.ids(); len(ids) != 0 {
		t.Fatalf("runtime holds %v", ids)
	}
	if ids := h.m.entryIDs(); len(ids) != 0 {
		t.Fatalf("manager holds %v", ids)
	}
	h.rt.startErr = nil

	// Booted but the agent never answers hello: the runtime's sandbox goes too.
	h.m.cfg.StartTimeout = 200 * time.Millisecond
	h.rt.noAgent = true
	_, err := h.m.Create(context.Background(), project, CreateRequest{Template: "base"})
	wantCode(t, err, pandastack.ETimeout)
	if ids := h.rt.ids(); len(ids) != 0 {
		t.Fatalf("runtime holds %v after a silent agent", ids)
	}
	if ids := h.m.entryIDs(); len(ids) != 0 {
		t.Fatalf("manager holds %v", ids)
	}
}

// A fork whose children fail leaves no child, no image, and the parent
// running. (The second child's restores all fail: a failed boot is tried
// once more.)
func TestForkChildFailure(t *testing.T) {
	h := newHarness(t)
	parent := h.create()
	h.exec(parent.ID, "set v=parent")
	var mu sync.Mutex
	n, failing := 0, ""
	h.rt.restoreErr = func(spec pandastack.RuntimeSpec) error {
		mu.Lock()
		defer mu.Unlock()
		if n++; n == 2 {
			failing = spec.ID
		}
		if spec.ID == failing {
			return errInjected
		}
		return nil
	}
	if _, err := h.m.Fork(context.Background(), project, parent.ID, 3, nil, nil); err == nil {
		t.Fatal("fork succeeded")
	}
	if ids := h.rt.ids(); !slices.Equal(ids, []string{parent.ID}) {
		t.Fatalf("runtime holds %v, want only the parent", ids)
	}
	if ids := h.m.entryIDs(); !slices.Equal(ids, []string{parent.ID}) {
		t.Fatalf("manager holds %v, want only the parent", ids)
	}
	live, _ := h.store.ListSandboxes(context.Background(), pandastack.SandboxFilter{States: []pandastack.SandboxState{pandastack.StateStarting, pandastack.StateRunning}})
	if len(live) != 1 || live[0].ID != parent.ID {
		t.Fatalf("live records %v", live)
	}
	if ents, _ := os.ReadDir(h.m.cfg.SnapshotDir); len(ents) != 0 {
		t.Fatalf("fork left %v in the snapshot dir", ents)
	}
	if out, err := h.exec(parent.ID, "get v"); err != nil || out != "parent" {
		t.Fatalf("parent after the failed fork: %q %v", out, err)
	}

	// And a fork that works carries the parent's state into each child.
	h.rt.restoreErr = nil
	kids, err := h.m.Fork(context.Background(), project, parent.ID, 2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		if out, err := h.exec(k.ID, "get v"); err != nil || out != "parent" {
			t.Fatalf("child %s: %q %v", k.ID, out, err)
		}
	}
}

// Snapshot, restore, pause and resume through the manager.
func TestSnapshotPauseResume(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create()
	h.exec(sb.ID, "set v=1")
	snap, err := h.m.Snapshot(ctx, project, sb.ID, map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	restored, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if out, _ := h.exec(restored.ID, "get v"); out != "1" {
		t.Fatalf("restored: %q", out)
	}
	p, err := h.m.Pause(ctx, project, sb.ID)
	if err != nil || p.State != pandastack.StatePaused {
		t.Fatalf("pause: %v %s", err, p.State)
	}
	if h.rt.Alive(sb.ID) || slices.Contains(h.m.entryIDs(), sb.ID) {
		t.Fatal("a paused sandbox is still held")
	}
	_, _, err = h.m.Acquire(ctx, project, sb.ID)
	wantCode(t, err, pandastack.EConflict) // paused without auto_resume
	if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	if out, _ := h.exec(sb.ID, "get v"); out != "1" {
		t.Fatalf("resumed: %q", out)
	}
	if _, err := os.Stat(h.m.pausedPath(sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("paused image kept after resume: %v", err)
	}
}

// A snapshot being restored from cannot be deleted under the restore (runsc
// would find its pages file gone and the create fail as an internal
// error); once no restore uses it, it can.
func TestDeleteSnapshotUnderARestore(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	snap := h.snapshot(h.create().ID)
	if _, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID}); err != nil {
		t.Fatal(err)
	}
	if h.m.snapUse.inUse(snap.ID) {
		t.Fatal("a finished restore still counts as a use of its snapshot")
	}
	release, _ := h.m.snapUse.take(snap.ID) // a restore in flight
	wantCode(t, h.m.DeleteSnapshot(ctx, project, snap.ID), pandastack.EConflict)
	release()
	// A restore while the delete is under way: not found, not corrupt.
	done, _, ok := h.m.snapUse.deleteStarts(snap.ID)
	if !ok {
		t.Fatal("a delete could not start")
	}
	_, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
	wantCode(t, err, pandastack.ENotFound)
	// A second delete meanwhile (a retry) waits for the first, then says
	// what the record says; here the first made no change.
	second := make(chan error, 1)
	go func() { second <- h.m.DeleteSnapshot(ctx, project, snap.ID) }()
	select {
	case err := <-second:
		t.Fatalf("a second delete during the first answered at once: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	done()
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if err := h.m.DeleteSnapshot(ctx, project, snap.ID); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Fatalf("a delete after the delete: %v, want not_found", err)
	}
	_, err = h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
	wantCode(t, err, pandastack.ENotFound)
}

// A restart re-adopts what still runs, stops what does not, and removes
// runtime state nobody owns.
func TestRecovery(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	keep := h.create()
	h.exec(keep.ID, "set v=kept")
	lost := h.create()
	expired := h.create()
	h.m.Close()

	h.rt.die(lost.ID, "")
	h.store.SetSandboxExpiry(ctx, expired.ID, time.Now().Add(-time.Second))
	h.rt.Start(ctx, pandastack.RuntimeSpec{ID: "sbx_orphan"})
	starting := pandastack.Sandbox{ID: "sbx_halfmade", ProjectID: project, Template: "base", State: pandastack.StateStarting, Metadata: map[string]string{}, CreatedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}
	h.store.CreateSandbox(ctx, starting)

	h.m = h.newManager()
	if out, err := h.exec(keep.ID, "get v"); err != nil || out != "kept" {
		t.Fatalf("re-adopted: %q %v", out, err)
	}
	for id, want := range map[string]string{lost.ID: pandastack.StopLost, expired.ID: pandastack.StopExpired, starting.ID: pandastack.StopFailed} {
		if rec := h.record(id); rec.State != pandastack.StateStopped || rec.StopReason != want {
			t.Errorf("%s: %s %s, want stopped %s", id, rec.State, rec.StopReason, want)
		}
	}
	if ids := h.rt.ids(); !slices.Equal(ids, []string{keep.ID}) {
		t.Fatalf("runtime holds %v, want only %s", ids, keep.ID)
	}
}

// The reaper stops expired sandboxes and records sandboxes that died.
func TestReaper(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a, b, c, d := h.create(), h.create(), h.create(), h.create()
	h.store.SetSandboxExpiry(ctx, a.ID, time.Now().Add(-time.Second))
	h.store.SetSandboxExpiry(ctx, b.ID, time.Now().Add(-time.Second))
	h.rt.die(c.ID, pandastack.ReasonOutOfMemory)
	h.rt.die(d.ID, pandastack.ReasonPIDsLimit) // a fork bomb the in-sandbox limit did not stop
	h.m.reapOnce()
	for id, want := range map[string]string{a.ID: pandastack.StopExpired, b.ID: pandastack.StopExpired, c.ID: pandastack.StopOOM, d.ID: pandastack.StopPIDsLimit} {
		if rec := h.record(id); rec.State != pandastack.StateStopped || rec.StopReason != want {
			t.Errorf("%s: %s %s, want stopped %s", id, rec.State, rec.StopReason, want)
		}
	}
	if ids := h.rt.ids(); len(ids) != 0 {
		t.Fatalf("runtime holds %v", ids)
	}
}

// A TTL extended after the reaper listed the sandbox as expired stands:
// the extension answered, and the sandbox runs on.
func TestReaperHonoursATTLExtendedMeanwhile(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create()
	h.store.SetSandboxExpiry(ctx, sb.ID, time.Now().Add(-time.Second))
	h.store.afterExpired = func([]pandastack.Sandbox) {
		h.store.afterExpired = nil
		if _, err := h.m.SetTTL(ctx, project, sb.ID, 600); err != nil {
			t.Error(err)
		}
	}
	h.m.reapOnce()
	if rec := h.record(sb.ID); rec.State != pandastack.StateRunning {
		t.Fatalf("after a TTL extended meanwhile: %s %s, want running", rec.State, rec.StopReason)
	}
	if _, err := h.exec(sb.ID, "set k=v"); err != nil {
		t.Fatalf("the sandbox kept answers no more: %v", err)
	}
}

// A TTL extended once the reaper has looked at the record a last time and
// is stopping the sandbox is refused (conflict, being stopped), not
// answered with an expiry the sandbox will not live to see.
func TestTTLExtendedWhileTheReaperStopsIsRefused(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create()
	h.store.SetSandboxExpiry(ctx, sb.ID, time.Now().Add(-time.Second))
	var patchErr error
	h.store.set(func(s *hookStore) {
		s.setStateErr = func(id string, state pandastack.SandboxState) error {
			if id == sb.ID && state == pandastack.StateStopped { // the reaper records its stop
				_, patchErr = h.m.SetTTL(ctx, project, sb.ID, 600)
			}
			return nil
		}
	})
	h.m.reapOnce()
	if !pandastack.IsCode(patchErr, pandastack.EConflict) || !strings.Contains(patchErr.Error(), "being stopped") {
		t.Fatalf("TTL extended during the reaper's stop: %v, want conflict saying it is being stopped", patchErr)
	}
	h.wantStopped(sb.ID, pandastack.StopExpired)
}

// A TTL change that waits behind the reaper's look at the records (a
// store slow to answer) gives up with its request.
func TestTTLChangeGivesUpWithItsRequest(t *testing.T) {
	h := newHarness(t)
	sb := h.create()
	other := h.create()
	done, err := h.m.expiry.take(context.Background(), sb.ID) // the reaper's look, held
	if err != nil {
		t.Fatal(err)
	}
	// Another sandbox's TTL does not wait for it.
	if _, err := h.m.SetTTL(context.Background(), project, other.ID, 600); err != nil {
		t.Fatalf("TTL of another sandbox: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err = h.m.SetTTL(ctx, project, sb.ID, 600)
	done()
	if !pandastack.IsCode(err, pandastack.ETimeout) {
		t.Fatalf("TTL change behind a held look: %v, want timeout", err)
	}
	if _, err := h.m.SetTTL(context.Background(), project, sb.ID, 600); err != nil {
		t.Fatalf("TTL change once the look is through: %v", err)
	}
}

// A TTL change being written when the reaper claims the sandbox is what
// the reaper's last look sees: an extension that answered leaves the
// sandbox running.
func TestReaperWaitsForATTLBeingWritten(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create()
	h.store.SetSandboxExpiry(ctx, sb.ID, time.Now().Add(-time.Second))
	reaped := make(chan struct{})
	h.store.set(func(s *hookStore) {
		s.beforeSetExpiry = func(string) {
			h.store.set(func(s *hookStore) { s.beforeSetExpiry = nil })
			go func() { h.m.reapOnce(); close(reaped) }()
			// The reaper has the time to claim and look; ordered, it waits.
			select {
			case <-reaped:
			case <-time.After(300 * time.Millisecond):
			}
		}
	})
	_, err := h.m.SetTTL(ctx, project, sb.ID, 600)
	<-reaped
	rec := h.record(sb.ID)
	if err == nil && rec.State != pandastack.StateRunning {
		t.Fatalf("the TTL extension answered, yet the sandbox is %s %s", rec.State, rec.StopReason)
	}
	if err != nil {
		t.Fatalf("TTL extension: %v", err)
	}
	if _, err := h.exec(sb.ID, "set k=v"); err != nil {
		t.Fatalf("the sandbox kept answers no more: %v", err)
	}
}

// A pool sandbox that dies while it waits is stopped and replaced at the
// pool's next look, not left counted as ready until a create claims it.
func TestPoolReplacesADeadSandbox(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	tpl := h.warmBase()
	h.tpls.tpl = tpl
	h.m.EnablePool(tpl, 2)
	waitFor(t, func() bool { return h.m.Pools(ctx)["base"].Ready == 2 })
	dead := h.rt.ids()[0]
	h.rt.die(dead, "")
	h.m.mu.Lock()
	p := h.m.pools["base"]
	h.m.mu.Unlock()
	h.m.pruneDead(p) // the pool's tick
	waitFor(t, func() bool {
		ids := h.rt.ids()
		return len(ids) == 2 && !slices.Contains(ids, dead)
	})
	waitFor(t, func() bool { return len(p.ready) == 2 })
}

// Warm makes a template image; the pool restores from it ahead of creates,
// a create takes a pooled sandbox, and Close stops what waits in the pool.
func TestWarmAndPool(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	tpl := h.warmBase()
	if _, err := verifyImage(tpl.WarmImage, "warm"); err != nil {
		t.Fatal(err)
	}
	if ids := h.rt.ids(); len(ids) != 0 {
		t.Fatalf("warm-up left %v", ids)
	}
	h.tpls.tpl = tpl
	h.m.EnablePool(tpl, 1)
	waitFor(t, func() bool { return h.m.Pools(ctx)["base"].Ready == 1 })
	pooled := h.rt.ids()[0]
	restores := h.rt.restores
	sb := h.create()
	if sb.ID != pooled {
		t.Fatalf("create got %s, not the pooled %s", sb.ID, pooled)
	}
	if _, err := h.exec(sb.ID, "set a=1"); err != nil {
		t.Fatal(err)
	}
	// The image holds the spare kernels Warm asked for, with the warm-up.
	if got, err := h.exec(sb.ID, "get spares"); err != nil || got != fmt.Sprintf("python %d import x", WarmSpares) {
		t.Fatalf("spares in the warm image: %q, %v", got, err)
	}
	waitFor(t, func() bool { return h.m.Pools(ctx)["base"].Ready == 1 })
	if h.rt.restores != restores+1 {
		t.Fatalf("restores %d, want %d (one refill)", h.rt.restores, restores+1)
	}
	h.m.Close()
	if ids := h.rt.ids(); !slices.Equal(ids, []string{sb.ID}) {
		t.Fatalf("after close the runtime holds %v, want only the created %s", ids, sb.ID)
	}
	// After Close no pool starts again.
	h.m.EnablePool(Template{Name: "other", WarmImage: tpl.WarmImage, RootFS: tpl.RootFS}, 1)
	if len(h.m.Pools(ctx)) != 1 {
		t.Fatal("a pool was enabled after Close")
	}
}

// TestCloseCutsPoolRefill: Close does not wait for a refill whose sandbox
// hangs (here its agent never answers): it cuts it short, and what the
// refill started is removed.
func TestCloseCutsPoolRefill(t *testing.T) {
	old := setupTimeout
	setupTimeout = time.Hour // only Close may end the wait
	t.Cleanup(func() { setupTimeout = old })
	h := newHarness(t)
	tpl := h.warmBase()
	h.tpls.tpl = tpl
	h.rt.mu.Lock()
	h.rt.noAgent = true
	h.rt.mu.Unlock()
	h.m.EnablePool(tpl, 1)
	waitFor(t, func() bool { return len(h.rt.ids()) == 1 }) // restored, its hello hangs
	closed := make(chan struct{})
	go func() { h.m.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("Close waited for a hanging pool refill")
	}
	if ids := h.rt.ids(); len(ids) != 0 {
		t.Fatalf("after Close the runtime holds %v, want nothing", ids)
	}
}

// StartWarming removes stale warm images, keeps current ones, and warms.
func TestStartWarming(t *testing.T) {
	h := newHarness(t)
	stale := filepath.Join(h.m.cfg.WarmDir, "base-old-old")
	recent := filepath.Join(h.m.cfg.WarmDir, "base-recent-recent")
	for _, d := range []string{stale, recent} {
		os.MkdirAll(d, 0o700)
	}
	old := time.Now().Add(-48 * time.Hour)
	os.Chtimes(stale, old, old)
	tpl := h.tpls.tpl
	tpl.WarmImage = WarmImageDir(h.m.cfg.WarmDir, "base", "aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb")
	h.m.cfg.PoolSize = 1
	h.m.StartWarming([]WarmSpec{{Template: tpl, Warmup: "import x"}})
	waitFor(t, func() bool { return h.m.Pools(context.Background())["base"].Ready == 1 })
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale warm image kept: %v", err)
	}
	if _, err := os.Stat(recent); err != nil {
		t.Errorf("recent warm image of another build removed: %v", err)
	}
	if _, err := verifyImage(tpl.WarmImage, "warm"); err != nil {
		t.Error(err)
	}
	if !strings.HasSuffix(tpl.WarmImage, "base-aaaaaaaaaaaaaaaa-bbbbbbbbbbbbbbbb"+warmRevision) {
		t.Errorf("warm image keyed as %s", tpl.WarmImage)
	}
	// The warm image is held in the page cache until Close.
	if got := h.m.warmHeld.bytes(); got != fakePagesSize {
		t.Errorf("warm image held: %d bytes, want %d", got, fakePagesSize)
	}
	h.m.Close()
	if got := h.m.warmHeld.bytes(); got != 0 {
		t.Errorf("after Close %d bytes of warm images still held", got)
	}
}

// A create that finishes after Close keeps its sandbox for the next start
// and holds no channel (Close misses nothing).
func TestCloseDuringCreate(t *testing.T) {
	h := newHarness(t)
	inStart := make(chan struct{})
	release := make(chan struct{})
	h.rt.startErr = func(pandastack.RuntimeSpec) error {
		close(inStart)
		h.rt.mu.Unlock()
		<-release
		h.rt.mu.Lock()
		return nil
	}
	created := make(chan pandastack.Sandbox, 1)
	go func() {
		sb, _ := h.m.Create(context.Background(), project, CreateRequest{Template: "base"})
		created <- sb
	}()
	<-inStart
	closed := make(chan struct{})
	go func() { h.m.Close(); close(closed) }()
	time.Sleep(10 * time.Millisecond) // let Close begin; correctness does not depend on it
	close(release)
	sb := <-created
	<-closed
	if ids := h.m.entryIDs(); len(ids) != 0 {
		t.Fatalf("manager holds %v after Close", ids)
	}
	if sb.ID != "" && !h.rt.Alive(sb.ID) {
		t.Fatalf("the created sandbox was stopped; it should wait for re-adoption")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A start after a crash removes half-written images and unowned paused
// ones, and keeps whole snapshots and the images of paused sandboxes.
func TestRecoverySweepsLeftovers(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	paused := h.create()
	if _, err := h.m.Pause(ctx, project, paused.ID); err != nil {
		t.Fatal(err)
	}
	running := h.create()
	snap, err := h.m.Snapshot(ctx, project, running.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	leftovers := []string{
		filepath.Join(h.m.cfg.SnapshotDir, ".tmp-snap_x-t_y"),
		filepath.Join(h.m.cfg.SnapshotDir, ".fork-f_z"),
		filepath.Join(h.m.cfg.PausedDir, ".tmp-sbx_a-t_b"),
		filepath.Join(h.m.cfg.PausedDir, "sbx_gone"), // no record
		filepath.Join(h.m.cfg.PausedDir, running.ID), // resumed before the crash
	}
	for _, d := range leftovers {
		os.MkdirAll(filepath.Join(d, "image"), 0o700)
		os.WriteFile(filepath.Join(d, "image", "pages"), []byte("x"), 0o600)
	}
	var mu sync.Mutex
	stopped := map[string]bool{}
	h.rt.stopHook = func(id string) {
		mu.Lock()
		stopped[id] = true
		mu.Unlock()
	}
	h.m = h.newManager()
	for _, d := range leftovers {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s survived the start: %v", d, err)
		}
	}
	mu.Lock()
	// The runtime's Stop releases what else it kept of a sandbox (its
	// network's policy file, when there is a network in front of it).
	if !stopped["sbx_gone"] {
		t.Errorf("a paused image with no record was removed, its sandbox not stopped in the runtime (its network state stays)")
	}
	if stopped[running.ID] || stopped[paused.ID] {
		t.Errorf("a running or paused sandbox was stopped by the sweep: %v", stopped)
	}
	mu.Unlock()
	for _, d := range []string{filepath.Join(h.m.cfg.SnapshotDir, snap.ID), h.m.pausedPath(paused.ID)} {
		if _, err := verifyImage(d, d); err != nil {
			t.Errorf("a whole image was touched: %v", err)
		}
	}
	if _, err := h.m.Resume(ctx, project, paused.ID); err != nil {
		t.Fatal(err)
	}
}

// Only the agent's known error codes reach the client; anything else is
// internal (the agent runs where user code could tamper with it).
func TestAgentErrorCodesAllowListed(t *testing.T) {
	h := newHarness(t)
	sb := h.create()
	for code, want := range map[string]string{
		pandastack.ENotFound:        pandastack.ENotFound,
		pandastack.ECommandNotFound: pandastack.ECommandNotFound,
		pandastack.EUnauthorized:    pandastack.EInternal,
		pandastack.EStorage:         pandastack.EInternal,
		"made_up":                   pandastack.EInternal,
	} {
		_, err := h.exec(sb.ID, "fail "+code)
		if got := pandastack.ErrorCode(err); got != want {
			t.Errorf("agent code %s reached the client as %s (%v), want %s", code, got, err, want)
		}
	}
}

// A snapshot whose files are gone is refused without naming host paths.
func TestMissingImageNamesNoHostPath(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create()
	snap, err := h.m.Snapshot(ctx, project, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(filepath.Join(h.m.cfg.SnapshotDir, snap.ID), "image"))
	_, err = h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
	wantCode(t, err, pandastack.ESnapshotCorrupt)
	if msg := pandastack.ErrorMessage(err); strings.Contains(msg, h.dir) || strings.Contains(msg, "/") {
		t.Fatalf("the message names a host path: %q", msg)
	}
}

// After the template's root filesystem changes under a running sandbox, its
// snapshots, forks and pauses still restore onto the one it runs on.
func TestCheckpointsRecordTheSandboxRootFS(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create()
	h.exec(sb.ID, "set v=old")
	rebuilt := filepath.Join(h.dir, "rootfs-rebuilt")
	os.MkdirAll(rebuilt, 0o700)
	h.tpls.tpl.RootFS = rebuilt

	snap, err := h.m.Snapshot(ctx, project, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	restored, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
	if err != nil {
		t.Fatalf("restore after the template changed: %v", err)
	}
	kids, err := h.m.Fork(ctx, project, sb.ID, 1, nil, nil)
	if err != nil {
		t.Fatalf("fork after the template changed: %v", err)
	}
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
		t.Fatalf("resume after the template changed: %v", err)
	}
	for _, id := range []string{restored.ID, kids[0].ID, sb.ID} {
		if out, err := h.exec(id, "get v"); err != nil || out != "old" {
			t.Errorf("%s: %q %v", id, out, err)
		}
	}
	// A new sandbox runs on the rebuilt one.
	if fresh := h.create(); h.record(fresh.ID).RootFS != rebuilt {
		t.Errorf("a new sandbox records %q", h.record(fresh.ID).RootFS)
	}
}

// The reaper stops expired sandboxes concurrently: one slow stop does not
// hold up the others.
func TestReaperStopsConcurrently(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	slow, quick := h.create(), h.create()
	h.store.SetSandboxExpiry(ctx, slow.ID, time.Now().Add(-2*time.Second)) // first in line
	h.store.SetSandboxExpiry(ctx, quick.ID, time.Now().Add(-time.Second))
	release := make(chan struct{})
	h.rt.stopHook = func(id string) {
		if id == slow.ID {
			<-release
		}
	}
	reaped := make(chan struct{})
	go func() { h.m.reapOnce(); close(reaped) }()
	waitFor(t, func() bool { return !h.rt.Alive(quick.ID) })
	close(release)
	<-reaped
	h.rt.stopHook = nil
	for _, id := range []string{slow.ID, quick.ID} {
		if rec := h.record(id); rec.State != pandastack.StateStopped {
			t.Errorf("%s: %s", id, rec.State)
		}
	}
}

// A kill that comes while the server stops the sandbox itself (its TTL,
// out of memory, the reaper) waits for that stop and then deletes the
// record, instead of answering conflict; a second kill after it finds
// nothing.
func TestKillDuringAStop(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create()
	if err := h.m.sbx.begin(sb.ID, phaseStopping); err != nil { // as the reaper does
		t.Fatal(err)
	}
	killed := make(chan error, 1)
	go func() { killed <- h.m.Kill(ctx, project, sb.ID) }()
	select {
	case err := <-killed:
		t.Fatalf("kill during a stop returned at once: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	h.m.stopSandbox(sb.ID, pandastack.StopOOM)
	h.m.sbx.end(sb.ID)
	select {
	case err := <-killed:
		if err != nil {
			t.Fatalf("kill after the stop: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("kill still waiting after the stop ended")
	}
	if _, err := h.store.GetSandbox(ctx, project, sb.ID); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Errorf("record after the kill: %v, want not found", err)
	}
	wantCode(t, h.m.Kill(ctx, project, sb.ID), pandastack.ENotFound)

	// A kill given up while it waits says so.
	sb = h.create()
	h.m.sbx.begin(sb.ID, phaseStopping)
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := h.m.Kill(cctx, project, sb.ID); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("kill whose caller gave up: %v", err)
	}
	h.m.sbx.end(sb.ID)
}

// TestValidateMetadata: metadata the stores could not hold is refused up
// front, naming the entry, whether the key or the value is at fault.
func TestValidateMetadata(t *testing.T) {
	for _, md := range []map[string]string{
		{"": "x"},
		{strings.Repeat("k", 257): "x"},
		{"a": strings.Repeat("v", 4097)},
		{"a": "x\x00y"},
		{"a\x00": "x"},
		{"a": "\xff"},
	} {
		err := ValidateMetadata(md)
		if !pandastack.IsCode(err, pandastack.EInvalid) || !strings.HasPrefix(pandastack.ErrorMessage(err), "metadata") {
			t.Errorf("%q: %v", md, err)
		}
	}
	if err := ValidateMetadata(map[string]string{"tool": "smolagents-run-python", "ünï": "cödé"}); err != nil {
		t.Errorf("good metadata: %v", err)
	}
}

// A kill cut short by a crash (the record says stopped, killed; the
// delete never came) is finished at the next start: the record goes, so
// GET answers 404 as for any killed sandbox (it answered the stopped
// record for a day, until the purge). Other stopped records stay.
func TestStartFinishesHalfDoneKills(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	half, expired := h.create(), h.create()
	h.store.SetSandboxState(ctx, half.ID, pandastack.StateStopped, pandastack.StopKilled, time.Now())
	h.store.SetSandboxState(ctx, expired.ID, pandastack.StateStopped, pandastack.StopExpired, time.Now())
	h.m.Close()
	h.m = h.newManager()
	if _, err := h.m.Get(ctx, project, half.ID); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Errorf("the half-killed sandbox after the restart: %v, want not_found", err)
	}
	if got, err := h.m.Get(ctx, project, expired.ID); err != nil || got.StopReason != pandastack.StopExpired {
		t.Errorf("an expired sandbox's record after the restart: %+v %v, want it kept", got, err)
	}
}

// An agent that exits before its hello (a crash at its start) is said to
// have crashed, as an internal error, not as a timeout that blames an
// overloaded host; a silent agent in a sandbox that runs is still a
// timeout.
func TestHelloOfADeadAgent(t *testing.T) {
	old := setupTimeout
	setupTimeout = 200 * time.Millisecond
	t.Cleanup(func() { setupTimeout = old })
	h := newHarness(t)
	h.rt.noAgent = true
	_, err := h.m.Create(context.Background(), project, CreateRequest{Template: "base"})
	wantCode(t, err, pandastack.ETimeout)
	h.rt.agentDies = true
	_, err = h.m.Create(context.Background(), project, CreateRequest{Template: "base"})
	wantCode(t, err, pandastack.EInternal)
	if !strings.Contains(pandastack.ErrorMessage(err), "agent exited") {
		t.Errorf("a dead agent's hello: %v", err)
	}
	if ids := h.rt.ids(); len(ids) != 0 {
		t.Errorf("runtime holds %v after two dead boots", ids)
	}
}

// watchingHarness is a harness whose boots wait for their hello and setup
// far longer than their watch (50 ms) takes to see a dead sandbox: only
// the watch can end them before the start's 20 s.
func watchingHarness(t *testing.T) *harness {
	oldTimeout, oldAfter := setupTimeout, helloWatchAfter
	setupTimeout, helloWatchAfter = time.Hour, 50*time.Millisecond
	t.Cleanup(func() { setupTimeout, helloWatchAfter = oldTimeout, oldAfter })
	h := newHarness(t)
	h.m.cfg.StartTimeout = 20 * time.Second
	return h
}

// A sandbox that dies after its hello, during its setup (the CA's
// install), is found gone too, its setup's request ends at once though
// the agent says nothing more, and it is booted afresh.
func TestCreateBootsAfreshAfterADeathInItsSetup(t *testing.T) {
	h := watchingHarness(t)
	h.m.UseSandboxCA([]byte("-----BEGIN CERTIFICATE-----\nA\n"))
	h.rt.setupDeaths = 1
	start := time.Now()
	sb, err := h.m.Create(context.Background(), project, CreateRequest{Template: "base"})
	if err != nil {
		t.Fatalf("create after a death in its setup: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the create took %s", took)
	}
	if got, err := h.exec(sb.ID, "get file:"+caMarker); got == "" || err != nil {
		t.Errorf("the sandbox booted afresh has no CA marker: %q %v", got, err)
	}
	lines := h.logs.with("sandbox=" + sb.ID)
	joined := strings.Join(lines, "\n")
	if !strings.Contains(joined, "the sandbox died during its start") || !strings.Contains(joined, "dead_agent_ms") || !strings.Contains(joined, "dead_setup_ms") {
		t.Errorf("log of the create:\n%s", joined)
	}
}

// A sandbox whose agent dies as its hello comes, its channel closed (the
// host reads EOF at once, no timeout), is found dead and booted afresh.
func TestCreateBootsAfreshAfterAnAgentGoneAtItsHello(t *testing.T) {
	h := watchingHarness(t)
	h.rt.resetBoots = 1
	sb, err := h.m.Create(context.Background(), project, CreateRequest{Template: "base"})
	if err != nil {
		t.Fatalf("create after an agent gone at its hello: %v", err)
	}
	if got, err := h.exec(sb.ID, "get v"); err != nil || got != "" {
		t.Errorf("the sandbox booted afresh: %q %v", got, err)
	}
	if len(h.logs.with("the sandbox died during its start")) != 1 || len(h.logs.with("booting the sandbox afresh")) != 1 {
		t.Errorf("log lines of the dead boot and the new one missing:\n%s", strings.Join(h.logs.with("sandbox="+sb.ID), "\n"))
	}
}

// A boot the runtime fails with no cause the server can name (runsc's exit
// status, as when its processes are killed half-way) is tried once more;
// one refused for a cause (a coded error: a damaged image) is not.
func TestForkChildBootsAgainAfterAnUnexplainedRuntimeFailure(t *testing.T) {
	h := newHarness(t)
	parent := h.create()
	calls := h.rt.failRestoreOnce(errInjected)
	kids, err := h.m.Fork(context.Background(), project, parent.ID, 1, nil, nil)
	if err != nil {
		t.Fatalf("fork after one failed restore: %v", err)
	}
	if *calls != 2 || len(h.logs.with("booting the sandbox afresh")) != 1 {
		t.Errorf("restores %d, log:\n%s", *calls, strings.Join(h.logs.with("sandbox="+kids[0].ID), "\n"))
	}
	for _, refusal := range []error{
		pandastack.Errorf(pandastack.ESnapshotCorrupt, "damaged"),
		fmt.Errorf("restore: %w", syscall.ENOSPC), // the disk's fault: a refusal too
	} {
		calls = h.rt.failRestoreOnce(refusal)
		_, err = h.m.Fork(context.Background(), project, parent.ID, 1, nil, nil)
		if pandastack.ErrorCode(err) != pandastack.ESnapshotCorrupt && pandastack.ErrorCode(err) != pandastack.EStorage {
			t.Errorf("fork after %v: %v", refusal, err)
		}
		if *calls != 1 {
			t.Errorf("a restore refused with %v was tried %d times, want once", refusal, *calls)
		}
	}
}

// A sandbox that dies before its agent's hello is found gone while the
// hello waits (not after the hello's whole timeout), logged with what the
// runtime knows, and booted once more: the create succeeds.
func TestCreateBootsAfreshAfterADeadStart(t *testing.T) {
	h := watchingHarness(t)
	h.rt.deadBoots = 1
	sb, err := h.m.Create(context.Background(), project, CreateRequest{Template: "base"})
	if err != nil {
		t.Fatalf("create after one dead boot: %v", err)
	}
	h.exec(sb.ID, "set v=1")
	if got, err := h.exec(sb.ID, "get v"); got != "1" || err != nil {
		t.Errorf("the sandbox booted afresh runs %q %v, want 1", got, err)
	}
	if len(h.logs.with("the sandbox died during its start")) != 1 || len(h.logs.with("booting the sandbox afresh")) != 1 {
		t.Errorf("log lines of the dead boot and the new one missing:\n%s", strings.Join(h.logs.with("sandbox="+sb.ID), "\n"))
	}
	// Two dead boots in a row: an internal error, found long before the
	// start's timeout, and nothing left.
	h.rt.deadBoots = 2
	start := time.Now()
	_, err = h.m.Create(context.Background(), project, CreateRequest{Template: "base"})
	wantCode(t, err, pandastack.EInternal)
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("two dead boots took %s to fail", took)
	}
	if ids := h.rt.ids(); len(ids) != 1 {
		t.Errorf("runtime holds %v, want the first sandbox alone", ids)
	}
	// A death the runtime has a reason for (out of memory) would come
	// again: no second boot.
	h.rt.deadBoots, h.rt.deadReason = 2, pandastack.ReasonOutOfMemory
	_, err = h.m.Create(context.Background(), project, CreateRequest{Template: "base"})
	wantCode(t, err, pandastack.EInternal)
	if h.rt.deadBoots != 1 {
		t.Errorf("a sandbox out of memory at its start was booted %d times, want once", 2-h.rt.deadBoots)
	}
}

// KillAll (--kill-on-exit) kills a create under way when it began, whose
// record came after its first list, and refuses creates from then on:
// nothing of them outlives the server.
func TestKillAllKillsCreatesUnderWay(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	running := h.create()
	booting, release := make(chan struct{}), make(chan struct{})
	var first sync.Once
	h.rt.startErr = func(pandastack.RuntimeSpec) error { // with the runtime's lock held
		first.Do(func() {
			close(booting)
			<-release
		})
		return nil
	}
	created := make(chan error, 1)
	go func() {
		_, err := h.m.Create(ctx, project, CreateRequest{Template: "base"})
		created <- err
	}()
	<-booting
	killed := make(chan struct{})
	go func() { h.m.KillAll(ctx); close(killed) }()
	waitFor(t, func() bool {
		h.m.sbx.mu.Lock()
		defer h.m.sbx.mu.Unlock()
		return h.m.sbx.noStarts
	})
	if _, err := h.m.Create(ctx, project, CreateRequest{Template: "base"}); !pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Errorf("a create while every sandbox is killed: %v, want sandbox_unavailable", err)
	}
	close(release)
	<-killed
	<-created
	if ids := h.rt.ids(); len(ids) != 0 {
		t.Fatalf("after KillAll the runtime holds %v", ids)
	}
	if _, err := h.m.Get(ctx, project, running.ID); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Fatalf("the running sandbox after KillAll: %v", err)
	}
}
