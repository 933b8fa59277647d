package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// idleHarness is a harness whose idleness runs on a settable clock.
func idleHarness(t *testing.T) (*harness, *clock) {
	h := newHarness(t)
	c := &clock{t: time.Now()}
	h.m.sbx.now = c.now
	return h, c
}

func (h *harness) createIdle(seconds int64) pandastack.Sandbox {
	h.t.Helper()
	sb, err := h.m.Create(context.Background(), project, CreateRequest{Template: "base", IdleTimeoutSeconds: &seconds})
	if err != nil {
		h.t.Fatal(err)
	}
	if sb.IdleTimeoutSeconds != seconds || h.record(sb.ID).IdleTimeoutSeconds != seconds {
		h.t.Fatalf("idle timeout %d, record %d; want %d", sb.IdleTimeoutSeconds, h.record(sb.ID).IdleTimeoutSeconds, seconds)
	}
	return sb
}

// passIdle runs the reaper's idle pass over a whole quiet spell.
func (h *harness) passIdle(c *clock, d time.Duration) {
	h.m.suspend(h.m.idleNow(), pandastack.PauseIdle) // opens the spell
	c.advance(d)
	h.m.suspend(h.m.idleNow(), pandastack.PauseIdle) // decides
}

// execAnswer is what an exec of execLater answered.
type execAnswer struct {
	out string
	err error
}

// execLater runs h.exec in the background; its answer comes on the channel.
func (h *harness) execLater(id, cmd string) <-chan execAnswer {
	ch := make(chan execAnswer, 1)
	go func() {
		out, err := h.exec(id, cmd)
		ch <- execAnswer{out, err}
	}()
	return ch
}

