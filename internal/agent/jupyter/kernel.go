// Package jupyter runs Jupyter kernels and speaks the Jupyter messaging
// protocol to them in pure Go, over ZeroMQ (github.com/go-zeromq/zmq4).
//
// It is the engine of the agent's code contexts: internal/agent imports it
// and injects how processes are started and killed (a Launcher), so this
// package never forks by itself and knows nothing of the agent's reaper.
// Nothing else should import it.
package jupyter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/pandastack/pandastack/internal/agentproto"
)

var (
	// ErrBusy is returned by Execute while another Execute runs on the
	// same kernel (a conflict for the caller).
	ErrBusy = errors.New("the kernel is busy with another execution")
	// ErrDead is returned by Execute and Interrupt when the kernel process
	// is gone; Restart brings a new one.
	ErrDead = errors.New("the kernel is dead: restart it")
	// ErrClosed is returned by every method after Close.
	ErrClosed = errors.New("the kernel is closed")
	// ErrInvalid wraps a request the kernel cannot take, such as an
	// environment variable it cannot hold (a client mistake).
	ErrInvalid = errors.New("invalid request")
	// ErrRestarted is returned by an Execute that waited for a cell whose
	// caller went away, when that cell ignored the interrupt and the kernel
	// was restarted: the code was not run, and the state it builds on is
	// gone.
	ErrRestarted = errors.New("the kernel was restarted: a cell before this one, whose caller went away, did not stop after an interrupt")
)

// cellStop is the stop of a cell whose caller went away: done is closed
// once it has stopped, after restarted says whether that took a restart.
type cellStop struct {
	done      chan struct{}
	restarted bool
}

// Launcher starts a kernel process with argv, env (the whole environment,
// as in os.ProcAttr) and working directory cwd.
// The process should lead its own process group so that an interrupt
// reaches the children of user code too, like a terminal's Ctrl-C.
type Launcher func(argv []string, env []string, cwd string) (Proc, error)

// Proc is a started kernel process.
type Proc interface {
	// Pid is the process id.
	Pid() int
	// Done is closed once the process has exited and been reaped.
	Done() <-chan struct{}
	// ExitReason says how the process ended, e.g. "exit status 1" or
	// "killed by SIGKILL". Valid once Done is closed.
	ExitReason() string
	// Kill SIGKILLs the process and everything it started. It may be
	// called after the process exited, so it must never signal a pid that
	// could have been recycled; Done closes soon after.
	Kill()
}

// ChildKiller is a Proc that can also kill what the kernel started (its
// descendants), leaving the kernel itself running: a timed-out cell that
// did not stop after an interrupt may be held up by them, and once they
// are gone the interrupt may end it, keeping the kernel's state, before
// the kernel is restarted (Execute waits childrenGrace for that).
type ChildKiller interface {
	KillChildren()
}

// GroupKiller is a Proc that can SIGKILL its process group at once, ahead
// of Kill's search of the tree: for a kernel whose death someone waits on
// (KillGroup). Like Kill, it must never signal a group whose leader was
// reaped (its id may be reused); unlike Kill, it returns at once.
type GroupKiller interface {
	KillGroup()
}

// Noter is a Proc that may have something to tell the cell that runs:
// what the sandbox did to what the kernel started (the memory watch killed
// it, the kernel lives on). Execute adds it to the cell's stderr as the
// cell ends; one left from between cells is dropped when the next starts.
type Noter interface {
	TakeNote() string
}

// childrenGrace is how long a timed-out cell is given to stop once the
// kernel's children were killed (ChildKiller).
var childrenGrace = 2 * time.Second

// Owner is a user that must be able to use the kernel's private
// directory, when the kernel runs as another user than this process.
type Owner struct{ UID, GID int }

