package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

const (
	maxExecRequest = 64 << 20 // stdin rides in the JSON; bigger inputs go through files
	outputChunk    = 32 << 10
	// drainAfterExit bounds how long output is still read after the command
	// exited: a background child may hold the pipes open indefinitely.
	drainAfterExit = 100 * time.Millisecond
	defaultPath    = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	rootHome       = "/root"
)

// execSpec is a validated command, ready to start.
type execSpec struct {
	path string // resolved program
	argv []string
	env  []string
	dir  string
	root bool
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) error {
	req, err := readExecRequest(w, r)
	if err != nil {
		return err
	}
	spec, err := s.prepareExec(req)
	if err != nil {
		return err
	}
	return s.run(w, r, spec, req)
}

// readExecRequest decodes the body of an exec or a background start.
func readExecRequest(w http.ResponseWriter, r *http.Request) (agentproto.ExecRequest, error) {
	var req agentproto.ExecRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxExecRequest))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return req, pandastack.Errorf(pandastack.ETooLarge, "exec request over %d MiB; upload large input with PUT /v1/sandboxes/{id}/files and read it from there", maxExecRequest>>20)
		}
		return req, pandastack.Errorf(pandastack.EInvalid, "reading the exec request: %v", err)
	}
	if err := json.Unmarshal(body, &req); err != nil {
		return req, pandastack.Errorf(pandastack.EInvalid, "exec request is not valid JSON: %v", err)
	}
	return req, nil
}

// maxArgLen is the longest argument or environment entry ("NAME=value")
// the kernel passes to a new program: 32 pages less its terminating NUL
// (Linux's MAX_ARG_STRLEN; gVisor has the same limit).
const maxArgLen = 32*4096 - 1

// argTooLong refuses an argument (or env entry) over maxArgLen.
func argTooLong(what string, n int) error {
	return pandastack.Errorf(pandastack.EInvalid, "%s is %d bytes; a program's argument or environment entry can be at most %d bytes (128 KiB); pass large input on stdin or in a file (PUT /v1/sandboxes/{id}/files)", what, n, maxArgLen)
}

// prepareExec checks everything that can be checked before starting, so that
// a mistake answers with an error status rather than an exit event.
func (s *Server) prepareExec(req agentproto.ExecRequest) (*execSpec, error) {
	switch {
	case len(req.Argv) > 0 && req.Cmd != "":
		return nil, pandastack.Errorf(pandastack.EInvalid, "give either argv or cmd, not both")
	case len(req.Argv) == 0 && req.Cmd == "":
		return nil, pandastack.Errorf(pandastack.EInvalid, "nothing to run: give argv (program and arguments) or cmd (a shell command line)")
	case len(req.Argv) > 0 && req.Argv[0] == "":
		return nil, pandastack.Errorf(pandastack.EInvalid, "argv[0] is empty; it must name the program to run")
	case req.TimeoutMS < 0:
		return nil, pandastack.Errorf(pandastack.EInvalid, "timeout_ms is %d; give a positive number of milliseconds, or 0 for none", req.TimeoutMS)
	}
	for i, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return nil, pandastack.Errorf(pandastack.EInvalid, "argv holds a NUL byte; arguments cannot contain NUL")
		}
		if len(a) > maxArgLen {
			return nil, argTooLong(fmt.Sprintf("argv[%d]", i), len(a))
		}
	}
	if strings.IndexByte(req.Cmd, 0) >= 0 {
		return nil, pandastack.Errorf(pandastack.EInvalid, "cmd holds a NUL byte; a command line cannot contain NUL")
	}
	if len(req.Cmd) > maxArgLen {
		return nil, argTooLong("cmd", len(req.Cmd))
	}
	for k, v := range req.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.IndexByte(v, 0) >= 0 {
			return nil, pandastack.Errorf(pandastack.EInvalid, "env variable %q is invalid: names must be non-empty without '=' or NUL, values without NUL", k)
		}
		if len(k)+1+len(v) > maxArgLen {
			return nil, argTooLong(fmt.Sprintf("env variable %q", k), len(k)+1+len(v))
		}
	}

	home, user := s.home, agentproto.UserName
	if req.Root {
		home, user = rootHome, "root"
	}
	env, pathVar := buildEnv(home, user, req.Env)

	dir := req.Cwd
	if dir == "" {
		dir = home
	} else if !filepath.IsAbs(dir) {
		dir = filepath.Join(home, dir)
	}
	fi, err := os.Stat(dir)
	if errors.Is(err, fs.ErrNotExist) && req.Cwd == "" {
		return nil, pandastack.Errorf(pandastack.EInvalid, "the home directory %s does not exist (it was removed); create it again (POST /v1/sandboxes/{id}/files/mkdir) or give a cwd that exists", dir)
	} else if errors.Is(err, fs.ErrNotExist) {
		return nil, pandastack.Errorf(pandastack.EInvalid, "cwd %s does not exist; create it first (POST /v1/sandboxes/{id}/files/mkdir) or leave cwd empty for the home directory", dir)
	} else if err != nil {
		return nil, pandastack.Errorf(pandastack.EInvalid, "cwd %s: %v", dir, errors.Unwrap(err))
	} else if !fi.IsDir() {
		return nil, pandastack.Errorf(pandastack.EInvalid, "cwd %s is not a directory", dir)
	}

	spec := &execSpec{argv: req.Argv, env: env, dir: dir, root: req.Root}
	if req.Cmd != "" {
		spec.path = "/bin/bash"
		if _, err := os.Stat(spec.path); err != nil {
			spec.path = "/bin/sh"
		}
		spec.argv = []string{filepath.Base(spec.path), "-c", req.Cmd}
		return spec, nil
	}
	if spec.path, err = lookPath(req.Argv[0], pathVar, dir); err != nil {
		return nil, err
	}
	return spec, nil
}

