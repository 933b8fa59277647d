package sandbox

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// The state machine alone: every transition from every phase.
func TestTableTransitions(t *testing.T) {
	type step struct {
		name string
		do   func(*table) error
		code string // "" for success
	}
	begin := func(p phase) func(*table) error { return func(tb *table) error { return tb.begin("s", p) } }
	quiesce := func(p phase) func(*table) error { return func(tb *table) error { return tb.quiesce("s", p, "x") } }
	run := func(tb *table) error { tb.run("s", nil, 0); return nil }
	settle := func(tb *table) error { tb.settle("s"); return nil }
	end := func(tb *table) error { tb.end("s"); return nil }

	cases := []struct {
		name  string
		steps []step
	}{
		{"create twice", []step{{"begin", begin(phaseCreating), ""}, {"begin again", begin(phaseCreating), pandastack.EConflict}}},
		{"kill while creating", []step{{"begin", begin(phaseCreating), ""}, {"stop", begin(phaseStopping), pandastack.EConflict}}},
		{"kill running", []step{{"begin", begin(phaseCreating), ""}, {"run", run, ""}, {"stop", begin(phaseStopping), ""}, {"stop again", begin(phaseStopping), pandastack.EConflict}, {"end", end, ""}, {"create after", begin(phaseCreating), ""}}},
		{"stop unknown (paused)", []step{{"stop", begin(phaseStopping), ""}, {"resume meanwhile", begin(phaseResuming), pandastack.EConflict}}},
		{"resume twice", []step{{"resume", begin(phaseResuming), ""}, {"resume again", begin(phaseResuming), pandastack.EConflict}}},
		{"snapshot of unknown", []step{{"quiesce", quiesce(phaseCheckpointing), pandastack.EUnavailable}}},
		{"snapshot while creating", []step{{"begin", begin(phaseCreating), ""}, {"quiesce", quiesce(phaseCheckpointing), pandastack.EConflict}}},
		{"two checkpoints", []step{{"begin", begin(phaseCreating), ""}, {"run", run, ""}, {"snap", quiesce(phaseCheckpointing), ""}, {"pause", quiesce(phasePausing), pandastack.EConflict}, {"stop", begin(phaseStopping), pandastack.EConflict}, {"settle", settle, ""}, {"pause", quiesce(phasePausing), ""}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tb := newTable()
			for _, s := range tc.steps {
				err := s.do(tb)
				if s.code == "" && err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				if s.code != "" && !pandastack.IsCode(err, s.code) {
					t.Fatalf("%s: got %v, want %s", s.name, err, s.code)
				}
			}
		})
	}
}

// Work and checkpoints exclude each other; done is idempotent.
func TestTableInflight(t *testing.T) {
	tb := newTable()
	if err := tb.begin("s", phaseCreating); err != nil {
		t.Fatal(err)
	}
	// A table entry without a live channel is not answering.
	tb.run("s", nil, 0)
	if _, _, err := tb.acquire("s"); !pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Fatalf("acquire without a channel: %v", err)
	}
	e := tb.entries["s"]
	e.inflight = 2
	if err := tb.quiesce("s", phaseCheckpointing, "take the snapshot"); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("quiesce with work in flight: %v", err)
	}
	e.inflight = 0
	if err := tb.quiesce("s", phaseCheckpointing, "take the snapshot"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tb.acquire("s"); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("acquire while checkpointing: %v", err)
	}
}

