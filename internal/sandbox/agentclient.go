package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/streamframe"
)

// AgentClient talks to one sandbox's agent over one channel session. It is
// safe for concurrent use: every request rides its own yamux stream.
type AgentClient struct {
	id    string
	epoch uint32
	sess  *yamux.Session
	http  *http.Client
	hello agentproto.Hello
	gone  atomic.Pointer[string] // the stop reason, once the manager stops the sandbox
	// contexts holds the ids of the code contexts known to exist (see
	// HasContext).
	contexts sync.Map
	// heldSpares: the hello held the agent's spare refills (refills.go).
	heldSpares bool
	// hostOOMKills counts the host's out-of-memory kills in the sandbox
	// (hostoom.go); nil when the runtime cannot. Set before the client is
	// shared (Manager.countHostKills).
	hostOOMKills func() int64
	procKills    procKills
}

// dialAgent opens a new session (a new epoch) on rwc and says hello. On
// failure it closes rwc. reseed is for a sandbox just restored from an
// image that others restore too (a template's warm image, a snapshot, a
// fork): the agent reseeds its kernels' random generators, as fresh
// processes would be, so no two sandboxes draw the same numbers. A
// sandbox's own image (pause, a server restart) keeps its state as is.
func dialAgent(ctx context.Context, id string, rwc io.ReadWriteCloser, reseed bool) (*AgentClient, error) {
	return dialAgentWith(ctx, id, rwc, hello{reseed: reseed})
}

// hello is what a dial asks of the agent in its hello: reseed (see
// dialAgent); holdSpares, a hold of the spares' refills that the
// manager's refill pacer ends (refills.go); and the sandbox's setup
// (setupSandbox) done in the same round trip: resolver, the nameserver to
// write into its resolv.conf, and caMarker, to learn whether its trust
// store has the host's certificates. A dial that must give up as soon as
// its sandbox is gone runs under watchAlive (Manager.dialAndSetup).
type hello struct {
	reseed, holdSpares bool
	resolver           string
	caMarker           bool
}

// helloWatchAfter is how long a hello may take before the dial asks every
// helloWatchEvery whether the sandbox still runs: hellos take
// milliseconds, and the first ask costs a runsc process (Runtime.Alive).
var helloWatchAfter, helloWatchEvery = time.Second, 250 * time.Millisecond

// errSandboxGone ends the wait for a hello whose sandbox is gone.
var errSandboxGone = errors.New("the sandbox is gone")

// watchAlive cancels ctx with errSandboxGone once alive says id is gone,
// asking from helloWatchAfter on; stop ends the watch and waits for an ask
// under way (a late answer about this boot must not land after the next
// boot of the same id began).
func watchAlive(ctx context.Context, cancel context.CancelCauseFunc, id string, alive func(string) bool) (stop func()) {
	if alive == nil {
		return func() {}
	}
	done, ended := make(chan struct{}), make(chan struct{})
	after, every := helloWatchAfter, helloWatchEvery // read here: a test sets them
	go func() {
		defer close(ended)
		t := time.NewTimer(after)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if !alive(id) {
				cancel(errSandboxGone)
				return
			}
			t.Reset(every)
		}
	}()
	return func() { close(done); <-ended }
}