// Options says how to run a kernel. Argv and Launch are required.
type Options struct {
	// Argv is the kernel command; "{connection_file}" in any argument is
	// replaced by the connection file's path, as in a kernelspec.
	// Python: python3 -m ipykernel_launcher -f {connection_file}
	Argv []string
	// Env is the kernel's whole environment, handed to Launch as is.
	Env []string
	// Cwd is the kernel's working directory; "" inherits ours.
	Cwd string
	// Launch starts the kernel process.
	Launch Launcher
	// Log receives operator logs; nil discards them.
	Log *slog.Logger
	// Transport between us and the kernel; default IPC.
	Transport Transport
	// RuntimeDir holds the kernel's private directory (connection file and
	// IPC sockets); default os.TempDir().
	RuntimeDir string
	// Owner, if set, gets the private directory and the connection file,
	// so a kernel launched as that user can read the file and bind its
	// sockets there.
	Owner *Owner
	// EnvCode turns ExecOptions.Env into code that sets those variables
	// and code that puts them back, both run silently around the cell.
	// Language-specific: PythonEnvCode for ipykernel. Nil makes Execute
	// refuse a non-empty Env.
	EnvCode func(env map[string]string) (set, restore string)
	// WrapCode, when set, turns a cell's code into what the kernel runs
	// (BashWrapCode: the cell's commands read no terminal).
	WrapCode func(code string) string
	// ShellExited, when set, is what the kernel prints at the end of a
	// cell's stdout when the cell ended the kernel's own interpreter and
	// the kernel started a new one (BashShellExited: bash_kernel after an
	// `exit`). Such a run answers with the error ShellExited.
	ShellExited string
	// ShellSame, when set, is code that succeeds (run silently) only in
	// the shell the last cell began in: a run that ends with ShellExited
	// is checked with it (BashShellSame).
	ShellSame string
	// Explain, when set, is asked about a finished cell's error: it may
	// return a clearer one for the run to end with (Deno's kernel answers
	// a syntax error with "Execution failed" and nothing else), or nil.
	Explain func(ctx context.Context, code string, e *agentproto.ExecutionError) *agentproto.ExecutionError
	// ValueDisplays says the kernel shows a cell's values as displays,
	// not as an execute_result (IRkernel): the run's last display that is
	// not an image becomes its main result, and so its text.
	ValueDisplays bool
	// LateOutput, when set, is how long a cell's output may follow its
	// reply and idle status: Deno's kernel sends results and streams
	// through another task than its status, and a cell's value came after
	// its idle status now and then (a run without its text). A run that
	// has no result or error by its idle status waits that long for one,
	// and ends as soon as an execute_result comes.
	LateOutput time.Duration
	// SetupCode runs silently in every new kernel process, at start and
	// after each restart, before any cell: PythonSetupCode installs the
	// output and result caps of ipykernel.
	SetupCode string
	// OutputCapCode returns code that sets the kernel's own per-cell
	// output cap to n characters per stream, sent before a cell whose
	// ExecOptions.OutputCap differs from the last one set; nil: none.
	OutputCapCode func(n int) string
	// DroppedExpr is a user expression whose text/plain value holds how
	// many characters of "stdout" and "stderr" the kernel itself dropped
	// in the cell (see PythonSetupCode); "" when it drops none.
	DroppedExpr string
	// ReseedCode returns code that reseeds what a fresh process seeds at
	// start (random generators); Reseed runs it. Nil: Reseed does nothing.
	ReseedCode func() string
	// InterruptByMessage interrupts with an interrupt_request on the
	// control channel (kernelspec interrupt_mode "message") instead of
	// SIGINT, for kernels that a signal would kill, such as Deno's.
	InterruptByMessage bool
	// InterruptGrace is how long a timed-out or cancelled cell may take to
	// stop after an interrupt before the kernel is restarted; default 5 s.
	InterruptGrace time.Duration
	// ShutdownGrace is how long Close waits for the kernel to exit after a
	// shutdown_request before killing it; default 2 s.
	ShutdownGrace time.Duration
}

// Kernel is a running Jupyter kernel. Its methods are safe for concurrent
// use; only one Execute runs at a time.
type Kernel struct {
	opts Options
	log  *slog.Logger
	busy atomic.Bool
	// stopping is the stop of a cell whose caller went away (nil when
	// none is being stopped); Execute waits for it.
	stopping atomic.Pointer[cellStop]

	// mu guards inst and closed, and is held across Restart and Close so
	// that lifecycle changes happen one at a time.
	mu     sync.Mutex
	inst   *instance // nil after a failed restart
	closed bool
}

