package api

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/sandbox"
)

// fileRequest is a file route's query, checked before the sandbox is asked.
type fileRequest struct {
	path      string
	root      bool   // ?user=root
	recursive bool   // DELETE only
	to        string // rename only: the new path
	overwrite bool   // rename only
}

// fileQuery checks a file route's query strictly with the same checks the
// agent applies (agentproto): known parameters only, a sane path, a known
// user, a real boolean. A refused path is logged, since a client sending
// 100 kB paths is worth an operator's look.
func (s *Server) fileQuery(r *http.Request, extra ...string) (fileRequest, error) {
	q := r.URL.Query()
	if err := agentproto.CheckQuery(q, append([]string{"path", "user"}, extra...)...); err != nil {
		return fileRequest{}, err
	}
	var fr fileRequest
	fr.path = q.Get("path")
	if fr.path == "" {
		return fr, pandastack.Errorf(pandastack.EInvalid, "the path query parameter is required, e.g. ?path=/home/user/data.csv")
	}
	if err := agentproto.CheckPath(fr.path); err != nil {
		s.log.Warn("file request refused: bad path", "method", r.Method, "route", r.URL.Path, "path_bytes", len(fr.path), "err", pandastack.ErrorMessage(err))
		return fr, err
	}
	var err error
	if fr.root, err = agentproto.CheckFileUser(q.Get("user")); err != nil {
		return fr, err
	}
	for _, k := range extra {
		switch k {
		case "recursive":
			fr.recursive, err = agentproto.ParseBool(k, q.Get(k), false)
		case "overwrite":
			fr.overwrite, err = agentproto.ParseBool(k, q.Get(k), false)
		case "to":
			if fr.to = q.Get(k); fr.to == "" {
				err = pandastack.Errorf(pandastack.EInvalid, "the to query parameter is required: the new path, e.g. ?path=data.csv&to=archive/data.csv")
			} else if err = agentproto.CheckPath(fr.to); err != nil {
				s.log.Warn("file request refused: bad path", "method", r.Method, "route", r.URL.Path, "path_bytes", len(fr.to), "err", pandastack.ErrorMessage(err))
			}
		}
		if err != nil {
			return fr, err
		}
	}
	return fr, nil
}

// fileDeadline bounds a file operation that moves no data (stat, list,
// mkdir, delete); the agent bounds its own walks a little sooner.
const fileDeadline = 3 * time.Minute

// fileIdle is how long a transfer may move no bytes before it is abandoned
// (a variable for tests).
var fileIdle = time.Minute

// fileError turns a missed deadline into ETimeout.
func fileError(ctx context.Context, err error, what string, limit time.Duration) error {
	if errors.Is(err, context.DeadlineExceeded) || (ctx.Err() != nil && errors.Is(context.Cause(ctx), errIdle)) {
		return pandastack.Errorf(pandastack.ETimeout, "%s did not finish within %s", what, limit)
	}
	return err
}

var errIdle = errors.New("transfer idle")

// idleGuard cancels a transfer's context when no bytes move for fileIdle.
type idleGuard struct {
	mu     sync.Mutex
	timer  *time.Timer
	cancel context.CancelCauseFunc
}

func newIdleGuard(ctx context.Context) (context.Context, *idleGuard) {
	return newIdleGuardThen(ctx, nil)
}

// newUploadGuard is newIdleGuard for a transfer that reads r's body: when it
// goes idle, the body's read is cut too. Cancelling the context alone left
// the handler blocked reading a client that sent part of its body and
// stopped, with the upload counted as work in the sandbox (no pause, no
// snapshot, no idle suspend) for as long as the client kept the connection.
func newUploadGuard(w http.ResponseWriter, r *http.Request) (context.Context, *idleGuard) {
	rc := http.NewResponseController(w)
	return newIdleGuardThen(r.Context(), func() { rc.SetReadDeadline(time.Now()) })
}

func newIdleGuardThen(ctx context.Context, onIdle func()) (context.Context, *idleGuard) {
	ctx, cancel := context.WithCancelCause(ctx)
	g := &idleGuard{cancel: cancel}
	g.timer = time.AfterFunc(fileIdle, func() {
		cancel(errIdle)
		if onIdle != nil {
			onIdle()
		}
	})
	return ctx, g
}

func (g *idleGuard) touch() { g.timer.Reset(fileIdle) }

func (g *idleGuard) stop() {
	g.timer.Stop()
	g.cancel(nil)
}

// reader wraps r so that every read that moves bytes resets the guard.
func (g *idleGuard) reader(r io.Reader) io.Reader {
	return readerFunc(func(p []byte) (int, error) {
		n, err := r.Read(p)
		if n > 0 {
			g.touch()
		}
		return n, err
	})
}

