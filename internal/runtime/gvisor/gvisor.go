// Package gvisor is the Runtime driver that isolates each sandbox in a gVisor
// (runsc) container on the systrap platform. Only cmd/ and tests import it.
//
// Every sandbox gets a directory under StateDir/sandboxes/<id> holding its OCI
// bundle, two FIFOs for the agent's stdin and stdout, and logs. FIFOs rather
// than anonymous pipes let a restarted server reattach to a running sandbox:
// the sandbox keeps its ends open, the server just opens the files again.
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pandastack/pandastack"
)

// Config configures the driver.
type Config struct {
	Runsc     string       // path of the runsc binary
	StateDir  string       // holds runsc's state root and one directory per sandbox
	AgentPath string       // host path of the static pandastack-agent binary
	Platform  string       // runsc --platform; "systrap" when empty (no KVM needed)
	Log       *slog.Logger // operator log; nil discards
	// MaxAgentLog is the size past which a sandbox's agent.log is rotated
	// (one old file, agent.log.1, is kept); 0 means DefaultMaxAgentLog.
	MaxAgentLog int64
	// DiskMB is the size of a sandbox's disk when its spec gives none:
	// DefaultDiskMB when 0; negative keeps writes in memory (no disk of
	// its own, the old behaviour).
	DiskMB int
	// DebugLogDir, if set, receives runsc's debug logs (see debugFlags).
	DebugLogDir string
	// Strace, with DebugLogDir, also logs every system call the sandbox's
	// processes make, with its duration (runsc --strace): for counting
	// them (bench's runcode profile). It slows every call down.
	Strace bool
}

// Runtime is the gVisor driver.
type Runtime struct {
	cfg     Config
	root    string // runsc --root
	sbxRoot string // per-sandbox directories
	log     *slog.Logger

	mu       sync.Mutex
	renameMu sync.Mutex              // one Rename at a time
	pids     map[string]aliveProc    // the runsc-sandbox process of each sandbox, for Alive
	prep     map[string]*prepared    // containers created ahead of their restore (prepare.go)
	widened  map[string]*memWidening // memory limits widened for checkpoints, by cgroup (checkpointmem.go)

	stopRotate chan struct{}
	closeOnce  sync.Once

	bootCaps int // the capability revision of boots; 0: capsRevision (a test sets an older one)
}

var (
	_ pandastack.Runtime         = (*Runtime)(nil)
	_ pandastack.RuntimePreparer = (*Runtime)(nil)
)

// New checks the configuration and prepares the state directory.
func New(cfg Config) (*Runtime, error) {
	if cfg.Platform == "" {
		cfg.Platform = "systrap"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.Runsc == "" {
		return nil, errors.New("gvisor: no runsc binary configured")
	}
	if _, err := os.Stat(cfg.Runsc); err != nil {
		return nil, fmt.Errorf("gvisor: runsc: %w", err)
	}
	if st, err := os.Stat(cfg.AgentPath); err != nil || st.IsDir() {
		return nil, fmt.Errorf("gvisor: agent binary %q not found", cfg.AgentPath)
	}
	abs, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	if cfg.MaxAgentLog <= 0 {
		cfg.MaxAgentLog = DefaultMaxAgentLog
	}
	r := &Runtime{cfg: cfg, root: filepath.Join(abs, "runsc"), sbxRoot: filepath.Join(abs, "sandboxes"), log: cfg.Log, pids: map[string]aliveProc{}, prep: map[string]*prepared{}, widened: map[string]*memWidening{}, stopRotate: make(chan struct{})}
	for _, d := range []string{r.root, r.sbxRoot} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("gvisor: %w", err)
		}
	}
	go r.rotateLoop(cfg.MaxAgentLog, 10*time.Second, r.stopRotate)
	return r, nil
}

func (r *Runtime) dir(id string) string { return filepath.Join(r.sbxRoot, id) }

// cid is the runsc container of sandbox id: id itself, or, for a sandbox
// that took over a container prepared under another id (Rename), that
// one's id, which its directory's symlink names.
func (r *Runtime) cid(id string) string {
	c, _ := r.container(id)
	return c
}

