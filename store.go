package pandastack

import (
	"context"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Store persists projects, API keys, sandbox records and snapshot records.
// Implementations are safe for concurrent use, also by several processes
// sharing one database where the implementation allows it (PostgreSQL):
// each method is atomic. Every method returns an *Error with ENotFound when
// the record it names does not exist, EInvalid for a record whose text fails
// StorableText, and wraps any other failure (a locked or broken database) as
// a plain error. Methods are short queries on an embedded or nearby
// database; they honour ctx cancellation between statements.
type Store interface {
	// CreateProject adds a project; a duplicate name is an EConflict.
	CreateProject(ctx context.Context, p Project) error
	// ProjectByName returns the project with that name.
	ProjectByName(ctx context.Context, name string) (Project, error)
	// ListProjects returns every project, oldest first.
	ListProjects(ctx context.Context) ([]Project, error)

	// CreateAPIKey stores k (its Hash, never the secret).
	CreateAPIKey(ctx context.Context, k APIKey) error
	// APIKeyByHash returns the key with that hash, revoked or not.
	APIKeyByHash(ctx context.Context, hash string) (APIKey, error)
	// ListAPIKeys returns every key, oldest first.
	ListAPIKeys(ctx context.Context) ([]APIKey, error)
	// RevokeAPIKey marks the key with that id (or, failing that, the unique
	// unrevoked key whose Prefix starts with it) revoked at t.
	RevokeAPIKey(ctx context.Context, idOrPrefix string, t time.Time) error

	// CreateSandbox stores a new record; a duplicate id is an EConflict.
	CreateSandbox(ctx context.Context, s Sandbox) error
	// GetSandbox returns the sandbox id of project projectID; an empty
	// projectID matches any project. Another project's sandbox is ENotFound.
	GetSandbox(ctx context.Context, projectID, id string) (Sandbox, error)
	// ListSandboxes returns the matching sandboxes, oldest first (those
	// created in the same millisecond by id), or a page of them (f.Limit,
	// f.After, f.Newest): a page starts at its cursor in an index, so its
	// cost does not grow with the pages before it. A cursor whose ID is
	// not text a store keeps (a NUL) may be refused with EInvalid.
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]Sandbox, error)
	// SetSandboxState records a state change. For StateStopped reason and
	// at are kept as StopReason and StoppedAt; for StatePaused reason is
	// kept as PauseReason; any other state clears all three.
	SetSandboxState(ctx context.Context, id string, state SandboxState, reason string, at time.Time) error
	// SetSandboxIdleTimeout sets IdleTimeoutSeconds.
	SetSandboxIdleTimeout(ctx context.Context, id string, seconds int64) error
	// SetSandboxExpiry moves a sandbox's expiry.
	SetSandboxExpiry(ctx context.Context, id string, expiresAt time.Time) error
	// DeleteSandbox removes the record.
	DeleteSandbox(ctx context.Context, id string) error
	// ExpiredSandboxes returns the sandboxes not yet stopped (paused ones
	// included) whose expiry is at or before now.
	ExpiredSandboxes(ctx context.Context, now time.Time) ([]Sandbox, error)
	// PurgeStoppedSandboxes deletes records stopped before t and returns how many.
	PurgeStoppedSandboxes(ctx context.Context, before time.Time) (int, error)

	// CreateSnapshot stores a new snapshot record; a duplicate id is an
	// EConflict. The record does not depend on its sandbox's: it outlives
	// DeleteSandbox and PurgeStoppedSandboxes of that sandbox.
	CreateSnapshot(ctx context.Context, snap Snapshot) error
	// GetSnapshot returns the snapshot id of project projectID; an empty
	// projectID matches any project. Another project's snapshot is ENotFound.
	GetSnapshot(ctx context.Context, projectID, id string) (Snapshot, error)
	// ListSnapshots returns the snapshots of project projectID (an empty
	// projectID means all projects), oldest first. Every metadata key must
	// be present with exactly its value, as in SandboxFilter.Metadata.
	ListSnapshots(ctx context.Context, projectID string, metadata map[string]string) ([]Snapshot, error)
	// DeleteSnapshot removes the record.
	DeleteSnapshot(ctx context.Context, id string) error

	NodeStore

	// HistoryStore: runs and origins (history.go).
	HistoryStore

	// Close releases the database.
	Close() error
}

// StoreErrors is implemented by a Store that can tell, among the plain
// errors its methods return, those of a database that cannot be reached
// or has no room left. The API answers such an error with EUnavailable
// (503: retry) or EStorage (507) instead of EInternal.
type StoreErrors interface {
	// ClassifyError returns err wrapped in an *Error with such a code, or
	// err unchanged.
	ClassifyError(err error) error
}

// StorableText reports whether every Store can hold each of ss: valid UTF-8
// with no NUL character (PostgreSQL's text holds neither). A Store refuses a
// record holding anything else with EInvalid, and a lookup by such a string
// finds nothing (ENotFound, or an empty list).
func StorableText(ss ...string) bool {
	for _, s := range ss {
		if !utf8.ValidString(s) || strings.ContainsRune(s, 0) {
			return false
		}
	}
	return true
}

// ValidLabel checks a name people read in lists (an API key's, a
// project's): at most 256 bytes of UTF-8 without control characters, which
// a terminal listing it would obey (escape sequences, line breaks).
func ValidLabel(what, s string) error {
	if len(s) > 256 || !utf8.ValidString(s) || strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return Errorf(EInvalid, "%s must be at most 256 bytes of UTF-8 without control characters (line breaks, tabs, escapes), got %q", what, s)
	}
	return nil
}

// ErrUnstorableText is the EInvalid a Store returns for a record of kind
// what (named name) holding text that fails StorableText.
func ErrUnstorableText(what, name string) error {
	return Errorf(EInvalid, "%s %q: text must be UTF-8 without NUL characters", what, name)
}
