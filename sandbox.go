package pandastack

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
	"time"
)

// SandboxState is the life-cycle state of a sandbox as users see it.
type SandboxState string

const (
	StateStarting SandboxState = "starting" // the runtime is booting it
	StateRunning  SandboxState = "running"  // its agent answers
	StatePaused   SandboxState = "paused"   // checkpointed to disk, its memory and CPU freed; resumes on request (see PauseReason)
	StateStopped  SandboxState = "stopped"  // gone from the runtime; the record stays for a while
)

// Reasons a sandbox stopped, reported in Sandbox.StopReason.
const (
	StopExpired = "expired"       // its TTL ran out
	StopKilled  = "killed"        // DELETE or `pandastack sandbox kill`
	StopDied    = "died"          // the runtime lost it (a crash)
	StopOOM     = "out_of_memory" // it used more than its memory_mb and was killed
	// StopPIDsLimit: its processes and threads (gVisor's own included)
	// filled the host's pids limit and it could not go on.
	StopPIDsLimit = "pids_limit"
	StopLost      = "lost"         // after a server restart its agent could not be reached, or its node stopped heartbeating (node.go)
	StopFailed    = "start_failed" // creation failed part-way
)

// Reasons a sandbox is paused, reported in Sandbox.PauseReason.
const (
	PauseRequested = ""       // POST …/pause
	PauseIdle      = "idle"   // nothing ran in it for its idle timeout; the next request resumes it
	PauseMemory    = "memory" // the host ran short of memory and it was among the quietest; the next request resumes it
)

// Suspended says whether a paused sandbox's reason is the server's own
// (idleness or the host's memory): such a sandbox resumes on its next
// request, whatever its AutoResume.
func Suspended(pauseReason string) bool {
	return pauseReason == PauseIdle || pauseReason == PauseMemory
}

// Sandbox is the stored record of one sandbox.
type Sandbox struct {
	ID         string            `json:"id"`
	ProjectID  string            `json:"-"`
	Template   string            `json:"template"`
	State      SandboxState      `json:"state"`
	Metadata   map[string]string `json:"metadata"`
	CPU        int               `json:"cpu"`
	MemoryMB   int               `json:"memory_mb"`
	CreatedAt  time.Time         `json:"created_at"`
	ExpiresAt  time.Time         `json:"expires_at"`
	StoppedAt  *time.Time        `json:"stopped_at,omitempty"`
	StopReason string            `json:"stop_reason,omitempty"`
	AutoResume bool              `json:"auto_resume"` // resume automatically on any request while paused
	// IdleTimeoutSeconds: after this long with nothing in flight and its CPU
	// quiet, the sandbox is paused to disk (PauseIdle) until the next
	// request; 0 never.
	IdleTimeoutSeconds int64  `json:"idle_timeout_seconds"`
	PauseReason        string `json:"pause_reason,omitempty"` // while paused: PauseIdle, PauseMemory, or "" when asked for
	// RootFS is the host path of the root filesystem it runs on, which its
	// checkpoints need; server-internal ("" in records older than it).
	RootFS string `json:"-"`
	// Network is its egress policy; nil when the server runs without
	// sandbox networking. Kept by the network layer, not the store.
	Network *NetworkPolicy `json:"network,omitempty"`
	// NodeID is the node that runs it (node.go); "" in records made
	// before nodes existed, until the first node to start on the store
	// claims them (NodeStore.ClaimSandboxesOfNoNode).
	NodeID string `json:"node_id,omitempty"`
}

// Snapshot is a saved sandbox state: memory, processes and filesystem.
type Snapshot struct {
	ID        string            `json:"id"` // "snap_…"
	ProjectID string            `json:"-"`
	SandboxID string            `json:"sandbox_id"` // the sandbox it was taken of
	Template  string            `json:"template"`
	SizeBytes int64             `json:"size_bytes"`
	Metadata  map[string]string `json:"metadata"`
	CreatedAt time.Time         `json:"created_at"`
	CPU       int               `json:"cpu"`
	MemoryMB  int               `json:"memory_mb"`
	// Network is the egress policy a restore applies unless it gives one
	// (that of the sandbox when it was taken); nil for a server without
	// sandbox networking, and for snapshots taken before it was kept.
	Network *NetworkPolicy `json:"network,omitempty"`
}

// SandboxFilter selects sandboxes in List. Zero fields match everything.
type SandboxFilter struct {
	ProjectID string            // required by the API layer; empty means all projects (server-internal use)
	States    []SandboxState    // any of these states
	Metadata  map[string]string // every key must be present with exactly this value
	// Node: only the sandboxes of this node, and those of no node (records
	// made before nodes existed).
	Node string
	// A page of the list: at most Limit sandboxes (0: all of them), only
	// those after After (nil: from the start) in the list's order, and
	// newest first when Newest is set.
	Limit  int
	After  *SandboxCursor
	Newest bool
}

// SandboxCursor is a place in a list of sandboxes: the last sandbox of a
// page. Lists are ordered by CreatedAt (in milliseconds, as stored) and
// then by ID, so a cursor stays valid whatever is created or removed
// meanwhile.
type SandboxCursor struct {
	CreatedAt time.Time
	ID        string
}

// CursorOf is the cursor of sb, the last sandbox of a page.
func CursorOf(sb Sandbox) *SandboxCursor {
	return &SandboxCursor{CreatedAt: sb.CreatedAt, ID: sb.ID}
}

// Project owns API keys and everything created with them.
type Project struct {
	ID        string    `json:"id"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
}

// APIKey is a stored key. The secret itself is never stored, only its hash.
type APIKey struct {
	ID        string     `json:"id"`
	ProjectID string     `json:"project_id"`
	Name      string     `json:"name"`
	Prefix    string     `json:"prefix"` // the first characters of the secret, to recognise it
	Hash      string     `json:"-"`
	CreatedAt time.Time  `json:"created_at"`
	RevokedAt *time.Time `json:"revoked_at,omitempty"`
	// Scope is what the key may do: ScopeAll (also "", keys made before
	// scopes), or ScopeSandboxes, everything but managing the project's keys.
	Scope string `json:"scope"`
}

// API key scopes.
const (
	ScopeAll       = "all"       // everything of its project, its keys included
	ScopeSandboxes = "sandboxes" // sandboxes, snapshots and the rest, not the keys
)

// ParseScope checks an API key scope as a caller gives it; "" is ScopeAll.
func ParseScope(s string) (string, error) {
	switch s {
	case "", ScopeAll:
		return ScopeAll, nil
	case ScopeSandboxes:
		return s, nil
	}
	return "", Errorf(EInvalid, "scope must be %q (everything, the project's keys included) or %q (everything but the keys), got %.40q", ScopeAll, ScopeSandboxes, s)
}

// NewID returns prefix + "_" + 16 random lower-case base32 characters (80 bits).
func NewID(prefix string) string {
	return prefix + "_" + randomToken(10)
}

// randomToken returns n random bytes as lower-case unpadded base32.
func randomToken(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

// NewAPIKeySecret returns a fresh key secret: "pds_" and 32 random characters (160 bits).
func NewAPIKeySecret() string { return "pds_" + randomToken(20) }