// buildEnv layers the defaults for the user, the agent's own environment
// (which carries the sandbox-wide variables) and the request's variables.
// HOME, USER and LOGNAME describe who runs the command, so the agent's own
// values of those (root's) are not passed on. It also returns the final PATH.
func buildEnv(home, user string, extra map[string]string) ([]string, string) {
	var keys []string
	vals := make(map[string]string)
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			keys = append(keys, k)
		}
		vals[k] = v
	}
	set("PATH", defaultPath)
	set("HOME", home)
	set("USER", user)
	set("LOGNAME", user)
	set("SHELL", "/bin/bash")
	set("LANG", "C.UTF-8")
	for _, kv := range os.Environ() {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || k == "HOME" || k == "USER" || k == "LOGNAME" {
			continue
		}
		set(k, v)
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range extra {
			if !yield(k) {
				return
			}
		}
	}) {
		set(k, extra[k])
	}
	env := make([]string, 0, len(keys))
	for _, k := range keys {
		env = append(env, k+"="+vals[k])
	}
	return env, vals["PATH"]
}

// lookPath finds the program like a shell would, with the command's PATH and
// cwd rather than the agent's.
func lookPath(name, pathVar, dir string) (string, error) {
	notFound := pandastack.Errorf(pandastack.ECommandNotFound, "command not found: %q (not in PATH %s); install it or give its full path", name, pathVar)
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		fi, err := os.Stat(p)
		switch {
		case err != nil:
			return "", pandastack.Errorf(pandastack.ECommandNotFound, "command not found: %q", name)
		case fi.IsDir():
			// As a shell and docker exec answer (126): it cannot be run.
			return "", pandastack.Errorf(pandastack.EPermission, "cannot run %q: it is a directory", name)
		}
		return p, nil // a file without x bits fails at start, with a clear error
	}
	for _, d := range filepath.SplitList(pathVar) {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", notFound
}

func startError(spec *execSpec, err error) error {
	name := spec.argv[0]
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return pandastack.Errorf(pandastack.ECommandNotFound, "cannot run %q: %v (for a script, check the interpreter on its #! line)", name, errors.Unwrap(err))
	case errors.Is(err, fs.ErrPermission):
		return pandastack.Errorf(pandastack.EPermission, "cannot run %q: permission denied; check that it is executable and that the user may enter %s", name, spec.dir)
	case errors.Is(err, syscall.ENOEXEC):
		return pandastack.Errorf(pandastack.EInvalid, "cannot run %q: not an executable format; a script needs a #! line", name)
	case errors.Is(err, syscall.E2BIG), errors.Is(err, syscall.ENAMETOOLONG):
		// Each argument passed prepareExec's check, so it is their sum
		// (gVisor answers ENAMETOOLONG where Linux answers E2BIG).
		return pandastack.Errorf(pandastack.EInvalid, "cannot run %q: its arguments and environment are too large in all for the kernel; pass large input on stdin or in a file (PUT /v1/sandboxes/{id}/files)", name)
	}
	if e := exhausted(fmt.Sprintf("run %q", name), err); e != nil {
		return e
	}
	return fmt.Errorf("start %q: %w", name, err)
}

