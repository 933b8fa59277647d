package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/sandbox"
)

type createSandboxRequest struct {
	Template   string                    `json:"template"`
	TTLSeconds *int64                    `json:"ttl_seconds"`
	Metadata   map[string]string         `json:"metadata"`
	Env        map[string]string         `json:"env"`
	CPU        int                       `json:"cpu"`
	MemoryMB   int                       `json:"memory_mb"`
	DiskMB     int                       `json:"disk_mb"`
	SnapshotID string                    `json:"snapshot_id"`
	AutoResume bool                      `json:"auto_resume"`
	Network    *pandastack.NetworkPolicy `json:"network"`
	// IdleTimeoutSeconds: nil takes the server's default; 0 never suspends.
	IdleTimeoutSeconds *int64 `json:"idle_timeout_seconds"`
}

func (s *Server) createSandbox(w http.ResponseWriter, r *http.Request, project string) {
	var req createSandboxRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	sb, err := s.mgr.Create(r.Context(), project, sandbox.CreateRequest{
		Template: req.Template, TTLSeconds: req.TTLSeconds, Metadata: req.Metadata,
		Env: req.Env, CPU: req.CPU, MemoryMB: req.MemoryMB, DiskMB: req.DiskMB, SnapshotID: req.SnapshotID, AutoResume: req.AutoResume,
		IdleTimeoutSeconds: req.IdleTimeoutSeconds,
		Network:            req.Network,
	})
	if err != nil {
		s.logFailure(r, err)
		writeError(w, err)
		return
	}
	if s.orphaned(r, project, sb) {
		return
	}
	if req.SnapshotID != "" {
		s.noteOrigins(project, "snapshot", req.SnapshotID, sb)
	}
	writeJSON(w, http.StatusCreated, sb)
}

// orphaned kills sandboxes made for a caller that hung up before they
// were ready: nobody would ever learn their ids, and they would hold
// memory until their TTL. It reports whether it did.
func (s *Server) orphaned(r *http.Request, project string, made ...pandastack.Sandbox) bool {
	if r.Context().Err() == nil {
		return false
	}
	for _, sb := range made {
		s.log.Info("the caller hung up before its sandbox was ready; killing it", "sandbox", sb.ID, "path", r.URL.Path)
		if err := s.mgr.Kill(context.WithoutCancel(r.Context()), project, sb.ID); err != nil && !pandastack.IsCode(err, pandastack.ENotFound) {
			s.log.Warn("killing a sandbox nobody will know of", "sandbox", sb.ID, "err", err)
		}
	}
	return true
}