// container is cid, and false when id is a container another id took
// over (Rename): calls that name it by its old id find nothing.
func (r *Runtime) container(id string) (string, bool) {
	if !validID(id) {
		return id, true
	}
	if target, err := os.Readlink(r.dir(id)); err == nil && validID(target) {
		return target, true
	}
	// Taken over only while the taker's link names it: a marker left
	// alone by a crash between the two, or by a failed rename, does not
	// count (Stop then removes the container as its own).
	if to, err := os.ReadFile(filepath.Join(r.dir(id), renamedFile)); err == nil && validID(string(to)) {
		if back, err := os.Readlink(r.dir(string(to))); err == nil && back == id {
			return id, false
		}
	}
	return id, true
}

// renamedFile marks the directory of a container that another id took
// over (Rename).
const renamedFile = "renamed"

// globalFlags are the runsc flags shared by every subcommand. runsc creates the
// log file's directory, so only `run` logs into the sandbox's directory:
// anything else would bring a removed directory back.
func (r *Runtime) globalFlags(logFile string) []string {
	return r.flags(logFile, "none", "root:memory")
}

// flags are the global flags with the given --network and --overlay2
// values. network is "none" (loopback only) or "sandbox" (runsc's own
// network stack takes over the interface of the namespace the sandbox
// joins). Only run and restore act on either; other commands (checkpoint
// included) ignore them, and an image checkpointed with either network
// restores with either (tried: the restored stack takes the new
// namespace's addresses and routes).
func (r *Runtime) flags(logFile, network, overlay string) []string {
	return append([]string{
		"--root=" + r.root,
		"--platform=" + r.cfg.Platform,
		"--network=" + network,
		"--overlay2=" + overlay,
		// runsc would log to stdout by default: that is the agent channel.
		"--log=" + logFile,
	}, r.debugFlags()...)
}

// debugFlags turn on runsc's debug logs, one file per runsc process (the
// command, the sandbox, the gofer) with microsecond timestamps: for
// profiling (bench's restore profile), far too verbose for a server.
func (r *Runtime) debugFlags() []string {
	if r.cfg.DebugLogDir == "" {
		return nil
	}
	flags := []string{"--debug", "--debug-log=" + filepath.Clean(r.cfg.DebugLogDir) + "/"}
	if r.cfg.Strace {
		flags = append(flags, "--strace")
	}
	return flags
}

