package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/pandastack/pandastack"
)

// The results of runs are the root package's public types.
type (
	Context        = pandastack.CodeContext // a code context: a Jupyter kernel in a sandbox
	Result         = pandastack.Result
	ExecutionError = pandastack.ExecutionError
	Execution      = pandastack.Execution
)

// CodeEvent is one event of a streamed run.
type CodeEvent struct {
	Type      string          `json:"type"`
	Data      string          `json:"data,omitempty"`
	Result    *Result         `json:"result,omitempty"`
	Error     json.RawMessage `json:"error,omitempty"`
	Execution *Execution      `json:"execution,omitempty"`
}

// RunRequest is the body of a run; Language and ContextID only for RunCode.
type RunRequest struct {
	Code           string            `json:"code"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Language       string            `json:"language,omitempty"`
	ContextID      string            `json:"context_id,omitempty"`
}

func ctxPath(id, cid, sub string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + "/contexts/" + url.PathEscape(cid) + sub
}

// CreateContext starts a code context; language "" means python.
func (c *Client) CreateContext(ctx context.Context, id, language, cwd string) (*Context, error) {
	var out Context
	body := map[string]string{"language": language, "cwd": cwd}
	return &out, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/contexts", nil, body, &out)
}

// ListContexts lists a sandbox's contexts.
func (c *Client) ListContexts(ctx context.Context, id string) ([]Context, error) {
	var out struct {
		Contexts []Context `json:"contexts"`
	}
	return out.Contexts, c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id)+"/contexts", nil, nil, &out)
}

// DeleteContext shuts a context down.
func (c *Client) DeleteContext(ctx context.Context, id, cid string) error {
	return c.do(ctx, http.MethodDelete, ctxPath(id, cid, ""), nil, nil, nil)
}

// InterruptContext interrupts a context's running code.
func (c *Client) InterruptContext(ctx context.Context, id, cid string) error {
	return c.do(ctx, http.MethodPost, ctxPath(id, cid, "/interrupt"), nil, nil, nil)
}

// RestartContext restarts a context's kernel.
func (c *Client) RestartContext(ctx context.Context, id, cid string) (*Context, error) {
	var out Context
	return &out, c.do(ctx, http.MethodPost, ctxPath(id, cid, "/restart"), nil, nil, &out)
}

// Run runs code in a context and waits for the Execution.
func (c *Client) Run(ctx context.Context, id, cid string, req RunRequest) (*Execution, error) {
	var ex Execution
	return &ex, c.do(ctx, http.MethodPost, ctxPath(id, cid, "/run"), nil, req, &ex)
}

// RunCode runs code in the sandbox's default context of req.Language.
func (c *Client) RunCode(ctx context.Context, id string, req RunRequest) (*Execution, error) {
	var ex Execution
	return &ex, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/run_code", nil, req, &ex)
}

// RunStream runs code in a context, calling onEvent for each event as it
// happens, and returns the final Execution.
func (c *Client) RunStream(ctx context.Context, id, cid string, req RunRequest, onEvent func(CodeEvent)) (*Execution, error) {
	b, _ := json.Marshal(req)
	hreq, err := c.newRequest(ctx, http.MethodPost, ctxPath(id, cid, "/run"), nil, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/x-ndjson")
	resp, err := c.send(hreq)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 256<<20)
	for sc.Scan() {
		var ev CodeEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("bad stream event: %w", err)
		}
		// An "error" event with a code is the server's, not the cell's:
		// the run could not finish (e.g. the sandbox was killed).
		var se struct {
			Error *struct{ Code, Message string } `json:"error"`
		}
		if ev.Type == "error" && json.Unmarshal(sc.Bytes(), &se) == nil && se.Error != nil && se.Error.Code != "" {
			return nil, &Error{Status: resp.StatusCode, Code: se.Error.Code, Message: se.Error.Message}
		}
		if onEvent != nil {
			onEvent(ev)
		}
		if ev.Type == "execution" && ev.Execution != nil {
			return ev.Execution, nil
		}
	}
	return nil, fmt.Errorf("run stream ended without an execution event (%v)", sc.Err())
}
