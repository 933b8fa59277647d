package sandbox

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
)

// The manager holds one entry per sandbox it is running or working on; the
// store holds every sandbox's record. An entry's phase says what may happen
// to the sandbox next, and every change of phase is one of the transitions
// below, each a single step under one mutex. That is the whole of claim and
// exclusion:
//
//	(none) --begin--> creating | resuming | stopping
//	creating, resuming --run--> running          (or --end--> none on failure)
//	running --quiesce--> checkpointing | pausing | suspending  (only with nothing in flight)
//	checkpointing, pausing, suspending --settle--> running   (done, or failed and still running)
//	pausing, suspending --end--> none (paused on disk)
//	running --begin(stopping)--> stopping --end--> none
//	(none, paused on disk) --begin(readingImage)--> readingImage --end--> none (still paused)
//
// Work in a sandbox (exec, run, upload) is acquired only while it is
// running, and counts as in flight until done; quiesce refuses while anything
// is in flight, and acquire refuses in any phase but running, so a checkpoint
// never sees work under way. Requests that find a sandbox resuming,
// suspending (an idle pause), pausing or checkpointing wait for the phase to
// end (wait, waitTurn) instead of failing: to them the sandbox is merely
// slow; after a resume, or a checkpoint they waited for, they go before the
// next checkpoint (entry.turn).

// phase is where an entry is in its life.
type phase int

const (
	phaseCreating      phase = iota + 1 // booting or restoring for a create; no agent yet
	phaseResuming                       // restoring a paused sandbox
	phaseRunning                        // its agent answers; work may be in flight
	phaseCheckpointing                  // a snapshot or fork writes its image; it keeps running
	phasePausing                        // being checkpointed to disk and stopped, as asked
	phaseSuspending                     // as pausing, because it was idle; requests wait and resume it
	phaseStopping                       // being killed, expired or reaped
	phaseReadingImage                   // paused, its image being read (a fork's children restore from it, a snapshot links it); it stays paused
)

func (p phase) String() string {
	switch p {
	case phaseCreating:
		return "created"
	case phaseResuming:
		return "resumed"
	case phaseRunning:
		return "running"
	case phaseCheckpointing:
		return "snapshotted or forked"
	case phasePausing, phaseSuspending:
		return "paused"
	case phaseStopping:
		return "stopped"
	case phaseReadingImage:
		return "forked or snapshotted"
	}
	return "unknown"
}

// entry is what the manager knows of one sandbox beyond its record. State
// of a sandbox that only this process holds (its network, its PTY sessions
// and port proxies) belongs here, guarded by table.mu.
type entry struct {
	phase    phase
	changed  chan struct{} // closed when phase changes (or the entry ends)
	client   *AgentClient  // the agent's channel: set while running, checkpointing or stopping
	inflight int           // work acquired and not yet done (exec, run, upload, …)
	holds    int           // long-lived uses (proxied connections, output streams): not idle, yet checkpointable
	idle     idleState     // see idle.go
	// idleSet: the idle timeout was changed (PATCH) while the sandbox was
	// being created or resumed; run keeps it rather than the timeout of
	// the record that boot began with.
	idleSet bool
	// Of inflight: terminal sessions, and of those the ones ending (their
	// client has gone; only the shell's teardown is left).
	terminals, ending int
	workChanged       chan struct{} // closed when inflight, terminals or ending change
	// A stop waits its turn: a kill (killsWaiting of them) behind a
	// checkpoint, or the reaper (expired: past its TTL) behind whatever
	// held the sandbox. No checkpoint begins meanwhile, so clients that
	// snapshot or pause it in a loop cannot keep it from its stop.
	killsWaiting int
	expired      bool
	// turn: when a resume made it running, or a checkpoint that requests
	// waited for (waiting of them, see waitTurn) ended. Those requests get
	// answerGrace from then to count their work before another checkpoint
	// may begin: a pause sent just after requests that woke an idle
	// sandbox must not undo the resume they caused, nor may clients that
	// snapshot in a loop keep work out.
	turn    time.Time
	waiting int
}

func newEntry(p phase) *entry {
	return &entry{phase: p, changed: make(chan struct{}), workChanged: make(chan struct{})}
}

