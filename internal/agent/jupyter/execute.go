package jupyter

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// DefaultOutputCap is how many bytes of each stream a run keeps by default.
const DefaultOutputCap = 1 << 20

// ResultsCap bounds the rich results one run keeps (their JSON size): past
// it, further displays are dropped with a marker, so a cell that displays
// without end cannot make the agent or the host hold it all in memory.
const ResultsCap = 32 << 20

// ExecOptions tunes one Execute.
type ExecOptions struct {
	// Timeout bounds the run; 0 means none. On expiry the kernel is
	// interrupted and the Execution carries a TimeoutError.
	Timeout time.Duration
	// OutputCap is how many bytes of stdout, and of stderr, are kept;
	// 0 means DefaultOutputCap.
	OutputCap int
	// Env is set for this run only (needs Options.EnvCode).
	Env map[string]string
	// NoHistory runs the cell without counting it in execution_count or
	// the kernel's history: for the platform's own cells (warm-up).
	NoHistory bool
	// Timing, if not nil, receives the run's breakdown (all but
	// HandlerUS, which is the caller's) once Execute returns.
	Timing *agentproto.RunTiming
}

// Execute runs code as one cell and returns its outcome. onEvent (may be
// nil) sees the output live, in order, from a goroutine of its own (never
// after Execute returned; see eventPump): "stdout"
// and "stderr" chunks, a "result" per rich output, an "error", and last an
// "execution" event with the same Execution that is returned.
//
// A failing cell, a timeout and a kernel that dies are all reported in the
// Execution's Error (names: the exception's, "TimeoutError", "KernelDied"),
// with a nil error. The error return is for a run that could not happen or
// was abandoned: ErrBusy while another Execute runs, ErrDead when the kernel
// is gone (restart it), ErrClosed, an invalid Env, or ctx.Err() when ctx
// ended first. On cancellation the cell is interrupted; the kernel stays
// busy (Busy) until the cell has stopped, and is restarted if it does not
// stop within Options.InterruptGrace; an Execute meanwhile waits for that
// (within its ctx) instead of failing with ErrBusy.
//
// A timeout works the same way: the cell is interrupted and, if it stops,
// the kernel's state survives; if not, the kernel is restarted and the
// error's value says so.
func (k *Kernel) Execute(ctx context.Context, code string, o ExecOptions, onEvent func(agentproto.CodeEvent)) (agentproto.Execution, error) {
	if onEvent == nil {
		onEvent = func(agentproto.CodeEvent) {}
	} else {
		pump := newEventPump(onEvent)
		defer pump.close() // after the kernel is released (a later defer)
		onEvent = pump.send
	}
	if len(o.Env) > 0 {
		if k.opts.EnvCode == nil {
			return agentproto.Execution{}, fmt.Errorf("%w: this kernel does not support per-run environment variables", ErrInvalid)
		}
		if err := checkEnv(o.Env); err != nil {
			return agentproto.Execution{}, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
	}
	if o.OutputCap <= 0 {
		o.OutputCap = DefaultOutputCap
	}
	for !k.busy.CompareAndSwap(false, true) {
		// A cell whose caller went away is being stopped (abandon): the
		// next one waits for that rather than failing busy.
		stopped := k.stopping.Load()
		if stopped == nil {
			return agentproto.Execution{}, ErrBusy
		}
		select {
		case <-stopped.done:
			if stopped.restarted {
				return agentproto.Execution{}, ErrRestarted
			}
		case <-ctx.Done():
			return agentproto.Execution{}, ctx.Err()
		}
	}
	release := true
	defer func() {
		if release {
			k.busy.Store(false)
		}
	}()
	in, err := k.current()
	if err != nil {
		return agentproto.Execution{}, err
	}

	takeNote(in) // one from between cells belongs to none
	start := time.Now()
	r := newRun(o.OutputCap)
	r.valueDisplays = k.opts.ValueDisplays
	r.lateFor = k.opts.LateOutput
	// The kernel runs shell requests in order, so the env code can be
	// queued around the cell without waiting for its replies.
	if k.opts.OutputCapCode != nil && in.outputCap != o.OutputCap {
		in.sendSilent(k.opts.OutputCapCode(o.OutputCap))
		in.outputCap = o.OutputCap
	}
	var restore string
	if len(o.Env) > 0 {
		var set string
		set, restore = k.opts.EnvCode(o.Env)
		in.sendSilent(set)
	}
	exprs := map[string]any{}
	if k.opts.DroppedExpr != "" {
		exprs[droppedKey] = k.opts.DroppedExpr
	}
	cell := code // as the caller wrote it
	if k.opts.WrapCode != nil {
		code = k.opts.WrapCode(code)
	}
	r.sent = time.Now()
	id, err := in.send(in.shell, "execute_request", executeRequest{
		Code: code, StoreHistory: !o.NoHistory, UserExpressions: exprs,
	}, r.handle)
	if err != nil {
		return agentproto.Execution{}, err
	}
	if o.Timing != nil {
		defer func() { r.timing(start, o.Timing) }()
	}
	keep := false // an abandoned cell's handler lives on in abandon
	defer func() {
		if !keep {
			in.forget(id)
		}
	}()
	if restore != "" {
		in.sendSilent(restore)
	}

	var timeout <-chan time.Time
	if o.Timeout > 0 {
		t := time.NewTimer(o.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	switch r.wait(ctx, in, timeout, onEvent) {
	case finished:
		r.note(takeNote(in))
		override := k.shellExited(ctx, in, r)
		if override == nil && k.opts.Explain != nil {
			if e := r.cellError(); e != nil {
				override = k.opts.Explain(ctx, cell, e)
			}
		}
		return r.finish(start, override, onEvent), nil
	case died:
		return r.finish(start, kernelDied(in), onEvent), nil
	case cancelled:
		release, keep = false, true
		k.abandon(in, id, r)
		return r.execution(start), ctx.Err()
	}

	// Timed out: interrupt, and give the cell a moment to stop.
	r.timeOut()
	stopInterrupts, err := k.interruptRun(in, r)
	defer stopInterrupts()
	if err != nil {
		k.log.Warn("interrupt timed-out cell", "err", err)
	}
	terr := &agentproto.ExecutionError{
		Name:  "TimeoutError",
		Value: "execution exceeded the " + seconds(o.Timeout) + " s timeout",
	}
	// stopped waits until deadline for the interrupted cell to end; done
	// is false when it did not.
	stopped := func(deadline <-chan time.Time, note string) (ex agentproto.Execution, done bool, err error) {
		switch r.wait(ctx, in, deadline, onEvent) {
		case finished:
			r.note(takeNote(in))
			terr.Value += note
			terr.Traceback = r.interruptTraceback()
			return r.finish(start, terr, onEvent), true, nil
		case died:
			return r.finish(start, kernelDied(in), onEvent), true, nil
		case cancelled:
			release, keep = false, true
			k.abandon(in, id, r)
			return r.execution(start), true, ctx.Err()
		}
		return agentproto.Execution{}, false, nil
	}
	grace := time.NewTimer(k.opts.InterruptGrace)
	defer grace.Stop()
	if ex, done, err := stopped(grace.C, ""); done {
		return ex, err
	}
	// The cell may be held up by what it started (a fork bomb starving
	// the kernel, a child it waits for that ignores the interrupt): a
	// restart would kill all that anyway, so kill it first and give the
	// interrupt another moment, which keeps the kernel's state.
	if ck, ok := in.proc.(ChildKiller); ok {
		ck.KillChildren()
		again := time.NewTimer(childrenGrace)
		defer again.Stop()
		if ex, done, err := stopped(again.C, "; the cell did not stop after an interrupt until the processes the kernel had started were killed"); done {
			return ex, err
		}
	}
	// The cell ignores interrupts (or the kernel is wedged): only a
	// restart gets the kernel back.
	rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.restartIf(rctx, in, "the kernel was restarted after a timeout"); err != nil {
		terr.Value += "; the cell did not stop after an interrupt and restarting the kernel failed: " + err.Error()
	} else {
		terr.Value += "; the cell did not stop after an interrupt, so the kernel was restarted and its state is lost"
	}
	return r.finish(start, terr, onEvent), nil
}

// abandon stops a cell whose caller went away, in the background: it
// interrupts it, waits for the kernel to go idle, and restarts it if it
// does not. The kernel stays busy meanwhile, so no new cell can be hit by
// the interrupt.
func (k *Kernel) abandon(in *instance, id string, r *run) {
	stopInterrupts, err := k.interruptRun(in, r)
	if err != nil {
		k.log.Debug("interrupt abandoned cell", "err", err)
	}
	stopped := &cellStop{done: make(chan struct{})}
	k.stopping.Store(stopped)
	go func() {
		defer func() {
			k.busy.Store(false)
			k.stopping.CompareAndSwap(stopped, nil)
			close(stopped.done)
		}()
		defer in.forget(id)
		defer stopInterrupts()
		t := time.NewTimer(k.opts.InterruptGrace)
		defer t.Stop()
		select {
		case <-r.done:
			return
		case <-in.proc.Done():
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := k.restartIf(ctx, in, "the kernel was restarted after a cancelled cell did not stop"); err != nil {
			k.log.Warn("restart after abandoned cell", "err", err) // the next run finds the kernel dead
			return
		}
		stopped.restarted = true
	}()
}

// interruptRun interrupts r's cell. ipykernel raises KeyboardInterrupt
// wherever its main thread is, and one raised outside the cell's code is
// caught by the kernel and lost: the cell runs on (or, hit while the
// kernel was taking the request, never runs and never answers) and, once
// the grace has passed, the kernel is restarted and its state lost. That
// is what an interrupt sent before the kernel began the cell (a short
// timeout, a cell queued behind another request, a cancel right after the
// request) or just as it began would do. So the interrupt waits until the
// cell has run for cellSettle since the kernel announced its input; a
// kernel that announces nothing within beginWait gets it then. stop ends
// the wait; call it once the cell is over.
func (k *Kernel) interruptRun(in *instance, r *run) (stop func(), err error) {
	if began, ok := r.beganAt(); ok && time.Since(began) >= cellSettle {
		return func() {}, k.interrupt(in)
	}
	quit, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		fallback := time.NewTimer(beginWait)
		defer fallback.Stop()
		select {
		case <-r.started:
			began, _ := r.beganAt()
			t := time.NewTimer(time.Until(began.Add(cellSettle)))
			defer t.Stop()
			select {
			case <-t.C:
			case <-quit:
				return
			case <-r.done:
				return
			}
		case <-fallback.C:
		case <-quit:
			return
		case <-r.done:
			return
		}
		select { // a timer and the end may fire together
		case <-quit:
			return
		case <-r.done:
			return
		default:
		}
		if err := k.interrupt(in); err != nil {
			k.log.Warn("interrupt a cell", "err", err)
		}
	}()
	// stop returns once no interrupt can come any more, so that one meant
	// for this cell never reaches the next.
	var once sync.Once
	return func() {
		once.Do(func() { close(quit) })
		<-exited
	}, nil
}

// deathDrain bounds the wait for a dead kernel's last messages.
var deathDrain = time.Second

// cellSettle is how long after announcing a cell's input ipykernel may
// still be readying its run, where an interrupt would be lost; beginWait
// bounds the wait for that announcement (well within the InterruptGrace).
var (
	cellSettle = 50 * time.Millisecond
	busySettle = 250 * time.Millisecond
	beginWait  = 2 * time.Second
)

func kernelDied(in *instance) *agentproto.ExecutionError {
	return &agentproto.ExecutionError{Name: "KernelDied", Value: in.deathReason()}
}

// seconds formats d as a number of seconds: "30", "0.5".
func seconds(d time.Duration) string {
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// checkEnv rejects what no environment can hold, and names that are not
// identifiers (every EnvCode writes them into code).
func checkEnv(env map[string]string) error {
	for k, v := range env {
		if !envNameRE.MatchString(k) || strings.ContainsRune(v, 0) {
			return fmt.Errorf("invalid environment variable %q", k)
		}
	}
	return nil
}

// PythonEnvCode is an Options.EnvCode for ipykernel: it saves and sets
// os.environ, then puts it back, leaving no names in the user's namespace.
func PythonEnvCode(env map[string]string) (set, restore string) {
	b, _ := json.Marshal(env)
	// A JSON string literal is a valid Python string literal.
	lit, _ := json.Marshal(string(b))
	set = "def _pandastack_env(env):\n" +
		"    import os\n" +
		"    os._pandastack_saved_env = {k: os.environ.get(k) for k in env}\n" +
		"    os.environ.update(env)\n" +
		"_pandastack_env(__import__('json').loads(" + string(lit) + "))\n" +
		"del _pandastack_env\n"
	restore = "def _pandastack_env():\n" +
		"    import os\n" +
		"    for k, v in os.__dict__.pop('_pandastack_saved_env', {}).items():\n" +
		"        if v is None:\n" +
		"            os.environ.pop(k, None)\n" +
		"        else:\n" +
		"            os.environ[k] = v\n" +
		"_pandastack_env()\n" +
		"del _pandastack_env\n"
	return set, restore
}

type outcome int

const (
	finished  outcome = iota // idle and execute_reply arrived
	died                     // the kernel process is gone
	expired                  // the deadline channel fired
	cancelled                // ctx ended
)

// run collects one cell's messages. handle runs in the socket readers;
// everything else in Execute's goroutine.
type run struct {
	notify  chan struct{} // a token when events are pending
	done    chan struct{} // closed when idle and the reply have both come
	started chan struct{} // closed when the kernel announces the cell's input

	mu             sync.Mutex
	exec           agentproto.Execution
	stdout, stderr capped
	// stdoutTail is the end of the cell's stdout as the kernel sent it,
	// the cap notwithstanding.
	stdoutTail     string
	events         []agentproto.CodeEvent
	gotIdle        bool
	gotReply       bool
	gotInput       bool      // execute_input (or busy) came: the cell runs
	byBusy         bool      // gotInput from the busy status alone
	inputAt        time.Time // when
	replyErr       *agentproto.ExecutionError
	timedOut       bool // hide the KeyboardInterrupt our interrupt causes
	interruptTB    string
	resultsBytes   int // JSON size of the results kept
	resultsDropped int
	// displays maps a display_id (IPython's display(..., display_id=True))
	// to the results showing it, which an update_display_data replaces.
	displays map[string][]int
	// clearWait: a clear_output(wait=True) came; the next output clears.
	clearWait bool
	// valueDisplays: Options.ValueDisplays.
	valueDisplays bool
	// lateFor: Options.LateOutput. Until sealed (the run's Execution is
	// being made), messages that come after the reply and idle status
	// still count; lateResult is closed by the first result among them.
	lateFor    time.Duration
	sealed     bool
	doneClosed bool
	lateResult chan struct{}

	// For ExecOptions.Timing: when the request went, when the reply and
	// the idle status came, and the kernel's own stamps of its busy
	// status, reply and idle status.
	sent, gotReplyAt, gotIdleAt time.Time
	kBusy, kReply, kIdle        time.Time
	messages                    int
}

func newRun(outputCap int) *run {
	return &run{
		notify:     make(chan struct{}, 1),
		done:       make(chan struct{}),
		started:    make(chan struct{}),
		stdout:     capped{limit: outputCap},
		stderr:     capped{limit: outputCap},
		exec:       agentproto.Execution{Results: []agentproto.Result{}},
		lateResult: make(chan struct{}),
	}
}

// wait delivers events until the run finishes, the kernel dies, deadline
// fires or ctx ends.
func (r *run) wait(ctx context.Context, in *instance, deadline <-chan time.Time, onEvent func(agentproto.CodeEvent)) outcome {
	for {
		select {
		case <-r.notify:
			r.flush(onEvent)
		case <-r.done:
			r.awaitLate(ctx)
			return finished
		case <-in.proc.Done():
			// What the kernel sent before it died (a flushed print, say)
			// may still be on its way: take it in, up to the iopub
			// connection's drop. A reply that raced the exit still counts.
			t := time.NewTimer(deathDrain)
			select {
			case <-in.iopubDropped:
			case <-r.done:
			case <-t.C:
			}
			t.Stop()
			r.flush(onEvent)
			select {
			case <-r.done:
				return finished
			default:
				return died
			}
		case <-deadline:
			return expired
		case <-ctx.Done():
			return cancelled
		}
	}
}

// awaitLate waits, for a kernel that may send a cell's output after its
// idle status (Options.LateOutput), until a result came or lateFor has
// passed; not after a cell that failed or already has its result.
func (r *run) awaitLate(ctx context.Context) {
	r.mu.Lock()
	wait := r.lateFor > 0 && r.replyErr == nil && r.exec.Error == nil && len(r.exec.Results) == 0
	r.mu.Unlock()
	if !wait {
		return
	}
	t := time.NewTimer(r.lateFor)
	defer t.Stop()
	select {
	case <-r.lateResult:
	case <-t.C:
	case <-ctx.Done():
	}
}

// flush hands pending events to onEvent, outside the lock.
func (r *run) flush(onEvent func(agentproto.CodeEvent)) {
	r.mu.Lock()
	evs := r.events
	r.events = nil
	r.mu.Unlock()
	for _, ev := range evs {
		onEvent(ev)
	}
}

// emit queues a live event; r.mu is held.
func (r *run) emit(ev agentproto.CodeEvent) {
	r.events = append(r.events, ev)
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// markStarted records that the kernel began the cell (its busy status or
// its execute_input, whichever comes first); r.mu is held. A start seen
// only as busy settles longer (busySettle): busy comes before the kernel
// readies the cell.
func (r *run) markStarted() {
	if !r.gotInput {
		r.gotInput, r.inputAt = true, time.Now()
		close(r.started)
	}
}

// beganAt is when the kernel announced the cell's input, if it has, plus
// how long an interrupt must wait after that.
func (r *run) beganAt() (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.byBusy {
		return r.inputAt.Add(busySettle - cellSettle), r.gotInput
	}
	return r.inputAt, r.gotInput
}

func (r *run) timeOut() {
	r.mu.Lock()
	r.timedOut = true
	r.mu.Unlock()
}

func (r *run) interruptTraceback() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.interruptTB
}

// execution is a snapshot of what the run has gathered.
func (r *run) execution(start time.Time) agentproto.Execution {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.exec
	e.Results = append([]agentproto.Result{}, r.exec.Results...)
	if r.valueDisplays {
		mainValue(&e)
	}
	e.Stdout = r.stdout.String()
	e.Stderr = r.stderr.String()
	if e.Error == nil {
		e.Error = r.replyErr
	}
	if e.Error != nil && e.Error.Traceback == "" {
		if tb := printedTraceback(e.Stderr); tb != "" {
			cp := *e.Error
			cp.Traceback = tb
			e.Error = &cp
		}
	}
	e.DurationMS = time.Since(start).Milliseconds()
	return e
}

// mainValue makes e's last display that is not an image its main result
// (and its text), unless it has one: a kernel with Options.ValueDisplays
// shows each visible value of a cell as a display. Streamed results were
// sent as they came, not main.
func mainValue(e *agentproto.Execution) {
	last := -1
	for i, res := range e.Results {
		if res.IsMainResult {
			return
		}
		if res.Text != "" && res.PNG == "" && res.JPEG == "" && res.SVG == "" {
			last = i
		}
	}
	if last >= 0 && !strings.HasPrefix(e.Results[last].Text, "[results truncated:") {
		e.Results[last].IsMainResult = true
		e.Text = e.Results[last].Text
	}
}

// printedTraceback is the last traceback in stderr, from its heading line
// on: IPython prints an ExceptionGroup's traceback there and sends its
// error without one.
func printedTraceback(stderr string) string {
	stderr = stripANSI(stderr)
	// A group's heading comes first; the tracebacks of its members, inside.
	i := strings.LastIndex(stderr, "Exception Group Traceback (most recent call last):")
	if i < 0 {
		i = strings.LastIndex(stderr, "Traceback (most recent call last):")
	}
	if i < 0 {
		return ""
	}
	if nl := strings.LastIndexByte(stderr[:i], '\n'); nl >= 0 {
		i = nl + 1 // the whole line: "  + Exception Group …"
	} else {
		i = 0
	}
	return strings.TrimRight(stderr[i:], "\n")
}

// tailKept is how much of the end of a cell's stdout a run keeps beside
// the capped output, for Options.ShellExited.
const tailKept = 64

// shellExited is r's error ShellExited when the cell ended the kernel's
// shell (Options.ShellExited), or nil. The kernel's line is only text a
// cell can print too, so Options.ShellSame, when set, confirms it.
func (k *Kernel) shellExited(ctx context.Context, in *instance, r *run) *agentproto.ExecutionError {
	e := r.shellExited(k.opts.ShellExited)
	if e == nil || k.opts.ShellSame == "" {
		return e
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := in.runSilent(ctx, k.opts.ShellSame); err == nil {
		return nil // the shell the cell began in: the cell printed the line
	}
	return e
}

// shellExited is the error of a run whose stdout ends with marker
// (Options.ShellExited), however much of it the cap kept, and that has no
// error of its own, or nil.
func (r *run) shellExited(marker string) *agentproto.ExecutionError {
	if marker == "" {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.exec.Error != nil || r.replyErr != nil || !strings.HasSuffix(strings.TrimRight(r.stdoutTail, "\r\n"), marker) {
		return nil
	}
	return &agentproto.ExecutionError{
		Name:  "ShellExited",
		Value: "the cell ended the context's shell (exit); a new shell was started, without the variables, functions and working directory of the cells before",
	}
}

// finish delivers the last events and returns the Execution, with override
// as its error if not nil.
func (r *run) finish(start time.Time, override *agentproto.ExecutionError, onEvent func(agentproto.CodeEvent)) agentproto.Execution {
	r.mu.Lock()
	r.sealed = true
	r.mu.Unlock()
	r.flush(onEvent)
	e := r.execution(start)
	if override != nil {
		e.Error = override
		onEvent(agentproto.CodeEvent{Type: "error", Error: override})
	}
	onEvent(agentproto.CodeEvent{Type: "execution", Execution: &e})
	return e
}

// stamp parses a Jupyter header's date; the zero time if it cannot.
func stamp(date string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, date)
	if err != nil {
		return time.Time{}
	}
	return t
}

// timing fills t from what the run saw; start is Execute's.
func (r *run) timing(start time.Time, t *agentproto.RunTiming) {
	r.mu.Lock()
	defer r.mu.Unlock()
	us := func(from, to time.Time) int64 {
		if from.IsZero() || to.IsZero() {
			return 0
		}
		return to.Sub(from).Microseconds()
	}
	done := r.gotReplyAt
	if r.gotIdleAt.After(done) {
		done = r.gotIdleAt
	}
	if !r.gotReply || !r.gotIdle {
		done = time.Time{}
	}
	t.QueueUS = us(start, r.sent)
	t.ToKernelUS = us(r.sent, r.kBusy)
	t.ExecuteUS = us(r.kBusy, r.kReply)
	t.ReplyToIdleUS = us(r.kReply, r.kIdle)
	t.BackUS = us(r.kIdle, done)
	t.KernelUS = us(r.sent, done)
	t.Messages = r.messages
}

// handle maps one message of the cell onto the run.
func (r *run) handle(channel string, m *message) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sealed || r.gotIdle && r.gotReply && r.lateFor == 0 {
		return
	}
	r.messages++
	switch channel {
	case "shell":
		if m.Header.MsgType == "execute_reply" {
			r.onReply(m.Content)
			r.gotReply = true
			r.gotReplyAt, r.kReply = time.Now(), stamp(m.Header.Date)
		}
	case "iopub":
		switch m.Header.MsgType {
		case "status":
			var c struct {
				State string `json:"execution_state"`
			}
			if json.Unmarshal(m.Content, &c) == nil {
				switch c.State {
				case "idle":
					r.gotIdle = true
					r.gotIdleAt, r.kIdle = time.Now(), stamp(m.Header.Date)
				case "busy":
					r.kBusy = stamp(m.Header.Date)
					r.byBusy = !r.gotInput
					// The kernel took the request. The Python setup turns
					// execute_input off (a system call less per cell), so
					// this starts the interrupt's settle time too; without
					// it a timeout's interrupt waited beginWait (2 s) more.
					r.markStarted()
				}
			}
		case "execute_input":
			if r.byBusy { // the precise start after all
				r.inputAt, r.byBusy = time.Now(), false
			}
			r.markStarted()
		case "stream":
			var c struct {
				Name string `json:"name"`
				Text string `json:"text"`
			}
			if json.Unmarshal(m.Content, &c) == nil {
				r.clearIfWaiting()
				r.onStream(c.Name, c.Text)
			}
		case "execute_result", "display_data", "update_display_data":
			var c struct {
				Data      map[string]json.RawMessage `json:"data"`
				Transient struct {
					DisplayID string `json:"display_id"`
				} `json:"transient"`
			}
			if json.Unmarshal(m.Content, &c) != nil || plotlyInit(c.Data) {
				break
			}
			res := toResult(c.Data, m.Header.MsgType == "execute_result")
			id := c.Transient.DisplayID
			if m.Header.MsgType == "update_display_data" && r.updateDisplay(id, res) {
				break
			}
			r.clearIfWaiting()
			if n := len(r.exec.Results); r.onResult(res) && id != "" {
				if r.displays == nil {
					r.displays = map[string][]int{}
				}
				r.displays[id] = append(r.displays[id], n)
			}
			if r.doneClosed && m.Header.MsgType == "execute_result" {
				select {
				case <-r.lateResult:
				default:
					close(r.lateResult) // what awaitLate waits for
				}
			}
		case "clear_output":
			var c struct {
				Wait bool `json:"wait"`
			}
			json.Unmarshal(m.Content, &c)
			if r.clearWait = c.Wait; !c.Wait {
				r.clearOutput()
			}
		case "error":
			var c errorContent
			if json.Unmarshal(m.Content, &c) == nil {
				r.onError(c.toError())
			}
		}
	}
	if r.gotIdle && r.gotReply && !r.doneClosed {
		r.doneClosed = true
		close(r.done)
	}
}

type errorContent struct {
	Status    string   `json:"status"`
	Ename     string   `json:"ename"`
	Evalue    string   `json:"evalue"`
	Traceback []string `json:"traceback"`
}

// toError is the Execution's error for a kernel's error message. A kernel
// that names none gets "Error": bash_kernel sends an empty name with the
// failed command's exit status as the value ("1"), which a client would
// otherwise show as ": 1".
func (c errorContent) toError() *agentproto.ExecutionError {
	name := c.Ename
	if strings.TrimSpace(name) == "" {
		name = "Error"
	}
	return &agentproto.ExecutionError{
		Name:      name,
		Value:     c.Evalue,
		Traceback: stripANSI(strings.Join(collapseRepeats(c.Traceback), "\n")),
	}
}

func (r *run) onReply(content json.RawMessage) {
	var c struct {
		errorContent
		ExecutionCount  int `json:"execution_count"`
		UserExpressions map[string]struct {
			Data map[string]json.RawMessage `json:"data"`
		} `json:"user_expressions"`
		// Put in the reply by PythonLauncher, after the cell's
		// subprocess output is drained and whatever its status.
		Dropped *struct{ Stdout, Stderr int } `json:"pandastack_dropped"`
		// What IPython hands a frontend to show aside: a pager's text
		// (obj?, obj??, %pinfo, %pdoc) and the next cell's input (%load).
		Payload []struct {
			Source string                     `json:"source"`
			Data   map[string]json.RawMessage `json:"data"`
			Text   string                     `json:"text"`
		} `json:"payload"`
	}
	if json.Unmarshal(content, &c) != nil {
		return
	}
	r.exec.ExecutionCount = c.ExecutionCount
	// A client without a pager or an input to fill gets them as stdout.
	for _, p := range c.Payload {
		out := ""
		switch p.Source {
		case "page":
			out = stripANSI(text(p.Data["text/plain"]))
		case "set_next_input":
			out = p.Text
		}
		if out != "" {
			if !strings.HasSuffix(out, "\n") {
				out += "\n"
			}
			r.onStream("stdout", out)
		}
	}
	// Counted at the end: the cell's last output may come after this.
	if c.Dropped != nil {
		r.stdout.dropped, r.stderr.dropped = c.Dropped.Stdout, c.Dropped.Stderr
	} else if d, ok := c.UserExpressions[droppedKey]; ok {
		r.stdout.dropped, r.stderr.dropped = parseDropped(text(d.Data["text/plain"]))
	}
	switch c.Status {
	case "error":
		// Normally the iopub error came first and wins; this covers
		// kernels that only reply.
		r.replyErr = c.toError()
		if r.timedOut {
			r.replyErr = nil
		}
	case "aborted":
		r.replyErr = &agentproto.ExecutionError{Name: "Aborted", Value: "the kernel aborted the execution"}
	}
}

// cellError is the cell's error so far, as execution takes it (the error
// event's, else the reply's), without copying the rest of the run.
func (r *run) cellError() *agentproto.ExecutionError {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.exec.Error != nil {
		return r.exec.Error
	}
	return r.replyErr
}

// takeNote is what in's process has to tell the cell (Noter), if anything.
func takeNote(in *instance) string {
	if n, ok := in.proc.(Noter); ok {
		return n.TakeNote()
	}
	return ""
}

// note adds a note of the sandbox's to the cell's stderr, on a line of its
// own.
func (r *run) note(s string) {
	if s == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if t := r.stderr.String(); t != "" && !strings.HasSuffix(t, "\n") {
		s = "\n" + s
	}
	r.onStream("stderr", s+"\n")
}

func (r *run) onStream(name, text string) {
	var c *capped
	switch name {
	case "stdout":
		c = &r.stdout
	case "stderr":
		c = &r.stderr
	default:
		return
	}
	if name == "stdout" {
		r.stdoutTail += text
		r.stdoutTail = r.stdoutTail[max(len(r.stdoutTail)-tailKept, 0):]
	}
	kept, truncated := c.write(text)
	if kept != "" {
		r.emit(agentproto.CodeEvent{Type: name, Data: kept})
	}
	if truncated {
		r.emit(agentproto.CodeEvent{Type: name, Data: fmt.Sprintf("\n[output truncated: %s exceeded %d bytes; the rest is omitted]\n", name, c.limit)})
	}
}

// updateDisplay replaces the results showing display id with res, as a
// notebook redraws them in place (a progress display updated a thousand
// times is one result, not a thousand); false when this cell showed no such
// display (one of an earlier cell: then res is kept as a new result). The
// update is not streamed: streamed results are only ever added.
func (r *run) updateDisplay(id string, res agentproto.Result) bool {
	idx := r.displays[id]
	if id == "" || len(idx) == 0 {
		return false
	}
	// Within the cap on the cell's results, as a new result would be.
	grow := 0
	for _, i := range idx {
		grow += resultSize(res) - resultSize(r.exec.Results[i])
	}
	if r.resultsBytes+grow > ResultsCap {
		return true // dropped: the display keeps its last state that fit
	}
	r.resultsBytes += grow
	for _, i := range idx {
		r.exec.Results[i] = res
	}
	return true
}

// resultSize is what a result counts against ResultsCap.
func resultSize(res agentproto.Result) int {
	size := len(res.Text) + len(res.HTML) + len(res.Markdown) + len(res.SVG) + len(res.PNG) + len(res.JPEG) +
		len(res.PDF) + len(res.LaTeX) + len(res.JavaScript)
	if b, err := json.Marshal([]any{res.JSON, res.Plotly, res.Extra, res.Chart, res.Data}); err == nil {
		size += len(b)
	}
	return size
}

// shrinkResult leaves res's largest forms out, one at a time, until it
// takes room bytes at most, its text always kept; it returns what is left
// and the forms left out ("image/png form", ...), none when it fits
// as it is or cannot fit whatever is left out.
func shrinkResult(res agentproto.Result, room int) (agentproto.Result, []string) {
	type form struct {
		name string
		size func(agentproto.Result) int
		drop func(*agentproto.Result)
	}
	jsonSize := func(v any) int {
		b, _ := json.Marshal(v)
		if string(b) == "null" { // nil, or a nil map in an interface
			return 0
		}
		return len(b)
	}
	forms := []form{
		{"image/png", func(r agentproto.Result) int { return len(r.PNG) }, func(r *agentproto.Result) { r.PNG = "" }},
		{"image/jpeg", func(r agentproto.Result) int { return len(r.JPEG) }, func(r *agentproto.Result) { r.JPEG = "" }},
		{"application/pdf", func(r agentproto.Result) int { return len(r.PDF) }, func(r *agentproto.Result) { r.PDF = "" }},
		{"image/svg+xml", func(r agentproto.Result) int { return len(r.SVG) }, func(r *agentproto.Result) { r.SVG = "" }},
		{"text/html", func(r agentproto.Result) int { return len(r.HTML) }, func(r *agentproto.Result) { r.HTML = "" }},
		{"text/markdown", func(r agentproto.Result) int { return len(r.Markdown) }, func(r *agentproto.Result) { r.Markdown = "" }},
		{"text/latex", func(r agentproto.Result) int { return len(r.LaTeX) }, func(r *agentproto.Result) { r.LaTeX = "" }},
		{"application/javascript", func(r agentproto.Result) int { return len(r.JavaScript) }, func(r *agentproto.Result) { r.JavaScript = "" }},
		{"application/json", func(r agentproto.Result) int { return jsonSize(r.JSON) }, func(r *agentproto.Result) { r.JSON = nil }},
		{"Plotly JSON", func(r agentproto.Result) int { return jsonSize(r.Plotly) }, func(r *agentproto.Result) { r.Plotly = nil }},
		{"chart data", func(r agentproto.Result) int { return jsonSize(r.Chart) }, func(r *agentproto.Result) { r.Chart = nil }},
		{"table data", func(r agentproto.Result) int { return jsonSize(r.Data) }, func(r *agentproto.Result) { r.Data = nil }},
		{"other forms", func(r agentproto.Result) int { return jsonSize(r.Extra) }, func(r *agentproto.Result) { r.Extra = nil }},
	}
	total := resultSize(res)
	if total <= room {
		return res, nil
	}
	sizes := make([]int, len(forms)) // each measured once: a form may be tens of MB of JSON
	for i, f := range forms {
		sizes[i] = f.size(res)
	}
	var dropped []string
	for total > room {
		big := -1
		for i := range forms {
			if sizes[i] > 0 && (big < 0 || sizes[i] > sizes[big]) {
				big = i
			}
		}
		if big < 0 {
			return res, nil // its text alone does not fit
		}
		forms[big].drop(&res)
		total -= sizes[big]
		sizes[big] = 0
		dropped = append(dropped, forms[big].name+" form")
	}
	return res, dropped
}

// clearOutput drops what the cell has shown so far, as IPython's
// clear_output() clears a notebook cell; what was streamed stays streamed.
func (r *run) clearOutput() {
	r.clearWait = false
	r.stdout.reset()
	r.stderr.reset()
	r.exec.Results = []agentproto.Result{}
	r.exec.Text, r.exec.PNG = "", ""
	r.resultsBytes, r.resultsDropped = 0, 0
	r.displays = nil
}

// clearIfWaiting carries out a clear_output(wait=True) at the next output.
func (r *run) clearIfWaiting() {
	if r.clearWait {
		r.clearOutput()
	}
}

// onResult keeps res (false: it was over the cap and is not kept).
func (r *run) onResult(res agentproto.Result) bool {
	size := resultSize(res)
	if r.resultsBytes+size > ResultsCap {
		// Its largest forms left out, it may still fit (a large image
		// whose PNG and JPEG together passed the cap kept neither, nor its
		// text, and the cell lost its main result).
		if kept, dropped := shrinkResult(res, ResultsCap-r.resultsBytes); len(dropped) > 0 {
			kept.Text = strings.TrimRight(kept.Text+"\n"+fmt.Sprintf("[results truncated: this cell's outputs passed %d MiB; this result's %s left out]", ResultsCap>>20, strings.Join(dropped, " and ")), "\n")
			if resultSize(kept) <= ResultsCap-r.resultsBytes {
				res, size = kept, resultSize(kept)
			}
		}
	}
	if r.resultsBytes+size > ResultsCap {
		r.resultsDropped++
		if res.IsMainResult && len(res.Text) <= 64<<10 {
			r.exec.Text = res.Text
		}
		if r.resultsDropped == 1 {
			marker := agentproto.Result{Text: fmt.Sprintf("[results truncated: this cell's outputs passed %d MiB; later ones are omitted]", ResultsCap>>20)}
			r.exec.Results = append(r.exec.Results, marker)
			r.emit(agentproto.CodeEvent{Type: "result", Result: &marker})
		}
		return false
	}
	r.resultsBytes += size
	r.exec.Results = append(r.exec.Results, res)
	if res.IsMainResult {
		r.exec.Text = res.Text
	}
	if r.exec.PNG == "" && res.PNG != "" {
		r.exec.PNG = res.PNG
	}
	r.emit(agentproto.CodeEvent{Type: "result", Result: &res})
	return true
}

func (r *run) onError(e *agentproto.ExecutionError) {
	if r.timedOut {
		// The KeyboardInterrupt of our own interrupt: its traceback shows
		// where the cell was stopped, under the TimeoutError.
		r.interruptTB = e.Traceback
		return
	}
	r.exec.Error = e
	r.emit(agentproto.CodeEvent{Type: "error", Error: e})
}

// capped keeps the first limit bytes written to it and counts the rest.
type capped struct {
	limit   int
	b       strings.Builder
	omitted int
	dropped int // what the kernel itself dropped (Options.DroppedExpr)
}

// write stores s, returning the part of it that was kept and whether this
// write is the one that crossed the limit.
func (c *capped) write(s string) (kept string, truncated bool) {
	if c.omitted > 0 {
		c.omitted += len(s)
		return "", false
	}
	room := c.limit - c.b.Len()
	if len(s) <= room {
		c.b.WriteString(s)
		return s, false
	}
	// Cut on a rune boundary so the kept text stays valid UTF-8.
	cut := room
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	c.b.WriteString(s[:cut])
	c.omitted = len(s) - cut
	return s[:cut], true
}

// reset empties c (a clear_output).
func (c *capped) reset() {
	c.b.Reset()
	c.omitted, c.dropped = 0, 0
}

func (c *capped) String() string {
	omitted := c.omitted + max(c.dropped, 0)
	if omitted == 0 {
		return c.b.String()
	}
	return c.b.String() + fmt.Sprintf("\n[output truncated: %d bytes omitted]\n", omitted)
}

// plotlyInit reports whether data is the display Plotly's notebook
// renderers send before a kernel's first figure: a script that sets up
// plotly.js in a notebook page, shown nowhere and no figure, which would
// otherwise be a cell's first result (its html) beside the figure's own.
func plotlyInit(data map[string]json.RawMessage) bool {
	if len(data) != 1 {
		return false
	}
	html, ok := data["text/html"]
	if !ok {
		return false
	}
	h := text(html)
	return strings.Contains(h, "window.PlotlyConfig = {MathJaxConfig: 'local'};") && !strings.Contains(h, "<div")
}

// toResult maps a mime bundle onto a Result.
func toResult(data map[string]json.RawMessage, main bool) agentproto.Result {
	res := agentproto.Result{IsMainResult: main}
	for mime, raw := range data {
		switch mime {
		case "text/plain":
			res.Text = text(raw)
		case "text/html":
			res.HTML = text(raw)
		case "text/markdown":
			res.Markdown = text(raw)
		case "image/svg+xml":
			res.SVG = text(raw)
		case "image/png":
			res.PNG = base64Text(raw)
		case "image/jpeg":
			res.JPEG = base64Text(raw)
		case "application/pdf":
			res.PDF = base64Text(raw)
		case "text/latex":
			res.LaTeX = text(raw)
		case "application/javascript":
			res.JavaScript = text(raw)
		case "application/json":
			res.JSON = value(raw)
		case "application/vnd.plotly.v1+json":
			res.Plotly = value(raw)
		case agentproto.ChartMIME:
			res.Chart, _ = value(raw).(map[string]any)
		case agentproto.TableMIME:
			res.Data, _ = value(raw).(map[string]any)
		default:
			if res.Extra == nil {
				res.Extra = make(map[string]any)
			}
			res.Extra[mime] = value(raw)
		}
	}
	return res
}

// text decodes a text mime value: a string, or (as notebooks store it) a
// list of lines.
func text(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var lines []string
	if json.Unmarshal(raw, &lines) == nil {
		return strings.Join(lines, "")
	}
	return string(raw)
}

// base64Text is a binary mime value without the line breaks some kernels
// put into their base64.
func base64Text(raw json.RawMessage) string {
	return strings.Join(strings.Fields(text(raw)), "")
}

func value(raw json.RawMessage) any {
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return string(raw)
	}
	return v
}

// stripANSI removes terminal escape sequences (colors, cursor moves,
// hyperlinks) that IPython puts into tracebacks.
func stripANSI(s string) string {
	if !strings.Contains(s, "\x1b") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); {
		if s[i] != 0x1b {
			b.WriteByte(s[i])
			i++
			continue
		}
		i++
		if i >= len(s) {
			break
		}
		switch s[i] {
		case '[': // CSI: parameters and intermediates, then a final byte
			i++
			for i < len(s) && (s[i] < 0x40 || s[i] > 0x7e) {
				i++
			}
			i++
		case ']': // OSC: up to BEL or ESC \
			i++
			for i < len(s) {
				if s[i] == 0x07 {
					i++
					break
				}
				if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '\\' {
					i += 2
					break
				}
				i++
			}
		default: // intermediates, then a final byte: ESC c, ESC ( B
			for i < len(s) && s[i] >= 0x20 && s[i] <= 0x2f {
				i++
			}
			i++
		}
	}
	return b.String()
}

// collapseRepeats shortens a traceback's frames where a block of one to
// four frames repeats three times or more in a row (a recursion that ran
// into the limit: IPython in a kernel prints every one of its thousand
// frames, some hundred KB that would flood an agent's context): the block
// is kept once, followed by a line that says how often it repeats.
func collapseRepeats(frames []string) []string {
	var out []string
	for i := 0; i < len(frames); {
		best, bestReps := 0, 0
		for p := 1; p <= 4 && i+p <= len(frames); p++ {
			reps := 1
			for i+(reps+1)*p <= len(frames) && slices.Equal(frames[i+reps*p:i+(reps+1)*p], frames[i:i+p]) {
				reps++
			}
			if reps >= 3 && reps*p > bestReps*best {
				best, bestReps = p, reps
			}
		}
		if best == 0 {
			out = append(out, frames[i])
			i++
			continue
		}
		out = append(out, frames[i:i+best]...)
		what := "the frame above"
		if best > 1 {
			what = fmt.Sprintf("the %d frames above", best)
		}
		out = append(out, fmt.Sprintf("[... %s repeated %d more times ...]", what, bestReps-1))
		i += best * bestReps
	}
	return out
}