// A checkpoint waits a while for work to end: other work in flight is
// refused after answerGrace, an open terminal after closeGrace, a
// teardown that outlasts endingGrace after that.
func TestTableTerminalTeardown(t *testing.T) {
	tb := newTable()
	// Graces far apart, and far from the 50 ms the helpers below take: the
	// bounds tell which grace was waited, on a loaded host too.
	tb.endingGrace, tb.closeGrace, tb.answerGrace = 3*time.Second, 1500*time.Millisecond, 500*time.Millisecond
	tb.begin("s", phaseCreating)
	tb.run("s", nil, 0)
	e := tb.entries["s"]
	take := func(terminal bool) *work { // acquireWork, without a live channel
		tb.mu.Lock()
		defer tb.mu.Unlock()
		w := &work{t: tb, e: e, terminal: terminal}
		w.change(1, 0)
		return w
	}
	quiesce := func(what string, wantConflict bool, min, max time.Duration) {
		t.Helper()
		start := time.Now()
		err := tb.quiesce("s", phaseCheckpointing, "take the snapshot")
		took := time.Since(start)
		if wantConflict != pandastack.IsCode(err, pandastack.EConflict) || (!wantConflict && err != nil) {
			t.Fatalf("%s: %v", what, err)
		}
		if took < min || took >= max {
			t.Fatalf("%s: answered after %s, want within [%s, %s)", what, took, min, max)
		}
		if err == nil {
			tb.settle("s")
		}
	}

	term, exec := take(true), take(false)
	term.ending()
	quiesce("a terminal tearing down and an exec", true, tb.answerGrace, tb.closeGrace)
	exec.done()
	exec.done() // idempotent
	exec = take(false)
	go func() { time.Sleep(50 * time.Millisecond); exec.done() }()
	if err := tb.refusesQuiesce("s", "fork it"); err != nil {
		t.Fatalf("an exec that ends meanwhile: %v", err)
	}
	exec = take(false)
	if err := tb.refusesQuiesce("s", "fork it"); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("an exec that runs on: %v", err)
	}
	go func() { time.Sleep(50 * time.Millisecond); exec.done() }()
	go func() { time.Sleep(50 * time.Millisecond); term.done() }()
	quiesce("a terminal tearing down", false, 0, tb.endingGrace)

	open := take(true)
	quiesce("an open terminal", true, tb.closeGrace, tb.endingGrace)
	go func() {
		time.Sleep(50 * time.Millisecond)
		open.ending()
		time.Sleep(50 * time.Millisecond)
		open.done()
	}()
	quiesce("a terminal closed meanwhile", false, 0, tb.endingGrace)

	stuck := take(true)
	stuck.ending()
	stuck.ending() // idempotent
	quiesce("a teardown past the grace", true, tb.endingGrace, 2*tb.endingGrace)
	stuck.done()
	stuck.ending() // after done: nothing
	exec = take(false)
	exec.ending() // not a terminal: nothing
	exec.done()
	if e.inflight != 0 || e.terminals != 0 || e.ending != 0 {
		t.Fatalf("after done: inflight %d, terminals %d, ending %d", e.inflight, e.terminals, e.ending)
	}
}

// A checkpoint of a sandbox resumed a moment ago, or just out of a
// checkpoint that requests waited for, gives those requests answerGrace to
// count their work: a pause sent just after a request that woke an idle
// sandbox finds that request's work in flight instead of undoing the
// resume it caused, and snapshots in a loop do not keep work out.
func TestTableTurnAfterAResumeOrCheckpoint(t *testing.T) {
	tb := newTable()
	tb.answerGrace = time.Second // far from the 50 ms the helpers below take, on a loaded host too
	quiesce := func() (time.Duration, error) {
		start := time.Now()
		err := tb.quiesce("s", phasePausing, "pause it")
		return time.Since(start), err
	}

	tb.begin("s", phaseCreating)
	tb.run("s", nil, 0)
	if took, err := quiesce(); err != nil || took >= tb.answerGrace/2 {
		t.Fatalf("a pause of a sandbox just created: %v after %s, want at once", err, took)
	}
	tb.end("s")

	tb.begin("s", phaseResuming)
	tb.run("s", nil, 0)
	e := tb.entries["s"]
	go func() {
		time.Sleep(50 * time.Millisecond)
		tb.mu.Lock()
		w := &work{t: tb, e: e}
		w.change(1, 0) // what acquire counts
		tb.mu.Unlock()
	}()
	took, err := quiesce()
	if !pandastack.IsCode(err, pandastack.EConflict) || took < tb.answerGrace {
		t.Fatalf("a pause just after a resume whose request runs: %v after %s, want conflict after the work's grace", err, took)
	}
	tb.end("s")

	tb.begin("s", phaseResuming)
	tb.run("s", nil, 0)
	took, err = quiesce()
	if err != nil || took < tb.answerGrace/2 || took >= 2*tb.answerGrace {
		t.Fatalf("a pause just after a resume nothing used: %v after %s, want success after about %s", err, took, tb.answerGrace)
	}
	tb.settle("s")

	// After a checkpoint that requests waited for, the same: they go first.
	if err := tb.quiesce("s", phaseCheckpointing, "take the snapshot"); err != nil {
		t.Fatal(err)
	}
	var release func()
	waited := make(chan bool)
	go func() { waited <- tb.waitTurn(context.Background(), "s", &release) }()
	for !tb.waitingFor("s") {
		time.Sleep(time.Millisecond)
	}
	tb.settle("s")
	<-waited
	e = tb.entries["s"]
	go func() {
		time.Sleep(50 * time.Millisecond)
		tb.mu.Lock()
		w := &work{t: tb, e: e}
		w.change(1, 0)
		tb.mu.Unlock()
		release()
	}()
	if took, err := quiesce(); !pandastack.IsCode(err, pandastack.EConflict) || took < tb.answerGrace {
		t.Fatalf("a pause just after a checkpoint a request waited for: %v after %s, want conflict after the work's grace", err, took)
	}
	// One that nobody waited for leaves none of that behind.
	tb.entries["s"].inflight = 0
	tb.entries["s"].turn = time.Time{}
	if err := tb.quiesce("s", phaseCheckpointing, "take the snapshot"); err != nil {
		t.Fatal(err)
	}
	tb.settle("s")
	if took, err := quiesce(); err != nil || took >= tb.answerGrace/2 {
		t.Fatalf("a pause after a checkpoint nobody waited for: %v after %s, want at once", err, took)
	}
}