// setPhase changes the phase and wakes whoever waits on the old one.
func (e *entry) setPhase(p phase) {
	e.phase = p
	close(e.changed)
	e.changed = make(chan struct{})
}

// refuseStarts makes begin refuse creates and resumes from now on.
func (t *table) refuseStarts() {
	t.mu.Lock()
	t.noStarts = true
	t.mu.Unlock()
}

// starting reports whether a create or a resume is under way.
func (t *table) starting() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, e := range t.entries {
		if e.phase == phaseCreating || e.phase == phaseResuming {
			return true
		}
	}
	return false
}

// table is the manager's entries and their transitions.
type table struct {
	mu      sync.Mutex
	entries map[string]*entry
	closed  bool // the manager is closing: nothing new begins
	// noStarts refuses new creates and resumes: every sandbox is being
	// killed (KillAll), and one started after its list would outlive it.
	noStarts bool
	now      func() time.Time // the clock of idleness
	// How long a checkpoint that finds only terminal sessions in flight
	// waits before it answers conflict: for those ending, endingGrace;
	// for one still open, closeGrace, since its client's close may be on
	// its way (the WebSocket answers a close before the session sees it).
	endingGrace, closeGrace time.Duration
	// How long it waits for other work: answerGrace, since a streamed
	// answer (an exec's exit, an upload's result) can reach its caller a
	// moment before the handler returns and the work is counted done, and
	// the caller's next request (a fork right after an exec) must not be
	// refused for it.
	answerGrace time.Duration
}

func newTable() *table {
	return &table{entries: map[string]*entry{}, now: time.Now, endingGrace: 3 * time.Second, closeGrace: 250 * time.Millisecond, answerGrace: 250 * time.Millisecond}
}

var errClosing = pandastack.Errorf(pandastack.EUnavailable, "the server is shutting down")

func busyError(id string, p phase) error {
	if p == phaseStopping { // a retry meets a sandbox that is gone
		return pandastack.Errorf(pandastack.EConflict, "sandbox %s is being stopped (killed, or past its TTL); it will not run again", id)
	}
	return pandastack.Errorf(pandastack.EConflict, "sandbox %s is being %s; retry in a moment", id, p)
}

// begin claims a sandbox for p, one of creating, resuming, readingImage
// (a paused one) or stopping. All but stopping need a sandbox nobody holds;
// stopping also takes a running one, whatever is in flight in it (that
// work then fails).
func (t *table) begin(id string, p phase) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || t.noStarts && (p == phaseCreating || p == phaseResuming) {
		return errClosing
	}
	e := t.entries[id]
	switch {
	case e == nil:
		t.entries[id] = newEntry(p)
	case p == phaseStopping && e.phase == phaseRunning:
		e.setPhase(p)
	default:
		return busyError(id, e.phase)
	}
	return nil
}

// quiesce moves a running sandbox with nothing in flight to p
// (checkpointing, pausing or suspending); what says what the caller wanted,
// for the error when work is in flight. Checkpoints never wait for work
// under way; only, briefly, for work ending (see answerGrace) and for
// terminal sessions being closed (see closeGrace).
func (t *table) quiesce(id string, p phase, what string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.waitWork(id, true)
	if e != nil && e.stopWaits() {
		return busyError(id, phaseStopping)
	}
	if e != nil && e.inflight > 0 {
		return inFlightError(id, e.inflight, what)
	}
	switch {
	case t.closed:
		return errClosing
	case e == nil:
		return pandastack.Errorf(pandastack.EUnavailable, "sandbox %s is not answering", id)
	case e.phase != phaseRunning:
		return busyError(id, e.phase)
	}
	e.setPhase(p)
	return nil
}

