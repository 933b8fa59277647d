package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/pandastack/pandastack"
)

// Snapshot is a saved sandbox state as the API shows it.
type Snapshot = pandastack.Snapshot

// CreateSnapshot saves a running sandbox's memory, processes and files; the
// sandbox keeps running. The server answers conflict while a command or
// cell runs in it (snapshots never wait).
func (c *Client) CreateSnapshot(ctx context.Context, id string, metadata map[string]string) (*Snapshot, error) {
	var snap Snapshot
	body := map[string]any{"metadata": metadata}
	return &snap, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/snapshots", nil, body, &snap)
}

// GetSnapshot returns one snapshot.
func (c *Client) GetSnapshot(ctx context.Context, sid string) (*Snapshot, error) {
	var snap Snapshot
	return &snap, c.do(ctx, http.MethodGet, "/v1/snapshots/"+url.PathEscape(sid), nil, nil, &snap)
}

// ListSnapshots lists the snapshots whose metadata has all the given pairs,
// and the disk they use together.
func (c *Client) ListSnapshots(ctx context.Context, metadata map[string]string) ([]Snapshot, int64, error) {
	q := url.Values{}
	for k, v := range metadata {
		q.Set("metadata."+k, v)
	}
	var out struct {
		Snapshots      []Snapshot `json:"snapshots"`
		TotalSizeBytes int64      `json:"total_size_bytes"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/snapshots", q, nil, &out)
	return out.Snapshots, out.TotalSizeBytes, err
}

// DeleteSnapshot removes a snapshot and its files; sandboxes restored from
// it keep running.
func (c *Client) DeleteSnapshot(ctx context.Context, sid string) error {
	return c.do(ctx, http.MethodDelete, "/v1/snapshots/"+url.PathEscape(sid), nil, nil, nil)
}

// RestoreRequest is the body of POST /v1/sandboxes that restores a
// snapshot: the template, resources and env come from the snapshot.
type RestoreRequest struct {
	SnapshotID string            `json:"snapshot_id"`
	TTLSeconds int64             `json:"ttl_seconds,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	AutoResume bool              `json:"auto_resume,omitempty"`
	// IdleTimeoutSeconds as in CreateSandboxRequest (nil: the server's
	// default).
	IdleTimeoutSeconds *int64 `json:"idle_timeout_seconds,omitempty"`
	// Network replaces the snapshot's policy; nil keeps it.
	Network *NetworkPolicy `json:"network,omitempty"`
}

// CreateSandboxFromSnapshot starts a new sandbox from a snapshot; its code
// contexts, files and working directories are as they were.
func (c *Client) CreateSandboxFromSnapshot(ctx context.Context, req RestoreRequest) (*Sandbox, error) {
	var sb Sandbox
	return &sb, c.do(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &sb)
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork. Count 0 means 1.
type ForkRequest struct {
	Count      int               `json:"count,omitempty"`
	TTLSeconds int64             `json:"ttl_seconds,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	// Network is each child's egress policy from its first instant; nil:
	// the parent's.
	Network *NetworkPolicy `json:"network,omitempty"`
}

// Fork makes independent copies of a running sandbox, each starting from
// its state at this instant; it returns once every child runs, or fails
// with none left behind.
func (c *Client) Fork(ctx context.Context, id string, req ForkRequest) ([]Sandbox, error) {
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	return out.Sandboxes, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/fork", nil, req, &out)
}

// Pause checkpoints a sandbox to disk and frees its memory and CPU.
func (c *Client) Pause(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	return &sb, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/pause", nil, nil, &sb)
}

// Resume brings a paused sandbox back with everything in place.
func (c *Client) Resume(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	return &sb, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/resume", nil, nil, &sb)
}