// dialAgentWith is dialAgent with more to ask in the hello.
func dialAgentWith(ctx context.Context, id string, rwc io.ReadWriteCloser, h hello) (*AgentClient, error) {
	epoch := rand.Uint32() | 1 // never 0, so a zeroed header is never ours
	mc := agentproto.MuxConfig()
	// A stream this side closed first (fullClose) is read no more: the
	// agent's writes into it block once its window is used up, holding a
	// cancelled cell from its interrupt, until a reset; yamux's default
	// sends it after 5 minutes. Host side only: a reset makes the reader
	// drop what it has buffered.
	mc.StreamCloseTimeout = 10 * time.Second
	sess, err := yamux.Client(agentproto.HostConn(rwc, epoch), mc)
	if err != nil {
		rwc.Close()
		return nil, fmt.Errorf("agent session %s: %w", id, err)
	}
	c := &AgentClient{id: id, epoch: epoch, sess: sess}
	c.http = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return openStream(sess)
		},
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     60 * time.Second,
		DisableCompression:  true,
		// Streamed output comes in frames of up to 256 KiB: a bigger
		// buffer than the default 4 KiB takes it in fewer stream reads.
		ReadBufferSize: 64 << 10,
	}}
	tctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	// large_frames: this host reads the agent's frames of up to 1 MiB
	// (agentproto.AllowLargeFrames); an older agent ignores it.
	q := url.Values{"sandbox_id": {id}, "large_frames": {"1"}}
	if h.reseed {
		q.Set("reseed", "1")
	}
	if h.holdSpares {
		q.Set("hold_spares", "1")
	}
	if h.resolver != "" {
		q.Set("resolver", h.resolver)
	}
	if h.caMarker {
		q.Set("ca_marker", "1")
	}
	if err := c.do(tctx, http.MethodGet, "/v1/hello", q, nil, &c.hello); err != nil {
		c.Close()
		if ownDeadline(tctx, ctx) {
			return nil, pandastack.Errorf(pandastack.ETimeout, "sandbox %s: its agent did not answer its hello within %s; the host may be overloaded", id, setupTimeout)
		}
		return nil, fmt.Errorf("agent hello %s: %w", id, err)
	}
	if c.hello.ProtocolVersion != agentproto.ProtocolVersion {
		c.Close()
		return nil, fmt.Errorf("agent hello %s: protocol version %d, want %d", id, c.hello.ProtocolVersion, agentproto.ProtocolVersion)
	}
	if c.hello.Epoch != epoch {
		c.Close()
		return nil, fmt.Errorf("agent hello %s: answered for epoch %d, want %d", id, c.hello.Epoch, epoch)
	}
	c.knowContexts(c.hello.Contexts)
	c.heldSpares = h.holdSpares
	return c, nil
}

// openStream opens a stream of sess for one HTTP connection (fullClose).
func openStream(sess *yamux.Session) (net.Conn, error) {
	st, err := sess.Open()
	if err != nil {
		return nil, err
	}
	return fullClose{st}, nil
}

// fullClose is a yamux stream whose Close also ends a Read under way. A
// yamux Close only half-closes the stream (it sends FIN and reads on), and
// net/http cancels a request by closing its connection: the read of an
// answer's body, a command's output say, whose request was cancelled
// waited for the agent's next bytes, forever from a dead sandbox, until
// the session's keepalive failed (45 s: a create whose sandbox died during
// its setup answered only then). What was received before the Close is
// still read; then the read fails with a timeout, not EOF, so a cut answer
// never passes for a whole one.
type fullClose struct{ net.Conn }

func (c fullClose) Close() error {
	c.Conn.SetReadDeadline(time.Now())
	return c.Conn.Close()
}

// Close ends the session; the sandbox keeps running.
func (c *AgentClient) Close() error {
	c.http.CloseIdleConnections()
	return c.sess.Close()
}

// reasonShutdown marks the sessions the manager's Close ends: the server
// stops, the sandbox does not.
const reasonShutdown = "server shutdown"

// reasonKillOnExit marks the sessions of sandboxes a server run with
// --kill-on-exit kills as it stops: nobody sent a DELETE.
const reasonKillOnExit = "server shutdown, kill on exit"

// reasonPaused marks the sessions a pause or an idle suspend ends: the
// sandbox is on disk, whole (a follow of a process's output is cut by it).
const reasonPaused = "paused"

// markStopped records why the manager is stopping the sandbox (a
// pandastack.Stop* reason), before it closes the session, so that requests
// in flight fail saying why rather than guessing.
func (c *AgentClient) markStopped(reason string) {
	c.gone.CompareAndSwap(nil, &reason)
}

