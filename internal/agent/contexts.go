package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agent/jupyter"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// Contexts holds the code contexts (Jupyter kernels) of the sandbox. It
// outlives host sessions: a server restart or a new epoch keeps the kernels.
type Contexts struct {
	mu      sync.Mutex
	ctxs    map[string]*codeContext
	created uint64               // contexts made so far
	procs   map[*kernelProc]bool // live kernel processes, for the memory watch
	// starts is held for reading by a kernel's start until its process is
	// in procs, and for writing by a kill of the user's processes, which
	// spares the kernels in procs: one starting meanwhile would be killed.
	starts  sync.RWMutex
	watch   sync.Once
	memKick chan struct{} // wakes the memory watch when a cell starts
	spares  spareSet      // kernels warmed up ahead of time (spare.go)
	// owners are the process trees other than kernels that the memory
	// watch may kill, by mark (guardMemory).
	owners map[uint32]*memOwner
}

type codeContext struct {
	info    agentproto.Context
	kernel  *jupyter.Kernel
	created uint64 // creation order, for listing oldest first
	// started is closed once the kernel has started (kernel is set) or
	// failed to (startErr is set, and the id is free again); requests that
	// name a context still starting wait on it.
	started  chan struct{}
	startErr error
	// sandboxID is the PANDASTACK_SANDBOX_ID its kernel has (Restored
	// gives it a restored sandbox's); guarded by Contexts.mu.
	sandboxID string
}

// NewContexts returns an empty registry.
func NewContexts() *Contexts {
	return &Contexts{ctxs: map[string]*codeContext{}, procs: map[*kernelProc]bool{}, memKick: make(chan struct{}, 1), owners: map[uint32]*memOwner{}}
}

// memOwner is a process tree under the memory watch that is not a
// kernel's: a command, a background process or a terminal.
type memOwner struct {
	what string // "command", "background process", "terminal"
	busy bool   // a command someone waits for: watched at the busy pace
	// young is when a tree that is not busy stops being watched at the
	// busy pace for its start.
	young time.Time
	note  func(why string) // tells the tree's caller why, before the kill; must not block
	kill  func()
}

func (o *memOwner) killForMemory(why string) {
	o.note(why)
	o.kill()
}

// memWatchYoung is how long the memory watch keeps its busy pace after a
// background process or a terminal starts: a command that allocates from
// its start grows faster than the watch's slow pace would see.
const memWatchYoung = 5 * time.Second

// guardMemory puts a process tree that is not a kernel's, marked mark
// (Process.Mark), under the memory watch: should the sandbox nearly run
// out with this tree the largest, note is told why and kill kills it,
// rather than the host stopping the whole sandbox. While a busy tree is
// under it (a command its caller waits for, like a cell), and for the
// first memWatchYoung of any other, the watch looks at its busy pace. It starts the watch if no kernel did yet, and wakes
// it. The returned func takes the tree off; what it left behind stays
// under the watch by its mark, killed without a note.
func (cs *Contexts) guardMemory(mark uint32, what string, busy bool, log *slog.Logger, note func(why string), kill func()) (release func()) {
	if mark == 0 {
		return func() {} // not root: processes are not marked
	}
	o := &memOwner{what: what, busy: busy, note: note, kill: kill, young: time.Now().Add(memWatchYoung)}
	cs.mu.Lock()
	cs.owners[mark] = o
	cs.mu.Unlock()
	cs.watch.Do(func() { go cs.watchMemory(log) })
	cs.wakeMemoryWatch()
	return func() {
		cs.mu.Lock()
		if cs.owners[mark] == o {
			delete(cs.owners, mark)
		}
		cs.mu.Unlock()
	}
}

// wakeMemoryWatch makes the memory watch (limits_linux.go) look now and
// take its busy pace.
func (cs *Contexts) wakeMemoryWatch() {
	select {
	case cs.memKick <- struct{}{}:
	default:
	}
}