func TestIdleSuspendAndResume(t *testing.T) {
	h, c := idleHarness(t)
	sb := h.createIdle(10)
	if _, err := h.exec(sb.ID, "set v=kept"); err != nil {
		t.Fatal(err)
	}
	h.passIdle(c, 5*time.Second)
	if rec := h.record(sb.ID); rec.State != pandastack.StateRunning {
		t.Fatalf("suspended before its idle timeout: %s", rec.State)
	}
	c.advance(6 * time.Second)
	h.m.suspend(h.m.idleNow(), pandastack.PauseIdle)
	rec := h.record(sb.ID)
	if rec.State != pandastack.StatePaused || rec.PauseReason != pandastack.PauseIdle {
		t.Fatalf("after the idle timeout: %s %q, want paused idle", rec.State, rec.PauseReason)
	}
	if h.rt.Alive(sb.ID) {
		t.Fatal("a suspended sandbox still runs")
	}
	// A look at its figures does not wake it: it holds nothing.
	if st, err := h.m.Stats(context.Background(), project, sb.ID); err != nil || st.PSSBytes != 0 || len(st.PIDs) != 0 {
		t.Fatalf("stats of a suspended sandbox: %+v %v", st, err)
	}
	if rec := h.record(sb.ID); rec.State != pandastack.StatePaused || h.rt.Alive(sb.ID) {
		t.Fatalf("stats woke the suspended sandbox: %s", rec.State)
	}
	// The next request resumes it, with its state, and it is running again.
	if out, err := h.exec(sb.ID, "get v"); err != nil || out != "kept" {
		t.Fatalf("after resume: %q %v", out, err)
	}
	if rec := h.record(sb.ID); rec.State != pandastack.StateRunning || rec.PauseReason != "" {
		t.Fatalf("after resume: %s %q", rec.State, rec.PauseReason)
	}
	if _, err := os.Stat(h.m.pausedPath(sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("image kept after resume: %v", err)
	}
}

// Work in flight, a hold, CPU use in the background, a recent request, or
// a timeout of 0 all keep a sandbox awake.
func TestIdleKeepsBusySandboxesAwake(t *testing.T) {
	h, c := idleHarness(t)
	ctx := context.Background()

	inflight := h.createIdle(10)
	_, done, err := h.m.Acquire(ctx, project, inflight.ID)
	if err != nil {
		t.Fatal(err)
	}
	held := h.createIdle(10)
	_, unhold, err := h.m.Hold(ctx, project, held.ID)
	if err != nil {
		t.Fatal(err)
	}
	cpu := h.createIdle(10)
	never := h.createIdle(0)
	used := h.createIdle(10)

	h.m.suspend(h.m.idleNow(), pandastack.PauseIdle)
	h.rt.mu.Lock()
	h.rt.boxes[cpu.ID].cpu += int64(5 * time.Second) // half a CPU over the spell
	h.rt.mu.Unlock()
	c.advance(9 * time.Second)
	h.exec(used.ID, "set a=1") // a request near the end of the spell
	c.advance(2 * time.Second)
	h.m.suspend(h.m.idleNow(), pandastack.PauseIdle)
	for _, sb := range []pandastack.Sandbox{inflight, held, cpu, never, used} {
		if rec := h.record(sb.ID); rec.State != pandastack.StateRunning {
			t.Errorf("%s was suspended", sb.ID)
		}
	}
	// Once the work ends and the CPU is quiet, they do go idle.
	done()
	unhold()
	h.passIdle(c, 11*time.Second)
	for _, sb := range []pandastack.Sandbox{inflight, held, cpu, used} {
		if rec := h.record(sb.ID); rec.State != pandastack.StatePaused {
			t.Errorf("%s: %s after a quiet spell, want paused", sb.ID, rec.State)
		}
	}
	if rec := h.record(never.ID); rec.State != pandastack.StateRunning {
		t.Errorf("idle_timeout 0 was suspended")
	}
}

// suspendedWithV is a harness with a sandbox suspended for idleness
// whose state holds v=1.
func suspendedWithV(t *testing.T) (*harness, pandastack.Sandbox) {
	h, c := idleHarness(t)
	sb := h.createIdle(10)
	h.exec(sb.ID, "set v=1")
	h.passIdle(c, 11*time.Second)
	if h.record(sb.ID).State != pandastack.StatePaused {
		t.Fatal("not suspended")
	}
	return h, sb
}

// holdRestore makes restores signal inRestore (at the first) and wait
// until release is closed, letting other calls into the runtime through.
func (h *harness) holdRestore() (inRestore, release chan struct{}) {
	inRestore, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.rt.restoreErr = func(pandastack.RuntimeSpec) error {
		once.Do(func() { close(inRestore) })
		h.rt.mu.Unlock()
		<-release
		h.rt.mu.Lock()
		return nil
	}
	return inRestore, release
}

// Requests that arrive while a suspended sandbox resumes wait for it and
// all succeed.
func TestIdleConcurrentResume(t *testing.T) {
	h, sb := suspendedWithV(t)
	inRestore, release := h.holdRestore()
	const n = 6
	errs := make(chan error, n)
	outs := make(chan string, n)
	for range n {
		go func() {
			out, err := h.exec(sb.ID, "get v")
			outs <- out
			errs <- err
		}()
	}
	<-inRestore
	time.Sleep(20 * time.Millisecond) // let the others arrive during the resume; the test holds without it
	close(release)
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("a request during the resume: %v", err)
		}
		if out := <-outs; out != "1" {
			t.Errorf("a request during the resume saw %q", out)
		}
	}
	if h.rt.restores != 1 {
		t.Fatalf("%d restores, want 1", h.rt.restores)
	}
}

// A request that wakes an idle sandbox runs, though a pause arrives while
// the resume is under way: the pause waits for the resume, then gives the
// request its turn (it lost the race and answered "resume it first").
func TestPauseDuringAWakeLetsTheRequestRun(t *testing.T) {
	h, sb := suspendedWithV(t)
	inRestore, release := h.holdRestore()
	woke := h.execLater(sb.ID, "get v")
	<-inRestore
	paused := make(chan error, 1)
	go func() {
		_, err := h.m.Pause(context.Background(), project, sb.ID)
		paused <- err
	}()
	time.Sleep(20 * time.Millisecond) // the pause waits for the resume
	close(release)
	if a := <-woke; a.err != nil || a.out != "1" {
		t.Fatalf("the request that woke it: %q %v", a.out, a.err)
	}
	if err := <-paused; err != nil && !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("the pause: %v", err)
	}
}