// stopped is the error of a request cut off by the sandbox's end, during
// what ("running code", "exec", "the request").
func (c *AgentClient) stopped(what string) error {
	reason := ""
	if r := c.gone.Load(); r != nil {
		reason = *r
	}
	switch reason {
	case pandastack.StopKilled:
		return pandastack.Errorf(pandastack.EStopped, "sandbox %s was killed (DELETE /v1/sandboxes/%s) during %s", c.id, c.id, what)
	case pandastack.StopExpired:
		return pandastack.Errorf(pandastack.EStopped, "sandbox %s reached the end of its TTL and was stopped during %s", c.id, what)
	case pandastack.StopOOM:
		return pandastack.Errorf(pandastack.EStopped, "sandbox %s ran out of memory (it used more than its memory_mb) and was stopped during %s", c.id, what)
	case pandastack.StopPIDsLimit:
		return pandastack.Errorf(pandastack.EStopped, "sandbox %s ran out of processes (its pids limit) and was stopped during %s", c.id, what)
	case reasonKillOnExit:
		return pandastack.Errorf(pandastack.EStopped, "the server is shutting down with --kill-on-exit, which kills every sandbox: sandbox %s was killed during %s", c.id, what)
	case reasonShutdown:
		return pandastack.Errorf(pandastack.EUnavailable, "the server is shutting down and cut off %s in sandbox %s, which keeps running: retry once the server is back", what, c.id)
	case reasonPaused:
		return pandastack.Errorf(pandastack.EUnavailable, "sandbox %s was paused (on request or for idleness) during %s; its processes are paused with it: resume it and ask again", c.id, what)
	case "":
		return pandastack.Errorf(pandastack.EUnavailable, "sandbox %s stopped answering during %s: it died (out of memory, if it used more than its memory_mb); GET /v1/sandboxes/%s shows the reason", c.id, what, c.id)
	}
	return pandastack.Errorf(pandastack.EStopped, "sandbox %s stopped (%s) during %s", c.id, reason, what)
}

// Ended is the error of what ("the terminal"), cut off by the sandbox's
// end, once the manager knows of that end; nil before.
func (c *AgentClient) Ended(what string) error {
	if c.gone.Load() == nil {
		return nil
	}
	return c.stopped(what)
}

// Explain turns an error of a request that the sandbox's end cut off into
// one that says how it ended, once the manager knows (after Reconcile).
func (c *AgentClient) Explain(err error) error {
	if c.gone.Load() == nil || !pandastack.IsCode(err, pandastack.EUnavailable) {
		return err
	}
	return c.stopped(c.during(err))
}

// describe names a request for an error message.
func describe(method, path string) string {
	switch {
	case strings.HasSuffix(path, "/run"):
		return "running code"
	case path == "/v1/exec":
		return "exec"
	case path == "/v1/processes/kill":
		return "the kill of its processes"
	case path == "/v1/files/rename":
		return "a file rename"
	case path == "/v1/files" && method == http.MethodPut:
		return "a file upload"
	case path == "/v1/files" && method == http.MethodGet:
		return "a file download"
	case strings.HasPrefix(path, "/v1/files"):
		return "a file operation"
	}
	return "the request" // the agent's own routes mean nothing to the caller
}

// during recovers what the request was doing from its error's message.
func (c *AgentClient) during(err error) string {
	if m := duringRE.FindStringSubmatch(pandastack.ErrorMessage(err)); m != nil {
		return m[1]
	}
	return "the request"
}

// duringRE finds what a request was doing in its error's message.
var duringRE = regexp.MustCompile(`during (running code|exec|the output of process \d+|the kill of its processes|a file (?:rename|upload|download|operation))`)

// Alive reports whether the session still stands.
func (c *AgentClient) Alive() bool { return !c.sess.IsClosed() }

// Done is closed when the session ends: the sandbox was paused, killed or
// stopped, or the server is closing.
func (c *AgentClient) Done() <-chan struct{} { return c.sess.CloseChan() }