// Start launches a kernel and connects to it. It returns once the kernel
// has answered a kernel_info_request on its shell socket and the iopub
// subscription is live, so no output of the first cell can be missed.
// A kernel that exits first, or a ctx that ends first, fails Start, and
// then nothing is left behind (process, sockets, files). Start costs what
// the kernel takes to boot: about a second for ipykernel natively. ctx only
// bounds the start; the kernel lives until Close.
func Start(ctx context.Context, o Options) (*Kernel, error) {
	if len(o.Argv) == 0 {
		return nil, errors.New("jupyter: no kernel command")
	}
	if o.Launch == nil {
		return nil, errors.New("jupyter: no launcher")
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Transport == "" {
		o.Transport = IPC
	}
	if o.InterruptGrace <= 0 {
		o.InterruptGrace = 5 * time.Second
	}
	if o.ShutdownGrace <= 0 {
		o.ShutdownGrace = 2 * time.Second
	}
	k := &Kernel{opts: o, log: o.Log}
	in, err := k.launch(ctx)
	if err != nil {
		return nil, err
	}
	k.inst = in
	return k, nil
}

// Stopping reports whether a cell whose caller went away is being stopped;
// an Execute meanwhile waits for it rather than failing with ErrBusy.
func (k *Kernel) Stopping() bool { return k.stopping.Load() != nil }

// Busy reports whether an Execute is running (or a cancelled one is still
// being stopped).
func (k *Kernel) Busy() bool { return k.busy.Load() }

// Exited reports whether the kernel's process has exited (it died, or was
// killed) or the kernel was closed: it runs nothing until a restart.
func (k *Kernel) Exited() bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.closed || k.inst != nil && k.inst.exited()
}

// Pid is the kernel process's id, or 0 when there is none.
func (k *Kernel) Pid() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.inst == nil {
		return 0
	}
	return k.inst.proc.Pid()
}

// current returns the running instance, or why there is none.
func (k *Kernel) current() (*instance, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case k.closed:
		return nil, ErrClosed
	case k.inst == nil:
		return nil, ErrDead
	}
	if k.inst.exited() {
		return nil, fmt.Errorf("%w (%s)", ErrDead, k.inst.deathReason())
	}
	return k.inst, nil
}

// Interrupt interrupts the running cell, like Ctrl-C: SIGINT to the kernel
// (interrupt_mode "signal"). An idle kernel ignores it. It returns ErrDead
// or ErrClosed when there is no kernel to interrupt; it does not wait.
func (k *Kernel) Interrupt() error {
	in, err := k.current()
	if err != nil {
		return err
	}
	return k.interrupt(in)
}

func (k *Kernel) interrupt(in *instance) error {
	if k.opts.InterruptByMessage {
		_, err := in.send(in.control, "interrupt_request", struct{}{}, nil)
		return err
	}
	err := signalInterrupt(in.proc.Pid())
	if err == nil {
		return nil
	}
	// Where signals are not available, ask over the control channel.
	k.log.Debug("interrupt by signal failed, sending interrupt_request", "err", err)
	_, err = in.send(in.control, "interrupt_request", struct{}{}, nil)
	return err
}

// Reseed runs Options.ReseedCode in the kernel, queued behind a running
// cell, without waiting: for a kernel restored from an image that other
// sandboxes restore too, whose random generators would otherwise draw the
// same numbers in all of them. A dead or closed kernel needs none.
func (k *Kernel) Reseed() { k.ReseedThen("") }

// ReseedThen is Reseed with code run in the same silent cell after the
// reseed (code alone for a kernel without Options.ReseedCode): one cell on
// the way to the next execution rather than two. Empty code with nothing
// to reseed sends nothing. It fails only for a dead or closed kernel.
func (k *Kernel) ReseedThen(code string) error {
	if k.opts.ReseedCode != nil {
		rc := k.opts.ReseedCode()
		if code != "" && !strings.HasSuffix(rc, "\n") {
			rc += "\n"
		}
		code = rc + code
	}
	if code == "" {
		return nil
	}
	in, err := k.current()
	if err != nil {
		return err
	}
	in.sendSilent(code)
	return nil
}

// Restart kills the kernel (its state is lost) and starts a fresh one with
// the same options. A running Execute ends with a KernelDied error. If the
// new kernel fails to start, Restart returns the error and the Kernel stays
// without a process (Execute returns ErrDead) until a later Restart works.
// ctx bounds the new start.
func (k *Kernel) Restart(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return ErrClosed
	}
	return k.restartLocked(ctx, "the kernel was restarted on request (a restart of its context), its state lost")
}

// RestartIfDead is Restart for a kernel found dead: it restarts it unless
// it is running again (another caller restarted it first), and reports
// whether it did.
func (k *Kernel) RestartIfDead(ctx context.Context) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return false, ErrClosed
	}
	if k.inst != nil && !k.inst.exited() {
		return false, nil
	}
	return true, k.restartLocked(ctx, "the kernel was restarted")
}

