package sandbox

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// PTY opens an interactive shell of the sandbox user on a new terminal of
// cols×rows in cwd ("" for the home). The returned stream carries
// agentproto PTY frames both ways; closing it kills the shell and all it
// started. ctx bounds only the opening.
func (c *AgentClient) PTY(ctx context.Context, cols, rows uint16, cwd string) (io.ReadWriteCloser, error) {
	q := url.Values{"cols": {strconv.Itoa(int(cols))}, "rows": {strconv.Itoa(int(rows))}}
	if cwd != "" {
		q.Set("cwd", cwd)
	}
	req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), http.MethodGet, "http://agent/v1/pty?"+q.Encode(), nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", agentproto.PTYUpgrade)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, pandastack.Errorf(pandastack.EUnavailable, "sandbox %s is not answering: %v", c.id, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer resp.Body.Close()
		return nil, decodeAgentError(resp)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		resp.Body.Close()
		return nil, pandastack.Errorf(pandastack.EInternal, "the agent's terminal stream cannot be written")
	}
	return rwc, nil
}
