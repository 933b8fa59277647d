package client

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/coder/websocket"

	"github.com/pandastack/pandastack"
)

// Terminal is an interactive shell in a sandbox, on a real terminal.
type Terminal struct {
	ws *websocket.Conn
	// ExitCode is set once Read has returned the shell's exit (io.EOF).
	ExitCode *int
}

// OpenTerminal starts a login shell of the sandbox user on a cols×rows
// terminal (GET /v1/sandboxes/{id}/pty). Close it when done: that kills the
// shell and everything it started.
func (c *Client) OpenTerminal(ctx context.Context, id string, cols, rows int) (*Terminal, error) {
	u := strings.Replace(c.BaseURL, "http", "ws", 1) + "/v1/sandboxes/" + url.PathEscape(id) + "/pty?" +
		url.Values{"cols": {strconv.Itoa(cols)}, "rows": {strconv.Itoa(rows)}}.Encode()
	ws, resp, err := websocket.Dial(ctx, u, &websocket.DialOptions{
		HTTPClient:   c.HTTP,
		HTTPHeader:   http.Header{"Authorization": {"Bearer " + c.APIKey}},
		Subprotocols: []string{"pandastack.pty"},
	})
	if err != nil {
		if resp != nil && resp.StatusCode >= 400 {
			return nil, decodeError(resp)
		}
		return nil, err
	}
	ws.SetReadLimit(1 << 20)
	return &Terminal{ws: ws}, nil
}

// Write sends keystrokes (bytes as typed: "\r" is Enter, "\x03" is Ctrl-C).
func (t *Terminal) Write(ctx context.Context, p []byte) error {
	return t.ws.Write(ctx, websocket.MessageBinary, p)
}

// Resize changes the terminal's size; the shell gets SIGWINCH.
func (t *Terminal) Resize(ctx context.Context, cols, rows int) error {
	b, _ := json.Marshal(map[string]any{"type": "resize", "cols": cols, "rows": rows})
	return t.ws.Write(ctx, websocket.MessageText, b)
}

// Read returns the next output of the terminal. When the shell exits it
// sets ExitCode and returns io.EOF.
func (t *Terminal) Read(ctx context.Context) ([]byte, error) {
	for {
		typ, p, err := t.ws.Read(ctx)
		if err != nil {
			if t.ExitCode != nil || websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				return nil, io.EOF
			}
			var ce websocket.CloseError
			if errors.As(err, &ce) && ce.Code == pandastack.CloseSandboxStopped {
				return nil, &Error{Status: http.StatusGone, Code: "sandbox_stopped", Message: ce.Reason}
			}
			return nil, err
		}
		if typ == websocket.MessageBinary {
			return p, nil
		}
		var m struct {
			Type     string `json:"type"`
			ExitCode *int   `json:"exit_code"`
		}
		if json.Unmarshal(p, &m) == nil && m.Type == "exit" {
			t.ExitCode = m.ExitCode
		}
	}
}

// Close ends the session.
func (t *Terminal) Close() error { return t.ws.Close(websocket.StatusNormalClosure, "") }
