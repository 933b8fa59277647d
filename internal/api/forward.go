package api

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/sandbox"
	"github.com/pandastack/pandastack/internal/streamframe"
)

// Several nodes share a store (issue 12): any node answers any request.
// A request about a sandbox of another node is passed to that node's
// advertised URL as it came — method, path, query, body, the caller's API
// key — by httputil.ReverseProxy, which also carries NDJSON streams
// (flushed as they come) and WebSocket upgrades (PTY, port proxy). The
// owner authenticates the caller's key again against the shared store: no
// node trusts another, and there is no internal path without a key.
//
// A create is placed first (Manager.Place) and passed to the chosen node
// the same way.

// forwardedHeader marks a request one node passed to another, with the
// sender's node id. The receiver answers it itself: a request is passed on
// at most once. It grants nothing: a caller who sets it only stops the
// request from being passed on.
const forwardedHeader = "X-Pandastack-Forwarded-By"

// forwardDialer dials other nodes: bounded dials, and keep-alive probes
// on connections kept alive (after 15 s quiet, 3 unanswered 5 s apart): a
// node that runs on but is cut off (a partition, a firewall change) is
// never marked lost, and the next request written to a connection kept
// alive to it waited for TCP's retransmissions, about 15 minutes, before
// its 503; now that connection is gone within 30 s of the cut, and the
// request's own dial fails in 10. Not TCP_USER_TIMEOUT, which would bound
// a request already under way too, but (on Linux 5.11 and later) also
// cut one whose node stopped reading its body for that long: an exec's
// stdin that its process does not read, streamed through another node.
var forwardDialer = &net.Dialer{
	Timeout:         10 * time.Second,
	KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3},
}

// forwardTransport is the proxies' transport: direct (no proxy from the
// environment: nodes talk to each other on their own network), with
// bounded dials.
var forwardTransport = &http.Transport{
	Proxy:                 nil,
	DialContext:           forwardDialer.DialContext,
	MaxIdleConnsPerHost:   64,
	IdleConnTimeout:       90 * time.Second,
	ResponseHeaderTimeout: 0, // a run_code may take its whole timeout before its first byte
}

// placeTransport passes creates on, each on a connection of its own. A
// create falls back to the node asked only when nothing of it reached the
// chosen node, which a failed dial proves. A kept-alive connection to a
// node that died a moment ago would fail after the request was written,
// and the create would fail with it; a dial costs far less than a create.
var placeTransport = func() *http.Transport {
	t := forwardTransport.Clone()
	t.DisableKeepAlives = true
	return t
}()

// forwardSandbox passes r to the node that runs sandbox id of project (""
// matches any project: the port proxy, whose tokens the owner checks) and
// reports whether it did. A request another node already passed on, about
// a sandbox that is not this node's, is refused rather than acted on here.
func (s *Server) forwardSandbox(w http.ResponseWriter, r *http.Request, project, id string, unreached func(http.ResponseWriter, *http.Request)) bool {
	target, err := s.mgr.Remote(r.Context(), project, id)
	if err != nil {
		writeError(w, err)
		return true
	}
	if target == "" {
		return false
	}
	if r.Header.Get(forwardedHeader) != "" && project == "" {
		// A port proxy's request, not yet authenticated, the header set
		// by its caller (or by a node at this node's URL): the port
		// proxy here checks its credential as it does for a sandbox
		// that does not exist. A token is the owner's, unknown here
		// (401), as is a key that does not check out; a key of another
		// project finds no such sandbox (404); one of the sandbox's
		// project comes back here with it, and gets the 503 below. Only
		// a credential's presence was checked before, and a made-up one
		// got the 503: the sandbox lives, on another node.
		return false
	}
	if r.Header.Get(forwardedHeader) != "" {
		writeError(w, pandastack.Errorf(pandastack.EUnavailable, "sandbox %s runs on another node, and this request was passed on to this node already: send it to any node without the %s header; if the caller did not set it, two nodes advertise the same URL (each node needs its own --advertise-url)", id, forwardedHeader))
		return true
	}
	s.proxyTo(w, r, target, unreached, project != "")
	return true
}

