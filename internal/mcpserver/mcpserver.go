// Package mcpserver is PandaStack's Model Context Protocol server: it offers
// sandboxes, code runs, commands, files and snapshots as MCP tools, and calls
// a PandaStack server's REST API through the Go client to do the work.
// `pandastack mcp` serves it over stdio; only cmd/ and tests import it.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/client"
)

// Defaults of Config.
const (
	DefaultTemplate   = "code-interpreter"
	DefaultSessionTTL = 15 * time.Minute
)

// SessionMetadata marks the sandbox a session creates for itself.
var SessionMetadata = map[string]string{"mcp": "session"}

// Config is everything a Server needs.
type Config struct {
	Client *client.Client // the PandaStack API every tool calls
	Log    *slog.Logger   // operator log; nil discards. Never stdout: stdio carries the protocol.

	// Template of a session's default sandbox and of create_sandbox without
	// one; default DefaultTemplate.
	Template string
	// SessionTTL is the time to live of a session's default sandbox. Each
	// call that uses it pushes its expiry SessionTTL ahead, so it outlives
	// quiet spells but not a crashed client by much. Default DefaultSessionTTL.
	SessionTTL time.Duration
	// Version is reported to clients in the initialize answer.
	Version string
	// Explain, if not nil, rewrites a tool's error before the client sees
	// it. `pandastack mcp` passes the CLI's own, so that a server it cannot
	// reach, or one that refuses its key, is said as the CLI says it (the
	// URL, PANDASTACK_API, where the key came from) rather than as a raw
	// transport error.
	Explain func(error) error
}

// Server serves MCP sessions. It holds no per-session state itself: each
// Serve call has its own default sandbox.
type Server struct {
	cfg Config
}