func (r *Runtime) runsc(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.cfg.Runsc, append(r.globalFlags(filepath.Join(filepath.Dir(r.root), "runsc.log")), args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("runsc %s: %w: %s", args[0], err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// Start implements pandastack.Runtime.
func (r *Runtime) Start(ctx context.Context, spec pandastack.RuntimeSpec) (io.ReadWriteCloser, error) {
	return r.boot(ctx, spec, "")
}

// Restore implements pandastack.Runtime.
func (r *Runtime) Restore(ctx context.Context, spec pandastack.RuntimeSpec, imageDir string) (io.ReadWriteCloser, error) {
	if _, err := os.Stat(filepath.Join(imageDir, "checkpoint.img")); err != nil {
		return nil, pandastack.Errorf(pandastack.ESnapshotCorrupt, "no checkpoint image in %s", imageDir)
	}
	return r.boot(ctx, spec, imageDir)
}

// Checkpoint implements pandastack.Runtime.
func (r *Runtime) Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error {
	if !validID(id) {
		return pandastack.Errorf(pandastack.ENotFound, "no sandbox %q in the runtime", id)
	}
	if _, ok := r.container(id); !ok {
		return pandastack.Errorf(pandastack.ENotFound, "no sandbox %q in the runtime", id)
	}
	disk := sandboxDisk(r.dir(id)) // before a checkpoint that stops it removes the dir
	caps := sandboxCaps(r.dir(id))
	agent := sandboxAgent(r.dir(id))
	// Zeroed memory (a DataFrame of zeros, a cleared buffer) is left out
	// of the image. The search for it reads every page the sandbox holds,
	// and a fork of a warm code-interpreter sandbox (0.4 MB of zeroes in
	// 189 MB) took 75 ms to checkpoint without it against 81-94 ms; but a
	// parent holding 512 MB of zeroes then made 655 MB images, and its
	// fork of 4 took 1.1-1.7 s against 0.45 s (session 45).
	args := []string{"checkpoint", "--image-path=" + imageDir, "--exclude-committed-zero-pages"}
	if leaveRunning {
		args = append(args, "--leave-running")
	}
	cid := r.cid(id)
	ended := r.widenForCheckpoint(id, cid)
	_, err := r.runsc(ctx, append(args, cid)...)
	ended()
	if err != nil {
		// Asked only now, on failure, why: a runsc process less (20-40
		// ms here) on the path of every snapshot, fork and pause.
		if st, serr := r.State(ctx, id); serr != nil {
			return serr
		} else if st != pandastack.RuntimeRunning {
			return pandastack.Errorf(pandastack.EUnavailable, "sandbox %s is not running", id)
		}
		return fmt.Errorf("checkpoint %s: %w", id, err)
	}
	merr := errors.Join(markImageDisk(imageDir, disk), markImageCaps(imageDir, caps), markImageAgent(imageDir, agent))
	if !leaveRunning {
		// The container stopped with the checkpoint; remove what is left.
		r.Stop(ctx, id)
	}
	if merr != nil {
		return fmt.Errorf("checkpoint %s: %w", id, merr)
	}
	return nil
}

// boot runs a new container, or restores one from imageDir when set: into
// the container Prepare made for it, when there is one that fits.
func (r *Runtime) boot(ctx context.Context, spec pandastack.RuntimeSpec, imageDir string) (io.ReadWriteCloser, error) {
	if !validID(spec.ID) {
		return nil, pandastack.Errorf(pandastack.EInvalid, "invalid sandbox id %q", spec.ID)
	}
	if imageDir != "" {
		if p := r.takePrepared(spec.ID); p != nil {
			caps, err := r.capsFor(imageDir)
			agent, aerr := r.agentFor(imageDir)
			if p.err == nil && p.key == prepareKey(spec, p.disk) && r.imageDisk(imageDir) == p.disk && err == nil && caps == p.caps && aerr == nil && agent == p.agent {
				conn, err := r.restorePrepared(ctx, spec, imageDir, p)
				if err == nil || ctx.Err() != nil {
					return conn, err
				}
				// The prepared container is an optimisation: one whose
				// processes died meanwhile (the host's OOM killer, a
				// crash) is gone now, and the restore is run afresh.
				r.log.Warn("restore into the prepared container failed; restoring afresh", "sandbox", spec.ID, "err", err)
			} else {
				// Failed, or made for another spec: start afresh.
				r.remove(spec.ID)
			}
		}
	}
	mode := modeRun
	if imageDir != "" {
		mode = modeRestore
	}
	if _, err := r.launch(ctx, spec, imageDir, mode); err != nil {
		return nil, err
	}
	conn, err := r.open(spec.ID)
	if err != nil {
		r.remove(spec.ID)
		return nil, err
	}
	r.log.Debug("sandbox started", "sandbox", spec.ID)
	return conn, nil
}

// What launch runs: runsc run, restore, or create (Prepare).
const (
	modeRun = iota
	modeRestore
	modeCreate
)

// launch makes the sandbox's directory (bundle, FIFOs, disk record) and
// runs runsc in the given mode; it returns the sandbox's disk size. On
// failure nothing of the sandbox is left.
func (r *Runtime) launch(ctx context.Context, spec pandastack.RuntimeSpec, imageDir string, mode int) (_ int, err error) {
	r.forgetPID(spec.ID) // a resume reuses the id with a new process
	dir := r.dir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return 0, pandastack.Errorf(pandastack.EConflict, "sandbox %s already exists in the runtime", spec.ID)
		}
		return 0, fmt.Errorf("start %s: %w", spec.ID, err)
	}
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
		}
	}()
	undo = append(undo, func() { r.cleanup(spec.ID) })

	for _, f := range []string{"in.fifo", "out.fifo"} {
		if err := syscall.Mkfifo(filepath.Join(dir, f), 0o600); err != nil {
			return 0, fmt.Errorf("start %s: mkfifo: %w", spec.ID, err)
		}
	}
	disk, err := r.diskFor(spec, imageDir)
	if err != nil {
		return 0, err
	}
	if disk > 0 && !flagSafe(dir) {
		if imageDir != "" {
			return 0, pandastack.Errorf(pandastack.EInvalid, "the image has a disk, which runsc cannot place in %q (a ',', ':' or '=' in the path)", dir)
		}
		r.log.Warn("the state directory's path cannot carry a disk in runsc's flags; the sandbox writes to memory", "dir", dir)
		disk = 0
	}
	if err := os.WriteFile(filepath.Join(dir, diskFile), []byte(strconv.Itoa(disk)), 0o600); err != nil {
		return 0, fmt.Errorf("start %s: %w", spec.ID, err)
	}
	caps, err := r.capsFor(imageDir)
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, capsFile), []byte(strconv.Itoa(caps)), 0o600); err != nil {
		return 0, fmt.Errorf("start %s: %w", spec.ID, err)
	}
	agent, err := r.agentFor(imageDir)
	if err != nil {
		return 0, err
	}
	cfgJSON, err := json.MarshalIndent(r.ociSpec(spec, disk > 0, caps, agent), "", "  ")
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfgJSON, 0o600); err != nil {
		return 0, fmt.Errorf("start %s: %w", spec.ID, err)
	}

	// The sandbox's own ends, opened O_RDWR so neither side ever sees EOF or
	// EPIPE while the server is away.
	childIn, err := os.OpenFile(filepath.Join(dir, "in.fifo"), os.O_RDWR, 0)
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", spec.ID, err)
	}
	defer childIn.Close()
	childOut, err := os.OpenFile(filepath.Join(dir, "out.fifo"), os.O_RDWR, 0)
	if err != nil {
		return 0, fmt.Errorf("start %s: %w", spec.ID, err)
	}
	defer childOut.Close()

	// Not CommandContext: with --detach runsc returns once the sandbox runs,
	// and killing it half-way would strand a sandbox. ctx bounds the wait.
	var args []string
	switch mode {
	case modeRun:
		args = []string{"run", "--detach", "--bundle=" + dir, spec.ID}
	case modeRestore:
		args = restoreArgs(dir, imageDir, spec.ID, spec.Lazy)
	case modeCreate:
		// The container's stdio is create's: the FIFOs, as for run.
		args = []string{"create", "--bundle=" + dir, spec.ID}
	}
	// Stop, not just runsc delete: a runsc killed half-way may leave
	// children that only a process scan finds.
	undo = append(undo, func() { r.remove(spec.ID) })
	if err := r.runDetached(ctx, spec, disk, args, childIn, childOut); err != nil {
		return 0, err
	}
	return disk, nil
}

