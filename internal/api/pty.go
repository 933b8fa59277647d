package api

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/history"
	"github.com/pandastack/pandastack/internal/sandbox"
)

// ptySubprotocol is the WebSocket subprotocol of the terminal. A browser
// cannot set the Authorization header on a WebSocket, so it may send its key
// as a second subprotocol, "bearer.<key>"; only ptySubprotocol is echoed.
const (
	ptySubprotocol = "pandastack.pty"
	bearerProtocol = "bearer."
)

// wsKey returns an API key sent as a WebSocket subprotocol, or "".
func wsKey(r *http.Request) string {
	for _, h := range r.Header.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(h, ",") {
			if k, ok := strings.CutPrefix(strings.TrimSpace(p), bearerProtocol); ok {
				return k
			}
		}
	}
	return ""
}

// ptyControl is a text message of the terminal WebSocket.
type ptyControl struct {
	Type     string `json:"type"`                // client: "resize"; server: "exit"
	Cols     int    `json:"cols,omitempty"`      // resize
	Rows     int    `json:"rows,omitempty"`      // resize
	ExitCode *int   `json:"exit_code,omitempty"` // exit
}

// termSize reads a terminal dimension from the query: def when absent.
func termSize(r *http.Request, name string, def int) (uint16, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return uint16(def), nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 {
		return 0, pandastack.Errorf(pandastack.EInvalid, "%s must be a whole number from 1 to 1000, got %q", name, v)
	}
	return uint16(n), nil
}

// pty serves GET /v1/sandboxes/{id}/pty: a WebSocket to a login shell of
// the sandbox user on a real terminal. Binary messages carry terminal bytes
// both ways; text messages are JSON: {"type":"resize","cols":C,"rows":R}
// from the client, {"type":"exit","exit_code":N} from the server when the
// shell ends. The session counts as work in flight for its whole life.
func (s *Server) pty(w http.ResponseWriter, r *http.Request, project string) {
	cols, err := termSize(r, "cols", 80)
	if err == nil {
		var rows uint16
		if rows, err = termSize(r, "rows", 24); err == nil {
			s.ptySession(w, r, project, cols, rows)
			return
		}
	}
	writeError(w, err)
}

// wsHandshakeError checks what websocket.Accept checks of a handshake, so
// that a request it would refuse gets a JSON error and opens no shell.
func wsHandshakeError(r *http.Request) error {
	const route = "GET /v1/sandboxes/{id}/pty is a WebSocket"
	switch {
	case !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") || !headerHasToken(r.Header, "Connection", "upgrade"):
		return pandastack.Errorf(pandastack.EInvalid, "%s: send the upgrade headers (Upgrade: websocket, Connection: Upgrade; any WebSocket client does)", route)
	case !r.ProtoAtLeast(1, 1):
		return pandastack.Errorf(pandastack.EInvalid, "%s: it needs HTTP/1.1 or later, got %s", route, r.Proto)
	case r.Header.Get("Sec-WebSocket-Version") != "13":
		return pandastack.Errorf(pandastack.EInvalid, "%s: Sec-WebSocket-Version must be 13, got %q", route, r.Header.Get("Sec-WebSocket-Version"))
	}
	if keys := r.Header.Values("Sec-WebSocket-Key"); len(keys) != 1 {
		return pandastack.Errorf(pandastack.EInvalid, "%s: give one Sec-WebSocket-Key header, got %d", route, len(keys))
	} else if k, err := base64.StdEncoding.DecodeString(keys[0]); err != nil || len(k) != 16 {
		return pandastack.Errorf(pandastack.EInvalid, "%s: Sec-WebSocket-Key must be 16 bytes in base64", route)
	}
	if origin := r.Header.Get("Origin"); origin != "" {
		u, err := url.Parse(origin)
		if err != nil || !strings.EqualFold(u.Host, r.Host) {
			return pandastack.Errorf(pandastack.EInvalid, "%s: a page from origin %q may not open it; only pages this server serves (%s) may", route, origin, r.Host)
		}
	}
	return nil
}