// Restored readies the kernels after the host's hello to a restored
// sandbox: with reseed (restored from an image other sandboxes restore
// too), every kernel's random generators are reseeded, spares included
// (see jupyter.Kernel.Reseed; a spare the refiller starts later is a new
// process and needs nothing); with id (the sandbox's id now; "" leaves
// ids alone), every ready spare whose kernel has another id learns it. A
// spare needing both gets them in one silent cell, so a context's first
// cell waits behind one cell rather than two.
//
// The contexts' kernels learn the id too: a fork's child, or a sandbox
// restored from a snapshot, holds the contexts of the sandbox it was made
// from, whose kernels said that sandbox's id (code reporting where it
// runs named the parent, while exec and the hostname said the child).
func (cs *Contexts) Restored(id string, reseed bool) {
	type kernelID struct {
		k    *jupyter.Kernel
		code string // sets the id; "" when it has it, or cannot be told
	}
	cs.mu.Lock()
	var ks []kernelID
	for _, cc := range cs.ctxs {
		if cc.kernel == nil {
			continue
		}
		ki := kernelID{k: cc.kernel}
		if id != "" && cc.sandboxID != id {
			if cc.info.Language == "python" {
				ki.code = sandboxIDCode(id)
			} else {
				ki.code = cc.kernel.EnvSetCode(map[string]string{"PANDASTACK_SANDBOX_ID": id})
			}
			cc.sandboxID = id
		}
		ks = append(ks, ki)
	}
	cs.mu.Unlock()
	for _, ki := range ks {
		switch {
		case reseed:
			ki.k.ReseedThen(ki.code)
		case ki.code != "":
			ki.k.QueueSilent(ki.code)
		}
	}
	cs.spares.restored(id, reseed)
}

// kernelDirs are where Jupyter kernelspecs live in a template.
var kernelDirs = []string{"/usr/local/share/jupyter/kernels", "/usr/share/jupyter/kernels", "/opt/venv/share/jupyter/kernels"}

// languageKernels maps an API language to kernelspec names to try.
var languageKernels = map[string][]string{
	"python": {"python3", "python"},
	"bash":   {"bash"},
	// Deno's kernel runs both; a javascript context also takes TypeScript.
	"javascript": {"deno"},
	"typescript": {"deno"},
	"r":          {"ir"},
	"java":       {"java"},
}

// kernelArgv returns the argv of the kernel for language, from its kernelspec.
func kernelArgv(language string) ([]string, error) {
	names, ok := languageKernels[language]
	if !ok {
		return nil, pandastack.Errorf(pandastack.EInvalid, "unknown language %q; supported: %s", language, strings.Join(supportedLanguages(), ", "))
	}
	for _, dir := range kernelDirs {
		for _, n := range names {
			b, err := os.ReadFile(filepath.Join(dir, n, "kernel.json"))
			if err != nil {
				continue
			}
			var spec struct {
				Argv []string `json:"argv"`
			}
			if json.Unmarshal(b, &spec) == nil && len(spec.Argv) > 0 {
				return withPython(spec.Argv, func(name string) (string, error) {
					return kernelLookPath(name, os.Getenv("PATH"), "/")
				}), nil
			}
		}
	}
	if language == "python" {
		if _, err := os.Stat("/usr/bin/python3"); err == nil && hasIPyKernel() {
			return []string{"python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"}, nil
		}
	}
	if language == "python" {
		return nil, pandastack.Errorf(pandastack.EInvalid, "this sandbox's template has no python Jupyter kernel: use the code-interpreter template, or add ipykernel to the pip list of your template's spec")
	}
	return nil, pandastack.Errorf(pandastack.EInvalid, "this sandbox's template has no %s Jupyter kernel; use the code-interpreter template", language)
}

// withPython gives a kernelspec whose command is a bare "python" (as the
// kernelspec of ipykernel's wheel has) the python3 on PATH when there is
// no "python", as Debian has none; as Jupyter itself runs such a spec
// with its own interpreter. Any other argv comes back as it is.
func withPython(argv []string, lookPath func(string) (string, error)) []string {
	if argv[0] != "python" {
		return argv
	}
	if _, err := lookPath("python"); err == nil {
		return argv
	}
	if _, err := lookPath("python3"); err != nil {
		return argv
	}
	return append([]string{"python3"}, argv[1:]...)
}

// kernelLookPath finds a kernel's program on the sandbox's PATH, then on
// the default one: a PATH given to the sandbox for its commands (without
// /usr/bin, say) must not cost it its kernels.
func kernelLookPath(name, pathVar, cwd string) (string, error) {
	p, err := lookPath(name, pathVar, cwd)
	if err != nil && !strings.Contains(name, "/") && pathVar != defaultPath {
		if p, derr := lookPath(name, defaultPath, cwd); derr == nil {
			return p, nil
		}
	}
	return p, err
}