// restoreArgs are runsc's arguments to restore imageDir into container
// cid, made from the bundle dir if none was created ahead.
func restoreArgs(dir, imageDir, cid string, lazy bool) []string {
	args := []string{"restore", "--detach", "--bundle=" + dir, "--image-path=" + imageDir, cid}
	if lazy {
		// --background loads memory pages after restore returns.
		args = append(args[:1], append([]string{"--background"}, args[1:]...)...)
	}
	return args
}

// runDetached runs a runsc command that returns once the sandbox is
// created or running, with the sandbox's flags, stdio and logs.
func (r *Runtime) runDetached(ctx context.Context, spec pandastack.RuntimeSpec, disk int, args []string, stdin, stdout *os.File) error {
	cid := r.cid(spec.ID)
	dir := r.dir(cid)
	agentLog, err := os.OpenFile(filepath.Join(dir, "agent.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	defer agentLog.Close()
	network := "none"
	if spec.NetNS != "" {
		network = "sandbox"
	}
	cmd := exec.Command(r.cfg.Runsc, append(r.flags(filepath.Join(dir, "runsc.log"), network, overlayFlag(dir, disk)), args...)...)
	cmd.Stderr = agentLog
	if stdin != nil {
		cmd.Stdin, cmd.Stdout = stdin, stdout
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", spec.ID, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
		return ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("start %s: runsc %s: %w: %s", spec.ID, args[0], err, r.logTail(cid))
	}
	if spec.MemoryMB > 0 {
		// The sentry runs with its total memory taken: now the headroom.
		if err := raiseMemoryLimit(cgroupPath(cid), spec.MemoryMB); err != nil {
			r.log.Warn("raising a sandbox's host memory limit", "sandbox", spec.ID, "err", err)
		}
	}
	if args[0] != "create" { // no task runs yet
		go r.raiseStubs(spec.ID, cid)
	}
	return nil
}

// stubWait bounds raiseStubs' wait for the agent's stub process: a
// restore in a burst of 20 took over 3 s (DESIGN.md).
const stubWait = 30 * time.Second

// stubFirstLook is how long raiseStubs waits before its first look: the
// looks read every process's /proc files, and made at once they slowed a
// create with no pool to its first result by 20-30 ms (bench, p50, side by
// side), in the middle of the agent's hello and the first cell. A sandbox
// that fills the host's limit sooner than this is left with the sentry
// first, as all were before.
const stubFirstLook = 250 * time.Millisecond

// raiseStubs raises the OOM scores of sandbox id's stub processes
// (raiseStubOOMScores) once its agent's stub runs, looking after
// stubFirstLook, then every 20 ms for at most stubWait: runsc returns
// before a restored sandbox's tasks have their stubs. One more look 50 ms
// after the first raise takes the stubs cloned meanwhile from the first
// one before it was raised.
func (r *Runtime) raiseStubs(id, cid string) {
	deadline := time.Now().Add(stubWait)
	time.Sleep(stubFirstLook)
	for {
		agent, raised, err := raiseStubOOMScores(cgroupPath(cid))
		if err != nil {
			r.log.Warn("raising a sandbox's stub processes for the host's OOM killer", "sandbox", id, "err", err)
			return
		}
		if agent {
			if raised > 0 {
				time.Sleep(50 * time.Millisecond)
				if _, _, err := raiseStubOOMScores(cgroupPath(cid)); err != nil {
					r.log.Warn("raising a sandbox's stub processes for the host's OOM killer", "sandbox", id, "err", err)
				}
			}
			return
		}
		if time.Now().After(deadline) {
			r.log.Warn("no stub process of the agent after a while: the host's OOM killer may take the sandbox's sentry rather than a task", "sandbox", id, "waited", stubWait)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// open returns the host's ends of the agent's stdin and stdout.
func (r *Runtime) open(id string) (io.ReadWriteCloser, error) {
	in, err := os.OpenFile(filepath.Join(r.dir(id), "in.fifo"), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open channel %s: %w", id, err)
	}
	out, err := os.OpenFile(filepath.Join(r.dir(id), "out.fifo"), os.O_RDWR, 0)
	if err != nil {
		in.Close()
		return nil, fmt.Errorf("open channel %s: %w", id, err)
	}
	growPipe(in)
	growPipe(out)
	return &pipeConn{w: in, r: out}, nil
}

type pipeConn struct{ w, r *os.File }

func (p *pipeConn) Read(b []byte) (int, error)  { return p.r.Read(b) }
func (p *pipeConn) Write(b []byte) (int, error) { return p.w.Write(b) }
func (p *pipeConn) Close() error {
	err := p.w.Close()
	if err2 := p.r.Close(); err == nil {
		err = err2
	}
	return err
}

// Close stops rotating the sandboxes' logs and unmounts the network namespace that runsc pins under its root to
// speed up later starts (runsc's null-netns). Running sandboxes keep their
// own reference to it; the next start pins a new one. Call it on shutdown.
func (r *Runtime) Close() error {
	r.closeOnce.Do(func() { close(r.stopRotate) })
	p := filepath.Join(r.root, "null-netns")
	// Concurrent starts can stack several bind mounts on the same path.
	for syscall.Unmount(p, syscall.MNT_DETACH) == nil {
	}
	return nil
}

// Alive implements pandastack.Runtime. The sandbox keeps its end of the
// FIFOs open, so the host never reads EOF when it dies: this check is how a
// dead sandbox is noticed at once rather than after a keepalive timeout.
func (r *Runtime) Alive(id string) bool {
	r.mu.Lock()
	p, ok := r.pids[id]
	r.mu.Unlock()
	if !ok {
		// The container once, not on every poll: Rename forgets both ids.
		cid, own := r.container(id)
		if !own {
			return false // another id took it over
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		out, err := r.runsc(ctx, "state", cid)
		if err != nil {
			// Only a container runsc no longer knows is dead; a slow or
			// failing runsc says nothing, and killing on it would be worse.
			return !strings.Contains(err.Error(), "does not exist") && !strings.Contains(err.Error(), "file does not exist")
		}
		var st struct {
			Pid int `json:"pid"`
		}
		if json.Unmarshal(out, &st) != nil || st.Pid <= 0 {
			return false
		}
		p = aliveProc{pid: st.Pid, cid: cid}
		r.mu.Lock()
		r.pids[id] = p
		r.mu.Unlock()
	}
	kills := oomKills(cgroupPath(p.cid))
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid))
	alive := cmdlineAlive(b, err, p.cid)
	if alive {
		// The kernel counts a kill before the victim is gone: a count read
		// now may be the sentry's own kill. One read by an earlier call
		// that finds the sandbox alive still was survived.
		r.mu.Lock()
		if q, ok := r.pids[id]; ok && q.pid == p.pid {
			q.survived = max(q.survived, q.seen)
			q.seen = max(q.seen, kills)
			r.pids[id] = q
		}
		r.mu.Unlock()
	}
	return alive
}

// aliveProc is what Alive keeps of a sandbox: its runsc-sandbox process,
// the container whose id that process's command line names, and the
// host's out-of-memory kills in it: the count it read last (seen) and the
// count it saw the sandbox survive, as the host kills a task before the
// sentry (raiseStubOOMScores): a death is the host's doing only if the
// count rose past that (DeathReason).
type aliveProc struct {
	pid            int
	cid            string
	seen, survived int64
}

// cmdlineAlive reads the answer to a read of a sandbox process's
// /proc/<pid>/cmdline: dead when the process is gone (ENOENT, ESRCH), a
// zombie (an empty command line) or the pid now someone else's (the command
// line does not name the sandbox). Any other failure, such as a server out
// of file descriptors (EMFILE), says nothing about the sandbox, and killing
// a healthy one on it would be worse than asking again in a second.
func cmdlineAlive(b []byte, err error, id string) bool {
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ESRCH)
	}
	return bytes.Contains(b, []byte(id))
}

func (r *Runtime) forgetPID(id string) {
	r.mu.Lock()
	delete(r.pids, id)
	r.mu.Unlock()
}

// DeathReason implements pandastack.Runtime.
func (r *Runtime) DeathReason(id string) string {
	if !validID(id) {
		return ""
	}
	cg := cgroupPath(r.cid(id))
	r.mu.Lock()
	survived := r.pids[id].survived
	r.mu.Unlock()
	switch {
	case oomKills(cg) > survived:
		return pandastack.ReasonOutOfMemory
	case pidsExhausted(cg):
		return pandastack.ReasonPIDsLimit
	}
	return ""
}

// OOMKills implements pandastack.RuntimeOOMKills: the oom_kill count of
// the sandbox's memory cgroup, which a restore starts afresh (a new
// cgroup); -1 for an id another took over (Rename).
func (r *Runtime) OOMKills(id string) int64 {
	if !validID(id) {
		return -1
	}
	cid, own := r.container(id)
	if !own {
		return -1
	}
	return oomKills(cgroupPath(cid))
}

// Attach implements pandastack.Runtime.
func (r *Runtime) Attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	st, err := r.State(ctx, id)
	if err != nil {
		return nil, err
	}
	if st != pandastack.RuntimeRunning {
		return nil, pandastack.Errorf(pandastack.EUnavailable, "sandbox %s is %s", id, st)
	}
	go r.raiseStubs(id, r.cid(id)) // one started by an older build has none raised
	r.narrowAdopted(id, r.cid(id))
	return r.open(id)
}

// Stop implements pandastack.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	if _, ok := r.container(id); !validID(id) || !ok {
		return nil
	}
	r.forgetPrepared(id)
	return r.remove(id)
}