// New returns a Server; cfg.Client is required.
func New(cfg Config) *Server {
	if cfg.Template == "" {
		cfg.Template = DefaultTemplate
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	return &Server{cfg: cfg}
}

// Serve runs one MCP session over t until the client goes away (for stdio:
// stdin reaches EOF) or ctx is cancelled, then kills the session's default
// sandbox, if it made one. Sandboxes made with create_sandbox are left to
// kill_sandbox or their TTL. It returns nil when the client ended the
// session, ctx.Err() on cancellation, or the transport's error.
func (s *Server) Serve(ctx context.Context, t mcp.Transport) error {
	sess := &session{cfg: &s.cfg, c: s.cfg.Client, log: s.cfg.Log}
	srv := mcp.NewServer(&mcp.Implementation{Name: "pandastack", Title: "PandaStack", Version: s.cfg.Version}, &mcp.ServerOptions{
		Instructions: fmt.Sprintf(instructions, s.cfg.Template),
		Logger:       s.cfg.Log,
		// Tools only; no logging capability.
		Capabilities: &mcp.ServerCapabilities{},
	})
	sess.addTools(srv)
	ss, err := srv.Connect(ctx, t, nil)
	if err != nil {
		return fmt.Errorf("mcp connect: %w", err)
	}
	done := make(chan error, 1)
	go func() { done <- ss.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		// The sandbox first: a call in flight on it (a cell of minutes)
		// then ends at once, where the SDK's Close waits for it. A client
		// that follows SIGTERM with SIGKILL a few seconds later left the
		// sandbox running to its TTL.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		sess.close(cctx)
		cancel()
		ss.Close()
		select {
		case <-done:
		case <-time.After(closeWait):
			s.cfg.Log.Warn("tool calls still running at shutdown; leaving them")
		}
		err = ctx.Err()
	}
	// The session's context may be cancelled already; the kill must still
	// go through.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	sess.close(cctx)
	if errors.Is(err, mcp.ErrConnectionClosed) {
		err = nil
	}
	return err
}

// closeWait bounds how long a cancelled Serve waits for calls in flight
// on sandboxes other than the session's (create_sandbox ones) to end.
const closeWait = 3 * time.Second

const instructions = `PandaStack runs code in isolated gVisor sandboxes.
run_code, exec, upload_file, download_file and snapshot act on this session's own sandbox (template %s, created on first use) unless you pass sandbox_id: variables, imports and files persist between calls. The session's sandbox is killed when the session ends.
Use run_code for Python (state kept like a notebook; matplotlib charts come back as images), exec for shell commands.`

// session is the state of one MCP session: its default sandbox.
type session struct {
	cfg *Config
	c   *client.Client
	log *slog.Logger

	// mu is held while the default sandbox is created or killed, so
	// concurrent calls share one sandbox and none is made after close.
	mu      sync.Mutex
	id      string    // the default sandbox, "" until first use
	touched time.Time // when its expiry was last pushed ahead
	closed  bool

	// turns holds one slot per sandbox and language: run_code calls that
	// go to the same default context take turns, as the SDK's agent tools
	// do, instead of all but one failing with "context is busy" (clients
	// make parallel tool calls).
	turnsMu sync.Mutex
	turns   map[string]chan struct{}
}

// turn waits until no other run_code of this session runs in key's
// context, or ctx ends; release ends the turn.
func (s *session) turn(ctx context.Context, key string) (release func(), err error) {
	s.turnsMu.Lock()
	if s.turns == nil {
		s.turns = map[string]chan struct{}{}
	}
	slot, ok := s.turns[key]
	if !ok {
		slot = make(chan struct{}, 1)
		s.turns[key] = slot
	}
	s.turnsMu.Unlock()
	select {
	case slot <- struct{}{}:
		return func() { <-slot }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// touchEvery bounds how often a call pushes the default sandbox's expiry
// ahead: a minute, or a quarter of a shorter SessionTTL, so a sandbox in
// use never expires (with a fixed minute, a --session-ttl of 20s expired
// between calls 5 s apart).
func (s *session) touchEvery() time.Duration {
	return min(time.Minute, s.cfg.SessionTTL/4)
}

// defaultSandbox returns the session's sandbox, creating it on first use,
// and pushes its expiry ahead. When the sandbox has stopped since the last
// call (it expired or was killed from elsewhere), it makes a new one and
// returns a note saying the earlier state is gone.
func (s *session) defaultSandbox(ctx context.Context) (id, note string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return "", "", errors.New("the MCP session is closing")
	}
	if s.id != "" && time.Since(s.touched) >= s.touchEvery() {
		_, err := s.c.SetTTL(ctx, s.id, s.cfg.SessionTTL)
		switch {
		case err == nil:
			s.touched = time.Now()
		case s.gone(ctx, s.id, err):
			note = fmt.Sprintf("[note] this session's sandbox %s had stopped; this call runs in a new sandbox, so earlier variables and files are gone", s.id)
			s.log.Info("session sandbox gone; making a new one", "sandbox", s.id, "err", err)
			s.id = ""
		default:
			return "", "", fmt.Errorf("session sandbox %s: %w", s.id, err)
		}
	}
	if s.id == "" {
		sb, err := s.c.CreateSandbox(ctx, client.CreateSandboxRequest{
			Template:   s.cfg.Template,
			TTLSeconds: int64(s.cfg.SessionTTL / time.Second),
			Metadata:   SessionMetadata,
		})
		if err != nil {
			return "", "", fmt.Errorf("create the session sandbox: %w", err)
		}
		s.id, s.touched = sb.ID, time.Now()
		s.log.Info("session sandbox created", "sandbox", sb.ID, "template", sb.Template)
	}
	return s.id, note, nil
}

// gone reports whether err, from a call on sandbox id, means the sandbox
// itself no longer runs (rather than, say, a missing file).
func (s *session) gone(ctx context.Context, id string, err error) bool {
	if client.IsCode(err, "sandbox_stopped") {
		return true
	}
	if !client.IsCode(err, "not_found") && !client.IsCode(err, "sandbox_unavailable") {
		return false
	}
	sb, gerr := s.c.GetSandbox(ctx, id)
	if client.IsCode(gerr, "not_found") {
		return true
	}
	return gerr == nil && sb.State == pandastack.StateStopped
}

// forget drops id as the default sandbox after a call found it gone, so the
// next call makes a new one.
func (s *session) forget(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.id == id {
		s.id = ""
	}
}

// keepAlive pushes the default sandbox's expiry ahead every touchEvery
// while a call runs on it, until stop: a call longer than the session's TTL
// (a 35 s cell under a 20 s one, or one of over 15 minutes under the
// default) lost the sandbox halfway.
func (s *session) keepAlive(ctx context.Context, id string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(s.touchEvery())
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if _, err := s.c.SetTTL(ctx, id, s.cfg.SessionTTL); err == nil {
					s.mu.Lock()
					if s.id == id {
						s.touched = time.Now()
					}
					s.mu.Unlock()
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}

// close kills the default sandbox and refuses further calls.
func (s *session) close(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.id == "" {
		return
	}
	switch err := s.c.KillSandbox(ctx, s.id); {
	case err == nil, client.IsCode(err, "not_found"):
		s.log.Info("session sandbox killed", "sandbox", s.id)
	default:
		s.log.Error("kill session sandbox", "sandbox", s.id, "err", err)
	}
	s.id = ""
}

// onSandbox runs fn on the sandbox the caller named, or on the session's
// default sandbox. A note from defaultSandbox goes first in the result; if
// fn finds the default sandbox gone, the error says the next call starts
// afresh.
func (s *session) onSandbox(ctx context.Context, named string, fn func(id string) (*mcp.CallToolResult, error)) (*mcp.CallToolResult, error) {
	if named != "" {
		return fn(named)
	}
	id, note, err := s.defaultSandbox(ctx)
	if err != nil {
		return nil, err
	}
	stop := s.keepAlive(ctx, id)
	res, err := fn(id)
	stop()
	if err != nil {
		if s.gone(ctx, id, err) {
			s.forget(id)
			return nil, fmt.Errorf("%w\nThis session's sandbox %s has stopped and its state is lost; the next call starts a new one", err, id)
		}
		return nil, err
	}
	if note != "" && res != nil {
		res.Content = append([]mcp.Content{&mcp.TextContent{Text: note}}, res.Content...)
	}
	return res, nil
}