func hasIPyKernel() bool {
	m, _ := filepath.Glob("/usr/*/lib/python3*/*-packages/ipykernel")
	m2, _ := filepath.Glob("/usr/lib/python3/dist-packages/ipykernel")
	return len(m)+len(m2) > 0
}

func supportedLanguages() []string {
	var l []string
	for k := range languageKernels {
		l = append(l, k)
	}
	sort.Strings(l)
	return l
}

// launcher starts kernels through the agent's reaper as the sandbox user.
func (s *Server) launcher(argv, env []string, cwd string) (jupyter.Proc, error) {
	// Started, or restarted, in the sandbox it is in now: the options'
	// env holds the id of the sandbox the context was made in (a fork's
	// parent, a snapshot's sandbox, a pool's image).
	if id := os.Getenv("PANDASTACK_SANDBOX_ID"); id != "" {
		env = slices.DeleteFunc(slices.Clone(env), func(e string) bool { return strings.HasPrefix(e, "PANDASTACK_SANDBOX_ID=") })
		env = append(env, "PANDASTACK_SANDBOX_ID="+id)
	}
	path := argv[0]
	if !strings.Contains(path, "/") {
		_, pathVar := buildEnv(s.home, agentproto.UserName, nil)
		p, err := kernelLookPath(path, pathVar, cwd)
		if err != nil {
			return nil, err
		}
		path = p
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, err
	}
	defer devnull.Close()
	logf, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cs := s.cfg.Contexts
	cs.starts.RLock()
	defer cs.starts.RUnlock()
	p, err := s.cfg.Reaper.Start(path, argv, &os.ProcAttr{
		Dir: cwd, Env: env, Files: []*os.File{devnull, logf, logf}, Sys: procAttr(false),
	})
	if err != nil {
		return nil, err
	}
	k := newKernelProc(p)
	k.shell = slices.Contains(argv, "bash_kernel")
	cs.mu.Lock()
	cs.procs[k] = true
	cs.mu.Unlock()
	go func() {
		<-k.done
		cs.mu.Lock()
		delete(cs.procs, k)
		cs.mu.Unlock()
	}()
	cs.watch.Do(func() { go cs.watchMemory(s.cfg.Log) })
	return k, nil
}

// kernelPids returns the pids of the living kernels (spares included),
// and of those that run their cells in a shell (bash_kernel).
func (cs *Contexts) kernelPids() (kernels, shells []int) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	for k := range cs.procs {
		select {
		case <-k.done:
			continue
		default:
		}
		kernels = append(kernels, k.p.Pid)
		if k.shell {
			shells = append(shells, k.p.Pid)
		}
	}
	return kernels, shells
}

// kernelProc adapts a reaper Process to jupyter.Proc.
type kernelProc struct {
	p      *Process
	done   chan struct{}
	status ExitStatus
	oom    atomic.Pointer[string] // why the memory watch killed it
	note   atomic.Pointer[string] // why it killed what the kernel started (jupyter.Noter)
	// shell: the kernel runs its cells in a shell, its child, whose
	// variables and functions are the context's (bash_kernel).
	shell bool
}

func newKernelProc(p *Process) *kernelProc {
	k := &kernelProc{p: p, done: make(chan struct{})}
	go func() {
		k.status = <-p.Done
		close(k.done)
	}()
	return k
}

// killForMemory kills the kernel's process tree and remembers why.
func (k *kernelProc) killForMemory(why string) {
	k.oom.CompareAndSwap(nil, &why)
	k.Kill()
}

// killChildrenForMemory kills what the kernel started, leaving the kernel
// and its variables, and has the running cell told why.
func (k *kernelProc) killChildrenForMemory(why string) {
	k.note.Store(&why)
	k.KillChildren()
}

// TakeNote implements jupyter.Noter.
func (k *kernelProc) TakeNote() string {
	if p := k.note.Swap(nil); p != nil {
		return *p
	}
	return ""
}

// KillChildren kills what the kernel started and leaves the kernel
// running, and for a shell's kernel its shell too: what the shell
// started dies (jupyter.ChildKiller).
func (k *kernelProc) KillChildren() {
	select {
	case <-k.done:
	default:
		KillDescendants(k.p.Pid, k.p.Mark, k.shell)
	}
}