// remove is Stop for the driver's own rollbacks, which may run inside a
// Prepare of id (Stop would wait for that Prepare to end).
func (r *Runtime) remove(id string) error {
	r.forgetPID(id)
	cid := r.cid(id)
	r.forgetWidened(cid)
	r.destroy(cid)
	var err error
	if pids := r.hostPIDs(cid); len(pids) > 0 {
		// Before the cleanup: their cgroups can go only once they exit.
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGKILL)
		}
		err = fmt.Errorf("stop %s: processes %v were still alive after runsc delete; killed", id, pids)
	}
	r.cleanup(id)
	return err
}

// destroy kills and deletes container id; errors mean it was already gone.
func (r *Runtime) destroy(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.runsc(ctx, "delete", "--force", id); err != nil && !strings.Contains(err.Error(), "does not exist") {
		r.log.Warn("runsc delete", "sandbox", id, "err", err)
	}
}

// cleanup removes the sandbox's directory and cgroups, those of the
// container it took over (Rename) too; the symlink that names that
// container goes last, so that a crash half-way leaves it to name what is
// left.
func (r *Runtime) cleanup(id string) {
	cid := r.cid(id)
	os.RemoveAll(r.dir(cid))
	if err := removeCgroups(cgroupPath(cid)); err != nil {
		r.log.Warn("removing the cgroups of a sandbox", "sandbox", id, "err", err)
	}
	if cid != id {
		os.Remove(r.dir(id))
	}
}

