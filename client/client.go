// Package client is the Go client of the PandaStack REST API. The
// `pandastack` CLI uses it, and so do the end-to-end tests.
package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack"
)

// DefaultURL is used when PANDASTACK_API is not set.
const DefaultURL = "http://localhost:8080"

// Client calls one PandaStack server with one API key.
type Client struct {
	BaseURL string
	APIKey  string
	HTTP    *http.Client
}

// New returns a client for baseURL (DefaultURL when empty).
func New(baseURL, apiKey string) *Client {
	if baseURL == "" {
		baseURL = DefaultURL
	}
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), APIKey: apiKey, HTTP: &http.Client{}}
}

// FromEnv reads PANDASTACK_API and PANDASTACK_API_KEY.
func FromEnv() (*Client, error) {
	key := os.Getenv("PANDASTACK_API_KEY")
	if key == "" {
		return nil, errors.New("PANDASTACK_API_KEY is not set: export the key that `pandastack serve` printed (also in <data dir>/api-key)")
	}
	return New(os.Getenv("PANDASTACK_API"), key), nil
}

// Error is an error answer of the API.
type Error struct {
	Status  int
	Code    string
	Message string
}

// Error reads "code (HTTP status): message"; an error that cut a stream
// off after its 200 has no status of its own: "code: message".
func (e *Error) Error() string {
	if e.Status == http.StatusOK {
		return fmt.Sprintf("%s: %s", e.Code, e.Message)
	}
	return fmt.Sprintf("%s (%d): %s", e.Code, e.Status, e.Message)
}

// IsCode reports whether err is an API error with that code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

func (c *Client) newRequest(ctx context.Context, method, path string, q url.Values, body io.Reader) (*http.Request, error) {
	u := c.BaseURL + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if c.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.APIKey)
	}
	return req, nil
}

func (c *Client) send(req *http.Request) (*http.Response, error) {
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

// decodeError reads an error answer.
func decodeError(resp *http.Response) error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var eb struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
		return &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
	}
	return &Error{Status: resp.StatusCode, Code: "http_error", Message: strings.TrimSpace(string(b))}
}

