package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

const (
	// keptOutput bounds the output kept per background process: past it
	// the oldest chunks go, so a long-running server keeps its latest logs.
	keptOutput = 4 << 20
	// keptExited is how many ended processes stay listed (and readable).
	keptExited = 64
)

// stdinWait bounds a write to a process that does not read its input (a
// variable for tests).
var stdinWait = 10 * time.Second

// Processes holds the sandbox's background processes. Like Contexts it
// outlives host sessions: a process started by one session is read, fed
// and killed by later ones.
type Processes struct {
	mu    sync.Mutex
	procs []*bgProc // oldest first
}

// NewProcesses returns an empty registry.
func NewProcesses() *Processes { return &Processes{} }

// bgProc is one background process and the output it has written.
type bgProc struct {
	pid   int
	mark  uint32 // Process.Mark
	stdin *os.File
	// stdinTurn is held by the one write to stdin under way: a write
	// deadline belongs to the file, so two writers would reset each
	// other's (one then blocked for ever, holding the file's write lock).
	stdinTurn chan struct{}
	// oom says why the memory watch killed it; release takes it off the
	// watch (Contexts.guardMemory).
	oom     atomic.Pointer[string]
	release func()

	mu     sync.Mutex
	info   agentproto.Process
	events []agentproto.ExecEvent // kept output, oldest first
	first  int                    // sequence number of events[0]
	size   int                    // memory events hold: keptCost of each
	// sealed is the sequence number past the last event a reader has
	// taken: events before it may no longer grow.
	sealed  int
	reaped  bool                  // it exited: its pid may be reused
	exit    *agentproto.ExecEvent // set once it ended and its output is read
	changed chan struct{}         // closed and replaced on every change
}

func (p *bgProc) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// eventCost is what an event kept costs beyond its bytes' array: the
// event itself in the slice and its allocation's header, roughly.
const eventCost = 96

// keptCost is the memory a kept event holds.
func keptCost(ev agentproto.ExecEvent) int { return cap(ev.Data) + eventCost }

// append keeps ev, the output's next piece. A piece of the same stream as
// the last event, which no reader has taken yet, grows that event up to
// outputChunk: a process that writes a line at a time (a server's log)
// yields a read per line, and kept one event each, its 4 MiB would be a
// million events. Past keptOutput, counted as memory held, the oldest go.
func (p *bgProc) append(ev agentproto.ExecEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := len(p.events); n > 0 && p.first+n > p.sealed {
		last := &p.events[n-1]
		if last.Type == ev.Type && len(last.Data)+len(ev.Data) <= outputChunk {
			p.size -= keptCost(*last)
			if need := len(last.Data) + len(ev.Data); need > cap(last.Data) {
				// Grown by a quarter, not append's doubling: the kept
				// bytes stay most of the memory counted.
				grown := make([]byte, len(last.Data), min(outputChunk, need+need/4))
				copy(grown, last.Data)
				last.Data = grown
			}
			last.Data = append(last.Data, ev.Data...)
			p.size += keptCost(*last)
			p.trim()
			p.notify()
			return
		}
	}
	ev.Data = bytes.Clone(ev.Data) // not the reader's buffer
	p.events = append(p.events, ev)
	p.size += keptCost(ev)
	p.trim()
	p.notify()
}

// trim drops the oldest events while those kept hold more than keptOutput.
func (p *bgProc) trim() {
	for p.size > keptOutput && len(p.events) > 1 {
		p.size -= keptCost(p.events[0])
		p.info.OutputDropped += int64(len(p.events[0].Data))
		p.events[0] = agentproto.ExecEvent{}
		p.events = p.events[1:]
		p.first++
	}
}

func (p *bgProc) snapshot() agentproto.Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.info
}

// add registers p, forgetting any ended process whose pid was reused and
// the oldest ended ones past keptExited.
func (ps *Processes) add(p *bgProc) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var kept []*bgProc
	ended := 0
	for _, q := range ps.procs {
		if q.ended() && q.pid == p.pid {
			continue
		}
		if q.ended() {
			ended++
		}
		kept = append(kept, q)
	}
	ps.procs = kept[:0]
	for _, q := range kept {
		if q.ended() && ended > keptExited-1 {
			ended--
			continue
		}
		ps.procs = append(ps.procs, q)
	}
	ps.procs = append(ps.procs, p)
}

// all returns the processes, oldest first.
func (ps *Processes) all() []*bgProc {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return slices.Clone(ps.procs)
}

func (p *bgProc) ended() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reaped
}