// State implements pandastack.Runtime.
func (r *Runtime) State(ctx context.Context, id string) (pandastack.RuntimeState, error) {
	if !validID(id) {
		return "", pandastack.Errorf(pandastack.ENotFound, "no sandbox %q in the runtime", id)
	}
	cid, ok := r.container(id)
	if !ok {
		return "", pandastack.Errorf(pandastack.ENotFound, "no sandbox %q in the runtime", id)
	}
	out, err := r.runsc(ctx, "state", cid)
	if err != nil {
		if !strings.Contains(err.Error(), "does not exist") {
			return "", fmt.Errorf("state %s: %w", id, err) // runsc failed; the sandbox may be fine
		}
		if _, statErr := os.Stat(r.dir(id)); statErr == nil {
			return pandastack.RuntimeStopped, nil
		}
		return "", pandastack.Errorf(pandastack.ENotFound, "no sandbox %q in the runtime", id)
	}
	var st struct {
		Status string `json:"status"`
		PID    int    `json:"pid"`
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return "", fmt.Errorf("state %s: %w", id, err)
	}
	// runsc counts a dead sandbox process that is not reaped yet (a
	// zombie: an init slow to reap, after a kill -9 or the host's OOM
	// killer) as running; so would a restart of serve, and wait in vain
	// for its agent.
	if st.Status == "running" && (st.PID <= 0 || processAlive(st.PID)) {
		return pandastack.RuntimeRunning, nil
	}
	return pandastack.RuntimeStopped, nil
}