// waitWork waits, t.mu held (it lets go while it waits), until no work is
// in flight in id (terminal sessions aside unless terminalsToo), or the
// graces have passed; it returns id's entry then. Less than answerGrace
// after its turn (see entry.turn) it first waits for work to begin.
func (t *table) waitWork(id string, terminalsToo bool) *entry {
	e := t.entries[id]
	for e != nil && e.inflight == 0 && !e.turn.IsZero() {
		wait := t.answerGrace - time.Since(e.turn)
		if wait <= 0 {
			break
		}
		e = t.waitWorkChange(id, e, wait)
	}
	start := time.Now()
	for e != nil && e.inflight > 0 && (terminalsToo || e.inflight > e.terminals) {
		wait := t.answerGrace
		if e.inflight == e.terminals {
			wait = t.endingGrace
			if e.ending < e.terminals {
				wait = t.closeGrace
			}
		}
		wait -= time.Since(start)
		if wait <= 0 {
			break
		}
		e = t.waitWorkChange(id, e, wait)
	}
	return e
}

// waitWorkChange waits, t.mu held (it lets go while it waits), until the
// work in flight in e changes or wait has passed; it returns id's entry
// then.
func (t *table) waitWorkChange(id string, e *entry, wait time.Duration) *entry {
	changed := e.workChanged
	t.mu.Unlock()
	select {
	case <-changed:
	case <-time.After(wait):
	}
	t.mu.Lock()
	return t.entries[id]
}

// inFlightError is quiesce's refusal for n pieces of work in flight.
func inFlightError(id string, n int, what string) error {
	return pandastack.Errorf(pandastack.EConflict, "sandbox %s has %d command(s), cell(s), upload(s) or terminal(s) running; %s once they finish (snapshots never wait for work)", id, n, what)
}

// refusesQuiesce is the refusal quiesce would give for work in flight
// other than terminals (for which it waits a while), or for a snapshot,
// fork or stop under way, or nil: for a caller with something to undo
// after a refusal to ask first. Like quiesce it waits answerGrace for work
// ending. The work may start or end just after. A pause, a resume or a
// create under way is no refusal: the caller waits those out.
func (t *table) refusesQuiesce(id, what string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.waitWork(id, false)
	switch {
	case e != nil && e.stopWaits():
		return busyError(id, phaseStopping)
	case e != nil && (e.phase == phaseCheckpointing || e.phase == phaseStopping):
		return busyError(id, e.phase)
	case e != nil && e.inflight > e.terminals:
		return inFlightError(id, e.inflight, what)
	}
	return nil
}

// stopWaits says a stop waits for the sandbox: nothing else may begin.
func (e *entry) stopWaits() bool { return e.killsWaiting > 0 || e.expired }

// waitToStop is a kill's wait for a sandbox it could not claim: until its
// phase ends or ctx does; it reports whether it waited. From the first
// wait until *release is called (the kill has claimed the sandbox or
// given up), no checkpoint begins on it.
func (t *table) waitToStop(ctx context.Context, id string, release *func()) bool {
	if *release != nil {
		// Held on the entry of an earlier wait; this one's may be new (a
		// pause ends its sandbox's entry, a resume makes one anew).
		(*release)()
		*release = nil
	}
	return t.waitOutThen(ctx, id, func(e *entry) {
		e.killsWaiting++
		*release = func() {
			t.mu.Lock()
			e.killsWaiting--
			t.mu.Unlock()
		}
	}, phaseStopping, phaseCreating, phaseResuming, phasePausing, phaseSuspending, phaseReadingImage, phaseCheckpointing)
}

// stopping reports whether the sandbox is being stopped.
func (t *table) stopping(id string) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[id]
	return e != nil && e.phase == phaseStopping
}

// expire marks a sandbox past its TTL that the reaper could not claim:
// nothing more begins on it, and the reaper's next round stops it.
func (t *table) expire(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.entries[id]; e != nil {
		e.expired = true
	}
}

// unexpire drops the mark of expire from the sandboxes for which keep is
// false: their TTL was extended since.
func (t *table) unexpire(keep func(id string) bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for id, e := range t.entries {
		if e.expired && !keep(id) {
			e.expired = false
		}
	}
}

// settle ends a checkpoint that left the sandbox running.
func (t *table) settle(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.entries[id]; e != nil && (e.phase == phaseCheckpointing || e.phase == phasePausing || e.phase == phaseSuspending) {
		if e.waiting > 0 {
			e.turn = time.Now()
		}
		e.setPhase(phaseRunning)
	}
}

