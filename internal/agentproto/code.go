package agentproto

import "github.com/pandastack/pandastack"

// Code contexts: Jupyter kernels inside the sandbox, spoken to by the agent.
//
//	POST   /v1/contexts                 ContextRequest → Context
//	GET    /v1/contexts                               → []Context
//	DELETE /v1/contexts/{id}                          → 204 (the kernel process is gone)
//	POST   /v1/contexts/{id}/interrupt                → 204
//	POST   /v1/contexts/{id}/restart                  → Context
//	POST   /v1/contexts/{id}/run        RunRequest    → 200 NDJSON stream of CodeEvent, ending with one "execution" event
//	                                                    (RunRequest.Create: the context is created first if missing)
//
// GET /v1/hello?reseed=1 (see api.go) reseeds every kernel's random
// generators: the host asks for it after restoring an image that other
// sandboxes restore too.

// ContextRequest creates a context.
type ContextRequest struct {
	ID       string            `json:"id"`       // chosen by the host ("ctx_…")
	Language string            `json:"language"` // "python", "bash", "javascript", "typescript", "r" or "java"
	Cwd      string            `json:"cwd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	// AutoRestart: a run on a kernel that died restarts it (and says the
	// state was lost) instead of failing; nil means true.
	AutoRestart *bool `json:"auto_restart,omitempty"`
}

// The results are the public types of the root package: the wire carries
// exactly what the API answers.
type (
	Context        = pandastack.CodeContext
	Result         = pandastack.Result
	ExecutionError = pandastack.ExecutionError
	Execution      = pandastack.Execution
)

// RunRequest runs code in a context.
type RunRequest struct {
	Code      string            `json:"code"`
	TimeoutMS int64             `json:"timeout_ms,omitempty"` // 0: none
	Env       map[string]string `json:"env,omitempty"`        // set for this run only
	OutputCap int               `json:"output_cap,omitempty"` // bytes kept per stream; 0: 1 MiB
	// Language, if set, must be the context's: a mismatch is refused
	// rather than run in the wrong language.
	Language string `json:"language,omitempty"`
	// NoHistory keeps the cell out of execution_count and the history:
	// for the platform's own cells (warm-up), not the user's.
	NoHistory bool `json:"no_history,omitempty"`
	// Create, if set, creates the context as POST /v1/contexts would
	// (its ID must be the run's) when the sandbox has none of that id yet,
	// before the run: the first run in a sandbox's default context in one
	// round trip. An existing context is used as it is. Only for an agent
	// whose hello names FeatureRunCreates.
	Create *ContextRequest `json:"create,omitempty"`
}

// MIME types of the structured data the code-interpreter template's IPython
// extension adds beside a figure's PNG and a DataFrame's HTML (Result.Chart
// and Result.Data).
const (
	ChartMIME = "application/vnd.pandastack.chart+json"
	TableMIME = "application/vnd.pandastack.table+json"
)

// CodeEvent is one line of a run's stream.
type CodeEvent struct {
	Type      string          `json:"type"` // "stdout", "stderr", "result", "error" or "execution"
	Data      string          `json:"data,omitempty"`
	Result    *Result         `json:"result,omitempty"`
	Error     *ExecutionError `json:"error,omitempty"`
	Execution *Execution      `json:"execution,omitempty"`
	// Timing, on the "execution" event only, is where the run's time went
	// inside the sandbox: for the host's debug log, never passed on to
	// API clients.
	Timing *RunTiming `json:"timing,omitempty"`
}

// RunTiming splits a run inside the sandbox, in microseconds. The kernel's
// figures come from the timestamps of its own messages (a Jupyter header's
// date), on the same clock as the agent's. A figure the run did not give
// (a kernel that sent no status, a run that ended early) is 0.
type RunTiming struct {
	// HandlerUS is the agent's whole handling of the request: from its
	// start to the execution event.
	HandlerUS int64 `json:"handler_us"`
	// QueueUS is from the handler's start to the execute_request's send
	// (request decoding, plumbing cells queued ahead of it).
	QueueUS int64 `json:"queue_us"`
	// ToKernelUS is from the send to the kernel's busy status.
	ToKernelUS int64 `json:"to_kernel_us"`
	// ExecuteUS is from the kernel's busy status to its execute_reply:
	// the kernel's handling of the cell.
	ExecuteUS int64 `json:"execute_us"`
	// ReplyToIdleUS is from the kernel's execute_reply to its idle status.
	ReplyToIdleUS int64 `json:"reply_to_idle_us"`
	// BackUS is from the kernel's idle status to the agent's having both
	// the reply and the idle status.
	BackUS int64 `json:"back_us"`
	// KernelUS is from the send to the agent's having both: what the
	// kernel round trip cost the agent.
	KernelUS int64 `json:"kernel_us"`
	// Messages counts the kernel's messages the run got (every channel).
	Messages int `json:"messages"`
}