// processAlive reports whether pid is a process that has not exited: it
// exists and is no zombie.
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist) // unreadable: assume it lives
	}
	// pid (comm) S ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return true
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}

// List implements pandastack.Runtime.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	seen := map[string]bool{}
	out, err := r.runsc(ctx, "list", "--quiet")
	if err != nil {
		return nil, err
	}
	for _, l := range strings.Fields(string(out)) {
		seen[l] = true
	}
	ents, err := os.ReadDir(r.sbxRoot)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		seen[e.Name()] = true
	}
	// A container taken over by another id (Rename) is listed as that id.
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink != 0 {
			if cid := r.cid(e.Name()); cid != e.Name() {
				delete(seen, cid)
			}
		}
	}
	ids := make([]string, 0, len(seen))
	for id := range seen {
		ids = append(ids, id)
	}
	return ids, nil
}

// Stats implements pandastack.Runtime.
func (r *Runtime) Stats(ctx context.Context, id string) (pandastack.RuntimeStats, error) {
	cid, ok := r.container(id)
	if !ok {
		return pandastack.RuntimeStats{}, pandastack.Errorf(pandastack.ENotFound, "no sandbox %q in the runtime", id)
	}
	pids := r.hostPIDs(cid)
	if len(pids) == 0 {
		return pandastack.RuntimeStats{}, pandastack.Errorf(pandastack.ENotFound, "no processes of sandbox %q", id)
	}
	st := pandastack.RuntimeStats{PIDs: pids, CPUNanos: -1, MemoryBytes: -1}
	if validID(id) {
		st.CPUNanos = cpuNanos(cgroupPath(cid))
		st.MemoryBytes = memoryBytes(cgroupPath(cid))
	}
	for _, p := range pids {
		st.PSSBytes += pss(p)
	}
	return st, nil
}

