package api

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/streamframe"
)

// cutReader gives data, then fails as a connection does when its node dies.
type cutReader struct{ r io.Reader }

func (c *cutReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err == io.EOF {
		return n, errors.New("unexpected EOF (the node died)")
	}
	return n, err
}
func (c *cutReader) Close() error { return nil }

func tailOf(t *testing.T, ct string, data []byte, ctx context.Context) ([]byte, error) {
	t.Helper()
	resp := &http.Response{Header: http.Header{"Content-Type": {ct}}, Body: &cutReader{bytes.NewReader(data)}}
	return io.ReadAll(endStreamWithError(resp, ctx))
}

// A stream from another node that breaks off ends with an error event of
// its own kind, where an event may begin; cut inside one, or with the
// caller gone, it stays broken; a revoked key says so.
func TestStreamCutOffEndsWithErrorEvent(t *testing.T) {
	line := `{"type":"stdout","data":"hi\n"}` + "\n"
	out, err := tailOf(t, "application/x-ndjson", []byte(line), context.Background())
	if err != nil || !strings.HasPrefix(string(out), line) || !strings.Contains(string(out), `{"type":"error","error":{"code":"sandbox_unavailable"`) || !strings.HasSuffix(string(out), "}\n") {
		t.Errorf("NDJSON cut after a line: %q %v", out, err)
	}
	if _, err := tailOf(t, "application/x-ndjson", []byte(line[:10]), context.Background()); err == nil {
		t.Errorf("NDJSON cut inside a line ended cleanly")
	}

	frame, _ := streamframe.AppendFrame(nil, streamframe.Stdout, []byte("hi"))
	out, err = tailOf(t, streamframe.MediaType, frame, context.Background())
	if err != nil {
		t.Fatalf("frames cut after a frame: %v", err)
	}
	fr := streamframe.NewReader(bytes.NewReader(out))
	if typ, p, err := fr.Next(); err != nil || typ != streamframe.Stdout || string(p) != "hi" {
		t.Errorf("first frame: %d %q %v", typ, p, err)
	}
	if typ, p, err := fr.Next(); err != nil || typ != streamframe.Error || !strings.Contains(string(p), "sandbox_unavailable") {
		t.Errorf("then: %d %q %v, want an error frame", typ, p, err)
	}
	if _, err := tailOf(t, streamframe.MediaType, frame[:3], context.Background()); err == nil {
		t.Errorf("frames cut inside a header ended cleanly")
	}

	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := tailOf(t, "application/x-ndjson", []byte(line), gone); err == nil {
		t.Errorf("a caller who hung up was sent an error event")
	}
	revoked, cancel2 := context.WithCancelCause(context.Background())
	cancel2(pandastack.Errorf(pandastack.EUnauthorized, "API key pds_abc… was revoked"))
	if out, err := tailOf(t, "application/x-ndjson", []byte(line), revoked); err != nil || !strings.Contains(string(out), `"code":"unauthorized"`) {
		t.Errorf("revoked key: %q %v", out, err)
	}

	// Cut right after the stream's own last event: it ended, nothing added.
	exit := line + `{"type":"exit","exit_code":0}` + "\n"
	if out, err := tailOf(t, "application/x-ndjson", []byte(exit), context.Background()); err != nil || string(out) != exit {
		t.Errorf("NDJSON cut after its exit: %q %v", out, err)
	}
	exitFrame, _ := streamframe.AppendFrame(frame, streamframe.Exit, []byte(`{"exit_code":0}`))
	if out, err := tailOf(t, streamframe.MediaType, exitFrame, context.Background()); err != nil || !bytes.Equal(out, exitFrame) {
		t.Errorf("frames cut after the exit frame: %q %v", out, err)
	}

	plain := &http.Response{Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader("{}"))}
	if endStreamWithError(plain, context.Background()) != plain.Body {
		t.Errorf("a plain answer was wrapped")
	}
}
