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
