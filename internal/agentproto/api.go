package agentproto

import (
	"io"
	"strings"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/pandastack/pandastack"
)

// The agent's HTTP API, spoken over each yamux stream (HTTP/1.1):
//
//	GET    /v1/hello[?reseed=1][&large_frames=1][&resolver=ADDR][&ca_marker=1] → Hello (reseed: after a restore of a
//	                                     shared image, see code.go; large_frames: the host reads frames of up to
//	                                     1 MiB, see AllowLargeFrames; resolver and ca_marker: see Hello)
//	POST   /v1/exec           ExecRequest → 200 NDJSON stream of ExecEvent, ending with one "exit" event
//	PUT    /v1/files?path=P   raw body    → FileInfo (parents created; owned by the sandbox user)
//	GET    /v1/files?path=P               → raw file content
//	DELETE /v1/files?path=P[&recursive=1] → 204
//	GET    /v1/files/list?path=P          → []FileInfo
//	GET    /v1/files/stat?path=P          → FileInfo
//	POST   /v1/files/mkdir?path=P         → FileInfo (like mkdir -p)
//
// Relative paths are resolved against the sandbox user's home. Every failure
// answers with a non-2xx status and an ErrorBody whose code is one of the
// pandastack E* codes, which the host passes on to the API client unchanged.

// Paths inside every sandbox.
const (
	AgentPath = "/.pandastack/agent" // the agent binary, mounted read-only
	UserName  = "user"
	UserUID   = 1000
	UserGID   = 1000
	UserHome  = "/home/user"
)

// NProcEnv names the environment variable of the agent's process (set by
// the runtime) that holds the RLIMIT_NPROC the agent sets on itself at
// boot, inherited by everything it starts.
const NProcEnv = "PANDASTACK_NPROC"

// Hello answers GET /v1/hello; the host sends it first on every new session.
type Hello struct {
	ProtocolVersion int       `json:"protocol_version"`
	AgentVersion    string    `json:"agent_version"`
	Epoch           uint32    `json:"epoch"` // the epoch of the session that asked
	BootedAt        time.Time `json:"booted_at"`
	// Contexts are the ids of the code contexts the agent has ready (a warm
	// image's default context, say), so that the host need not ask before
	// the first run in one. Older agents leave it out.
	Contexts []string `json:"contexts,omitempty"`
	// Features names what this agent does beyond its protocol version
	// (the Feature* constants). Older agents leave it out, and a host
	// asks them the older way.
	Features []string `json:"features,omitempty"`
	// Resolver is the nameserver address the hello wrote into
	// /etc/resolv.conf (ResolvConf) when asked (resolver=ADDR): the
	// host's setup of a sandbox, done without a round trip of its own.
	// Empty when not asked, or from an older agent.
	Resolver string `json:"resolver,omitempty"`
	// CAMarker is what CAMarkerPath holds (trimmed; "" when missing),
	// when asked (ca_marker=1): the host then knows whether the sandbox
	// trusts its certificates already. Nil from an older agent.
	CAMarker *string `json:"ca_marker,omitempty"`
}

// Features an agent names in its hello.
const (
	// FeatureRunCreates: a run (POST /v1/contexts/{id}/run) whose
	// RunRequest.Create is set creates its context first when there is
	// none, in the same round trip.
	FeatureRunCreates = "run_creates_context"
	// FeatureHostname: the hello sets the sandbox's hostname to the one
	// its id gives (Hostname) when it finds another, so a sandbox may be
	// restored into a container created under another id (a resume into
	// one prepared ahead) and keep its name.
	FeatureHostname = "sets_hostname"
	// FeatureDisk: GET /v1/disk answers the sandbox's disk use (Disk).
	FeatureDisk = "disk"
	// FeatureKillAll: POST /v1/processes/kill kills every process of the
	// sandbox user but the code contexts' kernels (KillAll).
	FeatureKillAll = "kill_all"
	// FeatureWatch: GET /v1/files/watch streams the changes in a
	// directory (FileEvent lines).
	FeatureWatch = "watch"
)

// KillAll answers POST /v1/processes/kill.
type KillAll = pandastack.ProcessesKilled

// FileEvent is one line of GET /v1/files/watch's NDJSON stream.
type FileEvent = pandastack.FileEvent

// Disk answers GET /v1/disk: the sandbox's root filesystem (its disk, the
// writable layer over its template) as statfs sees it from inside.
type Disk struct {
	SizeBytes int64 `json:"size_bytes"`
	UsedBytes int64 `json:"used_bytes"`
}

// Hostname is the hostname of sandbox id: sbx_abc is sbx-abc (an
// underscore is no letter of a hostname).
func Hostname(id string) string { return strings.ReplaceAll(id, "_", "-") }

// HasFeature reports whether the hello names feature f.
func (h Hello) HasFeature(f string) bool {
	for _, g := range h.Features {
		if g == f {
			return true
		}
	}
	return false
}

// CAMarkerPath holds the digest of the certificates the host installed in
// a sandbox's trust store (its caMarker).
const CAMarkerPath = "/usr/local/share/pandastack/ca.sha256"

// ResolvConf is the /etc/resolv.conf that points a sandbox at the resolver
// on its gateway, nameserver.
func ResolvConf(nameserver string) string {
	return "# pandastack: the sandbox resolver, on its gateway\nnameserver " + nameserver + "\n"
}

// EnvRequest (POST /v1/env) sets environment variables for every process
// the agent starts from then on; an empty value removes one.
type EnvRequest struct {
	Env map[string]string `json:"env"`
}

// ExecRequest runs one command. Exactly one of Argv and Cmd is set; Cmd is a
// shell string run by /bin/bash -c (or /bin/sh -c where bash is missing).
type ExecRequest struct {
	Argv      []string          `json:"argv,omitempty"`
	Cmd       string            `json:"cmd,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`        // default: the user's home
	TimeoutMS int64             `json:"timeout_ms,omitempty"` // 0: no timeout (the request's lifetime bounds it)
	Stdin     []byte            `json:"stdin,omitempty"`      // written to the command's stdin, which is then closed
	Root      bool              `json:"root,omitempty"`       // run as root instead of the sandbox user (host-internal use)
}

// ExecEvent is one line of the exec stream.
type ExecEvent struct {
	Type       string `json:"type"`           // "stdout", "stderr" or "exit"
	Data       []byte `json:"data,omitempty"` // stdout/stderr bytes
	ExitCode   int    `json:"exit_code"`      // exit: the exit status; -1 when killed by a signal
	Signal     string `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
}

// FileInfo describes one file in the sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"` // absolute
	Type    string    `json:"type"` // "file", "dir", "symlink" or "other"
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"` // permission bits in octal, e.g. "0644"
	ModTime time.Time `json:"mod_time"`
}

// ErrorBody is the JSON of every error answer, on the agent as on the API.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// MuxConfig is the yamux configuration both sides use.
func MuxConfig() *yamux.Config {
	c := yamux.DefaultConfig()
	c.MaxStreamWindowSize = 1 << 20 // 1 MiB windows keep uploads fast over the pipe
	c.KeepAliveInterval = 15 * time.Second
	c.ConnectionWriteTimeout = 30 * time.Second
	c.StreamOpenTimeout = 30 * time.Second
	c.LogOutput = io.Discard
	return c
}