// run makes a claimed sandbox running with the agent channel c; it goes
// idle after idleTimeout (0: never), or after the timeout a change during
// its boot set (setIdleTimeout), which it returns. It reports false,
// holding nothing, when the manager closed meanwhile: the caller closes c
// (the sandbox runs on, for the next start to re-adopt).
func (t *table) run(id string, c *AgentClient, idleTimeout time.Duration) (time.Duration, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[id]
	if t.closed {
		t.drop(id)
		return idleTimeout, false
	}
	if e == nil {
		e = newEntry(phaseRunning)
		t.entries[id] = e
	}
	if e.idleSet {
		idleTimeout, e.idleSet = e.idle.timeout, false
	}
	e.client = c
	e.idle = idleState{timeout: idleTimeout, lastUse: t.now()}
	if e.phase == phaseResuming {
		e.turn = time.Now()
	}
	e.setPhase(phaseRunning)
	return idleTimeout, true
}

// drop removes an entry and wakes its waiters. t.mu is held.
func (t *table) drop(id string) {
	if e := t.entries[id]; e != nil {
		close(e.changed)
		delete(t.entries, id)
	}
}

// detach takes the agent channel out of a claimed entry, for the caller to
// close; the entry stays claimed.
func (t *table) detach(id string) *AgentClient {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[id]
	if e == nil {
		return nil
	}
	c := e.client
	e.client = nil
	return c
}

// end drops the entry: the sandbox is gone from this process (stopped,
// paused to disk, or never made).
func (t *table) end(id string) {
	t.mu.Lock()
	t.drop(id)
	t.mu.Unlock()
}

// wait blocks while the sandbox is being created, resumed, paused,
// suspended, or forked or snapshotted while paused, until that phase ends
// or ctx is done.
// It reports whether it waited: the caller then looks again at what the
// sandbox has become.
func (t *table) wait(ctx context.Context, id string) bool {
	return t.waitOut(ctx, id, phaseCreating, phaseResuming, phasePausing, phaseSuspending, phaseReadingImage)
}

// waitTurn is wait for a request whose work the sandbox's phase refused,
// a snapshot or fork under way (checkpointing) included: the request is
// counted as waiting (see entry.turn) until *release is called, which the
// caller does once it has its work counted, or has given up.
func (t *table) waitTurn(ctx context.Context, id string, release *func()) bool {
	return t.waitOutThen(ctx, id, func(e *entry) {
		e.waiting++
		*release = func() {
			t.mu.Lock()
			e.waiting--
			t.mu.Unlock()
		}
	}, phaseCreating, phaseResuming, phasePausing, phaseSuspending, phaseReadingImage, phaseCheckpointing)
}

// waitOut blocks while the sandbox is in one of phases, until its phase
// changes or ctx is done, and reports whether it waited.
func (t *table) waitOut(ctx context.Context, id string, phases ...phase) bool {
	return t.waitOutThen(ctx, id, nil, phases...)
}

// waitOutThen is waitOut, calling before (if not nil) with the entry,
// t.mu held, when it is about to wait.
func (t *table) waitOutThen(ctx context.Context, id string, before func(*entry), phases ...phase) bool {
	t.mu.Lock()
	e := t.entries[id]
	if e == nil || !slices.Contains(phases, e.phase) {
		t.mu.Unlock()
		return false
	}
	if before != nil {
		before(e)
	}
	ch := e.changed
	t.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
	return true
}

// agent returns the channel of a running sandbox.
func (t *table) agent(id string) (*AgentClient, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, err := t.runningEntry(id)
	if err != nil {
		return nil, err
	}
	e.idle.used(t.now())
	return e.client, nil
}

// runningEntry returns the entry of a running sandbox whose agent answers.
// t.mu is held.
func (t *table) runningEntry(id string) (*entry, error) {
	e := t.entries[id]
	if e != nil && e.phase != phaseRunning {
		return nil, busyError(id, e.phase)
	}
	if e == nil || e.client == nil || !e.client.Alive() {
		return nil, pandastack.Errorf(pandastack.EUnavailable, "sandbox %s is not answering", id)
	}
	return e, nil
}

// acquire is agent for work that must not overlap a checkpoint: it counts
// the work as in flight in the same step. done (idempotent) ends it.
func (t *table) acquire(id string) (*AgentClient, func(), error) {
	c, w, err := t.acquireWork(id, false)
	if err != nil {
		return nil, nil, err
	}
	return c, w.done, nil
}

