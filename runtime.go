package pandastack

import (
	"context"
	"io"
)

// RuntimeSpec describes one sandbox for a Runtime to start.
type RuntimeSpec struct {
	ID       string   // the sandbox id; also the runtime's container id
	RootFS   string   // host path of the template's root filesystem; never written to
	Env      []string // KEY=VALUE pairs for the agent, passed on to user processes
	CPU      int      // CPUs (a quota of CPU*100 ms per 100 ms); 0 means unlimited
	MemoryMB int      // memory limit of the whole sandbox; 0 means unlimited
	PIDs     int      // limit on processes and threads; 0 means unlimited
	// DiskMB sizes the sandbox's own disk, the writable layer over RootFS
	// (and /tmp): a full disk is ENOSPC to the writer, not a dead sandbox.
	// 0 means the runtime's default. A restore keeps the size the image
	// was taken with.
	DiskMB int
	// Lazy (Restore only) lets the sandbox run while its memory is still
	// being loaded: a faster restore, slower first steps.
	Lazy bool
	// NetNS is the path of a network namespace holding one configured
	// interface that the sandbox's own network stack takes over; "" gives
	// the sandbox a loopback interface only.
	NetNS string
	// Network is the egress policy of a sandbox with networking; nil keeps
	// the one it had (a resume) or takes the server's default. Only a
	// networking layer in front of the runtime reads it.
	Network *NetworkPolicy
}

// RuntimeState is what the runtime knows of a sandbox.
type RuntimeState string

const (
	RuntimeRunning RuntimeState = "running"
	RuntimeStopped RuntimeState = "stopped" // exited or killed but not yet removed
)

// RuntimeStats are host-side resource figures of one sandbox.
type RuntimeStats struct {
	PSSBytes int64 // proportional set size of all its host processes
	PIDs     []int // its host processes
	CPUNanos int64 // CPU time used by all of it since it started (restored), in ns; -1 when unknown
	// MemoryBytes is the memory charged to it on the host, what its memory
	// limit counts, less file cache not in active use; -1 when unknown.
	// PSSBytes can be far less: the sandbox's memory is mapped by processes
	// that run its code, not only by those PIDs names.
	MemoryBytes int64
}

// Runtime isolates sandboxes on the host. The in-sandbox agent is PID 1 of
// every sandbox; the runtime connects the agent's stdin and stdout to the
// channel it returns. Implementations are safe for concurrent use and keep
// their sandboxes alive independently of any ctx passed in: ctx bounds only
// the call itself.
type Runtime interface {
	// Start boots a sandbox and returns the channel to its agent: writes go
	// to the agent's stdin, reads come from its stdout. On any failure
	// nothing of the sandbox is left on the host. A failure the runtime
	// knows would come again (a bad spec or image, no room) carries an
	// *Error code; the manager boots once more after one that carries
	// none (a process of the sandbox killed half-way). Costs one sandbox
	// boot (about 0.2 s on gVisor).
	Start(ctx context.Context, spec RuntimeSpec) (io.ReadWriteCloser, error)
	// Attach opens a new channel to a running sandbox, e.g. after the server
	// restarted. Bytes of an earlier channel may still be in flight; the
	// agent protocol resynchronises. ENotFound if the runtime has no such sandbox.
	Attach(ctx context.Context, id string) (io.ReadWriteCloser, error)
	// Stop kills the sandbox and removes everything of it from the host
	// (processes, runtime state, mounts, cgroups, temp files). Stopping an
	// unknown or already stopped sandbox is not an error.
	Stop(ctx context.Context, id string) error
	// State reports whether the sandbox runs. ENotFound if unknown.
	State(ctx context.Context, id string) (RuntimeState, error)
	// List returns the ids of every sandbox this runtime holds any state of.
	List(ctx context.Context) ([]string, error)
	// Stats measures the sandbox's host processes. ENotFound if unknown.
	Stats(ctx context.Context, id string) (RuntimeStats, error)
	// Checkpoint saves the sandbox's whole state (memory, processes, the
	// in-sandbox filesystem) as an image in the existing empty directory
	// imageDir. With leaveRunning the sandbox goes on unchanged; without,
	// it is stopped and removed as by Stop (pause). On failure imageDir
	// may hold partial files; the caller removes them. Costs about 0.3 s
	// plus the time to write the sandbox's memory.
	Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error
	// Restore boots a new sandbox spec.ID from an image written by
	// Checkpoint. spec.RootFS must be the root filesystem the image was
	// taken on. The image can be restored any number of times (fork). The
	// channel and failure behaviour are as for Start.
	Restore(ctx context.Context, spec RuntimeSpec, imageDir string) (io.ReadWriteCloser, error)
	// Alive reports whether the sandbox's processes still run. Cheap (a
	// file read or two after the first call), so it can be polled.
	Alive(id string) bool
	// DeathReason says why a sandbox that stopped answering died, when the
	// runtime knows: ReasonOutOfMemory, ReasonPIDsLimit, or "" for unknown. Call it before
	// Stop, which removes the evidence. Cheap: a file read. A runtime whose
	// sandboxes outlive some kills of the host's OOM killer tells a death
	// of one by what Alive last saw survived, so Alive must be polled.
	DeathReason(id string) string
}