// A suspend (or a pause) on a full disk leaves the sandbox running as it was.
func TestPauseOnFullDiskKeepsRunning(t *testing.T) {
	h, c := idleHarness(t)
	ctx := context.Background()
	sb := h.createIdle(10)
	h.exec(sb.ID, "set v=1")
	h.rt.checkpointErr = func(string) error { return &os.PathError{Op: "write", Path: "/var/lib/x/pages", Err: syscall.ENOSPC} }

	h.passIdle(c, 11*time.Second)
	_, err := h.m.Pause(ctx, project, sb.ID)
	wantCode(t, err, pandastack.EStorage)
	if msg := pandastack.ErrorMessage(err); strings.Contains(msg, "/var/lib") || len(msg) > 200 {
		t.Errorf("the 507 message shows host details or is long: %q", msg)
	}
	if rec := h.record(sb.ID); rec.State != pandastack.StateRunning {
		t.Fatalf("after failed pauses: %s %s", rec.State, rec.StopReason)
	}
	if out, err := h.exec(sb.ID, "get v"); err != nil || out != "1" {
		t.Fatalf("after failed pauses: %q %v", out, err)
	}
	if ents, _ := os.ReadDir(h.m.cfg.PausedDir); len(ents) != 0 {
		t.Fatalf("partial images left: %v", ents)
	}
}

// A checkpoint that kills its sandbox (runsc's encoding of its state ran
// it out of memory) answers that the sandbox stopped, with the reason,
// and records it so at once: not unavailable, which says to retry.
func TestCheckpointThatKillsTheSandbox(t *testing.T) {
	for _, op := range []string{"snapshot", "fork", "pause", "idle suspend"} {
		t.Run(op, func(t *testing.T) {
			h, c := idleHarness(t)
			ctx := context.Background()
			sb := h.createIdle(10)
			h.rt.checkpointErr = func(id string) error { // h.rt.mu held
				b := h.rt.boxes[id]
				b.stop()
				b.alive, b.reason = false, pandastack.ReasonOutOfMemory
				return errors.New("runsc checkpoint: exit status 128")
			}
			var err error
			switch op {
			case "snapshot":
				_, err = h.m.Snapshot(ctx, project, sb.ID, nil)
			case "fork":
				_, err = h.m.Fork(ctx, project, sb.ID, 1, nil, nil)
			case "pause":
				_, err = h.m.Pause(ctx, project, sb.ID)
			case "idle suspend":
				h.passIdle(c, 11*time.Second)
			}
			if op != "idle suspend" {
				wantCode(t, err, pandastack.EStopped)
				if !strings.Contains(pandastack.ErrorMessage(err), pandastack.StopOOM) {
					t.Errorf("the error does not say why: %v", err)
				}
			}
			if rec := h.record(sb.ID); rec.State != pandastack.StateStopped || rec.StopReason != pandastack.StopOOM {
				t.Fatalf("after the checkpoint: %s %q, want stopped %s", rec.State, rec.StopReason, pandastack.StopOOM)
			}
			// Its egress log went with it: not an empty one, which would
			// read as "it reached nothing".
			_, err = h.m.NetworkLog(ctx, project, sb.ID)
			wantCode(t, err, pandastack.EStopped)
		})
	}
}

// A failed idle suspend is not tried again at once: each try writes the
// sandbox's memory out (onto a full disk) and throws it away. The tries
// back off, and one succeeds once the disk has room.
func TestFailedIdleSuspendBacksOff(t *testing.T) {
	h, c := idleHarness(t)
	sb := h.createIdle(10)
	tries := 0
	h.rt.checkpointErr = func(string) error {
		tries++
		return &os.PathError{Op: "write", Path: "/x/pages", Err: syscall.ENOSPC}
	}
	h.passIdle(c, 11*time.Second)
	if tries != 1 {
		t.Fatalf("%d tries, want 1", tries)
	}
	for i := 0; i < 5; i++ { // 50 s: within the first back-off
		h.passIdle(c, 11*time.Second)
	}
	if tries != 1 {
		t.Errorf("%d tries within a minute of a failed one, want 1", tries)
	}
	c.advance(time.Minute)
	h.passIdle(c, 11*time.Second)
	if tries != 2 {
		t.Errorf("%d tries after the back-off, want 2", tries)
	}
	c.advance(90 * time.Second) // the second back-off is 2 minutes
	h.passIdle(c, 11*time.Second)
	if tries != 2 {
		t.Errorf("%d tries within the second back-off, want 2", tries)
	}
	h.rt.checkpointErr = nil
	c.advance(time.Minute)
	h.passIdle(c, 11*time.Second)
	if rec := h.record(sb.ID); rec.State != pandastack.StatePaused {
		t.Errorf("once the disk has room: %s, want paused", rec.State)
	}
}