// pipeError is the error for pipes a start (what) could not make.
func pipeError(what string, err error) error {
	if e := exhausted(what, err); e != nil {
		return e
	}
	return fmt.Errorf("%s: pipes: %w", what, err)
}

// exhausted is the error for a start (what) that failed because the
// sandbox is out of something its own processes took (processes, file
// descriptors, memory): the caller can free it, so a conflict that says
// how, not an internal error. nil for any other failure.
func exhausted(what string, err error) error {
	switch {
	case errors.Is(err, syscall.EAGAIN):
		limit := ""
		if n := nprocLimit(); n > 0 {
			limit = fmt.Sprintf(" (%d)", n)
		}
		return pandastack.Errorf(pandastack.EConflict, "cannot %s: the sandbox user has as many processes as it may%s; end some first (POST /v1/sandboxes/{id}/processes/{pid}/kill for a background one) or kill the sandbox", what, limit)
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return pandastack.Errorf(pandastack.EConflict, "cannot %s: the sandbox is out of file descriptors; end some of its processes first", what)
	case errors.Is(err, syscall.ENOMEM):
		return pandastack.Errorf(pandastack.EConflict, "cannot %s: the sandbox is out of memory; end some of its processes or free memory first", what)
	}
	return nil
}

// run starts the command and streams its output and exit as events. The
// request's context bounds the command: a client that goes away kills it.
func (s *Server) run(w http.ResponseWriter, r *http.Request, spec *execSpec, req agentproto.ExecRequest) error {
	var files []*os.File
	defer func() {
		for _, f := range files {
			f.Close() // a second Close is a harmless error
		}
	}()
	pipe := func() (*os.File, *os.File, error) {
		rd, wr, err := os.Pipe()
		if err == nil {
			files = append(files, rd, wr)
		}
		return rd, wr, err
	}
	inR, inW, err := pipe()
	if err != nil {
		return pipeError("run the command", err)
	}
	outR, outW, err := pipe()
	if err != nil {
		return pipeError("run the command", err)
	}
	errR, errW, err := pipe()
	if err != nil {
		return pipeError("run the command", err)
	}
	growPipe(outR, outputPipe)
	growPipe(errR, outputPipe)

	start := time.Now()
	c, err := s.cfg.Reaper.Start(spec.path, spec.argv, &os.ProcAttr{
		Dir:   spec.dir,
		Env:   spec.env,
		Files: []*os.File{inR, outW, errW},
		Sys:   procAttr(spec.root),
	})
	// The child holds its own copies; ours would keep EOF from ever coming.
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		return startError(spec, err)
	}
	go func() {
		// Fails harmlessly once run returns and closes inW, should the
		// command never read its input.
		inW.Write(req.Stdin)
		inW.Close()
	}()

	var gone atomic.Bool // the command has exited: its pid may be reused
	var oom atomic.Pointer[string]
	defer s.cfg.Contexts.guardMemory(c.Mark, "command", true, s.log, func(why string) {
		if !gone.Load() {
			oom.Store(&why)
		}
	}, func() {
		if gone.Load() {
			KillTree(0, c.Mark)
		} else {
			KillTree(c.Pid, c.Mark)
		}
	})()

	out := newOutputQueue()
	var wg sync.WaitGroup
	for _, p := range []struct {
		typ string
		f   *os.File
	}{{"stdout", outR}, {"stderr", errR}} {
		wg.Go(func() { out.read(p.f, p.typ) })
	}
	readersDone := make(chan struct{})
	go func() {
		wg.Wait()
		close(readersDone)
	}()

	ans, err := startAnswer(w, r)
	defer ans.end()
	send := ans.send
	broken := err != nil // the client is gone: drain, but stop writing

	var (
		status   ExitStatus
		exited   bool
		killed   bool
		timedOut bool
		elapsed  time.Duration
		timeoutC <-chan struct{}
		drainC   <-chan time.Time
		drainT   *time.Timer
		dropped  int  // the bytes left in the pipes when the drain ended
		cut      bool // the drain ended while output still came
		done     = make(chan ExitStatus, 1)
		ctxDone  = ans.ctx.Done()
	)
	// gone is set as the status comes, not when the loop takes it (the
	// loop may be stuck writing): the timer must not kill a pid reaped.
	go func() {
		st := <-c.Done
		gone.Store(true)
		done <- st
	}()
	// The timeout kills the command even while the loop below is stuck in
	// a write to a client that stopped reading (it would run on for as
	// long as the client stalls); the loop then records it and waits for
	// the reaping as after any kill.
	var pastTimeout atomic.Bool
	if req.TimeoutMS > 0 {
		expired := make(chan struct{})
		t := time.AfterFunc(time.Duration(req.TimeoutMS)*time.Millisecond, func() {
			if !gone.Load() {
				pastTimeout.Store(true)
				KillTree(c.Pid, c.Mark)
			}
			close(expired)
		})
		defer t.Stop()
		timeoutC = expired
	}
	kill := func() {
		if !exited && !killed {
			killed = true
			KillTree(c.Pid, c.Mark)
			// The answer comes once what the command started is reaped:
			// the next command neither sees its zombies nor has them
			// count against the user's process limit.
			awaitReaped(c.Mark, killAnswerWait)
		}
	}
	if broken {
		kill()
	}
	// A client that goes away kills the command even while this loop is
	// stuck in a write to it (a full stream window the host no longer
	// reads), which the select below would not notice.
	stopWatch := context.AfterFunc(ans.ctx, func() {
		if !gone.Load() {
			KillTree(c.Pid, c.Mark)
		}
	})
	defer stopWatch()
	// deliver writes the waiting output, all of it before one flush.
	deliver := func() {
		if evs := out.take(); len(evs) > 0 && !broken && send(evs...) != nil {
			broken = true
			kill()
		}
	}
	for !exited || readersDone != nil {
		select {
		case <-out.ready:
			deliver()
		case <-readersDone:
			readersDone = nil
			deliver() // what the readers pushed last
		case status = <-done:
			gone.Store(true)
			exited, elapsed = true, time.Since(start)
			done, timeoutC, ctxDone = nil, nil, nil
			if readersDone != nil {
				drainT = time.NewTimer(drainAfterExit)
				defer drainT.Stop()
				drainC = drainT.C
			}
		case <-timeoutC:
			timeoutC = nil
			timedOut = true
			kill()
		case <-ctxDone:
			ctxDone = nil
			broken = true
			kill()
		case <-drainC:
			left := unread(outR, errR)
			if keepDrainingExec(left, start.Add(elapsed), out.lastRead(), func() bool { return writerless(outR, errR) }) {
				drainT.Reset(drainPoll) // the readers lag behind, or the client
				continue
			}
			drainC = nil
			dropped = left
			// Cut off while output still came: a process the command
			// started writes on into pipes no one reads any more.
			cut = left > 0 || time.Since(out.lastRead()) < drainAfterExit
			outR.Close() // unblocks the readers
			errR.Close()
		}
	}
	if cut && !broken {
		send(agentproto.ExecEvent{Type: "stderr", Data: []byte(drainNote(dropped))})
	}
	if pastTimeout.Load() && !killed {
		// Killed by the timer while the loop was writing, its exit seen
		// before the timeout: the answer waits for the reaping as after
		// the loop's own kill.
		timedOut = status.Signal != ""
		awaitReaped(c.Mark, killAnswerWait)
	}
	if why := oom.Load(); why != nil && !broken {
		// Last on stderr, as a shell says "Killed".
		send(agentproto.ExecEvent{Type: "stderr", Data: []byte(oomNote(*why))})
	}
	if !broken {
		send(agentproto.ExecEvent{
			Type:       "exit",
			ExitCode:   status.Code,
			Signal:     status.Signal,
			TimedOut:   timedOut,
			DurationMS: elapsed.Milliseconds(),
		})
	}
	s.log.Info("exec", "cmd", summarize(req), "pid", c.Pid, "status", status.String(),
		"timed_out", timedOut, "killed", killed, "out_of_memory", oom.Load() != nil, "ms", elapsed.Milliseconds())
	return nil
}

// readChunks hands what f yields, in chunks of at most outputChunk bytes,
// to emit as events of type typ, until f ends or fails. The chunks share
// one buffer: emit keeps a copy of what it keeps.
func readChunks(f *os.File, typ string, emit func(agentproto.ExecEvent)) {
	buf := make([]byte, outputChunk)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			emit(agentproto.ExecEvent{Type: typ, Data: buf[:n]})
		}
		if err != nil {
			return
		}
	}
}

func summarize(req agentproto.ExecRequest) string {
	s := req.Cmd
	if s == "" {
		s = strings.Join(req.Argv, " ")
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// oomNote is what a command or background process killed by the memory
// watch gets last on its stderr.
func oomNote(why string) string { return "\npandastack: " + why + "\n" }