func (ps *Processes) get(pidText string) (*bgProc, error) {
	pid, err := strconv.Atoi(pidText)
	if err != nil {
		return nil, pandastack.Errorf(pandastack.EInvalid, "process id %q is not a number", pidText)
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for i := len(ps.procs) - 1; i >= 0; i-- {
		if ps.procs[i].pid == pid {
			return ps.procs[i], nil
		}
	}
	return nil, pandastack.Errorf(pandastack.ENotFound, "no background process %d in this sandbox (list them with GET …/processes)", pid)
}

// startProcess starts a command in the background and answers at once.
func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) error {
	req, err := readExecRequest(w, r)
	if err != nil {
		return err
	}
	spec, err := s.prepareExec(req)
	if err != nil {
		return err
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return pipeError("start the process", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return pipeError("start the process", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		for _, f := range []*os.File{inR, inW, outR, outW} {
			f.Close()
		}
		return pipeError("start the process", err)
	}
	start := time.Now()
	c, err := s.cfg.Reaper.Start(spec.path, spec.argv, &os.ProcAttr{
		Dir: spec.dir, Env: spec.env, Files: []*os.File{inR, outW, errW}, Sys: procAttr(spec.root),
	})
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		return startError(spec, err)
	}
	p := &bgProc{
		pid:       c.Pid,
		mark:      c.Mark,
		stdin:     inW,
		stdinTurn: make(chan struct{}, 1),
		changed:   make(chan struct{}),
		info: agentproto.Process{
			PID: c.Pid, Cmd: summarize(req), Cwd: spec.dir, StartedAt: start.UTC(), Running: true,
		},
	}
	if len(req.Stdin) > 0 {
		// Its turn taken now, before the answer: a write or an EOF sent
		// right after waits for it, rather than going first or cutting it.
		p.stdinTurn <- struct{}{}
		go p.writeStartStdin(req.Stdin)
	}
	s.cfg.Processes.add(p)
	p.release = s.cfg.Contexts.guardMemory(c.Mark, "background process", false, s.log, func(why string) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.reaped {
			p.oom.Store(&why)
		}
	}, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if !p.reaped {
			KillTree(p.pid, p.mark)
		} else {
			KillTree(0, p.mark)
		}
	})
	go s.watch(p, c, req, start, outR, errR)
	s.log.Info("background process", "cmd", p.info.Cmd, "pid", c.Pid)
	writeJSON(w, http.StatusOK, p.snapshot())
	return nil
}

// watch collects the output of p until it exits (or its timeout kills it),
// then records the exit. Its goroutines end with the process's output.
func (s *Server) watch(p *bgProc, c *Process, req agentproto.ExecRequest, start time.Time, outR, errR *os.File) {
	var wg sync.WaitGroup
	for _, src := range []struct {
		typ string
		f   *os.File
	}{{"stdout", outR}, {"stderr", errR}} {
		wg.Go(func() { readChunks(src.f, src.typ, p.append) })
	}
	var timedOut bool
	var timeout <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	var status ExitStatus
	select {
	case status = <-c.Done:
	case <-timeout:
		p.mu.Lock()
		timedOut = true
		KillTree(c.Pid, c.Mark)
		p.mu.Unlock()
		status = <-c.Done
	}
	p.mu.Lock()
	p.reaped = true
	p.mu.Unlock()
	elapsed := time.Since(start)
	// A child that inherited the pipes may hold them open: read what is
	// there for a moment, then stop.
	readers := make(chan struct{})
	go func() { wg.Wait(); close(readers) }()
	if !drained(readers, start.Add(elapsed), outR, errR) {
		outR.Close()
		errR.Close()
		<-readers
	}
	outR.Close()
	errR.Close()
	p.stdin.Close()

	p.release()
	if why := p.oom.Load(); why != nil {
		p.append(agentproto.ExecEvent{Type: "stderr", Data: []byte(oomNote(*why))})
	}
	exit := agentproto.ExecEvent{Type: "exit", ExitCode: status.Code, Signal: status.Signal, TimedOut: timedOut, DurationMS: elapsed.Milliseconds()}
	p.mu.Lock()
	p.exit = &exit
	code := status.Code
	p.info.Running, p.info.ExitCode, p.info.Signal, p.info.TimedOut = false, &code, status.Signal, timedOut
	p.notify()
	p.mu.Unlock()
	s.log.Info("background process ended", "pid", p.pid, "status", status.String(), "timed_out", timedOut, "ms", elapsed.Milliseconds())
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) error {
	ps := s.cfg.Processes
	ps.mu.Lock()
	list := make([]agentproto.Process, 0, len(ps.procs))
	for _, p := range ps.procs {
		list = append(list, p.snapshot())
	}
	ps.mu.Unlock()
	writeJSON(w, http.StatusOK, list)
	return nil
}