// work is one acquisition of work in flight.
type work struct {
	t        *table
	e        *entry
	terminal bool // a terminal session, which may end (ending) before done
	isEnding bool // guarded by t.mu, as is finished
	finished bool
}

// acquireWork is acquire; terminal says the work is a terminal session.
func (t *table) acquireWork(id string, terminal bool) (*AgentClient, *work, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, err := t.runningEntry(id)
	if err != nil {
		return nil, nil, err
	}
	w := &work{t: t, e: e, terminal: terminal}
	w.change(1, 0)
	return e.client, w, nil
}

// change adds to the entry's counts of work, and wakes a checkpoint
// waiting on them. t.mu is held.
func (w *work) change(inflight, ending int) {
	e := w.e
	e.inflight += inflight
	if w.terminal {
		e.terminals += inflight
	}
	e.ending += ending
	e.idle.used(w.t.now())
	close(e.workChanged)
	e.workChanged = make(chan struct{})
}

// ending marks a terminal session as only tearing down: its client has
// gone.
func (w *work) ending() {
	w.t.mu.Lock()
	defer w.t.mu.Unlock()
	if w.terminal && !w.isEnding && !w.finished {
		w.isEnding = true
		w.change(0, 1)
	}
}

// done ends the work; later calls do nothing.
func (w *work) done() {
	w.t.mu.Lock()
	defer w.t.mu.Unlock()
	if w.finished {
		return
	}
	w.finished = true
	ending := 0
	if w.isEnding {
		ending = -1
	}
	w.change(-1, ending)
}

// hold is acquire for long-lived uses (a proxied connection, a process's
// output stream): the sandbox is not idle while held, but may be
// checkpointed. done (idempotent) ends it.
func (t *table) hold(id string) (*AgentClient, func(), error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, err := t.runningEntry(id)
	if err != nil {
		return nil, nil, err
	}
	e.holds++
	e.idle.used(t.now())
	var once sync.Once
	return e.client, func() {
		once.Do(func() {
			t.mu.Lock()
			e.holds--
			e.idle.used(t.now())
			t.mu.Unlock()
		})
	}, nil
}

// running returns the ids and channels of every running sandbox.
func (t *table) running() map[string]*AgentClient {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]*AgentClient, len(t.entries))
	for id, e := range t.entries {
		if e.phase == phaseRunning && e.client != nil {
			out[id] = e.client
		}
	}
	return out
}

// client returns the channel of a running sandbox, or nil.
func (t *table) client(id string) *AgentClient {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.entries[id]; e != nil && e.phase == phaseRunning {
		return e.client
	}
	return nil
}

// clientIn returns the agent's channel of id while it is in phase p (one
// the caller claimed), or nil.
func (t *table) clientIn(id string, p phase) *AgentClient {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.entries[id]; e != nil && e.phase == p {
		return e.client
	}
	return nil
}

// close refuses every later begin, quiesce and run, and hands back every
// channel held, for the caller to close. Work already claimed finishes; a
// create that finishes after this closes its own channel (see run).
func (t *table) close() []*AgentClient {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil
	}
	t.closed = true
	var out []*AgentClient
	for _, e := range t.entries {
		if e.client != nil {
			out = append(out, e.client)
			e.client = nil
		}
	}
	return out
}

// turns lets one caller at a time act on a sandbox, by id: a change of its
// TTL and the reaper's last look before its stop. The zero value is ready.
type turns struct {
	mu   sync.Mutex
	held map[string]chan struct{} // closed when the turn ends
}

// take waits for id's turn, or until ctx ends (its error); call done when
// through.
func (t *turns) take(ctx context.Context, id string) (done func(), err error) {
	for {
		t.mu.Lock()
		ch := t.held[id]
		if ch == nil {
			if t.held == nil {
				t.held = map[string]chan struct{}{}
			}
			ch = make(chan struct{})
			t.held[id] = ch
			t.mu.Unlock()
			return func() {
				t.mu.Lock()
				delete(t.held, id)
				t.mu.Unlock()
				close(ch)
			}, nil
		}
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
