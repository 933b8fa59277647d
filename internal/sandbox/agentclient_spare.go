package sandbox

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// PrepareSpares asks the agent to keep spare kernels started and warmed up,
// and returns once they are ready (see agentproto.SparesRequest).
func (c *AgentClient) PrepareSpares(ctx context.Context, req agentproto.SparesRequest) (agentproto.Spares, error) {
	var out agentproto.Spares
	err := c.do(ctx, http.MethodPost, "/v1/contexts/spares", nil, req, &out)
	return out, err
}

// ListSpares reports the agent's spare kernels.
func (c *AgentClient) ListSpares(ctx context.Context) ([]agentproto.Spares, error) {
	var out []agentproto.Spares
	err := c.do(ctx, http.MethodGet, "/v1/contexts/spares", nil, nil, &out)
	return out, err
}

// TouchSpares runs a no-op in every spare kernel, so a lazily restored
// sandbox loads their pages now rather than on its first context.
func (c *AgentClient) TouchSpares(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/v1/contexts/spares/touch", nil, nil, nil)
}

// ReleaseSpares readies an idle sandbox for its suspend: the agent shuts
// its spare kernels down until the resume.
func (c *AgentClient) ReleaseSpares(ctx context.Context) (agentproto.Released, error) {
	var out agentproto.Released
	err := c.do(ctx, http.MethodPost, "/v1/contexts/spares/release", nil, nil, &out)
	return out, err
}

// RefillSpares undoes ReleaseSpares when the suspend did not happen (a
// resume's hello does it otherwise).
func (c *AgentClient) RefillSpares(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/v1/contexts/spares/refill", nil, nil, nil)
}

// HoldSpares readies a sandbox for a fork's checkpoint: the agent starts
// no spare kernel until UnholdSpares (or the next hello), and gives up a
// start in flight, waiting up to wait for it to end (see agentproto.Held);
// with release, it also shuts the ready spares down.
func (c *AgentClient) HoldSpares(ctx context.Context, wait time.Duration, release bool) (agentproto.Held, error) {
	var out agentproto.Held
	q := url.Values{"wait_ms": {strconv.FormatInt(wait.Milliseconds(), 10)}}
	if release {
		q.Set("release", "1")
	}
	err := c.do(ctx, http.MethodPost, "/v1/contexts/spares/hold", q, nil, &out)
	return out, err
}

// UnholdSpares ends one HoldSpares: once none is left, the agent may start
// its missing spares again.
func (c *AgentClient) UnholdSpares(ctx context.Context) error {
	return c.do(ctx, http.MethodDelete, "/v1/contexts/spares/hold", nil, nil, nil)
}

// DialAgent opens a host session with the agent of a sandbox the caller
// started or restored itself through a Runtime (rwc is its channel), as the
// manager does: for tools that drive a runtime directly, such as the
// benchmark's restore profile. reseed asks the agent to reseed its kernels'
// random generators, as after a restore from a shared image.
func DialAgent(ctx context.Context, id string, rwc io.ReadWriteCloser, reseed bool) (*AgentClient, error) {
	return dialAgent(ctx, id, rwc, reseed)
}