// storeAnswers reports whether r reads what the shared store keeps (a
// sandbox's record, its history), which this node can answer when the
// sandbox's own node cannot be reached (within its grace period, before
// it is found lost, a poll of the sandbox's state answered 503).
func storeAnswers(r *http.Request) bool {
	if r.Method != http.MethodGet {
		return false
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1/sandboxes/")
	return ok && (!strings.Contains(rest, "/") || strings.HasSuffix(r.URL.Path, "/history"))
}

// placeCreate places a POST /v1/sandboxes and passes it to the chosen node
// when that is another one; it reports whether it did. A body this node
// cannot read is left to the local handler, which says what is wrong; so is
// a create whose chosen node cannot be reached (it went down within its
// grace period): local creates it here instead.
func (s *Server) placeCreate(w http.ResponseWriter, r *http.Request, project string, local func(http.ResponseWriter, *http.Request, string)) bool {
	if r.Header.Get(forwardedHeader) != "" {
		return false
	}
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, 8<<20))
	r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), errReader{err}))
	if err != nil {
		return false
	}
	var req createSandboxRequest
	probe := r.Clone(r.Context())
	probe.Body = io.NopCloser(bytes.NewReader(body))
	if decode(probe, &req) != nil {
		return false
	}
	target, err := s.mgr.Place(r.Context(), project, sandbox.CreateRequest{
		Template: req.Template, CPU: req.CPU, MemoryMB: req.MemoryMB, SnapshotID: req.SnapshotID,
	})
	if err != nil {
		// No node has room by the books, or the store failed: this node
		// tries, and its create says what went wrong.
		s.log.Warn("placement failed; creating here", "err", err)
		return false
	}
	if target == "" {
		return false
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	s.proxyTo(w, r, target, func(w http.ResponseWriter, r *http.Request) {
		r.Body = io.NopCloser(bytes.NewReader(body))
		local(w, r, project)
	}, true)
	return true
}

// errReader returns err, or io.EOF when it is nil.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	return 0, io.EOF
}

// proxyTo passes r to the node at base and copies its answer back. When
// that node cannot be dialled, unreached (if not nil) answers instead:
// nothing of the request reached it. Such a request goes on a new
// connection (placeTransport), so that a dead node shows as a failed dial.
// api says the answer is the API's own, not a sandbox's server's through
// the port proxy: a stream of it cut off half-way ends with an error event.
func (s *Server) proxyTo(w http.ResponseWriter, r *http.Request, base string, unreached func(http.ResponseWriter, *http.Request), api bool) {
	if api || hasCredential(r) {
		clearBodyDeadline(w) // the other node bounds the body itself
	} // else a port proxy's request that can only be refused there: a caller with no key keeps the deadline
	var body *eofBody
	ctx, stop := s.watchNode(r.Context(), base, r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes")
	defer stop()
	orig := r // what unreached serves here: the caller's, not tied to the other node
	r = r.WithContext(ctx)
	u, err := url.Parse(base)
	if err != nil {
		writeError(w, err)
		return
	}
	transport := forwardTransport
	if r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes" {
		transport = placeTransport // a placed create (see placeTransport)
	}
	p := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(u)
			// As sent: the reverse proxy drops the pairs Go cannot parse
			// (a ';', a bad %) and sorts the rest, and a port proxy's
			// query is the sandbox server's to read.
			pr.Out.URL.RawQuery = pr.In.URL.RawQuery
			pr.Out.Host = pr.In.Host // the port proxy's {port}-{id}.domain routes by it
			pr.SetXForwarded()
			pr.Out.Header.Set(forwardedHeader, s.mgr.NodeID())
			if pr.Out.Body != nil && pr.Out.Body != http.NoBody {
				body = &eofBody{ReadCloser: pr.Out.Body}
				pr.Out.Body = body
			}
		},
		Transport:     transport,
		ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
		FlushInterval: -1, // NDJSON lines and SSE events as they come
		// A stream cut off half-way (the node died, the key was revoked)
		// ends with an error event, as on the sandbox's own node, rather
		// than with a broken connection.
		ModifyResponse: func(resp *http.Response) error {
			if resp.StatusCode >= 400 && body != nil && !body.eof.Load() {
				// Refused there before its body was all sent: the rest is
				// not waited for. Its deadline was lifted for the other
				// node to bound, and a caller that holds the body back
				// would keep this handler, stuck closing the body it
				// reads, and its connection, for ever. (Only while the
				// body is unfinished: once at its end, the server reads
				// on in the background, and a deadline passed would
				// cancel the request mid-answer.)
				http.NewResponseController(w).SetReadDeadline(time.Now())
			}
			if unreached != nil && notBuiltThere(resp) {
				return errNotBuiltThere
			}
			if api && resp.StatusCode == http.StatusSwitchingProtocols && strings.HasSuffix(r.URL.Path, "/pty") {
				if conn, ok := resp.Body.(io.ReadWriteCloser); ok {
					resp.Body = &wsTail{ReadWriteCloser: conn, ctx: r.Context()}
				}
			}
			if api {
				resp.Body = endStreamWithError(resp, r.Context())
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if lost := nodeLostCause(r.Context()); lost != nil {
				writeError(w, lost)
				return
			}
			if errors.Is(err, context.Canceled) {
				return // the caller hung up
			}
			if errors.Is(err, errNotBuiltThere) {
				// The chosen node lacks the template (a build rolled out
				// node by node): it made nothing, so this node, which
				// has it, creates.
				s.log.Warn("the node a create was placed on has not built its template; creating here", "node_url", base)
				unreached(w, orig)
				return
			}
			s.log.Warn("forward to node failed", "node_url", base, "path", r.URL.Path, "err", err)
			var op *net.OpError
			if unreached != nil && (r.Method == http.MethodGet || errors.As(err, &op) && op.Op == "dial") {
				// A read (the store answers it) on any failure; a create
				// only when nothing of it reached the node.
				unreached(w, orig)
				return
			}
			// Its heartbeat says nothing of whether this node reaches it: a
			// node that runs on but is not reachable at its advertised URL
			// is never marked lost.
			writeError(w, pandastack.Errorf(pandastack.EUnavailable,
				"the node that runs this sandbox does not answer; retry. A node that has stopped is marked lost, with its sandboxes, once silent for %s; one that runs on but cannot be reached at its advertised URL (serve --advertise-url) stays so until that is fixed", s.mgr.Config().Node.Grace))
		},
	}
	s.log.Debug("forwarding", "method", r.Method, "path", r.URL.Path, "node_url", base)
	serveProxy(p, w, r)
}