// restartIf restarts the kernel only if old is still the current instance,
// so two reasons to restart at once restart it once.
func (k *Kernel) restartIf(ctx context.Context, old *instance, why string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return ErrClosed
	}
	if k.inst != old {
		return nil
	}
	return k.restartLocked(ctx, why)
}

func (k *Kernel) restartLocked(ctx context.Context, why string) error {
	if old := k.inst; old != nil {
		k.inst = nil
		if err := old.stop(why, 0); err != nil {
			k.log.Warn("stop kernel for restart", "err", err)
		}
	}
	in, err := k.launch(ctx)
	if err != nil {
		return fmt.Errorf("restart kernel: %w", err)
	}
	k.inst = in
	return nil
}

// Close shuts the kernel down: a shutdown_request on the control channel,
// then SIGKILL after Options.ShutdownGrace. On return the process has been
// reaped and the connection file and sockets are removed, unless an error
// says otherwise. A running Execute ends with a KernelDied error. Close is
// idempotent.
func (k *Kernel) Close() error { return k.closeWithin(k.opts.ShutdownGrace) }

// Kill is Close without the shutdown_request: SIGKILL at once. For a
// kernel whose work is to be thrown away (a start given up), which may be
// too busy to answer the request within the grace.
func (k *Kernel) Kill() error { return k.closeWithin(0) }

// KillGroup SIGKILLs the kernel's process group, when its Proc is a
// GroupKiller, and returns at once: a Kill after it then searches the
// kernel's tree while the kernel dies, instead of before. For kernels
// whose death a caller waits on (spares shut down for a fork).
func (k *Kernel) KillGroup() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.inst != nil {
		if g, ok := k.inst.proc.(GroupKiller); ok {
			g.KillGroup()
		}
	}
}

func (k *Kernel) closeWithin(grace time.Duration) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.closed {
		return nil
	}
	k.closed = true
	in := k.inst
	k.inst = nil
	if in == nil {
		return nil
	}
	return in.stop("the kernel was shut down", grace)
}

// instance is one kernel process and our connection to it. A restart
// replaces the whole instance.
type instance struct {
	log   *slog.Logger
	proc  Proc
	dir   string
	sig   *signer
	ctx   context.Context // the sockets' lifeline
	close context.CancelFunc

	shell, control, iopub zmq4.Socket
	readers               sync.WaitGroup

	iopubLive     chan struct{} // closed by the first valid iopub message
	iopubLiveOnce sync.Once
	// iopubDropped is closed when the iopub connection drops (the kernel
	// died), after every message the kernel sent before was handled.
	iopubDropped     chan struct{}
	iopubDroppedOnce sync.Once

	mu       sync.Mutex
	handlers map[string]func(channel string, m *message) // by parent msg_id
	why      string                                      // why we stopped it, if we did

	outputCap int // the cap last set in the kernel by OutputCapCode; only Execute uses it
}

