package agentproto

// Code contexts: Jupyter kernels inside the sandbox, spoken to by the agent.
//
//	POST   /v1/contexts                 ContextRequest → Context
//	GET    /v1/contexts                               → []Context
//	DELETE /v1/contexts/{id}                          → 204 (the kernel process is gone)
//	POST   /v1/contexts/{id}/interrupt                → 204
//	POST   /v1/contexts/{id}/restart                  → Context
//	POST   /v1/contexts/{id}/run        RunRequest    → 200 NDJSON stream of CodeEvent, ending with one "execution" event

// ContextRequest creates a context.
type ContextRequest struct {
	ID       string            `json:"id"`       // chosen by the host ("ctx_…")
	Language string            `json:"language"` // "python", "bash", "javascript", "typescript" or "r"
	Cwd      string            `json:"cwd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
}

// Context describes a code context.
type Context struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// RunRequest runs code in a context.
type RunRequest struct {
	Code      string            `json:"code"`
	TimeoutMS int64             `json:"timeout_ms,omitempty"` // 0: none
	Env       map[string]string `json:"env,omitempty"`        // set for this run only
	OutputCap int               `json:"output_cap,omitempty"` // bytes kept per stream; 0: 1 MiB
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
	// Chart is a displayed matplotlib figure's structure (ChartMIME), Data
	// a displayed DataFrame's or Series' table (TableMIME): decoded JSON,
	// built in the kernel by the code-interpreter template's extension.
	Chart any `json:"chart,omitempty"`
	Data  any `json:"data,omitempty"`
}

// MIME types of the structured data the code-interpreter template's IPython
// extension adds beside a figure's PNG and a DataFrame's HTML.
const (
	ChartMIME = "application/vnd.pandastack.chart+json"
	TableMIME = "application/vnd.pandastack.table+json"
)

// ExecutionError is a cell's exception.
type ExecutionError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"` // plain text, no ANSI escapes
}

// Execution is the whole outcome of one run.
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

// CodeEvent is one line of a run's stream.
type CodeEvent struct {
	Type      string          `json:"type"` // "stdout", "stderr", "result", "error" or "execution"
	Data      string          `json:"data,omitempty"`
	Result    *Result         `json:"result,omitempty"`
	Error     *ExecutionError `json:"error,omitempty"`
	Execution *Execution      `json:"execution,omitempty"`
}