// hasCredential reports whether r carries any credential: an API key or a
// port token, in a header, the query or the port's cookie.
func hasCredential(r *http.Request) bool {
	if r.Header.Get("Authorization") != "" || r.Header.Get("X-API-Key") != "" || r.URL.Query().Get(tokenParam) != "" {
		return true
	}
	return tokenCookieOf(r) != ""
}

// eofBody is a request body passed on that tells whether it was read to
// its end.
type eofBody struct {
	io.ReadCloser
	eof atomic.Bool
}

func (b *eofBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

// wsTail wraps the owner's side of a terminal's WebSocket passed through
// this node: when the owner's connection ends without the WebSocket's
// close frame (the node died or stopped answering), the caller gets one,
// 1001 with the reason, as from the owner's own shutdown, rather than a
// connection that just breaks off. It follows the owner's frames (server
// frames: unmasked, but the mask bit is honoured) to end at a frame's
// boundary and to know whether a close frame came.
type wsTail struct {
	io.ReadWriteCloser
	ctx    context.Context // the caller's request: a revoked key ends it (1008, as on the owner)
	hdr    []byte          // the current frame's header as far as read
	left   int64           // payload bytes of the current frame still to come
	closed bool            // a close frame came from the owner
	ending                 // the close frame to give, once the connection ended
}

// ending is what a wrapped stream gives once the stream under it ended:
// tail (an error event, a close frame), then EOF.
type ending struct {
	tail  []byte
	ended bool
}

// rest gives what is left of the tail, then EOF.
func (e *ending) rest(p []byte) (int, error) {
	if len(e.tail) == 0 {
		return 0, io.EOF
	}
	n := copy(p, e.tail)
	e.tail = e.tail[n:]
	return n, nil
}

// wsNodeGone is the reason of the close frame wsTail adds.
const wsNodeGone = "the node that runs this sandbox stopped answering"

func (t *wsTail) Read(p []byte) (int, error) {
	if t.ended {
		return t.rest(p)
	}
	n, err := t.ReadWriteCloser.Read(p)
	t.pass(p[:n])
	if err == nil {
		return n, nil
	}
	t.ended = true
	if t.closed || t.left != 0 || len(t.hdr) != 0 {
		return n, err // closed as it should be, or cut inside a frame
	}
	code, reason := uint16(1001), wsNodeGone
	if t.ctx != nil {
		if c := revokedErr(t.ctx, nil); c != nil {
			code, reason = 1008, pandastack.ErrorMessage(c) // policy violation, as the owner closes it
		}
	}
	if len(reason) > 123 { // a close frame's payload is at most 125 bytes, in UTF-8
		reason = reason[:123]
		for !utf8.ValidString(reason) {
			reason = reason[:len(reason)-1]
		}
	}
	payload := binary.BigEndian.AppendUint16(nil, code)
	payload = append(payload, reason...)
	t.tail = append([]byte{0x88, byte(len(payload))}, payload...)
	return n, nil
}

// pass follows the frames in b.
func (t *wsTail) pass(b []byte) {
	for len(b) > 0 {
		if t.left > 0 {
			k := min(int64(len(b)), t.left)
			t.left -= k
			b = b[k:]
			continue
		}
		t.hdr = append(t.hdr, b[0])
		b = b[1:]
		if len(t.hdr) < 2 {
			continue
		}
		need := 2
		switch t.hdr[1] & 0x7f {
		case 126:
			need += 2
		case 127:
			need += 8
		}
		if t.hdr[1]&0x80 != 0 {
			need += 4
		}
		if len(t.hdr) < need {
			continue
		}
		var size int64
		switch l := t.hdr[1] & 0x7f; l {
		case 126:
			size = int64(binary.BigEndian.Uint16(t.hdr[2:4]))
		case 127:
			size = int64(binary.BigEndian.Uint64(t.hdr[2:10]) & (1<<63 - 1))
		default:
			size = int64(l)
		}
		if t.hdr[0]&0x0f == 0x8 {
			t.closed = true
		}
		t.left, t.hdr = size, t.hdr[:0]
	}
}

// errNotBuiltThere: the node a create was placed on answered that it has
// not built the create's template.
var errNotBuiltThere = errors.New("template not built on the chosen node")

// notBuiltThere reports whether resp, a placed create's answer, is 409
// template_not_built; its body is kept for whoever reads it.
func notBuiltThere(resp *http.Response) bool {
	if resp.StatusCode != http.StatusConflict {
		return false
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(b), resp.Body))
	if err != nil {
		return false
	}
	var eb errorBody
	return json.Unmarshal(b, &eb) == nil && eb.Error.Code == pandastack.ETemplateMissing
}

