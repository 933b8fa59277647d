package client

import (
	"context"
	"net/http"
	"net/url"
)

// ContextOptions are the settings of a new code context.
type ContextOptions struct {
	Language string            `json:"language,omitempty"` // "" means python
	Cwd      string            `json:"cwd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	// AutoRestart: nil means the server's default (true): a run on a
	// kernel that died restarts it and answers KernelRestarted.
	AutoRestart *bool `json:"auto_restart,omitempty"`
}

// CreateContextWith starts a code context with all of its options.
func (c *Client) CreateContextWith(ctx context.Context, id string, opts ContextOptions) (*Context, error) {
	var out Context
	return &out, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/contexts", nil, opts, &out)
}