// headerHasToken reports whether a comma-separated header holds token.
func headerHasToken(h http.Header, name, token string) bool {
	for _, v := range h.Values(name) {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}

func (s *Server) ptySession(w http.ResponseWriter, r *http.Request, project string, cols, rows uint16) {
	if err := wsHandshakeError(r); err != nil {
		writeError(w, err)
		return
	}
	id := r.PathValue("id")
	agent, ending, done, err := s.mgr.AcquireTerminal(r.Context(), project, id)
	if err != nil {
		writeError(w, err)
		return
	}
	defer done()
	term, err := agent.PTY(r.Context(), cols, rows, r.URL.Query().Get("cwd"))
	if err != nil {
		s.logFailure(r, err)
		writeError(w, err)
		return
	}
	defer term.Close()
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{Subprotocols: []string{ptySubprotocol}})
	if err != nil {
		return // Accept has answered
	}
	s.ptys.Add(1)
	defer s.ptys.Done()
	defer ws.CloseNow()
	ws.SetReadLimit(1 << 20)
	// The socket's own context: a request cut by its key's revocation, or
	// by the server's shutdown, closes it with the reason, rather than
	// dropping the connection.
	var closing atomic.Bool // the session ends from this side
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	go func() {
		select {
		case <-r.Context().Done():
			if c := revokedErr(r.Context(), nil); c != nil {
				ws.Close(websocket.StatusPolicyViolation, pandastack.ErrorMessage(c))
			}
			cancel()
		case <-s.stopping:
			closing.Store(true)
			ws.Close(websocket.StatusGoingAway, "the PandaStack server is shutting down; open a new terminal once it is back")
			cancel()
		case <-ctx.Done():
		}
	}()

	rec := s.history.Begin(project, id, history.Entry{Kind: history.KindTerminal, Command: "terminal"})
	var exited *int                   // the shell's exit status, once it exited
	var cutOff atomic.Pointer[string] // why, when the sandbox stopped under it
	defer func() {
		rec.End(func(e *history.Entry) {
			e.ExitCode = exited
			if exited != nil {
				return
			}
			// Closed before the shell exited: a plain close has no exit
			// status (it had -1) and is no failure; these are.
			if revokedErr(r.Context(), nil) != nil {
				e.Failure = failure(r.Context(), nil)
				return
			}
			if stopped := cutOff.Load(); stopped != nil {
				e.Failure = *stopped
				return
			}
			select {
			case <-s.stopping:
				e.Failure = "ended: the PandaStack server shut down"
			default:
			}
		})
	}()

	// Shell → browser.
	outDone := make(chan struct{})
	go func() {
		defer close(outDone)
		defer cancel()
		for {
			typ, p, err := agentproto.ReadPTYFrame(term)
			if err != nil {
				if !closing.Load() && ctx.Err() == nil {
					if why := s.terminalCutOff(ws, agent, id); why != "" {
						cutOff.Store(&why)
					}
				}
				return
			}
			switch typ {
			case agentproto.PTYData:
				rec.Stdout(p)
				if ws.Write(ctx, websocket.MessageBinary, p) != nil {
					return
				}
			case agentproto.PTYExit:
				code, _ := agentproto.ParseExit(p)
				exited = &code
				msg, _ := json.Marshal(ptyControl{Type: "exit", ExitCode: &code})
				ws.Write(ctx, websocket.MessageText, msg)
				ws.Close(websocket.StatusNormalClosure, "the shell exited")
				return
			}
		}
	}()

	// Browser → shell.
	var wmu sync.Mutex
	toShell := func(typ byte, p []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return agentproto.WritePTYFrame(term, typ, p)
	}
	for {
		typ, p, err := ws.Read(ctx)
		if err != nil {
			if !errors.Is(err, context.Canceled) && websocket.CloseStatus(err) == -1 && !errors.Is(err, io.EOF) {
				s.log.Debug("terminal closed", "sandbox", id, "err", err)
			}
			break
		}
		if typ == websocket.MessageBinary {
			err = toShell(agentproto.PTYData, p)
		} else {
			var c ptyControl
			if json.Unmarshal(p, &c) != nil || c.Type != "resize" || c.Cols < 1 || c.Rows < 1 || c.Cols > 1000 || c.Rows > 1000 {
				ws.Close(websocket.StatusPolicyViolation, `text messages must be {"type":"resize","cols":1..1000,"rows":1..1000}`)
				break
			}
			err = toShell(agentproto.PTYResize, agentproto.ResizePayload(uint16(c.Cols), uint16(c.Rows)))
		}
		if err != nil {
			break
		}
	}
	// Only the teardown is left: a snapshot now waits for it rather than
	// refusing.
	ending()
	closing.Store(true)
	term.Close() // the agent kills the shell
	cancel()
	<-outDone
	done() // now, not after the history's write (deferred, which may trim)
}

// terminalCutOff closes ws, a terminal of sandbox id whose agent stopped
// answering, saying why when the sandbox has stopped (a kill, its TTL, out
// of memory), as a request cut off so answers sandbox_stopped; a death the
// manager has yet to notice is looked for first. It returns that why ("":
// not stopped).
func (s *Server) terminalCutOff(ws *websocket.Conn, agent *sandbox.AgentClient, id string) (why string) {
	err := agent.Ended("the terminal")
	if err == nil {
		s.mgr.Reconcile(id)
		err = agent.Ended("the terminal")
	}
	if pandastack.IsCode(err, pandastack.EStopped) {
		why = pandastack.ErrorMessage(err)
		ws.Close(pandastack.CloseSandboxStopped, closeReason(why))
	}
	return why
}

// closeReason fits msg into a WebSocket close frame's 123 bytes, cut at a
// character's start.
func closeReason(msg string) string {
	if len(msg) <= 123 {
		return msg
	}
	cut := 120
	for cut > 0 && !utf8.RuneStart(msg[cut]) {
		cut--
	}
	return msg[:cut] + "..."
}