// launch starts a kernel process and connects to it, undoing every step if
// a later one fails.
func (k *Kernel) launch(ctx context.Context) (in *instance, err error) {
	o := k.opts
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()

	dir, err := os.MkdirTemp(o.RuntimeDir, "kernel-") // mode 0700
	if err != nil {
		return nil, fmt.Errorf("kernel dir: %w", err)
	}
	undo = append(undo, func() { os.RemoveAll(dir) })
	key := newKey()
	ci, err := newConnInfo(o.Transport, dir, key)
	if err != nil {
		return nil, err
	}
	cf := filepath.Join(dir, "connection.json")
	if err := ci.write(cf); err != nil {
		return nil, fmt.Errorf("connection file: %w", err)
	}
	if o.Owner != nil {
		for _, p := range []string{dir, cf} {
			if err := os.Chown(p, o.Owner.UID, o.Owner.GID); err != nil {
				return nil, fmt.Errorf("kernel dir: %w", err)
			}
		}
	}

	argv := make([]string, len(o.Argv))
	for i, a := range o.Argv {
		argv[i] = strings.ReplaceAll(a, "{connection_file}", cf)
	}
	proc, err := o.Launch(argv, o.Env, o.Cwd)
	if err != nil {
		return nil, fmt.Errorf("launch kernel %q: %w", argv[0], err)
	}
	undo = append(undo, func() { proc.Kill(); <-proc.Done() })
	log := k.log.With("kernel_pid", proc.Pid())

	sctx, cancel := context.WithCancel(context.Background())
	in = &instance{
		log:          log,
		proc:         proc,
		dir:          dir,
		sig:          &signer{key: key, session: newUUID()},
		ctx:          sctx,
		close:        cancel,
		iopubLive:    make(chan struct{}),
		iopubDropped: make(chan struct{}),
		handlers:     make(map[string]func(string, *message)),
	}
	undo = append(undo, in.closeSockets)

	// Dialing retries until the kernel has bound its sockets; a dead
	// kernel or an expired ctx must stop it.
	starting := make(chan struct{})
	defer close(starting)
	go func() {
		select {
		case <-ctx.Done():
			cancel()
		case <-proc.Done():
			cancel()
		case <-starting:
		}
	}()
	fail := func(what string, err error) error {
		select {
		case <-proc.Done():
			return fmt.Errorf("the kernel exited during start (%s)", proc.ExitReason())
		default:
		}
		if ctx.Err() != nil {
			return fmt.Errorf("start kernel: %w", ctx.Err())
		}
		return fmt.Errorf("start kernel: %s: %w", what, err)
	}

	zlog := slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	sockOpts := []zmq4.Option{
		zmq4.WithDialerMaxRetries(-1),
		zmq4.WithDialerRetry(20 * time.Millisecond),
		zmq4.WithTimeout(30 * time.Second), // bounds a Send to a wedged kernel
		zmq4.WithLogger(zlog),
	}
	in.shell = zmq4.NewDealer(sctx, sockOpts...)
	in.control = zmq4.NewDealer(sctx, sockOpts...)
	in.iopub = zmq4.NewSub(sctx, sockOpts...)
	if err := in.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return nil, fmt.Errorf("subscribe iopub: %w", err)
	}
	for _, s := range []struct {
		name string
		sock zmq4.Socket
		port int
	}{{"shell", in.shell, ci.ShellPort}, {"control", in.control, ci.ControlPort}, {"iopub", in.iopub, ci.IOPubPort}} {
		if err := s.sock.Dial(dialEndpoint(ci.endpoint(s.port))); err != nil {
			return nil, fail("connect "+s.name, err)
		}
		in.readers.Add(1)
		go in.read(s.name, s.sock)
	}

	// The iopub subscription takes a moment to reach the kernel, and a
	// PUB socket drops what it sends before that (ZeroMQ's slow joiner):
	// ask for kernel_info until both a reply and some iopub message came.
	replied := make(chan struct{})
	var once sync.Once
	onInfo := func(ch string, m *message) {
		if ch == "shell" && m.Header.MsgType == "kernel_info_reply" {
			once.Do(func() { close(replied) })
		}
	}
	var asked []string
	started := in // the result is nil when the handshake fails
	defer func() {
		for _, id := range asked {
			started.forget(id)
		}
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	gotReply, gotIOPub := replied, in.iopubLive
	for gotReply != nil || gotIOPub != nil {
		if len(asked) == 0 {
			id, err := in.send(in.shell, "kernel_info_request", struct{}{}, onInfo)
			if err != nil {
				return nil, fail("kernel_info_request", err)
			}
			asked = append(asked, id)
		}
		select {
		case <-gotReply:
			gotReply = nil
		case <-gotIOPub:
			gotIOPub = nil
		case <-tick.C:
			if gotIOPub != nil {
				id, err := in.send(in.shell, "kernel_info_request", struct{}{}, onInfo)
				if err != nil {
					return nil, fail("kernel_info_request", err)
				}
				asked = append(asked, id)
			}
		case <-sctx.Done():
			return nil, fail("handshake", sctx.Err())
		}
	}
	log.Debug("kernel started", "transport", ci.Transport, "requests", len(asked))
	if o.SetupCode != "" {
		// Queued ahead of every cell: the shell runs requests in order.
		in.sendSilent(o.SetupCode)
		in.outputCap = DefaultOutputCap
	}
	return in, nil
}

// read receives one socket's messages until the instance closes and hands
// each to the handler registered for its parent.
func (in *instance) read(name string, s zmq4.Socket) {
	defer in.readers.Done()
	for {
		msg, err := s.Recv()
		if in.ctx.Err() != nil {
			return
		}
		if err != nil {
			// The connection dropped (the kernel died): zmq4 removes it and
			// the next Recv blocks until the socket closes.
			in.log.Debug("recv", "socket", name, "err", err)
			if name == "iopub" {
				in.iopubDroppedOnce.Do(func() { close(in.iopubDropped) })
			}
			continue
		}
		if msg.Type == zmq4.CmdMsg {
			continue // a ZMTP command such as PING, not a message
		}
		m, err := in.sig.decode(msg.Frames)
		if err != nil {
			in.log.Warn("dropped a kernel message", "socket", name, "err", err)
			continue
		}
		if name == "iopub" {
			in.iopubLiveOnce.Do(func() { close(in.iopubLive) })
		}
		in.mu.Lock()
		h := in.handlers[m.Parent.MsgID]
		in.mu.Unlock()
		if h != nil {
			h(name, m)
		}
	}
}