// CPUNanos implements pandastack.RuntimeUsage: the CPU time in the
// sandbox's cgroup, without Stats' walk of /proc.
func (r *Runtime) CPUNanos(ctx context.Context, id string) (int64, error) {
	cg, err := r.usageCgroup(id)
	if err != nil {
		return -1, err
	}
	return cpuNanos(cg), nil
}

// MemoryBytes implements pandastack.RuntimeUsage: the memory charged to
// the sandbox's cgroup, as Stats counts it.
func (r *Runtime) MemoryBytes(ctx context.Context, id string) (int64, error) {
	cg, err := r.usageCgroup(id)
	if err != nil {
		return -1, err
	}
	return memoryBytes(cg), nil
}

// usageCgroup is the cgroup of sandbox id, which must be in the runtime.
func (r *Runtime) usageCgroup(id string) (string, error) {
	cid, ok := r.container(id)
	if _, err := os.Stat(r.dir(id)); !ok || !validID(id) || err != nil {
		return "", pandastack.Errorf(pandastack.ENotFound, "no sandbox %q in the runtime", id)
	}
	return cgroupPath(cid), nil
}

// hostPIDs finds the host processes of a sandbox (runsc-sandbox, gofer) by
// their command lines, which name our runsc root and the container id.
func (r *Runtime) hostPIDs(id string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(b) == 0 {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if hasArg(args, "--root="+r.root) && hasArg(args, id) {
			pids = append(pids, pid)
		}
	}
	return pids
}

func hasArg(args []string, want string) bool {
	for _, a := range args {
		if a == want {
			return true
		}
	}
	return false
}

// pss reads a process's proportional set size in bytes.
func pss(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "Pss:") {
			f := strings.Fields(l)
			if len(f) >= 2 {
				kb, _ := strconv.ParseInt(f[1], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// LogTail implements pandastack.RuntimeLogs.
func (r *Runtime) LogTail(id string) string {
	if !validID(id) {
		return ""
	}
	return r.logTail(r.cid(id))
}

// logTail returns the last lines of the runsc and agent logs of container
// id, for error messages.
func (r *Runtime) logTail(id string) string {
	var parts []string
	for _, f := range []string{"runsc.log", "agent.log"} {
		b, err := os.ReadFile(filepath.Join(r.dir(id), f))
		if err != nil || len(b) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 10 {
			lines = lines[len(lines)-10:]
		}
		parts = append(parts, f+": "+strings.Join(lines, " | "))
	}
	return strings.Join(parts, "; ")
}

// validID keeps ids safe as path elements and runsc arguments.
func validID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