func (k *kernelProc) Pid() int              { return k.p.Pid }
func (k *kernelProc) Done() <-chan struct{} { return k.done }

// Kill kills the kernel's process tree; once the kernel was reaped its pid
// may be reused, so then only what carries its mark (left-behind children).
func (k *kernelProc) Kill() {
	select {
	case <-k.done:
		KillTree(0, k.p.Mark)
	default:
		KillTree(k.p.Pid, k.p.Mark)
	}
}

// KillGroup SIGKILLs the kernel's process group, while the kernel is
// unreaped (jupyter.GroupKiller).
func (k *kernelProc) KillGroup() {
	select {
	case <-k.done:
	default:
		KillGroupNow(k.p.Pid)
	}
}

func (k *kernelProc) ExitReason() string {
	select {
	case <-k.done:
	default:
		return "running"
	}
	if why := k.oom.Load(); why != nil {
		return *why
	}
	if k.status.Signal != "" {
		reason := "killed by " + k.status.Signal
		if k.status.Signal == "SIGKILL" {
			reason += " (out of memory, or killed)"
		}
		return reason
	}
	return fmt.Sprintf("exit status %d", k.status.Code)
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request) error {
	var req agentproto.ContextRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return pandastack.Errorf(pandastack.EInvalid, "bad context request: %v", err)
	}
	cc, err := s.newContext(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, cc.info)
	return nil
}

// newContext creates the context req asks for (POST /v1/contexts, or a
// run's RunRequest.Create) and returns it with its kernel started: a spare
// when one fits, else a kernel started now. The start is not cancelled
// with ctx's request.
func (s *Server) newContext(rctx context.Context, req agentproto.ContextRequest) (*codeContext, error) {
	if req.Language == "" {
		req.Language = "python"
	}
	if req.ID == "" {
		return nil, pandastack.Errorf(pandastack.EInvalid, "context id is required")
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = s.home
	} else if !filepath.IsAbs(cwd) {
		cwd = filepath.Join(s.home, cwd)
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		if errors.Is(err, fs.ErrNotExist) || err == nil {
			return nil, pandastack.Errorf(pandastack.EInvalid, "cwd %s is not an existing directory", cwd)
		}
		return nil, pandastack.Errorf(pandastack.EInvalid, "cwd %s: %v", cwd, err)
	}
	if runningAsRoot() {
		if err := userCanEnter(cwd, agentproto.UserUID, agentproto.UserGID); err != nil {
			return nil, pandastack.Errorf(pandastack.EInvalid, "cwd %s: %v; the kernel runs as the sandbox user (%s)", cwd, err, agentproto.UserName)
		}
	}

	cs := s.cfg.Contexts
	cs.mu.Lock()
	if _, ok := cs.ctxs[req.ID]; ok {
		cs.mu.Unlock()
		return nil, pandastack.Errorf(pandastack.EConflict, "context %s already exists", req.ID)
	}
	auto := req.AutoRestart == nil || *req.AutoRestart
	cs.created++
	cc := &codeContext{info: agentproto.Context{ID: req.ID, Language: req.Language, Cwd: cwd, AutoRestart: auto}, created: cs.created, started: make(chan struct{})}
	cs.ctxs[req.ID] = cc // reserve the id while the kernel starts
	cs.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.WithoutCancel(rctx), 60*time.Second)
	defer cancel()
	// A spare kernel, started and warmed up ahead of time, if it fits;
	// else one started now (a language without a kernel fails here).
	var err error
	k := cs.takeSpare(ctx, req.Language, cwd == s.home && len(req.Env) == 0)
	if k == nil {
		var argv []string
		if argv, err = kernelArgv(req.Language); err == nil {
			k, err = jupyter.Start(ctx, s.kernelOptions(req.Language, argv, req.ID, cwd, req.Env))
		}
	}
	if err != nil {
		what := fmt.Sprintf("start a %s kernel", req.Language)
		switch {
		case errors.Is(err, syscall.ENOSPC):
			err = pandastack.Errorf(pandastack.ETooLarge, "no space left on the sandbox's disk to start a %s kernel; delete files", req.Language)
		case errors.Is(err, syscall.E2BIG), errors.Is(err, syscall.ENAMETOOLONG):
			err = pandastack.Errorf(pandastack.EInvalid, "cannot %s: its environment is too large in all for the kernel; pass large values in a file (PUT /v1/sandboxes/{id}/files)", what)
		case exhausted(what, err) != nil:
			err = exhausted(what, err)
		case !pandastack.IsCode(err, pandastack.EInvalid) && atProcessLimit():
			// A kernel that could not start what it needs (bash_kernel's
			// shell) fails late and vaguely: the limit is the likely cause.
			err = exhausted(what, syscall.EAGAIN)
		case !pandastack.IsCode(err, pandastack.EInvalid):
			err = fmt.Errorf("start %s kernel: %w", req.Language, err)
		}
		cs.mu.Lock()
		delete(cs.ctxs, req.ID)
		cc.startErr = err
		cs.mu.Unlock()
		close(cc.started)
		return nil, err
	}
	cs.mu.Lock()
	cc.kernel = k
	cc.sandboxID = os.Getenv("PANDASTACK_SANDBOX_ID") // a spare's was set at its hand-out
	cs.mu.Unlock()
	close(cc.started)
	return cc, nil
}

