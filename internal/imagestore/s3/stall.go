package s3

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"
)

// DefaultStallTimeout is how long a request to the bucket may go with no
// byte moving, either way, before it is given up.
const DefaultStallTimeout = time.Minute

// stallGuard ends a request to the bucket once no byte of it has moved for
// after, in its body or its answer's: a server that takes the connection
// and then stops answering (an overloaded gateway, a connection half
// closed) held a snapshot's upload, and the request that took it, for
// ever. A slow transfer that moves goes on, however long it takes.
type stallGuard struct {
	next  http.RoundTripper
	after time.Duration
}

// stalledError says a request was given up for want of progress. It is a
// timeout to net.Error's eyes, so unreachable makes it sandbox_unavailable.
type stalledError struct{ after time.Duration }

func (e *stalledError) Error() string {
	return fmt.Sprintf("the snapshot store sent and took nothing for %s", e.after)
}
func (e *stalledError) Timeout() bool   { return true }
func (e *stalledError) Temporary() bool { return true }

func (g *stallGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	var fired atomic.Bool
	t := time.AfterFunc(g.after, func() {
		fired.Store(true)
		cancel()
	})
	moved := func() { t.Reset(g.after) }
	end := func() {
		t.Stop()
		cancel()
	}
	stalled := func(err error) error {
		if fired.Load() {
			return &stalledError{after: g.after}
		}
		return err
	}
	r := req.WithContext(ctx)
	if req.Body != nil && req.Body != http.NoBody {
		r.Body = &movingBody{ReadCloser: req.Body, moved: moved, stalled: stalled}
	}
	resp, err := g.next.RoundTrip(r)
	if err != nil {
		end()
		return nil, stalled(err)
	}
	moved()
	resp.Body = &movingBody{ReadCloser: resp.Body, moved: moved, stalled: stalled, closed: end}
	return resp, nil
}

// movingBody resets its request's stall timer as bytes pass.
type movingBody struct {
	io.ReadCloser
	moved   func()
	stalled func(error) error
	closed  func() // nil for a request's body, which the transport closes early
}

func (b *movingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.moved()
	}
	if err != nil && err != io.EOF {
		err = b.stalled(err)
	}
	return n, err
}

func (b *movingBody) Close() error {
	err := b.ReadCloser.Close()
	if b.closed != nil {
		b.closed()
	}
	return err
}