// do sends JSON in (if non-nil) and decodes the answer into out (if non-nil).
func (c *Client) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := c.newRequest(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.send(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.Copy(io.Discard, resp.Body)
		return nil
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// CreateSandboxRequest is the body of POST /v1/sandboxes.
type CreateSandboxRequest struct {
	Template   string            `json:"template,omitempty"`
	TTLSeconds int64             `json:"ttl_seconds,omitempty"`
	Metadata   map[string]string `json:"metadata,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	CPU        int               `json:"cpu,omitempty"`
	MemoryMB   int               `json:"memory_mb,omitempty"`
	DiskMB     int               `json:"disk_mb,omitempty"`
	// IdleTimeoutSeconds suspends it after this long idle; nil takes the
	// server's default, 0 never.
	IdleTimeoutSeconds *int64         `json:"idle_timeout_seconds,omitempty"`
	Network            *NetworkPolicy `json:"network,omitempty"` // nil: the server's default
	// AutoResume: while paused, any request resumes it instead of
	// answering conflict.
	AutoResume bool `json:"auto_resume,omitempty"`
}

// Sandbox is a sandbox as the API shows it.
type Sandbox = pandastack.Sandbox

// CreateSandbox boots a sandbox.
func (c *Client) CreateSandbox(ctx context.Context, req CreateSandboxRequest) (*Sandbox, error) {
	var sb Sandbox
	return &sb, c.do(ctx, http.MethodPost, "/v1/sandboxes", nil, req, &sb)
}

// GetSandbox returns one sandbox.
func (c *Client) GetSandbox(ctx context.Context, id string) (*Sandbox, error) {
	var sb Sandbox
	return &sb, c.do(ctx, http.MethodGet, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &sb)
}

// ListSandboxes lists the sandboxes whose metadata has all the given
// pairs, oldest first; state is "" (starting, running and paused ones),
// "all", or states separated by commas ("running", "paused", "stopped",
// "starting"). It reads the list a page at a time.
func (c *Client) ListSandboxes(ctx context.Context, metadata map[string]string, state string) ([]Sandbox, error) {
	var all []Sandbox
	page := ListPage{Limit: listPageSize}
	for {
		list, next, err := c.ListSandboxesPage(ctx, metadata, state, page)
		var apiErr *Error
		if err != nil && page.After == "" && errors.As(err, &apiErr) && apiErr.Code == "invalid_request" && strings.Contains(apiErr.Message, `"limit"`) {
			// A server from before pages lists everything at once.
			list, _, err = c.ListSandboxesPage(ctx, metadata, state, ListPage{})
			return list, err
		}
		if err != nil {
			return nil, err
		}
		all = append(all, list...)
		if next == "" {
			return all, nil
		}
		if next == page.After || len(list) == 0 {
			return nil, fmt.Errorf("list sandboxes: the server answered next %q to the page after %q, which would never end", next, page.After)
		}
		page.After = next
	}
}

// listPageSize is how many sandboxes ListSandboxes asks for at a time.
const listPageSize = 500

// ListPage selects a page of a list: at most Limit items (0: all), after
// the place an earlier page's next names (After), newest first if Newest.
type ListPage struct {
	Limit  int
	After  string
	Newest bool
}

// ListSandboxesPage is one page of ListSandboxes; next is the After of the
// page that follows, "" after the last.
func (c *Client) ListSandboxesPage(ctx context.Context, metadata map[string]string, state string, page ListPage) (list []Sandbox, next string, err error) {
	q := url.Values{}
	for k, v := range metadata {
		q.Set("metadata."+k, v)
	}
	if state != "" {
		q.Set("state", state)
	}
	if page.Limit > 0 {
		q.Set("limit", strconv.Itoa(page.Limit))
	}
	if page.After != "" {
		q.Set("after", page.After)
	}
	if page.Newest {
		q.Set("order", "newest")
	}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
		Next      string    `json:"next"`
	}
	err = c.do(ctx, http.MethodGet, "/v1/sandboxes", q, nil, &out)
	return out.Sandboxes, out.Next, err
}

// SetTTL makes the sandbox expire ttl from now.
func (c *Client) SetTTL(ctx context.Context, id string, ttl time.Duration) (*Sandbox, error) {
	var sb Sandbox
	body := map[string]int64{"ttl_seconds": wholeSeconds(ttl)}
	return &sb, c.do(ctx, http.MethodPatch, "/v1/sandboxes/"+url.PathEscape(id), nil, body, &sb)
}

// SetIdleTimeout sets how long the sandbox may be idle before it is
// suspended (0: never; a part of a second counts as a whole one).
func (c *Client) SetIdleTimeout(ctx context.Context, id string, d time.Duration) (*Sandbox, error) {
	var sb Sandbox
	body := map[string]int64{"idle_timeout_seconds": wholeSeconds(d)}
	return &sb, c.do(ctx, http.MethodPatch, "/v1/sandboxes/"+url.PathEscape(id), nil, body, &sb)
}

// wholeSeconds is d in the API's whole seconds, rounded up: 500 ms is 1 s,
// not 0 (which, for an idle timeout, means never).
func wholeSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d > 0 && d%time.Second != 0 {
		s++
	}
	return s
}

// KillSandbox stops and deletes a sandbox.
func (c *Client) KillSandbox(ctx context.Context, id string) error {
	return c.do(ctx, http.MethodDelete, "/v1/sandboxes/"+url.PathEscape(id), nil, nil, nil)
}

// ProcessesKilled is what KillAllProcesses did.
type ProcessesKilled = pandastack.ProcessesKilled

// KillAllProcesses SIGKILLs every process of the sandbox user but the code
// contexts' kernels, which keep their state (POST …/processes/kill).
func (c *Client) KillAllProcesses(ctx context.Context, id string) (*ProcessesKilled, error) {
	var k ProcessesKilled
	if err := c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/processes/kill", nil, nil, &k); err != nil {
		return nil, err
	}
	return &k, nil
}

// ExecRequest is the body of POST /v1/sandboxes/{id}/exec. Set Cmd (a shell
// string) or Argv.
type ExecRequest struct {
	Cmd            string            `json:"cmd,omitempty"`
	Argv           []string          `json:"argv,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Cwd            string            `json:"cwd,omitempty"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty"`
	Stdin          string            `json:"stdin,omitempty"`
}

// ExecResult is the outcome of a command.
type ExecResult = pandastack.ExecResult

// Exec runs a command and waits for it.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest) (*ExecResult, error) {
	var res ExecResult
	return &res, c.do(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/exec", nil, req, &res)
}

// ExecEvent is one event of a streamed exec.
type ExecEvent struct {
	Type       string `json:"type"` // stdout, stderr, exit or error
	Data       string `json:"data,omitempty"`
	ExitCode   int    `json:"exit_code,omitempty"`
	Signal     string `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	DurationMS int64  `json:"duration_ms,omitempty"`
	Error      *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error,omitempty"`
}

// ExecStream runs a command, calling onEvent for each output chunk as it
// happens, and returns the collected result. It reads NDJSON and keeps all
// output in memory; for large output, ExecPipe streams binary frames to
// writers.
func (c *Client) ExecStream(ctx context.Context, id string, req ExecRequest, onEvent func(ExecEvent)) (*ExecResult, error) {
	b, _ := json.Marshal(req)
	hreq, err := c.newRequest(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/exec", nil, bytes.NewReader(b))
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
	var res ExecResult
	var out, errb strings.Builder
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		var ev ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("bad stream event: %w", err)
		}
		if onEvent != nil {
			onEvent(ev)
		}
		switch ev.Type {
		case "stdout":
			out.WriteString(ev.Data)
		case "stderr":
			errb.WriteString(ev.Data)
		case "error":
			return nil, &Error{Status: 200, Code: ev.Error.Code, Message: ev.Error.Message}
		case "exit":
			res.ExitCode, res.Signal, res.TimedOut, res.DurationMS = ev.ExitCode, ev.Signal, ev.TimedOut, ev.DurationMS
			res.Stdout, res.Stderr = out.String(), errb.String()
			return &res, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, errors.New("exec stream ended without an exit event")
}

// FileInfo describes a file in a sandbox.
type FileInfo struct {
	Name    string    `json:"name"`
	Path    string    `json:"path"`
	Type    string    `json:"type"`
	Size    int64     `json:"size"`
	Mode    string    `json:"mode"`
	ModTime time.Time `json:"mod_time"`
}

func filesPath(id, sub string) string { return "/v1/sandboxes/" + url.PathEscape(id) + "/files" + sub }

// WriteFile streams r into path in the sandbox.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader) (*FileInfo, error) {
	req, err := c.newRequest(ctx, http.MethodPut, filesPath(id, ""), url.Values{"path": {path}}, r)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var fi FileInfo
	return &fi, json.NewDecoder(resp.Body).Decode(&fi)
}

// ReadFile opens path in the sandbox for streaming; close the reader.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	req, err := c.newRequest(ctx, http.MethodGet, filesPath(id, ""), url.Values{"path": {path}}, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.send(req)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// RemoveFile deletes a file or empty directory (a tree when recursive).
func (c *Client) RemoveFile(ctx context.Context, id, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return c.do(ctx, http.MethodDelete, filesPath(id, ""), q, nil, nil)
}

// ListFiles lists a directory.
func (c *Client) ListFiles(ctx context.Context, id, path string) ([]FileInfo, error) {
	var out struct {
		Files []FileInfo `json:"files"`
	}
	return out.Files, c.do(ctx, http.MethodGet, filesPath(id, "/list"), url.Values{"path": {path}}, nil, &out)
}

// StatFile describes one file.
func (c *Client) StatFile(ctx context.Context, id, path string) (*FileInfo, error) {
	var fi FileInfo
	return &fi, c.do(ctx, http.MethodGet, filesPath(id, "/stat"), url.Values{"path": {path}}, nil, &fi)
}

// FileEvent is one line of a directory watch (WatchDir).
type FileEvent = pandastack.FileEvent

// WatchDir streams the changes in the directory at path (and, with
// recursive, beneath it) to onEvent, starting with a "watching" line once
// the watch is live, until ctx ends (nil), the directory is removed or moved
// (nil, after its event), the watch fails (an *Error), or onEvent returns an
// error (that error).
func (c *Client) WatchDir(ctx context.Context, id, path string, recursive bool, onEvent func(FileEvent) error) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	req, err := c.newRequest(ctx, http.MethodGet, filesPath(id, "/watch"), q, nil)
	if err != nil {
		return err
	}
	resp, err := c.send(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var ev FileEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("bad watch event: %w", err)
		}
		switch ev.Type {
		case pandastack.FileEventKeepalive:
			continue
		case pandastack.FileEventError:
			if ev.Error != nil {
				return &Error{Status: 200, Code: ev.Error.Code, Message: ev.Error.Message}
			}
		}
		if err := onEvent(ev); err != nil {
			return err
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return sc.Err()
}

// MakeDir creates a directory and its parents.
func (c *Client) MakeDir(ctx context.Context, id, path string) (*FileInfo, error) {
	var fi FileInfo
	return &fi, c.do(ctx, http.MethodPost, filesPath(id, "/mkdir"), url.Values{"path": {path}}, nil, &fi)
}

// RenameFile moves a file or directory to a new path, making missing
// parents; an existing destination is refused (code "conflict") unless
// overwrite.
func (c *Client) RenameFile(ctx context.Context, id, from, to string, overwrite bool) (*FileInfo, error) {
	q := url.Values{"path": {from}, "to": {to}}
	if overwrite {
		q.Set("overwrite", "true")
	}
	var fi FileInfo
	return &fi, c.do(ctx, http.MethodPost, filesPath(id, "/rename"), q, nil, &fi)
}

// Template is a built template.
type Template struct {
	Name         string    `json:"name"`
	Description  string    `json:"description,omitempty"`
	Hash         string    `json:"hash"`
	SizeBytes    int64     `json:"size_bytes"`
	BuildSeconds float64   `json:"build_seconds"`
	BuiltAt      time.Time `json:"built_at"`
	CPU          int       `json:"cpu"`
	MemoryMB     int       `json:"memory_mb"`
}

// ListTemplates lists the server's built templates.
func (c *Client) ListTemplates(ctx context.Context) ([]Template, error) {
	var out struct {
		Templates []Template `json:"templates"`
	}
	return out.Templates, c.do(ctx, http.MethodGet, "/v1/templates", nil, nil, &out)
}
