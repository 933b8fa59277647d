package sandbox

import (
	"context"
	"net/http"

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