// nodeLostError ends a request passed on to a node that was found lost
// while the request waited on it.
type nodeLostError struct{ err error }

func (e nodeLostError) Error() string { return e.err.Error() }
func (e nodeLostError) Unwrap() error { return e.err }

// nodeLostCause is the nodeLostError ctx was cancelled with, or nil.
func nodeLostCause(ctx context.Context) error {
	var lost nodeLostError
	if errors.As(context.Cause(ctx), &lost) {
		return lost
	}
	return nil
}

// watchNode returns ctx cancelled once the node at base is found lost (at
// each heartbeat of this node): a node that stalls with connections open
// (a stopped process, a partition that drops packets) answers nothing and
// cuts nothing, and a request or stream passed to it waited for ever, well
// after its sandboxes were stopped as lost. Call stop when the request is
// over.
func (s *Server) watchNode(ctx context.Context, base string, create bool) (_ context.Context, stop func()) {
	nc := s.mgr.Config().Node
	why := fmt.Sprintf("the node that runs this sandbox was lost (silent for %s) while this request waited on it; its running sandboxes are stopped as lost: look at the sandbox before you retry", nc.Grace)
	if create {
		why = fmt.Sprintf("the node this create was placed on was lost (silent for %s) before it answered; create again (a sandbox it made there meanwhile is stopped as lost)", nc.Grace)
	}
	if nc.Heartbeat <= 0 {
		return ctx, func() {}
	}
	id := s.mgr.NodeAt(base)
	lost := func() bool {
		if id == "" {
			id = s.mgr.NodeAt(base) // one that joined since the last heartbeat
		}
		return id != "" && s.mgr.NodeLost(id)
	}
	if s.nodeLost != nil {
		lost = func() bool { return s.nodeLost(base) }
	}
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(nc.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				if lost() {
					cancel(nodeLostError{pandastack.Errorf(pandastack.EUnavailable, "%s", why)})
					return
				}
			}
		}
	}()
	return ctx, func() {
		close(done)
		cancel(nil)
	}
}

// serveProxy runs p for r with the caller's body going on while the answer
// comes back. By default net/http's HTTP/1 server drains and closes a
// request's body as the answer's first bytes go out; p's transport, still
// reading that body (if only for its end), then fails and drops its
// connection, which cuts the answer off mid-stream.
//
// What p left of the body is drained before the handler returns: in full
// duplex net/http would drain it only after its last check for a
// background read, and then panic on the connection's next request
// (golang/go#68560), resetting the caller's connection.
func serveProxy(p *httputil.ReverseProxy, w http.ResponseWriter, r *http.Request) {
	http.NewResponseController(w).EnableFullDuplex()
	p.ServeHTTP(w, r)
	r.Body.Close()
}