// logFailure logs errors that are not the caller's fault. When a sandbox
// stopped answering it also settles at once whether it died, so that the
// caller's next GET shows why.
func (s *Server) logFailure(r *http.Request, err error) {
	if rec, ok := r.Context().Value(recorderKey{}).(*statusRecorder); ok {
		if rec.logged {
			return
		}
		rec.logged = true
	}
	code := pandastack.ErrorCode(err)
	if hungUp(r, err) {
		// The caller hung up (or its deadline passed): nothing failed here.
		s.log.Debug("request ended by its caller", "method", r.Method, "path", r.URL.Path, "err", err)
		return
	}
	switch code {
	case pandastack.EInternal:
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	case pandastack.EUnavailable:
		// Often what a pause or a stop does to a stream under way, or a
		// sandbox still starting: a warning, not a fault of the server's.
		s.log.Warn("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if code == pandastack.EUnavailable && r.PathValue("id") != "" {
		s.mgr.Reconcile(r.PathValue("id"))
	}
}

// hungUp reports whether err is the end of a request whose caller went
// away: its context's error, or a write that found the caller's connection
// gone (a `| head -1` that stopped reading a stream). net/http ends the
// context when such a write fails, but the handler sees the write's error,
// not the context's. The same errors with the caller still there come
// from elsewhere (a sandbox's connection) and are failures.
func hungUp(r *http.Request, err error) bool {
	ctxErr := r.Context().Err()
	if ctxErr == nil {
		return false
	}
	return errors.Is(err, ctxErr) || errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}

// checkMetadataFilters refuses more metadata.<key> filters than a
// sandbox's or a snapshot's metadata has keys: each is a term of the
// store's query, and SQLite refused a thousand of them as too deep (an
// internal error).
func checkMetadataFilters(md map[string]string) error {
	if len(md) > sandbox.MaxMetadataKeys {
		return pandastack.Errorf(pandastack.EInvalid, "at most %d metadata.<key> filters, got %d (a sandbox or snapshot holds at most %d metadata keys)", sandbox.MaxMetadataKeys, len(md), sandbox.MaxMetadataKeys)
	}
	return nil
}

// singleValued refuses a query parameter given twice: a filter has one
// value, and the second was silently dropped. checkQuery asks it of every
// API route.
func singleValued(q url.Values) error {
	for k, vs := range q {
		if len(vs) > 1 {
			return pandastack.Errorf(pandastack.EInvalid, "query parameter %.80q is given %d times; give it once", k, len(vs))
		}
	}
	return nil
}

func (s *Server) listSandboxes(w http.ResponseWriter, r *http.Request, project string) {
	f := pandastack.SandboxFilter{Metadata: map[string]string{}}
	q := r.URL.Query() // one value each: checkQuery refused repeats
	for k, vs := range q {
		switch {
		case strings.HasPrefix(k, "metadata."):
			f.Metadata[strings.TrimPrefix(k, "metadata.")] = vs[0]
		case k == "state" && vs[0] == "":
		case k == "state" && vs[0] == "all":
		case k == "state":
			for _, v := range strings.Split(vs[0], ",") {
				switch st := pandastack.SandboxState(v); st {
				case pandastack.StateStarting, pandastack.StateRunning, pandastack.StatePaused, pandastack.StateStopped:
					if !slices.Contains(f.States, st) {
						f.States = append(f.States, st)
					}
				case "all":
					// "all,running" listed only the running ones.
					writeError(w, pandastack.Errorf(pandastack.EInvalid, "state=all stands alone; it cannot be combined with other states"))
					return
				default:
					writeError(w, pandastack.Errorf(pandastack.EInvalid, "state must be starting, running, paused, stopped or all, got %q", v))
					return
				}
			}
		case k == "limit":
			n, err := strconv.Atoi(vs[0])
			if err != nil || n < 1 || n > maxListLimit {
				writeError(w, pandastack.Errorf(pandastack.EInvalid, "limit must be a whole number from 1 to %d, got %.40q", maxListLimit, vs[0]))
				return
			}
			f.Limit = n
		case k == "after":
			c, err := parseListCursor(vs[0])
			if err != nil {
				writeError(w, err)
				return
			}
			f.After = c
		case k == "order":
			switch vs[0] {
			case "oldest", "":
			case "newest":
				f.Newest = true
			default:
				writeError(w, pandastack.Errorf(pandastack.EInvalid, "order must be oldest or newest, got %.40q", vs[0]))
				return
			}
		default:
			writeError(w, pandastack.Errorf(pandastack.EInvalid, "unknown query parameter %q; filter with metadata.<key>=<value> or state=, page with limit=, after= and order=", k))
			return
		}
	}
	if err := checkMetadataFilters(f.Metadata); err != nil {
		writeError(w, err)
		return
	}
	if q.Get("state") == "" {
		f.States = []pandastack.SandboxState{pandastack.StateStarting, pandastack.StateRunning, pandastack.StatePaused}
	}
	limit := f.Limit
	if limit > 0 {
		f.Limit++ // one more than asked: whether there is a next page
	}
	list, err := s.mgr.List(r.Context(), project, f)
	if err != nil {
		writeError(w, err)
		return
	}
	if list == nil {
		list = []pandastack.Sandbox{}
	}
	out := map[string]any{}
	if limit > 0 && len(list) > limit {
		list = list[:limit]
		out["next"] = listCursor(list[limit-1])
	}
	for i := range list {
		list[i] = s.mgr.WithNetwork(list[i])
	}
	out["sandboxes"] = list
	writeJSON(w, http.StatusOK, out)
}

// maxListLimit is the largest page of a list of sandboxes.
const maxListLimit = 1000

// listCursor is the after= of the page that follows sb's: its creation
// time (in milliseconds, as stored) and id, opaque to the caller.
func listCursor(sb pandastack.Sandbox) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(sb.CreatedAt.UnixMilli(), 10) + ":" + sb.ID))
}