// writer wraps w so that the guard waits while a write to the client is
// under way: the guard is for a sandbox that stops sending, not for a
// client that reads slowly (a download paused by its client for minutes
// must not be cut for it).
func (g *idleGuard) writer(w io.Writer) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		g.timer.Stop()
		defer g.touch()
		return w.Write(p)
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// fileAgent checks the query and finds the sandbox's agent; on failure it
// has answered already.
func (s *Server) fileAgent(w http.ResponseWriter, r *http.Request, project string, extra ...string) (*sandbox.AgentClient, fileRequest, bool) {
	fr, err := s.fileQuery(r, extra...)
	if err == nil {
		var agent *sandbox.AgentClient
		if agent, err = s.mgr.Agent(r.Context(), project, r.PathValue("id")); err == nil {
			return agent, fr, true
		}
	}
	writeError(w, err)
	return nil, fr, false
}

func (s *Server) putFile(w http.ResponseWriter, r *http.Request, project string) {
	if r.ContentLength > s.cfg.MaxUploadBytes {
		writeError(w, pandastack.Errorf(pandastack.ETooLarge, "upload of %d bytes is over the server's limit of %d", r.ContentLength, s.cfg.MaxUploadBytes))
		return
	}
	fr, err := s.fileQuery(r)
	if err != nil {
		writeError(w, err)
		return
	}
	agent, done, err := s.mgr.Acquire(r.Context(), project, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer done()
	clearBodyDeadline(w) // an upload takes as long as it moves
	ctx, idle := newUploadGuard(w, r)
	defer idle.stop()
	body := idle.reader(http.MaxBytesReader(w, r.Body, s.cfg.MaxUploadBytes))
	fi, err := agent.PutFile(ctx, fr.path, fr.root, body)
	if err != nil {
		var tooBig *http.MaxBytesError
		var broken *sandbox.BodyError
		if errors.As(err, &tooBig) {
			err = pandastack.Errorf(pandastack.ETooLarge, "upload is over the server's limit of %d bytes", s.cfg.MaxUploadBytes)
		} else if errors.As(err, &broken) && ctx.Err() == nil {
			err = pandastack.Errorf(pandastack.EInvalid, "the upload's body could not be read: %v", broken.Err)
		}
		err = fileError(ctx, err, "the upload (no data moved for a while)", fileIdle)
		s.logFailure(r, err)
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

// getFile relays a download. A failure after the status line went out
// cannot be an error answer any more: the response is aborted instead
// (the connection is cut before the body is complete), so no client takes
// a truncated file for a whole one.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request, project string) {
	agent, fr, ok := s.fileAgent(w, r, project)
	if !ok {
		return
	}
	ctx, idle := newIdleGuard(r.Context())
	defer idle.stop()
	rc, size, err := agent.GetFile(ctx, fr.path, fr.root)
	if err != nil {
		err = fileError(ctx, err, "the download", fileIdle)
		s.logFailure(r, err)
		writeError(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	if size >= 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	}
	w.WriteHeader(http.StatusOK)
	n, err := io.Copy(idle.writer(w), idle.reader(rc))
	if err == nil && size >= 0 && n != size {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		s.log.Warn("download broke off; aborting the response", "sandbox", r.PathValue("id"), "sent", n, "err", err)
		panic(http.ErrAbortHandler)
	}
}

// metaOp serves a file operation that moves no data: the query checked,
// the agent found, call run under fileDeadline, and its answer (nil: 204)
// or error written.
func metaOp[T any](s *Server, w http.ResponseWriter, r *http.Request, project, what string, call func(context.Context, *sandbox.AgentClient, fileRequest) (T, error), extra ...string) {
	agent, fr, ok := s.fileAgent(w, r, project, extra...)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), fileDeadline)
	defer cancel()
	out, err := call(ctx, agent, fr)
	if err != nil {
		writeError(w, fileError(ctx, err, what, fileDeadline))
		return
	}
	if any(out) == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request, project string) {
	metaOp(s, w, r, project, "the delete", func(ctx context.Context, a *sandbox.AgentClient, fr fileRequest) (any, error) {
		return nil, a.RemoveFile(ctx, fr.path, fr.root, fr.recursive)
	}, "recursive")
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request, project string) {
	metaOp(s, w, r, project, "the listing", func(ctx context.Context, a *sandbox.AgentClient, fr fileRequest) (map[string]any, error) {
		list, err := a.ListFiles(ctx, fr.path, fr.root)
		return map[string]any{"files": list}, err
	})
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request, project string) {
	metaOp(s, w, r, project, "the stat", func(ctx context.Context, a *sandbox.AgentClient, fr fileRequest) (agentproto.FileInfo, error) {
		return a.StatFile(ctx, fr.path, fr.root)
	})
}

// queryOrBody decodes r's JSON body into v (strictly; an empty body is
// {}) and refuses one that gives anything (given) when the query gives a
// parameter of the operation too: they come from one or the other, never
// half from each. ?user= may go with either.
func queryOrBody(r *http.Request, v any, given func() bool) error {
	if err := decode(r, v); err != nil {
		return err
	}
	if !given() {
		return nil
	}
	for k := range r.URL.Query() {
		if k != "user" {
			return pandastack.Errorf(pandastack.EInvalid, "the query gives %.40q and the JSON body gives parameters too: give them in one or the other (?user= may go with either)", k)
		}
	}
	return nil
}

// renameFile moves a file or directory within the sandbox (?path= to
// ?to=, or the same in a JSON body), refusing an existing destination
// unless ?overwrite=true.
func (s *Server) renameFile(w http.ResponseWriter, r *http.Request, project string) {
	var body struct {
		Path      string `json:"path"`
		To        string `json:"to"`
		Overwrite bool   `json:"overwrite"`
	}
	if err := queryOrBody(r, &body, func() bool { return body.Path != "" || body.To != "" || body.Overwrite }); err != nil {
		writeError(w, err)
		return
	}
	if r.URL.Query().Get("path") == "" {
		q := r.URL.Query()
		for k, v := range map[string]string{"path": body.Path, "to": body.To} {
			if v != "" {
				q.Set(k, v)
			}
		}
		if body.Overwrite {
			q.Set("overwrite", "true")
		}
		r.URL.RawQuery = q.Encode()
	}
	metaOp(s, w, r, project, "the rename", func(ctx context.Context, a *sandbox.AgentClient, fr fileRequest) (agentproto.FileInfo, error) {
		return a.RenameFile(ctx, fr.path, fr.to, fr.root, fr.overwrite)
	}, "to", "overwrite")
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request, project string) {
	// The path may come as ?path= or as a JSON body {"path": ...}.
	var body struct {
		Path string `json:"path"`
	}
	if err := queryOrBody(r, &body, func() bool { return body.Path != "" }); err != nil {
		writeError(w, err)
		return
	}
	if body.Path != "" {
		q := r.URL.Query()
		q.Set("path", body.Path)
		r.URL.RawQuery = q.Encode()
	}
	metaOp(s, w, r, project, "the mkdir", func(ctx context.Context, a *sandbox.AgentClient, fr fileRequest) (agentproto.FileInfo, error) {
		return a.MakeDir(ctx, fr.path, fr.root)
	})
}

// watchKeepalive is how often a quiet watch stream sends a keepalive line:
// a proxy in front does not cut it for idleness, and a client that went
// away is noticed (its watch then ends). A variable for tests.
var watchKeepalive = 30 * time.Second

// watchFiles streams the changes in a directory (?path=, ?recursive=,
// ?user=) as NDJSON FileEvent lines, the first saying the watch is live,
// with a keepalive line now and then, until the caller hangs up, the
// directory goes, or the server shuts down (an error line says so).
// Someone watching uses the sandbox: it is not suspended for idleness
// meanwhile.
func (s *Server) watchFiles(w http.ResponseWriter, r *http.Request, project string) {
	fr, err := s.fileQuery(r, "recursive")
	if err != nil {
		writeError(w, err)
		return
	}
	agent, done, err := s.mgr.Hold(r.Context(), project, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer done()
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var shutdown atomic.Bool
	go func() {
		select {
		case <-s.draining:
			shutdown.Store(true)
			cancel()
		case <-ctx.Done():
		}
	}()
	nd := newNDJSON(w)
	var mu sync.Mutex // the agent's events and the keepalives
	ended := false    // the handler returns: nothing may write any more
	send := func(v any) error {
		mu.Lock()
		defer mu.Unlock()
		if ended {
			return context.Canceled
		}
		return nd.send(v)
	}
	keepalive := func() {
		t := time.NewTicker(watchKeepalive)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				if send(pandastack.FileEvent{Type: pandastack.FileEventKeepalive}) != nil {
					cancel() // the client is gone
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}
	err = agent.WatchDir(ctx, fr.path, fr.root, fr.recursive, func(ev agentproto.FileEvent) error {
		if err := send(ev); err != nil {
			return err
		}
		if ev.Type == pandastack.FileEventWatching {
			go keepalive() // after the first line, which says the watch is live
		}
		return nil
	})
	cancel()
	mu.Lock()
	defer mu.Unlock()
	defer func() { ended = true }() // under mu, as the handler returns
	if shutdown.Load() && nd.started {
		nd.send(pandastack.FileEvent{Type: pandastack.FileEventError, Error: &pandastack.StreamError{Code: pandastack.EUnavailable, Message: "the server is shutting down"}})
		return
	}
	if revoked := revokedErr(r.Context(), nil); revoked != nil {
		// The watch ended cleanly as its context did: say why.
		if !nd.started {
			writeError(w, revoked)
			return
		}
		eb := errorJSON(revoked)
		nd.send(pandastack.FileEvent{Type: pandastack.FileEventError, Error: &pandastack.StreamError{Code: eb.Error.Code, Message: eb.Error.Message}})
		return
	}
	if err == nil || r.Context().Err() != nil {
		if !nd.started { // cannot be: the agent's first line says the watch is live
			w.WriteHeader(http.StatusNoContent)
		}
		return
	}
	s.logFailure(r, err)
	err = agent.Explain(err)
	if !nd.started {
		writeError(w, err)
		return
	}
	eb := errorJSON(revokedErr(r.Context(), err))
	nd.send(pandastack.FileEvent{Type: pandastack.FileEventError, Error: &pandastack.StreamError{Code: eb.Error.Code, Message: eb.Error.Message}})
}
