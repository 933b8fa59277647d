package pandastack

import (
	"context"
	"slices"
	"time"
)

// HistoryEntry is one thing run in a sandbox through the API (a command, a
// code cell, a terminal session) with its output, as an operator reads it.
type HistoryEntry struct {
	ID         string    `json:"id"`
	Kind       string    `json:"kind"`                 // exec, code or terminal
	Command    string    `json:"command,omitempty"`    // exec: the command line (argv joined by spaces)
	Code       string    `json:"code,omitempty"`       // code: the cell's source
	Language   string    `json:"language,omitempty"`   // code
	ContextID  string    `json:"context_id,omitempty"` // code
	StartedAt  time.Time `json:"started_at"`
	DurationMS int64     `json:"duration_ms"`
	Running    bool      `json:"running"`
	Stdout     string    `json:"stdout"` // for a terminal: its transcript, escape sequences removed
	Stderr     string    `json:"stderr"`
	Text       string    `json:"text,omitempty"`      // code: the main result's text
	Results    []string  `json:"results,omitempty"`   // code: the kinds of rich outputs, e.g. "png", "html"
	ExitCode   *int      `json:"exit_code,omitempty"` // exec and terminal
	// Background: an exec with background: true, recorded when it started
	// as process PID; its output and exit are the process's
	// (GET …/processes/{pid}/output), not the entry's.
	Background      bool          `json:"background,omitempty"`
	PID             int           `json:"pid,omitempty"`
	TimedOut        bool          `json:"timed_out,omitempty"`
	Error           *HistoryError `json:"error,omitempty"`   // code: the cell's exception
	Failure         string        `json:"failure,omitempty"` // the request itself failed (or the server stopped): why
	OutputTruncated bool          `json:"output_truncated,omitempty"`
}

// HistoryError is a cell's exception in a HistoryEntry.
type HistoryError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// Origin says where a sandbox came from.
type Origin struct {
	SandboxID string    `json:"sandbox_id"`
	Kind      string    `json:"kind"` // "snapshot": restored from a snapshot; "fork": forked from a sandbox
	From      string    `json:"from"` // the snapshot's or the parent sandbox's id
	At        time.Time `json:"at"`
}

// HistoryStore persists what was run in sandboxes and where sandboxes came
// from, so both outlive the sandbox and a restart of serve. Every Store is
// one. The rules of Store (errors, atomicity, cancellation) apply.
type HistoryStore interface {
	// PutHistory stores e in the history of the project's sandbox: a new
	// entry, newest of all, or, when an entry with e.ID exists, its
	// replacement (keeping its place). Then only the newest keep entries of
	// that sandbox are kept (keep <= 0: all). Times keep milliseconds.
	PutHistory(ctx context.Context, projectID, sandboxID string, e HistoryEntry, keep int) error
	// ListHistory returns the entries of the project's sandbox, newest
	// first; none (no error) for an unknown sandbox or another project's.
	ListHistory(ctx context.Context, projectID, sandboxID string) ([]HistoryEntry, error)
	// TrimHistory forgets old entries until all the entries together hold
	// at most maxBytes of text (as stored), and returns how many went. It
	// takes them from the projects that hold the most, each project's
	// oldest first, down to a share no smaller project is cut to
	// (HistoryShare): one project's flood of output forgets its own
	// entries, not another's. It reads every entry's size: call it now and
	// then, not per entry.
	TrimHistory(ctx context.Context, maxBytes int64) (int, error)

	// AddOrigin records o in the project, then keeps only the project's
	// newest keep origins (keep <= 0: all). A second origin for one
	// sandbox is an EConflict.
	AddOrigin(ctx context.Context, projectID string, o Origin, keep int) error
	// ListOrigins returns the project's origins, oldest first.
	ListOrigins(ctx context.Context, projectID string) ([]Origin, error)
}

// HistoryShare is the most history a project may keep when the projects
// hold held bytes each and all may keep maxBytes together: the largest
// share such that every project keeps min(held, share) and the sum fits.
// Projects that hold less than the share keep all they hold. -1 when all
// already fits.
func HistoryShare(held []int64, maxBytes int64) int64 {
	var total int64
	for _, h := range held {
		total += h
	}
	if total <= maxBytes {
		return -1
	}
	sorted := slices.Clone(held)
	slices.Sort(sorted)
	left := max(maxBytes, 0) // for the projects not yet given their whole holding
	for i, h := range sorted {
		rest := int64(len(sorted) - i)
		if h*rest > left {
			return left / rest // this one and every larger one keep the same share
		}
		left -= h
	}
	return sorted[len(sorted)-1] // not reached: the total did not fit
}