// If the paused state cannot be recorded, the sandbox keeps running and the
// image goes: a record must never say running for a stopped sandbox.
func TestPauseRecordFailureKeepsRunning(t *testing.T) {
	setFor(t, &recordRetry, []time.Duration{time.Millisecond, time.Millisecond, 0})
	h := newHarness(t)
	sb := h.create()
	h.exec(sb.ID, "set v=1")
	h.store.setStateErr = func(id string, st pandastack.SandboxState) error {
		if st == pandastack.StatePaused {
			return errInjected
		}
		return nil
	}
	if _, err := h.m.Pause(context.Background(), project, sb.ID); err == nil {
		t.Fatal("pause succeeded")
	}
	h.store.setStateErr = nil
	if out, err := h.exec(sb.ID, "get v"); err != nil || out != "1" {
		t.Fatalf("after a failed pause: %q %v", out, err)
	}
	if _, err := os.Stat(h.m.pausedPath(sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("image of a failed pause kept: %v", err)
	}
}

// A write of the paused state that fails once (a database failing over)
// is tried again, and the pause is made.
func TestPauseRecordRetried(t *testing.T) {
	setFor(t, &recordRetry, []time.Duration{time.Millisecond, time.Millisecond, 0})
	h := newHarness(t)
	sb := h.create()
	h.exec(sb.ID, "set v=1")
	failed := 0
	h.store.set(func(s *hookStore) {
		s.setStateErr = func(id string, st pandastack.SandboxState) error {
			if st == pandastack.StatePaused && failed == 0 {
				failed++
				return errInjected
			}
			return nil
		}
	})
	_, err := h.m.Pause(context.Background(), project, sb.ID)
	h.store.set(func(s *hookStore) { s.setStateErr = nil })
	if err != nil || failed != 1 {
		t.Fatalf("pause with one failed write: %v (%d failed)", err, failed)
	}
	if rec := h.record(sb.ID); rec.State != pandastack.StatePaused {
		t.Fatalf("after the pause: %s", rec.State)
	}
	if _, err := h.m.Resume(context.Background(), project, sb.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := h.exec(sb.ID, "get v"); err != nil || out != "1" {
		t.Fatalf("after the resume: %q %v", out, err)
	}
}

// TTL expiry of a suspended sandbox deletes its image.
func TestIdleExpiryDeletesImage(t *testing.T) {
	h, c := idleHarness(t)
	sb := h.createIdle(10)
	h.passIdle(c, 11*time.Second)
	if _, err := os.Stat(h.m.pausedPath(sb.ID)); err != nil {
		t.Fatalf("suspended without an image: %v", err)
	}
	h.store.SetSandboxExpiry(context.Background(), sb.ID, time.Now().Add(-time.Second))
	h.m.reapOnce()
	if rec := h.record(sb.ID); rec.State != pandastack.StateStopped || rec.StopReason != pandastack.StopExpired {
		t.Fatalf("%s %s", rec.State, rec.StopReason)
	}
	if _, err := os.Stat(h.m.pausedPath(sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("image of an expired suspended sandbox kept: %v", err)
	}
}

// PATCH of the idle timeout applies at once; invalid values are refused.
func TestSetIdleTimeout(t *testing.T) {
	h, c := idleHarness(t)
	ctx := context.Background()
	sb := h.createIdle(0)
	if _, err := h.m.SetIdleTimeout(ctx, project, sb.ID, -1); !pandastack.IsCode(err, pandastack.EInvalid) {
		t.Fatalf("-1: %v", err)
	}
	if got, err := h.m.SetIdleTimeout(ctx, project, sb.ID, 5); err != nil || got.IdleTimeoutSeconds != 5 {
		t.Fatalf("set: %+v %v", got, err)
	}
	h.passIdle(c, 6*time.Second)
	if rec := h.record(sb.ID); rec.State != pandastack.StatePaused || rec.IdleTimeoutSeconds != 5 {
		t.Fatalf("%s %d", rec.State, rec.IdleTimeoutSeconds)
	}
	bad := int64(-5)
	_, err := h.m.Create(ctx, project, CreateRequest{Template: "base", IdleTimeoutSeconds: &bad})
	wantCode(t, err, pandastack.EInvalid)
}

// suspendHeld starts an idle suspend of id and returns once it is in its
// checkpoint, which goes on when release is closed; suspended gives its
// outcome.
func (h *harness) suspendHeld(id string) (release chan struct{}, suspended chan error) {
	inCheckpoint := make(chan struct{})
	release = make(chan struct{})
	h.rt.checkpointErr = func(string) error {
		close(inCheckpoint)
		h.rt.mu.Unlock()
		<-release
		h.rt.mu.Lock()
		return nil
	}
	suspended = make(chan error, 1)
	go func() {
		_, err := h.m.pause(context.Background(), h.record(id), pandastack.PauseIdle)
		suspended <- err
	}()
	<-inCheckpoint
	h.rt.checkpointErr = nil
	return release, suspended
}

// A request that arrives while an idle suspend is under way waits for it,
// then resumes the sandbox, and succeeds.
func TestRequestDuringSuspendWaits(t *testing.T) {
	h, _ := idleHarness(t)
	sb := h.createIdle(10)
	h.exec(sb.ID, "set v=1")
	release, suspended := h.suspendHeld(sb.ID)
	got := h.execLater(sb.ID, "get v")
	close(release)
	if err := <-suspended; err != nil {
		t.Fatal(err)
	}
	if r := <-got; r.err != nil || r.out != "1" {
		t.Fatalf("a request during the suspend: %q %v", r.out, r.err)
	}
	if rec := h.record(sb.ID); rec.State != pandastack.StateRunning {
		t.Fatalf("after: %s", rec.State)
	}
}

// An idle suspend first has the agent release its spare kernels; a pause
// asked for does not. A suspend that fails has the agent start its spares
// again.
func TestIdleSuspendReleasesSpares(t *testing.T) {
	h, c := idleHarness(t)
	ctx := context.Background()
	sb := h.createIdle(10)
	h.passIdle(c, 11*time.Second)
	if rec := h.record(sb.ID); rec.State != pandastack.StatePaused {
		t.Fatalf("not suspended: %s", rec.State)
	}
	want := []string{"release " + sb.ID, "checkpoint " + sb.ID}
	if got := h.rt.takeSuspendLog(); !slices.Equal(got, want) {
		t.Fatalf("idle suspend: %q, want %q", got, want)
	}

	// Resumed by a request; then paused on request: all of it.
	if _, err := h.exec(sb.ID, "set v=1"); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got, want := h.rt.takeSuspendLog(), []string{"checkpoint " + sb.ID}; !slices.Equal(got, want) {
		t.Fatalf("pause: %q, want %q", got, want)
	}
	if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}

	// A suspend that fails (a full disk) gives the sandbox its spares back.
	h.rt.checkpointErr = func(string) error { return &os.PathError{Op: "write", Path: "pages", Err: syscall.ENOSPC} }
	h.rt.takeSuspendLog()
	h.passIdle(c, 11*time.Second)
	if rec := h.record(sb.ID); rec.State != pandastack.StateRunning {
		t.Fatalf("after a failed suspend: %s", rec.State)
	}
	want = []string{"release " + sb.ID, "checkpoint " + sb.ID, "refill " + sb.ID}
	if got := h.rt.takeSuspendLog(); !slices.Equal(got, want) {
		t.Fatalf("failed idle suspend: %q, want %q", got, want)
	}

	// So does one cut short after its checkpoint, the record no longer
	// saying running (here: starting, as no request would leave it).
	h.rt.checkpointErr = func(id string) error {
		return h.store.Store.SetSandboxState(ctx, id, pandastack.StateStarting, "", h.m.now())
	}
	c.advance(time.Minute) // the failed one's next try
	h.passIdle(c, 11*time.Second)
	h.rt.checkpointErr = nil
	if rec := h.record(sb.ID); rec.State == pandastack.StatePaused {
		t.Fatalf("after a suspend cut short: %s", rec.State)
	}
	if got := h.rt.takeSuspendLog(); !slices.Equal(got, want) {
		t.Fatalf("idle suspend cut short after its checkpoint: %q, want %q", got, want)
	}
}

// A sandbox still being created: a request waits for it and then runs,
// and an idle timeout changed meanwhile is the one it runs with (and
// answers with), not the create's.
func TestRequestsDuringACreate(t *testing.T) {
	h, c := idleHarness(t)
	gate, booting := make(chan struct{}), make(chan string, 1)
	h.rt.startErr = func(spec pandastack.RuntimeSpec) error {
		booting <- spec.ID
		<-gate
		return nil
	}
	seconds := int64(10)
	created := make(chan pandastack.Sandbox, 1)
	go func() {
		sb, err := h.m.Create(context.Background(), project, CreateRequest{Template: "base", IdleTimeoutSeconds: &seconds})
		if err != nil {
			t.Error(err)
		}
		created <- sb
	}()
	id := <-booting
	if _, err := h.m.SetIdleTimeout(context.Background(), project, id, 0); err != nil {
		t.Fatal(err)
	}
	ttlSet := make(chan error, 1)
	go func() {
		_, err := h.m.SetTTL(context.Background(), project, id, 600)
		ttlSet <- err
	}()
	ran := make(chan error, 1)
	go func() {
		_, err := h.exec(id, "set a=1")
		ran <- err
	}()
	select {
	case err := <-ran:
		t.Fatalf("a request during the create ended before it: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(gate)
	if err := <-ran; err != nil {
		t.Fatalf("the request that waited for the create: %v", err)
	}
	if err := <-ttlSet; err != nil {
		t.Fatalf("a TTL change during the create: %v", err)
	}
	sb := <-created
	if sb.IdleTimeoutSeconds != 0 || h.record(id).IdleTimeoutSeconds != 0 {
		t.Errorf("create answered idle %d, record %d; want the 0 set meanwhile", sb.IdleTimeoutSeconds, h.record(id).IdleTimeoutSeconds)
	}
	h.passIdle(c, time.Hour)
	if rec := h.record(id); rec.State != pandastack.StateRunning {
		t.Fatalf("suspended with the idle timeout set to never during its create: %s", rec.State)
	}
}

// A paused auto_resume sandbox: requests that come while the pause
// finishes wait for it and resume it, and concurrent resumes all answer
// the resumed sandbox.
func TestRequestsDuringAPause(t *testing.T) {
	h := newHarness(t)
	sb, err := h.m.Create(context.Background(), project, CreateRequest{Template: "base", AutoResume: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.exec(sb.ID, "set a=kept"); err != nil {
		t.Fatal(err)
	}
	paused := make(chan error, 1)
	go func() {
		_, err := h.m.Pause(context.Background(), project, sb.ID)
		paused <- err
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := h.exec(sb.ID, "get a")
			if err == nil && out != "kept" {
				err = fmt.Errorf("got %q", out)
			}
			errs <- err
		}()
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	close(errs)
	if err := <-paused; err != nil && !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("pause: %v", err)
	}
	for err := range errs {
		if err != nil {
			t.Errorf("a request around the pause: %v", err)
		}
	}
	// Resumes at once of a paused sandbox: each answers it running. The
	// restore waits until all three have asked, and a while more for
	// them to find it under way (one that came after it would rightly
	// be told the sandbox is running, not paused).
	if _, err := h.m.Pause(context.Background(), project, sb.ID); err != nil {
		t.Fatal(err)
	}
	asking := make(chan struct{}, 3)
	held := false // the hook runs with the runtime's lock held
	h.rt.restoreErr = func(pandastack.RuntimeSpec) error {
		if !held {
			held = true
			for range 3 {
				<-asking
			}
			waitParkedIn(t, ".(*table).waitOutThen(", 2) // the other two
		}
		return nil
	}
	res := make(chan error, 3)
	for range 3 {
		go func() {
			asking <- struct{}{}
			got, err := h.m.Resume(context.Background(), project, sb.ID)
			if err == nil && (got.State != pandastack.StateRunning || got.PauseReason != "") {
				err = fmt.Errorf("answered %s (pause_reason %q)", got.State, got.PauseReason)
			}
			res <- err
		}()
	}
	for range 3 {
		if err := <-res; err != nil {
			t.Errorf("a concurrent resume: %v", err)
		}
	}
}

// Pauses at once: one pauses the sandbox, the others wait for it and
// answer the paused sandbox, as concurrent resumes answer the running one.
// A pause of a sandbox already paused is still refused.
func TestConcurrentPauses(t *testing.T) {
	h := newHarness(t)
	sb, err := h.m.Create(context.Background(), project, CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	inCheckpoint, release := h.holdCheckpoint()
	res := make(chan error, 3)
	pause := func() {
		got, err := h.m.Pause(context.Background(), project, sb.ID)
		if err == nil && (got.State != pandastack.StatePaused || got.PauseReason != pandastack.PauseRequested) {
			err = fmt.Errorf("answered %s (pause_reason %q)", got.State, got.PauseReason)
		}
		res <- err
	}
	go pause()
	<-inCheckpoint
	go pause()
	go pause()
	waitParkedIn(t, ".(*table).waitOutThen(", 2) // they found the pause under way (it is held until release)
	close(release)
	for range 3 {
		if err := <-res; err != nil {
			t.Errorf("a concurrent pause: %v", err)
		}
	}
	if _, err := h.m.Pause(context.Background(), project, sb.ID); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("a pause of a paused sandbox: %v", err)
	}
}

// A long-lived use (a follow of a process's output, a proxied connection)
// cut off by a pause says the sandbox was paused, not that it died.
func TestHoldCutByAPause(t *testing.T) {
	h := newHarness(t)
	sb := h.create()
	c, done, err := h.m.Hold(context.Background(), project, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer done()
	if _, err := h.m.Pause(context.Background(), project, sb.ID); err != nil {
		t.Fatal(err)
	}
	_, err = c.Exec(context.Background(), agentproto.ExecRequest{Cmd: "get a"}, func(agentproto.ExecEvent) error { return nil })
	if !pandastack.IsCode(err, pandastack.EUnavailable) || !strings.Contains(err.Error(), "was paused") {
		t.Fatalf("a use cut off by a pause: %v", err)
	}
}

// A kill that comes during a pause waits for it and then kills the
// paused sandbox, rather than answering conflict.
func TestKillDuringAPause(t *testing.T) {
	h := newHarness(t)
	sb := h.create()
	inCheckpoint, release := h.holdCheckpoint()
	paused := make(chan error, 1)
	go func() {
		_, err := h.m.Pause(context.Background(), project, sb.ID)
		paused <- err
	}()
	<-inCheckpoint
	killed := make(chan error, 1)
	go func() { killed <- h.m.Kill(context.Background(), project, sb.ID) }()
	select {
	case err := <-killed:
		t.Fatalf("the kill did not wait for the pause: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-paused; err != nil {
		t.Fatal(err)
	}
	if err := <-killed; err != nil {
		t.Fatalf("kill after the pause: %v", err)
	}
	if _, err := h.store.GetSandbox(context.Background(), project, sb.ID); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Fatalf("the record after the kill: %v", err)
	}
}

// waitParkedIn waits until n goroutines are blocked in a select within
// the function fn names (as it appears in a stack trace).
func waitParkedIn(t *testing.T, fn string, n int) {
	t.Helper()
	buf := make([]byte, 4<<20)
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		got := 0
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if header, _, _ := strings.Cut(g, "\n"); strings.Contains(header, "[select") && strings.Contains(g, fn) {
				got++
			}
		}
		if got >= n {
			return
		}
		if time.Now().After(end) {
			t.Errorf("%d goroutines wait in %s, want %d", got, fn, n)
			return
		}
	}
}