// kernelMPLConfigDir is matplotlib's config and cache directory for the
// kernels, unless the sandbox's or the context's environment names one:
// one per sandbox, in /tmp (the user's whatever HOME is), the directory the
// code-interpreter template gives every other process too. Its font list,
// which matplotlib builds at its first import where there is none (0.3-0.7
// s of a kernel's start in gVisor, measured by hand), is then built once
// per sandbox (or in the template's warm image) rather than by every
// kernel: a directory per context made each spare kernel and each kernel
// started on demand build its own. Tests set it.
var kernelMPLConfigDir = "/tmp/matplotlib"

// mplConfigDir is shared, the kernels' matplotlib directory, unless it
// exists and is not a directory of the sandbox user's (a command run as
// root made it first, say), or holds a lock of matplotlib's older than
// mplStaleLock (a kernel killed while it wrote the font list leaves one,
// and the list cut short: every kernel would then wait 5 s for the lock,
// build the list and warn that it could not save it): then a directory of
// the context's own beside it, as every kernel had before. The agent only
// looks (Lstat, ReadDir): what the user puts there is the user's. When the
// agent is not root (its tests) its own uid stands for the user's.
func mplConfigDir(shared, id string) string {
	fi, err := os.Lstat(shared)
	if err != nil {
		return shared // the first kernel makes it
	}
	uid := uint32(agentproto.UserUID)
	if !runningAsRoot() {
		uid = uint32(os.Getuid())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || !fi.IsDir() || st.Uid != uid {
		return shared + "-" + id
	}
	ents, _ := os.ReadDir(shared)
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".matplotlib-lock") {
			continue
		}
		if li, err := e.Info(); err == nil && time.Since(li.ModTime()) > mplStaleLock {
			return shared + "-" + id
		}
	}
	return shared
}

// mplStaleLock is the age past which a lock file of matplotlib's is taken
// for one left by a killed kernel (matplotlib holds it for the few
// milliseconds of a write, and gives up waiting for it after 5 s).
const mplStaleLock = 10 * time.Second

