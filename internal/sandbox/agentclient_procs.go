package sandbox

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

func processPath(pid int, sub string) string { return "/v1/processes/" + strconv.Itoa(pid) + sub }

// StartProcess starts a command in the background and returns at once; the
// agent keeps its output (see agentproto/procs.go).
func (c *AgentClient) StartProcess(ctx context.Context, req agentproto.ExecRequest) (agentproto.Process, error) {
	var out agentproto.Process
	kills := c.oomKills()
	err := c.do(ctx, http.MethodPost, "/v1/processes", nil, req, &out)
	if err == nil {
		c.procKills.start(out.PID, kills)
	}
	return out, err
}

// ListProcesses lists the background processes, oldest first.
func (c *AgentClient) ListProcesses(ctx context.Context) ([]agentproto.Process, error) {
	var out []agentproto.Process
	err := c.do(ctx, http.MethodGet, "/v1/processes", nil, nil, &out)
	if out == nil && err == nil {
		out = []agentproto.Process{}
	}
	return out, err
}

// ProcessOutput calls onEvent for each kept output event of a background
// process, from the first kept byte, then for its exit event if it has
// ended. With follow it waits for new output until the process ends (or
// ctx ends); without, it returns after what there is. It returns the exit
// event, or nil when the process still runs.
func (c *AgentClient) ProcessOutput(ctx context.Context, pid int, follow bool, onEvent func(agentproto.ExecEvent) error) (*agentproto.ExecEvent, error) {
	q := url.Values{}
	if follow {
		q.Set("follow", "1")
	}
	resp, err := c.request(ctx, http.MethodGet, processPath(pid, "/output"), q, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	onEvent = c.procKills.explain(pid, c.oomKills, onEvent)
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev agentproto.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("process %d output: bad event: %w", pid, err)
		}
		if err := onEvent(ev); err != nil {
			return nil, err
		}
		if ev.Type == "exit" {
			return &ev, nil
		}
	}
	// Without follow the output so far ends the answer; a stream cut off
	// (an error, or the session gone) says how.
	if err := sc.Err(); err != nil || ctx.Err() != nil || c.sess.IsClosed() {
		return nil, c.streamEnded(ctx, err, fmt.Sprintf("the output of process %d", pid))
	}
	return nil, nil
}

// ProcessStdin writes to a background process's input, closing it after
// when req.EOF.
func (c *AgentClient) ProcessStdin(ctx context.Context, pid int, req agentproto.StdinRequest) error {
	return c.do(ctx, http.MethodPost, processPath(pid, "/stdin"), nil, req, nil)
}

// KillProcess SIGKILLs a background process and its descendants.
func (c *AgentClient) KillProcess(ctx context.Context, pid int) error {
	c.procKills.forget(pid) // its SIGKILL is the caller's, not the host's
	return c.do(ctx, http.MethodPost, processPath(pid, "/kill"), nil, nil, nil)
}

// KillAll kills every process of the sandbox user but the code contexts'
// kernels; EConflict from an agent too old to (its hello lacks
// agentproto.FeatureKillAll).
func (c *AgentClient) KillAll(ctx context.Context) (agentproto.KillAll, error) {
	var k agentproto.KillAll
	if !c.Hello().HasFeature(agentproto.FeatureKillAll) {
		return k, pandastack.Errorf(pandastack.EConflict, "sandbox %s runs the agent of an older server build, which cannot kill all its processes at once; kill them one by one (a sandbox created now can)", c.id)
	}
	c.procKills.forget(0)
	err := c.do(ctx, http.MethodPost, "/v1/processes/kill", nil, nil, &k)
	return k, err
}
