package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// CreateContext starts a code context (a Jupyter kernel) in the sandbox.
// Afterwards HasContext knows the id, also when the create failed because
// the context exists (EConflict).
func (c *AgentClient) CreateContext(ctx context.Context, req agentproto.ContextRequest) (agentproto.Context, error) {
	var out agentproto.Context
	err := c.do(ctx, http.MethodPost, "/v1/contexts", nil, req, &out)
	if err == nil || pandastack.IsCode(err, pandastack.EConflict) {
		c.contexts.Store(req.ID, true)
	}
	return out, err
}

// HasContext reports whether this session made or found the context id
// (CreateContext) and did not delete it since (DeleteContext): for the
// default context, which a run creates on first use, so that later runs
// need not ask. Contexts go only through DeleteContext. A new session (a
// resume, a restore) starts knowing the contexts its agent's hello lists,
// and, for the resume of an image this process paused, those the session
// before the pause knew (knowContexts; an older agent's hello lists none).
func (c *AgentClient) HasContext(id string) bool {
	_, ok := c.contexts.Load(id)
	return ok
}

// KnownContexts returns the ids HasContext knows, in no order.
func (c *AgentClient) KnownContexts() []string {
	var ids []string
	c.contexts.Range(func(k, _ any) bool {
		ids = append(ids, k.(string))
		return true
	})
	return ids
}

// knowContexts makes HasContext know ids: for a session with an agent
// resumed from the image a pause of this process wrote, whose contexts are
// the ones the session before the pause knew.
func (c *AgentClient) knowContexts(ids []string) {
	for _, id := range ids {
		c.contexts.Store(id, true)
	}
}

// ListContexts lists the sandbox's code contexts.
func (c *AgentClient) ListContexts(ctx context.Context) ([]agentproto.Context, error) {
	var out []agentproto.Context
	err := c.do(ctx, http.MethodGet, "/v1/contexts", nil, nil, &out)
	if out == nil && err == nil {
		out = []agentproto.Context{}
	}
	return out, err
}

func contextPath(id, sub string) string { return "/v1/contexts/" + url.PathEscape(id) + sub }

// DeleteContext shuts the context's kernel down.
func (c *AgentClient) DeleteContext(ctx context.Context, id string) error {
	c.contexts.Delete(id)
	return c.do(ctx, http.MethodDelete, contextPath(id, ""), nil, nil, nil)
}

// InterruptContext interrupts the code running in a context.
func (c *AgentClient) InterruptContext(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodPost, contextPath(id, "/interrupt"), nil, nil, nil)
}

// RestartContext restarts a context's kernel; its state is lost.
func (c *AgentClient) RestartContext(ctx context.Context, id string) (agentproto.Context, error) {
	var out agentproto.Context
	err := c.do(ctx, http.MethodPost, contextPath(id, "/restart"), nil, nil, &out)
	return out, err
}

// RunCode runs code in a context, calling onEvent for each output as it
// happens (not for the final execution), and returns the whole Execution.
// With req.Create (for an agent whose hello names
// agentproto.FeatureRunCreates) the agent creates a missing context first,
// and HasContext knows it once the run started.
func (c *AgentClient) RunCode(ctx context.Context, id string, req agentproto.RunRequest, onEvent func(agentproto.CodeEvent) error) (agentproto.Execution, error) {
	ex, _, err := c.RunCodeTimed(ctx, id, req, onEvent)
	return ex, err
}

// RunCodeTimed is RunCode that also returns the agent's breakdown of the
// run (nil from an agent that gives none).
func (c *AgentClient) RunCodeTimed(ctx context.Context, id string, req agentproto.RunRequest, onEvent func(agentproto.CodeEvent) error) (agentproto.Execution, *agentproto.RunTiming, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // hanging up interrupts the kernel in the sandbox
	b, err := json.Marshal(req)
	if err != nil {
		return agentproto.Execution{}, nil, err
	}
	kills := c.oomKills()
	resp, err := c.request(ctx, http.MethodPost, contextPath(id, "/run"), nil, bytes.NewReader(b))
	if err != nil {
		if pandastack.IsCode(err, pandastack.ENotFound) {
			// Gone after all (a create that conflicted with one that
			// then failed): the next CreateContext finds out.
			c.contexts.Delete(id)
		}
		return agentproto.Execution{}, nil, err
	}
	if req.Create != nil {
		c.contexts.Store(id, true) // the run started: the context exists
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	// The agent caps a run's outputs (1 MiB per stream, 32 MiB of results),
	// so a longer line is a broken agent, not output to hold.
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var ev agentproto.CodeEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return agentproto.Execution{}, nil, fmt.Errorf("run %s: bad event: %w", id, err)
		}
		if ev.Type == "execution" && ev.Execution != nil {
			explainHostKernelKill(ev.Execution, kills, c.oomKills)
			return *ev.Execution, ev.Timing, nil
		}
		if onEvent != nil {
			ev.Timing = nil // the agent's, for the host only
			if err := onEvent(ev); err != nil {
				return agentproto.Execution{}, nil, err
			}
		}
	}
	return agentproto.Execution{}, nil, c.streamEnded(ctx, sc.Err(), "running code")
}