// kernelOptions says how to start a kernel of language with argv for the
// context id.
func (s *Server) kernelOptions(language string, argv []string, id, cwd string, extraEnv map[string]string) jupyter.Options {
	env, _ := buildEnv(s.home, agentproto.UserName, extraEnv)
	if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "MPLCONFIGDIR=") }) {
		env = append(env, "MPLCONFIGDIR="+mplConfigDir(kernelMPLConfigDir, id))
	}
	env = append(env, "PYTHONUNBUFFERED=1")
	opts := jupyter.Options{Argv: argv, Env: env, Cwd: cwd, Launch: s.launcher, Log: s.log, RuntimeDir: os.TempDir()}
	if runningAsRoot() {
		opts.Owner = &jupyter.Owner{UID: agentproto.UserUID, GID: agentproto.UserGID}
	}
	switch language {
	case "python":
		opts.Argv = jupyter.PythonLauncherArgv(argv)
		opts.EnvCode = jupyter.PythonEnvCode
		opts.SetupCode = jupyter.PythonSetupCode
		opts.OutputCapCode = jupyter.PythonOutputCapCode
		opts.DroppedExpr = jupyter.PythonDroppedExpr
		opts.ReseedCode = jupyter.PythonReseedCode
	case "bash":
		opts.EnvCode = jupyter.BashEnvCode
		opts.ReseedCode = jupyter.BashReseedCode
		opts.WrapCode = jupyter.BashWrapCode
		opts.ShellExited = jupyter.BashShellExited
		opts.ShellSame = jupyter.BashShellSame
		if i := slices.IndexFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PATH=") }); i >= 0 {
			// The kernel starts its shell by PATH: without a bash on the
			// sandbox's, it gets the default directories after those, and
			// its shell the sandbox's PATH back.
			path := strings.TrimPrefix(env[i], "PATH=")
			if _, err := lookPath("bash", path, "/"); err != nil {
				opts.Env = slices.Clone(env)
				opts.Env[i] = "PATH=" + path + ":" + defaultPath
				opts.SetupCode = jupyter.BashPathCode(path)
			}
		}
	case "r":
		opts.SetupCode = jupyter.RSetupCode
		opts.ValueDisplays = true
	}
	if lk, ok := otherKernels[language]; ok {
		opts.EnvCode, opts.Transport, opts.InterruptByMessage, opts.ReseedCode = lk.envCode, lk.transport, lk.byMessage, lk.reseedCode
	}
	if language == "javascript" || language == "typescript" {
		opts.LateOutput = denoLateOutput
		// The kernel's argv runs deno (through env): the same binary parses.
		// Parsed as TypeScript either way: a javascript context runs it too.
		if deno := denoPath(argv); deno != "" {
			opts.Explain = denoExplain(deno, "ts")
		}
	}
	return opts
}

// denoLateOutput is jupyter.Options.LateOutput for Deno's kernel, which
// itself sleeps 5 ms after a reply for the task that sends its streams.
const denoLateOutput = 50 * time.Millisecond

