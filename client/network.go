package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/pandastack/pandastack"
)

// NetworkPolicy is a sandbox's egress policy.
type NetworkPolicy = pandastack.NetworkPolicy

// SetNetwork replaces a sandbox's egress policy; it takes effect at once.
func (c *Client) SetNetwork(ctx context.Context, id string, p NetworkPolicy) (*Sandbox, error) {
	var sb Sandbox
	return &sb, c.do(ctx, http.MethodPut, "/v1/sandboxes/"+url.PathEscape(id)+"/network", nil, p, &sb)
}

// EgressEntry is one line of a sandbox's egress log.
type EgressEntry = pandastack.EgressEntry

// NetworkLog returns a sandbox's egress log, oldest first.
func (c *Client) NetworkLog(ctx context.Context, id string) ([]EgressEntry, error) {
	var out struct {
		Entries []EgressEntry `json:"entries"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/network/log", nil, nil, &out)
	return out.Entries, err
}
