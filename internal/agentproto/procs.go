package agentproto

import "time"

// Background processes: commands that outlive the request that started
// them. The agent keeps their output, so a caller can read it later.
//
//	POST /v1/processes                 ExecRequest  → Process (started, not waited for)
//	GET  /v1/processes                              → []Process, oldest first
//	GET  /v1/processes/{pid}/output[?follow=1]      → 200 NDJSON stream of ExecEvent from the first kept byte;
//	                                                  "exit" last once the process has ended. Without follow the
//	                                                  stream ends with what there is; with it, at the exit.
//	POST /v1/processes/{pid}/stdin     StdinRequest → 204
//	POST /v1/processes/{pid}/kill                   → 204 (SIGKILL to its process tree)

// Process describes a background process.
type Process struct {
	PID       int       `json:"pid"`
	Cmd       string    `json:"cmd"` // the shell command, or argv joined by spaces
	Cwd       string    `json:"cwd"`
	StartedAt time.Time `json:"started_at"`
	Running   bool      `json:"running"`
	// Once it has ended:
	ExitCode *int   `json:"exit_code,omitempty"` // -1 when killed by a signal
	Signal   string `json:"signal,omitempty"`
	TimedOut bool   `json:"timed_out,omitempty"`
	// OutputDropped counts the oldest output bytes no longer kept.
	OutputDropped int64 `json:"output_dropped,omitempty"`
}

// StdinRequest writes to a background process's standard input.
type StdinRequest struct {
	Data []byte `json:"data,omitempty"`
	EOF  bool   `json:"eof,omitempty"` // close stdin after Data
}