// context returns a started context by id. One still starting is waited
// for (until ctx ends): a request that names it, such as a second first
// run racing the one that creates it, gets the kernel once it is up, or
// the error its start ended with.
func (s *Server) context(ctx context.Context, id string) (*codeContext, error) {
	cs := s.cfg.Contexts
	cs.mu.Lock()
	cc, ok := cs.ctxs[id]
	cs.mu.Unlock()
	if !ok {
		return nil, pandastack.Errorf(pandastack.ENotFound, "no code context %s in this sandbox", id)
	}
	if cc.started != nil {
		select {
		case <-cc.started:
		case <-ctx.Done():
			return nil, pandastack.Errorf(pandastack.EConflict, "context %s is still starting", id)
		}
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cc.kernel == nil {
		return nil, cc.startErr
	}
	return cc, nil
}

// runContext returns the context a run of id goes to; with create (the
// run's RunRequest.Create), one that does not exist yet is created first.
// Two first runs at once create it once: the second waits for the first's
// kernel, as a run after a POST /v1/contexts would.
func (s *Server) runContext(ctx context.Context, id string, create *agentproto.ContextRequest) (*codeContext, error) {
	cc, err := s.context(ctx, id)
	if create == nil || !pandastack.IsCode(err, pandastack.ENotFound) {
		return cc, err
	}
	if create.ID != id {
		return nil, pandastack.Errorf(pandastack.EInvalid, "the run's create names context %q, not this run's %s", create.ID, id)
	}
	cc, err = s.newContext(ctx, *create)
	if pandastack.IsCode(err, pandastack.EConflict) {
		return s.context(ctx, id)
	}
	return cc, err
}

// ready returns the contexts whose kernel has started, oldest first.
func (cs *Contexts) ready() []*codeContext {
	cs.mu.Lock()
	ccs := make([]*codeContext, 0, len(cs.ctxs))
	for _, cc := range cs.ctxs {
		if cc.kernel != nil {
			ccs = append(ccs, cc)
		}
	}
	cs.mu.Unlock()
	sort.Slice(ccs, func(i, j int) bool { return ccs[i].created < ccs[j].created })
	return ccs
}

// readyIDs returns the ids of the contexts whose kernel has started.
func (cs *Contexts) readyIDs() []string {
	ccs := cs.ready()
	ids := make([]string, len(ccs))
	for i, cc := range ccs {
		ids[i] = cc.info.ID
	}
	return ids
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request) error {
	ccs := s.cfg.Contexts.ready()
	list := make([]agentproto.Context, len(ccs))
	for i, cc := range ccs {
		list[i] = cc.info
	}
	writeJSON(w, http.StatusOK, list)
	return nil
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request) error {
	cc, err := s.context(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	cs := s.cfg.Contexts
	cs.mu.Lock()
	delete(cs.ctxs, cc.info.ID)
	cs.mu.Unlock()
	cc.kernel.Close()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) interruptContext(w http.ResponseWriter, r *http.Request) error {
	// Not waited for: an interrupt that reached a kernel just started, with
	// no cell yet, would be lost, and the cell sent next would run on.
	cs := s.cfg.Contexts
	cs.mu.Lock()
	c := cs.ctxs[r.PathValue("id")]
	starting := c != nil && c.kernel == nil
	cs.mu.Unlock()
	if starting {
		return pandastack.Errorf(pandastack.EConflict, "context %s is still starting: nothing runs in it yet to interrupt", r.PathValue("id"))
	}
	cc, err := s.context(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if err := cc.kernel.Interrupt(); err != nil {
		if errors.Is(err, jupyter.ErrClosed) { // deleted meanwhile
			return pandastack.Errorf(pandastack.ENotFound, "context %s was deleted", cc.info.ID)
		}
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request) error {
	cc, err := s.context(r.Context(), r.PathValue("id"))
	if err != nil {
		return err
	}
	if diskFull() {
		return pandastack.Errorf(pandastack.ETooLarge, "no space left on the sandbox's disk to restart the %s kernel of context %s; delete files", cc.info.Language, cc.info.ID)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 60*time.Second)
	defer cancel()
	if err := cc.kernel.Restart(ctx); err != nil {
		if errors.Is(err, jupyter.ErrClosed) { // deleted meanwhile
			return pandastack.Errorf(pandastack.ENotFound, "context %s was deleted", cc.info.ID)
		}
		return fmt.Errorf("restart %s: %w", cc.info.ID, err)
	}
	writeJSON(w, http.StatusOK, cc.info)
	return nil
}

// diskFull reports whether the sandbox's disk has no room for a kernel to
// start: a new context's kernel fails to start there, when its connection
// file is written, but a restarted one reuses that file, starts, and then
// fails its first cell (ipykernel finds no usable temporary directory).
func diskFull() bool {
	f, err := os.CreateTemp(os.TempDir(), ".pandastack-room-*")
	if err == nil {
		_, err = f.Write(make([]byte, 4096))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		os.Remove(f.Name())
	}
	return errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT)
}

// busyGrace is how long a run that finds its context busy waits for the
// cell there to be cancelled before it answers conflict.
const busyGrace = 250 * time.Millisecond

func (s *Server) runCode(w http.ResponseWriter, r *http.Request) error {
	begun := time.Now()
	var req agentproto.RunRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return pandastack.Errorf(pandastack.EInvalid, "bad run request: %v", err)
	}
	cc, err := s.runContext(r.Context(), r.PathValue("id"), req.Create)
	if err != nil {
		return err
	}
	if req.Language != "" && req.Language != cc.info.Language {
		return pandastack.Errorf(pandastack.EInvalid, "context %s runs %s, not %s; leave out the language, or use a %s context", cc.info.ID, cc.info.Language, req.Language, req.Language)
	}
	// A cell whose caller hung up a moment ago may not know it yet (the
	// hang-up crosses the server first): give it busyGrace to start
	// stopping. A cancelled cell being stopped: Execute waits for it.
	for deadline := time.Now().Add(busyGrace); cc.kernel.Busy() && !cc.kernel.Stopping() && time.Now().Before(deadline) && r.Context().Err() == nil; {
		time.Sleep(10 * time.Millisecond)
	}
	if cc.kernel.Busy() && !cc.kernel.Stopping() {
		return pandastack.Errorf(pandastack.EConflict, "context %s is busy running other code; wait for it, or interrupt it", cc.info.ID)
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	started := false
	var mu sync.Mutex
	send := func(ev agentproto.CodeEvent) {
		mu.Lock()
		defer mu.Unlock()
		if !started {
			w.WriteHeader(http.StatusOK)
			started = true
		}
		enc.Encode(ev)
		rc.Flush()
	}
	timing := &agentproto.RunTiming{}
	opts := jupyter.ExecOptions{Timeout: time.Duration(req.TimeoutMS) * time.Millisecond, OutputCap: req.OutputCap, Env: req.Env, NoHistory: req.NoHistory, Timing: timing}
	s.cfg.Contexts.wakeMemoryWatch() // a cell may allocate fast: watch at the busy pace now
	executing := time.Now()
	ex, err := cc.kernel.Execute(r.Context(), req.Code, opts, func(ev agentproto.CodeEvent) {
		if ev.Type != "execution" {
			send(ev)
		}
	})
	if errors.Is(err, jupyter.ErrDead) && cc.info.AutoRestart {
		ex, err = s.autoRestart(r, cc, err)
		if err == nil {
			send(agentproto.CodeEvent{Type: "error", Error: ex.Error})
		}
	}
	if errors.Is(err, jupyter.ErrRestarted) {
		ex, err = agentproto.Execution{Results: []agentproto.Result{}, Error: &agentproto.ExecutionError{
			Name:  "KernelRestarted",
			Value: "the kernel of context " + cc.info.ID + " was restarted, since a cell before this one, whose caller went away, did not stop after an interrupt: its variables and imports are lost, and this code was not run; run it again, with any setup it needs",
		}}, nil
		send(agentproto.CodeEvent{Type: "error", Error: ex.Error})
	}
	if err != nil {
		switch {
		case errors.Is(err, jupyter.ErrInvalid):
			err = pandastack.Errorf(pandastack.EInvalid, "%v", err)
		case errors.Is(err, jupyter.ErrBusy):
			err = pandastack.Errorf(pandastack.EConflict, "context %s is busy running other code; wait for it, or interrupt it", cc.info.ID)
		case errors.Is(err, jupyter.ErrDead):
			err = pandastack.Errorf(pandastack.EConflict, "the kernel of context %s has died; restart it (POST …/contexts/%s/restart)", cc.info.ID, cc.info.ID)
		case errors.Is(err, jupyter.ErrClosed):
			err = pandastack.Errorf(pandastack.ENotFound, "context %s was deleted", cc.info.ID)
		}
		if !started {
			return err
		}
		ex = agentproto.Execution{Error: &agentproto.ExecutionError{Name: "SandboxError", Value: err.Error()}}
	}
	timing.QueueUS += executing.Sub(begun).Microseconds()
	timing.HandlerUS = time.Since(begun).Microseconds()
	send(agentproto.CodeEvent{Type: "execution", Execution: &ex, Timing: timing})
	return nil
}

// autoRestart restarts the dead kernel of cc for a run that found it dead,
// and answers that run with a KernelRestarted error: its code did not run,
// since whatever it builds on is gone with the old kernel's state.
func (s *Server) autoRestart(r *http.Request, cc *codeContext, dead error) (agentproto.Execution, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 60*time.Second)
	defer cancel()
	start := time.Now()
	why := strings.TrimPrefix(dead.Error(), jupyter.ErrDead.Error())
	why = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(why), "("), ")")
	if why == "" {
		why = "it had died"
	}
	if diskFull() {
		return agentproto.Execution{}, pandastack.Errorf(pandastack.ETooLarge, "the kernel of context %s had died (%s), and no space is left on the sandbox's disk to restart it; delete files (an exec of rm works), then run again", cc.info.ID, why)
	}
	// Two runs that found it dead restart it once; both report the loss.
	if _, err := cc.kernel.RestartIfDead(ctx); err != nil {
		return agentproto.Execution{}, fmt.Errorf("restart the dead kernel of context %s: %w", cc.info.ID, err)
	}
	s.log.Info("restarted a dead kernel", "context", cc.info.ID, "reason", why)
	return agentproto.Execution{
		Results:    []agentproto.Result{},
		DurationMS: time.Since(start).Milliseconds(),
		Error: &agentproto.ExecutionError{
			Name:  "KernelRestarted",
			Value: "the kernel of context " + cc.info.ID + " had died (" + why + "), so it was restarted: its variables and imports are lost, and this code was not run; run it again, with any setup it needs",
		},
	}, nil
}