// processOutput streams a process's kept output from the start; with
// follow it goes on until the process has ended, else it stops at what
// there is. The exit event comes last once the process has ended.
func (s *Server) processOutput(w http.ResponseWriter, r *http.Request) error {
	p, err := s.cfg.Processes.get(r.PathValue("pid"))
	if err != nil {
		return err
	}
	follow := isTrue(r.URL.Query().Get("follow"))
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	rc.Flush()
	next := 0
	for {
		p.mu.Lock()
		// A reader that lagged: what it had not read yet is gone. Said
		// where it happened, not skipped over in silence.
		lagged := next < p.first
		next = max(next, p.first)
		pending := append([]agentproto.ExecEvent(nil), p.events[next-p.first:]...)
		next += len(pending)
		p.sealed = max(p.sealed, next)
		exit, changed := p.exit, p.changed
		p.mu.Unlock()
		if lagged {
			pending = append([]agentproto.ExecEvent{{Type: "stderr", Data: []byte(lostOutputNote)}}, pending...)
		}
		for _, ev := range pending {
			if enc.Encode(ev) != nil {
				return nil
			}
		}
		if exit != nil {
			enc.Encode(exit)
			rc.Flush()
			return nil
		}
		if rc.Flush() != nil || !follow {
			return nil
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return nil
		}
	}
}

// lostOutputNote marks, in a followed output, where output the reader had
// not read yet was dropped (past keptOutput).
const lostOutputNote = "\npandastack: output dropped here: the process wrote more than the 4 MiB the agent keeps before this reader read it\n"

func isTrue(v string) bool {
	switch strings.ToLower(v) {
	case "1", "true", "yes":
		return true
	}
	return false
}