// send sends a request on sock. If h is not nil it receives every message
// whose parent is this request, from any socket, in the socket's reader
// goroutine (so it must not block), until forget.
func (in *instance) send(sock zmq4.Socket, msgType string, content any, h func(string, *message)) (string, error) {
	frames, id, err := in.sig.encode(msgType, content)
	if err != nil {
		return "", err
	}
	if h != nil {
		in.mu.Lock()
		in.handlers[id] = h
		in.mu.Unlock()
	}
	if err := sock.SendMulti(zmq4.NewMsgFrom(frames...)); err != nil {
		in.forget(id)
		return "", fmt.Errorf("send %s: %w", msgType, err)
	}
	return id, nil
}

func (in *instance) forget(id string) {
	in.mu.Lock()
	delete(in.handlers, id)
	in.mu.Unlock()
}

func (in *instance) exited() bool {
	select {
	case <-in.proc.Done():
		return true
	default:
		return false
	}
}

// deathReason says why the process is gone. Valid once it is.
func (in *instance) deathReason() string {
	in.mu.Lock()
	why := in.why
	in.mu.Unlock()
	if why != "" {
		return why
	}
	return "the kernel process exited (" + in.proc.ExitReason() + ")"
}

// stop ends the instance: a shutdown_request first if grace > 0, then
// SIGKILL; it waits until the process is reaped, then removes the sockets
// and the private directory.
func (in *instance) stop(why string, grace time.Duration) error {
	in.mu.Lock()
	if in.why == "" {
		in.why = why
	}
	in.mu.Unlock()
	if grace > 0 && !in.exited() {
		if _, err := in.send(in.control, "shutdown_request", map[string]bool{"restart": false}, nil); err != nil {
			in.log.Debug("shutdown_request", "err", err)
		} else {
			t := time.NewTimer(grace)
			select {
			case <-in.proc.Done():
			case <-t.C:
				in.log.Info("kernel ignored shutdown_request; killing it")
			}
			t.Stop()
		}
	}
	// Also after a clean exit: user code may have left processes behind.
	in.proc.Kill()
	var err error
	t := time.NewTimer(10 * time.Second)
	select {
	case <-in.proc.Done():
	case <-t.C:
		err = fmt.Errorf("kernel pid %d did not exit after SIGKILL", in.proc.Pid())
	}
	t.Stop()
	in.closeSockets()
	if rerr := os.RemoveAll(in.dir); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

func (in *instance) closeSockets() {
	in.close()
	for _, s := range []zmq4.Socket{in.shell, in.control, in.iopub} {
		if s != nil {
			s.Close()
		}
	}
	in.readers.Wait()
}

// executeRequest is the content of an execute_request.
type executeRequest struct {
	Code            string         `json:"code"`
	Silent          bool           `json:"silent"`
	StoreHistory    bool           `json:"store_history"`
	UserExpressions map[string]any `json:"user_expressions"`
	// AllowStdin is false so that input() fails at once instead of
	// waiting for an answer nobody will give.
	AllowStdin bool `json:"allow_stdin"`
	// StopOnError is false so an error never aborts the requests queued
	// behind it (such as our env restore).
	StopOnError bool `json:"stop_on_error"`
}

// sendSilent runs code without output or history, for our own plumbing;
// a failure is only logged.
func (in *instance) sendSilent(code string) {
	h := func(ch string, m *message) {
		if ch != "shell" || m.Header.MsgType != "execute_reply" {
			return
		}
		in.forget(m.Parent.MsgID)
		var c struct {
			Status string `json:"status"`
			Ename  string `json:"ename"`
			Evalue string `json:"evalue"`
		}
		json.Unmarshal(m.Content, &c)
		if c.Status != "ok" {
			in.log.Warn("silent execution failed", "status", c.Status, "ename", c.Ename, "evalue", c.Evalue)
		}
	}
	_, err := in.send(in.shell, "execute_request", executeRequest{
		Code: code, Silent: true, UserExpressions: map[string]any{},
	}, h)
	if err != nil {
		in.log.Warn("silent execution", "err", err)
	}
}
