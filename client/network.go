package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

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

// NetworkLog returns a sandbox's egress log, oldest first: DNS answers,
// connections through NAT or the domain proxy, and connects the firewall
// refused (Allowed false).
func (c *Client) NetworkLog(ctx context.Context, id string) ([]EgressEntry, error) {
	var out struct {
		Entries []EgressEntry `json:"entries"`
	}
	err := c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/network/log", nil, nil, &out)
	return out.Entries, err
}

// PortURL is the URL of a sandbox port through the server's port proxy;
// requests to it need the API key (Authorization header).
func (c *Client) PortURL(id string, port int) string {
	return strings.TrimRight(c.BaseURL, "/") + "/v1/sandboxes/" + url.PathEscape(id) + "/ports/" + strconv.Itoa(port) + "/"
}

// PortToken is a URL of a sandbox port that works without the API key.
type PortToken struct {
	URL       string    `json:"url"`
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// CreatePortToken makes a revocable, expiring URL for a sandbox port that
// works in a browser with no header (ttl 0: the server's default, 1 h;
// a part of a second rounds up).
func (c *Client) CreatePortToken(ctx context.Context, id string, port int, ttl time.Duration) (*PortToken, error) {
	body := map[string]any{}
	if ttl > 0 {
		body["ttl_seconds"] = wholeSeconds(ttl) // rounded up, as SetTTL does
	}
	var tok PortToken
	return &tok, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/ports/"+strconv.Itoa(port)+"/token", nil, body, &tok)
}

// RevokePortTokens revokes every token of a sandbox port.
func (c *Client) RevokePortTokens(ctx context.Context, id string, port int) error {
	return c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id)+"/ports/"+strconv.Itoa(port)+"/token", nil, nil, nil)
}