func (s *Server) processStdin(w http.ResponseWriter, r *http.Request) error {
	p, err := s.cfg.Processes.get(r.PathValue("pid"))
	if err != nil {
		return err
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxExecRequest))
	if err != nil {
		return pandastack.Errorf(pandastack.EInvalid, "reading the request: %v", err)
	}
	var req agentproto.StdinRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return pandastack.Errorf(pandastack.EInvalid, "stdin request is not valid JSON: %v", err)
	}
	if !p.snapshot().Running {
		return pandastack.Errorf(pandastack.EConflict, "process %d has ended; its input is closed", p.pid)
	}
	if len(req.Data) > 0 {
		err := p.writeStdin(r.Context(), req.Data)
		written := 0
		var se *stdinError
		if errors.As(err, &se) {
			written = se.written
		}
		switch {
		case errors.Is(err, errStdinBusy):
			return pandastack.Errorf(pandastack.EConflict, "process %d is not reading its input: an earlier write to it still waits (for %s)", p.pid, stdinWait)
		case errors.Is(err, os.ErrDeadlineExceeded):
			return pandastack.Errorf(pandastack.EConflict, "process %d is not reading its input (nothing taken for %s); %d of the %d bytes were written", p.pid, stdinWait, written, len(req.Data))
		case errors.Is(err, os.ErrClosed):
			return pandastack.Errorf(pandastack.EConflict, "the input of process %d is closed; %d of the %d bytes were written", p.pid, written, len(req.Data))
		case err != nil:
			return pandastack.Errorf(pandastack.EConflict, "writing to process %d: %v (of %d bytes)", p.pid, err, len(req.Data))
		}
	}
	if req.EOF {
		// After any write under way (the start's stdin): closed in its
		// turn, so the process reads all that was sent first.
		if err := p.takeStdinTurn(r.Context()); err != nil {
			if errors.Is(err, errStdinBusy) {
				return pandastack.Errorf(pandastack.EConflict, "process %d is not reading its input: an earlier write to it still waits (for %s); its input stays open", p.pid, stdinWait)
			}
			return err
		}
		p.stdin.Close()
		<-p.stdinTurn
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) killProcess(w http.ResponseWriter, r *http.Request) error {
	p, err := s.cfg.Processes.get(r.PathValue("pid"))
	if err != nil {
		return err
	}
	p.mu.Lock()
	if !p.reaped {
		KillTree(p.pid, p.mark)
	} else {
		KillTree(0, p.mark) // what it started lives on after it
	}
	p.mu.Unlock()
	// The answer means it ended: a list or a look right after says so
	// (its exit comes once it is reaped and its output read, ~100 ms).
	p.waitEnded(r.Context(), killAnswerWait)
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// killAll kills every process of the sandbox user but the code contexts'
// kernels (and a shell kernel's shell, whose variables are the
// context's): commands, background processes, terminals, and what cells
// started. Root's processes (commands run as root) are left.
func (s *Server) killAll(w http.ResponseWriter, r *http.Request) error {
	if err := agentproto.CheckQuery(r.URL.Query()); err != nil {
		return err
	}
	cs := s.cfg.Contexts
	cs.starts.Lock() // no kernel starts unseen by the kill
	kernels, shells := cs.kernelPids()
	killed, left, ok := KillUser(kernels, shells)
	cs.starts.Unlock()
	if !ok {
		return pandastack.Errorf(pandastack.EUnavailable, "this agent cannot kill the sandbox user's processes (it runs outside a sandbox, or could not take the user's ids)")
	}
	// The answer means they ended: a list right after says so.
	ctx, cancel := context.WithTimeout(r.Context(), killAnswerWait)
	defer cancel()
	for _, p := range s.cfg.Processes.all() {
		if _, found := slices.BinarySearch(killed, p.pid); found {
			p.waitEnded(ctx, killAnswerWait)
		}
	}
	writeJSON(w, http.StatusOK, agentproto.KillAll{Killed: len(killed), Remaining: left})
	return nil
}

var errStdinBusy = errors.New("another write to stdin is under way")

// writeStdin writes b to p's stdin, one writer at a time: it waits up to
// stdinWait for its turn (errStdinBusy), then up to stdinWait for the
// process to take the data (os.ErrDeadlineExceeded); ctx ending cuts the
// write short, so no write outlives its request.
func (p *bgProc) writeStdin(ctx context.Context, b []byte) error {
	if err := p.takeStdinTurn(ctx); err != nil {
		return err
	}
	return p.writeStdinTaken(ctx, b)
}

// takeStdinTurn waits up to stdinWait for p's stdin to be free.
func (p *bgProc) takeStdinTurn(ctx context.Context) error {
	turn := time.NewTimer(stdinWait)
	defer turn.Stop()
	select {
	case p.stdinTurn <- struct{}{}:
		return nil
	case <-turn.C:
		return errStdinBusy
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stdinChunk is how much of a write to a process's input goes at once:
// each chunk has stdinWait to be taken, so a process that reads its input
// slowly, but reads it, gets all of it.
const stdinChunk = 64 << 10

// stdinError is a write to a process's input that stopped part way.
type stdinError struct {
	written int
	err     error
}

func (e *stdinError) Error() string {
	return fmt.Sprintf("%d bytes written, then: %v", e.written, e.err)
}
func (e *stdinError) Unwrap() error { return e.err }

// writeStdinTaken is writeStdin with the turn already taken; it gives the
// turn back. A write cut short says how much of b went (*stdinError).
func (p *bgProc) writeStdinTaken(ctx context.Context, b []byte) error {
	cut := make(chan struct{})
	var gone atomic.Bool
	stop := context.AfterFunc(ctx, func() {
		gone.Store(true)
		p.stdin.SetWriteDeadline(time.Now())
		close(cut)
	})
	written := 0
	var err error
	for written < len(b) && err == nil {
		if !gone.Load() {
			p.stdin.SetWriteDeadline(time.Now().Add(stdinWait))
		}
		var n int
		n, err = p.stdin.Write(b[written:min(len(b), written+stdinChunk)])
		written += n
	}
	if !stop() {
		<-cut // its deadline set before this one's reset, not in the next turn
	}
	p.stdin.SetWriteDeadline(time.Time{})
	<-p.stdinTurn
	if err != nil {
		return &stdinError{written, err}
	}
	return nil
}

// writeStartStdin writes the input given with the process's start, its
// turn taken; a write cut short is said on the process's stderr, as the
// start has answered already.
func (p *bgProc) writeStartStdin(b []byte) {
	var se *stdinError
	if err := p.writeStdinTaken(context.Background(), b); errors.As(err, &se) {
		why := "it took none of it for " + stdinWait.String()
		if !errors.Is(se.err, os.ErrDeadlineExceeded) {
			why = se.err.Error()
		}
		p.append(agentproto.ExecEvent{Type: "stderr", Data: []byte(fmt.Sprintf("\npandastack: %d of the %d bytes of input given with the start reached the process: %s\n", se.written, len(b), why))})
	}
}

// killAnswerWait bounds how long a kill waits for the process's exit to be
// recorded before it answers.
const killAnswerWait = 3 * time.Second

// waitEnded waits until p's exit is recorded, for limit at most.
func (p *bgProc) waitEnded(ctx context.Context, limit time.Duration) {
	t := time.NewTimer(limit)
	defer t.Stop()
	for {
		p.mu.Lock()
		running, changed := p.info.Running, p.changed
		p.mu.Unlock()
		if !running {
			return
		}
		select {
		case <-changed:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}