// Hello returns the agent's answer to the session's hello.
func (c *AgentClient) Hello() agentproto.Hello { return c.hello }

func (c *AgentClient) request(ctx context.Context, method, path string, q url.Values, body io.Reader) (*http.Response, error) {
	return c.requestAccept(ctx, method, path, q, body, "")
}

// requestAccept is request with an Accept header (none if accept is "").
func (c *AgentClient) requestAccept(ctx context.Context, method, path string, q url.Values, body io.Reader, accept string) (*http.Response, error) {
	u := "http://agent" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	// A body streamed from a caller (an upload) is watched for the
	// caller's failures. One in memory (JSON) cannot fail, and stays as it
	// is: its known length lets the agent read it to its end, and only
	// then does the agent's server notice a hang-up (a chunked JSON body
	// left every cancelled run running on).
	var rec *BodyReader
	switch body.(type) {
	case nil, *bytes.Reader, *bytes.Buffer, *strings.Reader:
	default:
		rec = &BodyReader{R: body}
		body = rec
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return nil, err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if rec != nil && rec.Err() != nil {
			return nil, &BodyError{Err: rec.Err()} // the caller's body, not the sandbox
		}
		if c.sess.IsClosed() {
			return nil, c.stopped(describe(method, path))
		}
		return nil, pandastack.Errorf(pandastack.EUnavailable, "sandbox %s is not answering during %s: %v", c.id, describe(method, path), err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		err := decodeAgentError(resp)
		if resp.StatusCode == http.StatusNotFound && strings.HasPrefix(pandastack.ErrorMessage(err), noEndpoint) {
			what := describe(method, path)
			if what == "the request" || what == "a file operation" {
				// What that agent lacks is a route, which these names
				// for the caller would hide.
				what = method + " " + path
			}
			return nil, c.tooOld(what)
		}
		return nil, err
	}
	return resp, nil
}

// noEndpoint starts the agent's answer to a route it does not have (an
// agent of an older build, started by an earlier server).
const noEndpoint = "the agent has no endpoint"

// tooOld is the error of an operation the sandbox's agent cannot do: it is
// of an older build (the sandbox was started, or its image taken, by an
// earlier server). Not a retry's matter: the sandbox keeps that agent.
func (c *AgentClient) tooOld(what string) error {
	return pandastack.Errorf(pandastack.EConflict, "sandbox %s runs the agent of an older server build, which cannot do %s; a sandbox created now can", c.id, what)
}

// BodyReader reads R and keeps its first failure (io.EOF is none): a
// request that failed while its body was read failed on its caller's side
// (a client that broke off, sent a malformed or too large body), which
// the transport's error does not tell from the far side going away.
type BodyReader struct {
	R   io.Reader
	mu  sync.Mutex
	err error
}

func (b *BodyReader) Read(p []byte) (int, error) {
	n, err := b.R.Read(p)
	// A read after the transport closed the body (it gave up on the far
	// side) is not the caller's failure.
	if err != nil && err != io.EOF && !errors.Is(err, http.ErrBodyReadAfterClose) {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
	}
	return n, err
}

// Err is the body's first read failure, nil if none. The transport reads
// the body in a goroutine of its own, which may still run when the
// request has failed.
func (b *BodyReader) Err() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// A BodyError is a failure to read the body a request to the agent
// carried (BodyReader): the caller's, not the sandbox's. It unwraps to the
// read's error (*http.MaxBytesError for a body over a limit).
type BodyError struct{ Err error }

func (e *BodyError) Error() string { return "reading the request's body: " + e.Err.Error() }
func (e *BodyError) Unwrap() error { return e.Err }

// do sends a request and decodes a JSON answer into out (if non-nil).
func (c *AgentClient) do(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	resp, err := c.request(ctx, method, path, q, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		io.CopyN(io.Discard, resp.Body, maxAgentAnswer) // an answer that goes on is not read for ever
		return nil
	}
	if err := json.NewDecoder(&capped{r: resp.Body, left: maxAgentAnswer}).Decode(out); err != nil {
		return fmt.Errorf("agent %s %s: bad answer: %w", method, path, err)
	}
	return nil
}

// maxAgentAnswer bounds a JSON answer of the agent's, which code in the
// sandbox could tamper with: its largest, a listing of the 100 000 entries
// the agent lists at most, is some 20 MB.
const maxAgentAnswer = 64 << 20

// errAnswerTooLarge ends an answer read past maxAgentAnswer.
var errAnswerTooLarge = errors.New("the answer is larger than 64 MiB")

// capped reads r until left bytes have been read, then fails.
type capped struct {
	r    io.Reader
	left int64
}

func (c *capped) Read(p []byte) (int, error) {
	if c.left <= 0 {
		return 0, errAnswerTooLarge
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	return n, err
}

// agentCodes are the error codes an agent may give a client: the agent
// runs inside the sandbox, where user code could tamper with it, so
// anything else (auth, method, storage codes, unknown ones) is internal.
var agentCodes = map[string]bool{
	pandastack.EInvalid: true, pandastack.ENotFound: true, pandastack.EConflict: true,
	pandastack.ETimeout: true, pandastack.EUnavailable: true, pandastack.ECommandNotFound: true,
	pandastack.ETooLarge: true, pandastack.EInternal: true, pandastack.EPermission: true,
}

func decodeAgentError(resp *http.Response) error {
	var eb agentproto.ErrorBody
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
		return fromAgent(resp.Status, eb.Error.Code, eb.Error.Message)
	}
	return fmt.Errorf("agent answered %s: %.200s", resp.Status, bytes.TrimSpace(b))
}

// fromAgent is the error an agent reported (in an answer, or in a stream
// after it began), with its code if it is one an agent may give, else an
// internal error that names it.
func fromAgent(where, code, message string) error {
	if !agentCodes[code] {
		return fmt.Errorf("agent answered %s with code %.40q, which it may not give: %.200s", where, code, message)
	}
	return &pandastack.Error{Code: code, Message: message}
}

// Exec runs a command and calls onEvent for every output chunk and for the
// final exit event, in order. It returns the exit event. If onEvent fails,
// the command is cancelled and that error returned. An event's Data is valid
// only during its onEvent call.
//
// The agent answers in binary frames (streamframe), or in NDJSON if it is
// older than this host (an agent of a restored snapshot) and ignores Accept.
func (c *AgentClient) Exec(ctx context.Context, req agentproto.ExecRequest, onEvent func(agentproto.ExecEvent) error) (agentproto.ExecEvent, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // cancelling the stream kills the command in the sandbox
	b, err := json.Marshal(req)
	if err != nil {
		return agentproto.ExecEvent{}, err
	}
	kills := c.oomKills()
	resp, err := c.requestAccept(ctx, http.MethodPost, "/v1/exec", nil, bytes.NewReader(b), streamframe.MediaType+", application/x-ndjson")
	if err != nil {
		return agentproto.ExecEvent{}, err
	}
	defer resp.Body.Close()
	if onEvent == nil {
		onEvent = func(agentproto.ExecEvent) error { return nil }
	}
	onEvent = explainHostKills("command", kills, c.oomKills, onEvent)
	if resp.Header.Get("Content-Type") == streamframe.MediaType {
		return c.execFrames(ctx, resp.Body, onEvent)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for sc.Scan() {
		var ev agentproto.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return agentproto.ExecEvent{}, fmt.Errorf("exec %s: bad event: %w", c.id, err)
		}
		if err := onEvent(ev); err != nil {
			return agentproto.ExecEvent{}, err
		}
		if ev.Type == "exit" {
			return ev, nil
		}
	}
	return agentproto.ExecEvent{}, c.streamEnded(ctx, sc.Err(), "exec")
}

// execFrames reads the agent's binary exec answer.
func (c *AgentClient) execFrames(ctx context.Context, body io.Reader, onEvent func(agentproto.ExecEvent) error) (agentproto.ExecEvent, error) {
	fr := streamframe.NewReader(body)
	for {
		t, p, err := fr.Next()
		if err == io.EOF {
			err = nil
		}
		if err != nil || t == 0 {
			if errors.Is(err, streamframe.ErrBadFrame) && ctx.Err() == nil && !c.sess.IsClosed() {
				return agentproto.ExecEvent{}, fmt.Errorf("exec %s: %w", c.id, err)
			}
			return agentproto.ExecEvent{}, c.streamEnded(ctx, err, "exec")
		}
		ev := agentproto.ExecEvent{Type: streamframe.TypeName(t)}
		switch t {
		case streamframe.Stdout, streamframe.Stderr:
			ev.Data = p
		case streamframe.Exit:
			if err := json.Unmarshal(p, &ev); err != nil || ev.Type != "exit" {
				return agentproto.ExecEvent{}, fmt.Errorf("exec %s: bad exit frame: %.200q", c.id, p)
			}
		default: // the agent reports failures before its answer starts
			return agentproto.ExecEvent{}, fmt.Errorf("exec %s: unexpected %s frame: %.200q", c.id, ev.Type, p)
		}
		if err := onEvent(ev); err != nil {
			return agentproto.ExecEvent{}, err
		}
		if t == streamframe.Exit {
			return ev, nil
		}
	}
}

// streamEnded explains why an NDJSON answer of the agent ended before its
// last event: the caller left, a line too long to hold, a broken stream, or
// the sandbox's end.
func (c *AgentClient) streamEnded(ctx context.Context, err error, what string) error {
	switch {
	case ctx.Err() != nil:
		return ctx.Err()
	case errors.Is(err, bufio.ErrTooLong):
		return pandastack.Errorf(pandastack.ETooLarge, "sandbox %s sent an event line too long to hold during %s; its output was not kept", c.id, what)
	case err != nil && !c.sess.IsClosed():
		return pandastack.Errorf(pandastack.EUnavailable, "sandbox %s: reading its answer failed during %s: %v", c.id, what, err)
	}
	return c.stopped(what)
}

// fileQuery is the agent's query for a file at path, as the sandbox user or
// as root.
func fileQuery(path string, asRoot bool) url.Values {
	q := url.Values{"path": {path}}
	if asRoot {
		q.Set("user", agentproto.FileUserRoot)
	}
	return q
}

// PutFile streams r into the file at path.
func (c *AgentClient) PutFile(ctx context.Context, path string, asRoot bool, r io.Reader) (agentproto.FileInfo, error) {
	var fi agentproto.FileInfo
	resp, err := c.request(ctx, http.MethodPut, "/v1/files", fileQuery(path, asRoot), r)
	if err != nil {
		return fi, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&fi)
	return fi, err
}

// GetFile opens the file at path for streaming; the caller closes the
// reader. size is -1 when unknown. A read error of the reader means the
// agent aborted the download midway.
func (c *AgentClient) GetFile(ctx context.Context, path string, asRoot bool) (rc io.ReadCloser, size int64, err error) {
	resp, err := c.request(ctx, http.MethodGet, "/v1/files", fileQuery(path, asRoot), nil)
	if err != nil {
		return nil, 0, err
	}
	return resp.Body, resp.ContentLength, nil
}

// RemoveFile deletes a file or an empty directory, or a tree when recursive.
func (c *AgentClient) RemoveFile(ctx context.Context, path string, asRoot, recursive bool) error {
	q := fileQuery(path, asRoot)
	if recursive {
		q.Set("recursive", "true")
	}
	return c.do(ctx, http.MethodDelete, "/v1/files", q, nil, nil)
}

// ListFiles lists a directory.
func (c *AgentClient) ListFiles(ctx context.Context, path string, asRoot bool) ([]agentproto.FileInfo, error) {
	var out []agentproto.FileInfo
	err := c.do(ctx, http.MethodGet, "/v1/files/list", fileQuery(path, asRoot), nil, &out)
	if out == nil && err == nil {
		out = []agentproto.FileInfo{}
	}
	return out, err
}

// WatchDir streams the changes in the directory at path (and beneath it,
// with recursive) to onEvent, the watch's first line included, until ctx
// ends (nil), the directory goes (nil), or the watch fails (an error: the
// agent's, or the stream's end); an error from onEvent ends it too.
// An agent too old to watch (its hello lacks
// agentproto.FeatureWatch: EConflict).
func (c *AgentClient) WatchDir(ctx context.Context, path string, asRoot, recursive bool, onEvent func(agentproto.FileEvent) error) error {
	if !c.Hello().HasFeature(agentproto.FeatureWatch) {
		return c.tooOld("a directory watch")
	}
	q := fileQuery(path, asRoot)
	if recursive {
		q.Set("recursive", "true")
	}
	resp, err := c.request(ctx, http.MethodGet, "/v1/files/watch", q, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev agentproto.FileEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return fmt.Errorf("watch of %s: bad event: %w", path, err)
		}
		switch ev.Type {
		case pandastack.FileEventError:
			if ev.Error == nil {
				return fmt.Errorf("watch of %s: an error event without its error", path)
			}
			return fromAgent("a watch", ev.Error.Code, ev.Error.Message)
		case pandastack.FileEventWatching, pandastack.FileEventCreate, pandastack.FileEventWrite, pandastack.FileEventRemove,
			pandastack.FileEventRename, pandastack.FileEventChmod, pandastack.FileEventOverflow:
		default:
			continue // not one this host knows: the agent may be tampered with
		}
		ev.Error = nil
		if err := onEvent(ev); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil || ctx.Err() != nil || c.sess.IsClosed() {
		if ctx.Err() != nil {
			return nil
		}
		return c.streamEnded(ctx, err, "the watch of "+path)
	}
	return nil
}

// StatFile describes one file.
func (c *AgentClient) StatFile(ctx context.Context, path string, asRoot bool) (agentproto.FileInfo, error) {
	var fi agentproto.FileInfo
	err := c.do(ctx, http.MethodGet, "/v1/files/stat", fileQuery(path, asRoot), nil, &fi)
	return fi, err
}

// RenameFile moves a file or directory to a new path (missing parents
// made); an existing destination is refused unless overwrite.
func (c *AgentClient) RenameFile(ctx context.Context, from, to string, asRoot, overwrite bool) (agentproto.FileInfo, error) {
	var fi agentproto.FileInfo
	q := fileQuery(from, asRoot)
	q.Set("to", to)
	if overwrite {
		q.Set("overwrite", "true")
	}
	err := c.do(ctx, http.MethodPost, "/v1/files/rename", q, nil, &fi)
	return fi, err
}

// Disk returns the size and use of the sandbox's disk; EUnavailable from
// an agent too old to tell (its hello lacks agentproto.FeatureDisk).
func (c *AgentClient) Disk(ctx context.Context) (agentproto.Disk, error) {
	var d agentproto.Disk
	if !c.Hello().HasFeature(agentproto.FeatureDisk) {
		return d, pandastack.Errorf(pandastack.EUnavailable, "the agent of sandbox %s is of a build that does not measure its disk", c.id)
	}
	err := c.do(ctx, http.MethodGet, "/v1/disk", nil, nil, &d)
	return d, err
}

// MakeDir creates a directory and its parents.
func (c *AgentClient) MakeDir(ctx context.Context, path string, asRoot bool) (agentproto.FileInfo, error) {
	var fi agentproto.FileInfo
	err := c.do(ctx, http.MethodPost, "/v1/files/mkdir", fileQuery(path, asRoot), nil, &fi)
	return fi, err
}