// parseListCursor reads an after= that listCursor made.
func parseListCursor(s string) (*pandastack.SandboxCursor, error) {
	bad := pandastack.Errorf(pandastack.EInvalid, "after must be the next of an earlier page of this list, got %.80q", s)
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, bad
	}
	ms, id, ok := strings.Cut(string(b), ":")
	at, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil || at < 0 || at > maxCursorMillis || !validCursorID(id) {
		return nil, bad
	}
	return &pandastack.SandboxCursor{CreatedAt: time.UnixMilli(at).UTC(), ID: id}, nil
}

// maxCursorMillis is the last millisecond of the year 9999, the latest time
// both stores keep.
const maxCursorMillis = 253402300799999

// validCursorID: an id as the server makes them (a prefix, an underscore,
// letters and digits), at most 64 bytes.
func validCursorID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

func (s *Server) getSandbox(w http.ResponseWriter, r *http.Request, project string) {
	sb, err := s.mgr.Get(r.Context(), project, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

type patchSandboxRequest struct {
	TTLSeconds         *int64 `json:"ttl_seconds"`
	IdleTimeoutSeconds *int64 `json:"idle_timeout_seconds"`
}

func (s *Server) patchSandbox(w http.ResponseWriter, r *http.Request, project string) {
	var req patchSandboxRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.TTLSeconds == nil && req.IdleTimeoutSeconds == nil {
		writeError(w, pandastack.Errorf(pandastack.EInvalid, "give ttl_seconds, idle_timeout_seconds or both"))
		return
	}
	sb, err := s.mgr.Update(r.Context(), project, r.PathValue("id"), req.TTLSeconds, req.IdleTimeoutSeconds)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.mgr.WithNetwork(sb))
}

func (s *Server) deleteSandbox(w http.ResponseWriter, r *http.Request, project string) {
	if err := s.mgr.Kill(r.Context(), project, r.PathValue("id")); err != nil {
		s.logFailure(r, err)
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

type execRequest struct {
	Cmd            string            `json:"cmd"`
	Argv           []string          `json:"argv"`
	Env            map[string]string `json:"env"`
	Cwd            string            `json:"cwd"`
	TimeoutSeconds *float64          `json:"timeout_seconds"`
	Stdin          string            `json:"stdin"`
	Background     bool              `json:"background"` // answer a Process at once (processes.go)
}

// wantsStream reports whether the client asked for NDJSON streaming.
func wantsStream(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), "application/x-ndjson")
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request, project string) {
	var req execRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if (req.Cmd == "") == (len(req.Argv) == 0) {
		writeError(w, pandastack.Errorf(pandastack.EInvalid, "give exactly one of cmd (a shell string) or argv (a list)"))
		return
	}
	if err := sandbox.ValidateEnv(req.Env); err != nil {
		writeError(w, err)
		return
	}
	if req.Background {
		s.execBackground(w, r, project, req)
		return
	}
	timeout, err := s.timeout(req.TimeoutSeconds, s.cfg.DefaultExecTimeout)
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
	areq := agentproto.ExecRequest{Argv: req.Argv, Cmd: req.Cmd, Env: req.Env, Cwd: req.Cwd, TimeoutMS: timeout.Milliseconds(), Stdin: []byte(req.Stdin)}
	if wantsFrames(r) {
		s.execFrames(w, r, project, agent, areq)
		return
	}
	if wantsStream(r) {
		s.execStream(w, r, project, agent, areq)
		return
	}
	var res pandastack.ExecResult
	var out, errb capBuffer
	out.max, errb.max = s.cfg.ExecOutputCap, s.cfg.ExecOutputCap
	exit, err := s.recordedExec(r.Context(), project, r.PathValue("id"), agent, areq, func(ev agentproto.ExecEvent) error {
		switch ev.Type {
		case "stdout":
			out.Write(ev.Data)
		case "stderr":
			errb.Write(ev.Data)
		}
		return nil
	})
	if err != nil {
		s.logFailure(r, err)
		err = agent.Explain(err) // after logFailure reconciled: say how it ended
		writeError(w, err)
		return
	}
	res.Stdout, res.StdoutTruncated = out.String(), out.dropped > 0
	res.Stderr, res.StderrTruncated = errb.String(), errb.dropped > 0
	res.ExitCode, res.Signal, res.DurationMS, res.TimedOut = exit.ExitCode, exit.Signal, exit.DurationMS, exit.TimedOut
	writeJSON(w, http.StatusOK, res)
}

// capBuffer keeps the first max bytes and counts the rest.
type capBuffer struct {
	bytes.Buffer
	max     int
	dropped int64
}

func (b *capBuffer) Write(p []byte) {
	room := b.max - b.Len()
	if room >= len(p) {
		b.Buffer.Write(p)
		return
	}
	if room > 0 {
		b.Buffer.Write(p[:room])
	}
	b.dropped += int64(len(p) - max(room, 0))
}

func (b *capBuffer) String() string {
	if b.dropped == 0 {
		return b.Buffer.String()
	}
	return b.Buffer.String() + fmt.Sprintf("\n[pandastack: output truncated, %d more bytes not kept; stream the exec to get all of it (the SDKs: pass on_stdout / onStdout; HTTP: Accept: application/x-ndjson)]\n", b.dropped)
}

// streamEvent is one NDJSON line of a streamed exec.
type streamEvent struct {
	Type       string       `json:"type"`
	Data       string       `json:"data,omitempty"`
	ExitCode   *int         `json:"exit_code,omitempty"`
	Signal     string       `json:"signal,omitempty"`
	TimedOut   *bool        `json:"timed_out,omitempty"`
	DurationMS *int64       `json:"duration_ms,omitempty"`
	Error      *errorDetail `json:"error,omitempty"`
}

func (s *Server) execStream(w http.ResponseWriter, r *http.Request, project string, agent *sandbox.AgentClient, req agentproto.ExecRequest) {
	nd := newNDJSON(w)
	_, err := s.recordedExec(r.Context(), project, r.PathValue("id"), agent, req, func(ev agentproto.ExecEvent) error {
		return nd.sendExec(ev)
	})
	if err != nil {
		s.logFailure(r, err)
		err = agent.Explain(err) // after logFailure reconciled: say how it ended
		if !nd.started {
			writeError(w, err)
			return
		}
		eb := errorJSON(revokedErr(r.Context(), err))
		nd.flushCarry()
		nd.send(streamEvent{Type: "error", Error: &eb.Error})
	}
}

// toStreamEvent is the API's form of an agent's exec event.
func toStreamEvent(ev agentproto.ExecEvent) streamEvent {
	out := streamEvent{Type: ev.Type}
	switch ev.Type {
	case "stdout", "stderr":
		out.Data = string(ev.Data)
	case "exit":
		out.ExitCode, out.Signal, out.TimedOut, out.DurationMS = &ev.ExitCode, ev.Signal, &ev.TimedOut, &ev.DurationMS
	}
	return out
}

// ndjson writes newline-delimited JSON, flushing after each line.
type ndjson struct {
	w       http.ResponseWriter
	enc     *json.Encoder
	rc      *http.ResponseController
	started bool
	line    []byte // sendExec's, reused
	// carry holds the start of a UTF-8 character an output event ended
	// in, by stream, for the next event of that stream: each event's data
	// is a JSON string, so a character split between two would become two
	// U+FFFD.
	carry map[string][]byte
}

func newNDJSON(w http.ResponseWriter) *ndjson {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return &ndjson{w: w, enc: enc, rc: http.NewResponseController(w)}
}

func (n *ndjson) start() {
	if !n.started {
		n.w.Header().Set("Content-Type", "application/x-ndjson")
		n.w.Header().Set("X-Content-Type-Options", "nosniff")
		n.w.WriteHeader(http.StatusOK)
		n.started = true
	}
}

func (n *ndjson) send(v any) error {
	n.start()
	if err := n.enc.Encode(v); err != nil {
		return err
	}
	return n.rc.Flush()
}

// sendExec writes an exec event as send(toStreamEvent(ev)) would, but
// for a UTF-8 character split between two output events of a stream,
// which goes whole in the second.
func (n *ndjson) sendExec(ev agentproto.ExecEvent) error {
	if ev.Type == "stdout" || ev.Type == "stderr" {
		ev.Data = n.joinCarry(ev.Type, ev.Data)
		if len(ev.Data) == 0 {
			return nil
		}
	} else if err := n.flushCarry(); err != nil {
		return err
	}
	line, ok := appendExecEvent(n.line[:0], ev)
	if !ok {
		return n.send(toStreamEvent(ev))
	}
	n.line = line
	n.start()
	if _, err := n.w.Write(line); err != nil {
		return err
	}
	return n.rc.Flush()
}

// joinCarry returns data after what stream's last event held back, less
// the start of a character it ends in, which it holds back in turn.
func (n *ndjson) joinCarry(stream string, data []byte) []byte {
	if held := n.carry[stream]; len(held) > 0 {
		data = append(held, data...)
		n.carry[stream] = nil
	}
	cut := len(data)
	for i := len(data) - 1; i >= 0 && i >= len(data)-utf8.UTFMax+1; i-- {
		if utf8.RuneStart(data[i]) {
			if data[i] >= utf8.RuneSelf && !utf8.FullRune(data[i:]) {
				cut = i
			}
			break
		}
	}
	if cut < len(data) {
		if n.carry == nil {
			n.carry = map[string][]byte{}
		}
		n.carry[stream] = append([]byte(nil), data[cut:]...)
	}
	return data[:cut]
}

// flushCarry sends what is held back as it is, before an event that ends
// the output (its bytes never became a whole character).
func (n *ndjson) flushCarry() error {
	for _, stream := range []string{"stdout", "stderr"} {
		if held := n.carry[stream]; len(held) > 0 {
			n.carry[stream] = nil
			line, _ := appendExecEvent(n.line[:0], agentproto.ExecEvent{Type: stream, Data: held})
			n.line = line
			n.start()
			if _, err := n.w.Write(line); err != nil {
				return err
			}
		}
	}
	return nil
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request, project string) {
	list, err := s.catalog.Built(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	if list == nil {
		list = []TemplateInfo{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"templates": list})
}

// timeout reads an optional timeout_seconds: def when absent, else above 0
// and at most the server's maximum.
func (s *Server) timeout(seconds *float64, def time.Duration) (time.Duration, error) {
	if seconds == nil {
		return def, nil
	}
	t := *seconds
	// Compared as floats: a huge value must not wrap around to "none".
	if !(t > 0) || t > s.cfg.MaxExecTimeout.Seconds() {
		return 0, pandastack.Errorf(pandastack.EInvalid, "timeout_seconds must be above 0 and at most %d", int64(s.cfg.MaxExecTimeout/time.Second))
	}
	// At least 1 ms: the agent reads 0 as no timeout.
	return time.Duration(max(1, int64(math.Ceil(t*1000)))) * time.Millisecond, nil
}