// RuntimeUsage is a Runtime that reads a sandbox's CPU time or memory
// alone, cheaper than Stats (optional: the manager asks for it with a
// type assertion).
type RuntimeUsage interface {
	// CPUNanos is RuntimeStats.CPUNanos of sandbox id: -1 when unknown,
	// ENotFound when the runtime has no such sandbox.
	CPUNanos(ctx context.Context, id string) (int64, error)
	// MemoryBytes is RuntimeStats.MemoryBytes of sandbox id, likewise.
	MemoryBytes(ctx context.Context, id string) (int64, error)
}

// RuntimeLogs is a Runtime that keeps a sandbox's own logs (optional: the
// manager asks for it with a type assertion when a sandbox died before its
// agent answered, to say why).
type RuntimeLogs interface {
	// LogTail is the last lines of what the runtime logged for sandbox id,
	// one line, or "" when it has nothing. Call it before Stop, which
	// removes the logs.
	LogTail(id string) string
}

// RuntimeOOMKills is a Runtime that counts the processes its host's
// out-of-memory killer killed in a sandbox (optional: the manager asks for
// it with a type assertion). The agent's memory watch kills a process
// filling the sandbox and says so on its stderr; a process growing faster
// than the watch looks can reach the host's limit first, and the host
// kills a task without a word. A count that went up while a command ran
// tells the server to say so instead.
type RuntimeOOMKills interface {
	// OOMKills is how many processes of sandbox id the host's
	// out-of-memory killer has killed since it started or was restored,
	// or -1 when the runtime cannot tell. Cheap: a file read.
	OOMKills(id string) int64
}

// RuntimePreparer is a Runtime that can do the start of a Restore ahead of
// it (optional: the manager asks for it with a type assertion).
type RuntimePreparer interface {
	// Prepare readies a Restore of spec from imageDir: the sandbox's host
	// processes are started and wait, so that the Restore of spec.ID with
	// the same spec only loads the image. A Restore with another spec, or
	// Stop, removes the prepared sandbox. Until then it holds host
	// processes and some memory (no image), and State says stopped. On
	// failure nothing of it is left. EConflict if the runtime holds the id
	// already. Costs the start of a restore; ctx bounds the call only.
	Prepare(ctx context.Context, spec RuntimeSpec, imageDir string) error
	// Rename gives the sandbox prepared as from, not yet restored, the id
	// to: the Restore of to (with the spec prepared but for its ID)
	// restores into it, and every later call names it to. It lets a
	// restore whose id is fixed (a suspended sandbox's resume) use a
	// sandbox prepared ahead under an id of its own. ENotFound if from is
	// not prepared, EConflict if the runtime holds to already; then
	// nothing changed. On another failure from is removed. Cheap (no
	// process is started).
	Rename(ctx context.Context, from, to string) error
}

// ReasonOutOfMemory: the sandbox hit its memory limit and was killed.
const ReasonOutOfMemory = "out_of_memory"

// ReasonPIDsLimit: the sandbox filled its pids limit and died of it.
const ReasonPIDsLimit = "pids_limit"