// After close nothing begins, and a create finishing late holds nothing.
func TestTableClose(t *testing.T) {
	tb := newTable()
	tb.begin("a", phaseCreating)
	tb.close()
	if err := tb.begin("b", phaseCreating); !pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Fatalf("begin after close: %v", err)
	}
	if _, ok := tb.run("a", nil, 0); ok {
		t.Fatal("run after close kept the channel")
	}
	if len(tb.entries) != 0 {
		t.Fatalf("entries left: %v", tb.entries)
	}
}

// A kill waiting behind a checkpoint keeps new checkpoints out until it
// has claimed the sandbox or given up; so does the reaper's mark of an
// expired sandbox it could not claim.
func TestTableStopWaits(t *testing.T) {
	tb := newTable()
	tb.answerGrace = 0
	tb.begin("s", phaseCreating)
	tb.run("s", nil, 0)
	if err := tb.quiesce("s", phaseCheckpointing, "take the snapshot"); err != nil {
		t.Fatal(err)
	}
	var release func()
	waited := make(chan bool)
	go func() { waited <- tb.waitToStop(context.Background(), "s", &release) }()
	for {
		tb.mu.Lock()
		n := tb.entries["s"].killsWaiting
		tb.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	tb.settle("s")
	if !<-waited {
		t.Fatal("the kill did not wait")
	}
	if err := tb.quiesce("s", phaseCheckpointing, "take the snapshot"); !pandastack.IsCode(err, pandastack.EConflict) || !strings.Contains(err.Error(), "will not run again") {
		t.Fatalf("a snapshot while a kill waits: %v", err) // not "retry": it is about to go
	}
	if err := tb.refusesQuiesce("s", "fork it"); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("a fork while a kill waits: %v", err)
	}
	release()
	if err := tb.quiesce("s", phasePausing, "pause it"); err != nil {
		t.Fatalf("a pause once the kill gave up: %v", err)
	}
	tb.settle("s")
	if tb.waitToStop(context.Background(), "s", &release) {
		t.Fatal("waited for a running sandbox")
	}

	tb.expire("s")
	if err := tb.quiesce("s", phaseSuspending, "suspend it"); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("a suspend of an expired sandbox: %v", err)
	}
	if err := tb.begin("s", phaseStopping); err != nil {
		t.Fatalf("the reaper's next round: %v", err)
	}
}

// waitingFor says a request waits for sandbox id's phase to end.
func (t *table) waitingFor(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[id]
	return e != nil && e.waiting > 0
}

// stopWaiting says a kill waits for sandbox id.
func (t *table) stopWaiting(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[id]
	return e != nil && e.killsWaiting > 0
}

// The reaper's mark of an expired sandbox goes when its TTL is extended.
func TestUnexpire(t *testing.T) {
	tb := newTable()
	tb.answerGrace = 0
	for _, id := range []string{"a", "b"} {
		tb.begin(id, phaseCreating)
		tb.run(id, nil, 0)
		tb.expire(id)
	}
	tb.unexpire(func(id string) bool { return id == "b" })
	if err := tb.quiesce("a", phaseCheckpointing, "x"); err != nil {
		t.Fatalf("a, extended: %v", err)
	}
	if err := tb.quiesce("b", phaseCheckpointing, "x"); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("b, still expired: %v", err)
	}
}
