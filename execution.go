package pandastack

// The public results of running code and commands. They are the API's
// answers as clients see them; the agent's wire package (internal/agentproto)
// and the Go client (client/) alias these types, so a change to the agent
// protocol cannot change the public API without a change here.

// CodeContext describes a code context: a Jupyter kernel in a sandbox.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
	// AutoRestart: a run on a kernel that died restarts it first and
	// answers KernelRestarted (the code did not run).
	AutoRestart bool `json:"auto_restart"`
}

// Result is one rich output of a cell: a display_data or the execute_result.
type Result struct {
	IsMainResult bool           `json:"is_main_result"`
	Text         string         `json:"text,omitempty"`
	HTML         string         `json:"html,omitempty"`
	Markdown     string         `json:"markdown,omitempty"`
	SVG          string         `json:"svg,omitempty"`
	PNG          string         `json:"png,omitempty"`  // base64
	JPEG         string         `json:"jpeg,omitempty"` // base64
	PDF          string         `json:"pdf,omitempty"`  // base64
	LaTeX        string         `json:"latex,omitempty"`
	JSON         any            `json:"json,omitempty"`
	JavaScript   string         `json:"javascript,omitempty"`
	Plotly       any            `json:"plotly,omitempty"` // application/vnd.plotly.v1+json
	Extra        map[string]any `json:"extra,omitempty"`  // any other MIME type
	// Chart is a displayed matplotlib figure's structure and Data a
	// displayed DataFrame's or Series' rows, as JSON objects built in the
	// kernel by the code-interpreter template's extension (schemas in
	// docs/code-and-snapshots.md and the OpenAPI document).
	Chart map[string]any `json:"chart,omitempty"`
	Data  map[string]any `json:"data,omitempty"`
}

// ExecutionError is a cell's exception.
type ExecutionError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"` // plain text, no ANSI escapes
}

// Execution is the whole outcome of one run of code in a context.
type Execution struct {
	ExecutionCount int             `json:"execution_count"`
	Stdout         string          `json:"stdout"`
	Stderr         string          `json:"stderr"`
	Text           string          `json:"text,omitempty"` // the main result's text/plain
	PNG            string          `json:"png,omitempty"`  // the cell's first PNG, base64
	Error          *ExecutionError `json:"error"`
	Results        []Result        `json:"results"`
	DurationMS     int64           `json:"duration_ms"`
}

// ProcessesKilled is what a kill of every process of the sandbox user
// (but the kernels) did: Killed processes, and Remaining, those still found
// at the end, each sent a kill then (0 unless they forked faster than the
// kill went round for its 10 s; kill again).
type ProcessesKilled struct {
	Killed    int `json:"killed"`
	Remaining int `json:"remaining"`
}

// FileEvent is one line of a directory watch's stream (GET
// …/files/watch): a change under the directory, or news of the watch.
type FileEvent struct {
	// Type is one of the FileEvent* constants.
	Type  string `json:"type"`
	Path  string `json:"path,omitempty"`   // the file the change is about (absolute); for FileEventWatching, the directory
	Name  string `json:"name,omitempty"`   // Path relative to the watched directory
	IsDir bool   `json:"is_dir,omitempty"` // the file is a directory
	// Error says why the watch ended, on a FileEventError line (the last).
	Error *StreamError `json:"error,omitempty"`
}

// Types of FileEvent.
const (
	FileEventWatching = "watching" // the first line: the watch is live, changes from now on are reported
	FileEventCreate   = "create"   // a file or directory appeared (made, or moved here)
	FileEventWrite    = "write"    // a file's contents changed (writes in a row come as one)
	FileEventRemove   = "remove"   // a file or directory was deleted
	FileEventRename   = "rename"   // moved away from Path; its new name, if watched, comes as a create
	FileEventChmod    = "chmod"    // permissions, owner or times changed
	FileEventOverflow = "overflow" // changes were lost (the kernel's queue filled up): list the directory again
	// FileEventKeepalive comes from the server every 30 s while nothing
	// else does; clients skip it.
	FileEventKeepalive = "keepalive"
	FileEventError     = "error" // the last line: the watch ended, Error says why
)

// StreamError is an error that ends a stream after its answer began: the
// code and message an error answer would have had.
type StreamError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// ExecResult is the outcome of a command (exec) answered as one document.
type ExecResult struct {
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	ExitCode        int    `json:"exit_code"`
	Signal          string `json:"signal,omitempty"`
	DurationMS      int64  `json:"duration_ms"`
	TimedOut        bool   `json:"timed_out"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
}