// endStreamWithError wraps the body of a streamed answer (NDJSON events or
// binary frames) from another node so that a read that fails half-way
// ends it with the stream's own error event: unauthorized when the
// caller's key was revoked, sandbox_unavailable when the node stopped
// answering. A caller that hung up gets the error as it is; other
// answers pass unchanged.
func endStreamWithError(resp *http.Response, ctx context.Context) io.ReadCloser {
	ct := resp.Header.Get("Content-Type")
	ndjson := strings.HasPrefix(ct, "application/x-ndjson")
	if !ndjson && !strings.HasPrefix(ct, streamframe.MediaType) {
		return resp.Body
	}
	return &streamTail{ReadCloser: resp.Body, ctx: ctx, ndjson: ndjson}
}

type streamTail struct {
	io.ReadCloser
	ctx    context.Context
	ndjson bool
	ending // the error event, once the read failed
	// Where the bytes passed so far stop: an event can follow only at a
	// line's end (NDJSON) or a frame's (hdr bytes of a frame's header
	// seen, then left bytes of its payload to come).
	midLine bool
	hdr     []byte
	left    int
	// final: the last whole event ended the stream (an exit or an error);
	// a cut after it is the stream's end, not a failure. line and typ are
	// what tells: the current line's start, the current frame's type.
	final bool
	line  []byte
	typ   byte
}

// finalLine reports whether an NDJSON line beginning so ends a stream.
func finalLine(start []byte) bool {
	return bytes.HasPrefix(start, []byte(`{"type":"exit"`)) || bytes.HasPrefix(start, []byte(`{"type":"error"`))
}

// pass notes the bytes b handed on.
func (t *streamTail) pass(b []byte) {
	if t.ndjson {
		for len(b) > 0 {
			i := bytes.IndexByte(b, '\n')
			part := b
			if i >= 0 {
				part = b[:i]
			}
			if k := min(len(part), 16-len(t.line)); k > 0 {
				t.line = append(t.line, part[:k]...)
			}
			if i < 0 {
				t.midLine = true
				return
			}
			t.final, t.midLine, t.line = finalLine(t.line), false, t.line[:0]
			b = b[i+1:]
		}
		return
	}
	for len(b) > 0 {
		if t.left > 0 {
			k := min(t.left, len(b))
			t.left -= k
			b = b[k:]
			if t.left == 0 {
				t.final = t.typ == streamframe.Exit || t.typ == streamframe.Error
			}
			continue
		}
		k := min(streamframe.HeaderSize-len(t.hdr), len(b))
		t.hdr = append(t.hdr, b[:k]...)
		b = b[k:]
		if len(t.hdr) == streamframe.HeaderSize {
			t.typ, t.left = t.hdr[0], int(binary.BigEndian.Uint32(t.hdr[1:]))
			t.hdr = t.hdr[:0]
			if t.left == 0 {
				t.final = t.typ == streamframe.Exit || t.typ == streamframe.Error
			}
		}
	}
}

// atBoundary reports whether an event may follow what was passed.
func (t *streamTail) atBoundary() bool {
	if t.ndjson {
		return !t.midLine
	}
	return len(t.hdr) == 0 && t.left == 0
}

func (t *streamTail) Read(p []byte) (int, error) {
	if t.ended {
		return t.rest(p)
	}
	n, err := t.ReadCloser.Read(p)
	t.pass(p[:n])
	if err == nil || err == io.EOF || !t.atBoundary() {
		return n, err // cut inside an event: nothing can follow it
	}
	if t.final {
		return n, io.EOF // cut after the stream's last event: it ended
	}
	cause := revokedErr(t.ctx, nil)
	if cause == nil {
		cause = nodeLostCause(t.ctx)
	}
	if cause == nil {
		if t.ctx.Err() != nil {
			return n, err // the caller hung up: nobody to tell
		}
		cause = pandastack.Errorf(pandastack.EUnavailable, "the node that runs this sandbox stopped answering in the middle of the stream; what ran may have finished or not: check before you retry")
	}
	eb := errorJSON(cause)
	if t.ndjson {
		b, _ := json.Marshal(streamEvent{Type: "error", Error: &eb.Error})
		t.tail = append(b, '\n')
	} else {
		b, _ := json.Marshal(eb)
		t.tail, _ = streamframe.AppendFrame(nil, streamframe.Error, b)
	}
	t.ended = true
	return n, nil
}
