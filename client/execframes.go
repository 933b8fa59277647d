package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"github.com/pandastack/pandastack/internal/streamframe"
)

// StreamMediaType is the Accept type of the binary exec stream: frames of a
// type byte (1 stdout, 2 stderr, 3 exit JSON, 4 error JSON), a uint32
// big-endian length and the payload.
const StreamMediaType = streamframe.MediaType

// ExecPipe runs a command and copies its stdout and stderr to the given
// writers (nil discards) as the output arrives, in the binary stream format:
// raw bytes, no JSON. It returns the exit status; the result's Stdout and
// Stderr stay empty. An error of the exec after the output began, or a
// failing writer (which cancels the command), is returned as the error.
func (c *Client) ExecPipe(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (*ExecResult, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // closing the stream early kills the command
	b, _ := json.Marshal(req)
	hreq, err := c.newRequest(ctx, http.MethodPost, "/v1/sandboxes/"+url.PathEscape(id)+"/exec", nil, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", StreamMediaType)
	resp, err := c.send(hreq)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != StreamMediaType {
		return nil, fmt.Errorf("exec stream: answer of type %q, want %s", ct, StreamMediaType)
	}
	return readFrames(resp.Body, stdout, stderr)
}

// readFrames reads an exec's binary stream up to its exit or error frame.
func readFrames(r io.Reader, stdout, stderr io.Writer) (*ExecResult, error) {
	fr := streamframe.NewReader(r)
	for {
		t, p, err := fr.Next()
		if err == io.EOF {
			return nil, errors.New("exec stream ended without an exit frame")
		}
		if err != nil {
			return nil, fmt.Errorf("exec stream: %w", err)
		}
		switch t {
		case streamframe.Stdout, streamframe.Stderr:
			w := stdout
			if t == streamframe.Stderr {
				w = stderr
			}
			if w != nil {
				if _, err := w.Write(p); err != nil {
					return nil, fmt.Errorf("exec stream: writing %s: %w", streamframe.TypeName(t), err)
				}
			}
		case streamframe.Exit:
			var res ExecResult
			if err := json.Unmarshal(p, &res); err != nil {
				return nil, fmt.Errorf("exec stream: bad exit frame %.200q: %w", p, err)
			}
			return &res, nil
		case streamframe.Error:
			var eb struct {
				Error struct{ Code, Message string }
			}
			if err := json.Unmarshal(p, &eb); err != nil || eb.Error.Code == "" {
				return nil, fmt.Errorf("exec stream: bad error frame %.200q", p)
			}
			return nil, &Error{Status: http.StatusOK, Code: eb.Error.Code, Message: eb.Error.Message}
		}
	}
}
