// Package api is the REST API under /v1: routing, API-key auth, JSON
// decoding with clear errors, the one error shape, and streaming. Only cmd/
// imports it.
package api

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/console"
	"github.com/pandastack/pandastack/internal/history"
	"github.com/pandastack/pandastack/internal/metrics"
	"github.com/pandastack/pandastack/internal/sandbox"
)

//go:embed openapi.json
var openAPI []byte

// TemplateInfo is a built template as GET /v1/templates shows it.
type TemplateInfo struct {
	Name         string    `json:"name"`
	Description  string    `json:"description,omitempty"`
	Hash         string    `json:"hash"`
	SizeBytes    int64     `json:"size_bytes"`
	BuildSeconds float64   `json:"build_seconds"`
	BuiltAt      time.Time `json:"built_at"`
	CPU          int       `json:"cpu"`
	MemoryMB     int       `json:"memory_mb"`
	DiskMB       int       `json:"disk_mb"`              // its sandboxes' own disk; 0: writes stay in memory
	Warm         bool      `json:"warm"`                 // creates restore a warm snapshot
	WarmError    string    `json:"warm_error,omitempty"` // why its warm-up failed (its creates boot cold)
	Pool         *PoolInfo `json:"pool,omitempty"`       // sandboxes restored ahead of creates
}

// PoolInfo describes a template's pool of pre-restored sandboxes.
type PoolInfo struct {
	Ready    int   `json:"ready"`
	Size     int   `json:"size"`
	PSSBytes int64 `json:"pss_bytes"` // host memory the ready ones hold
}

// Catalog lists the built templates.
type Catalog interface {
	Built(ctx context.Context) ([]TemplateInfo, error)
}

// Config holds the API's limits.
type Config struct {
	MaxUploadBytes     int64         // largest file upload
	ExecOutputCap      int           // bytes kept per stream in a non-streamed exec answer
	DefaultExecTimeout time.Duration // when timeout_seconds is absent
	MaxExecTimeout     time.Duration // the longest timeout a caller may ask for
	DefaultRunTimeout  time.Duration // run_code without timeout_seconds
	RunOutputCap       int           // bytes kept per stream per run_code
	PublicDomain       string        // with it, {port}-{id}.PublicDomain is the port proxy too (ports.go)
	// PublicURL is the scheme and host clients reach the server at
	// (https://… behind a proxy that ends TLS): port token URLs are made
	// on it, and their cookie is Secure when it is https. "": the
	// request's own.
	PublicURL string
	// Metrics is where the API's series go (metrics.go); nil: none are
	// kept.
	Metrics *metrics.Registry
}

// DefaultConfig returns the defaults: the one place they are written. New
// fills any zero field from it.
func DefaultConfig() Config {
	return Config{
		MaxUploadBytes:     4 << 30,
		ExecOutputCap:      4 << 20,
		DefaultExecTimeout: 60 * time.Second,
		MaxExecTimeout:     24 * time.Hour,
		DefaultRunTimeout:  300 * time.Second,
		RunOutputCap:       1 << 20,
	}
}

// Server serves the API.
type Server struct {
	cfg     Config
	mgr     *sandbox.Manager
	store   pandastack.Store
	catalog Catalog
	log     *slog.Logger
	mux     *http.ServeMux
	tokens  portTokens   // port URLs that work without an API key (ports.go)
	live    liveKeys     // requests in flight by API key, cut when it is revoked (keywatch.go)
	history *history.Log // what was run in each sandbox, and where sandboxes came from
	// stopping is closed when the server shuts down (Stopping): terminals,
	// whose WebSockets the HTTP server's shutdown does not track, close
	// with a reason rather than being dropped.
	stopping chan struct{}
	stopOnce sync.Once
	// draining is closed when the server's shutdown begins (Draining),
	// with or without --kill-on-exit: endless streams (directory
	// watches) end then rather than hold the shutdown's grace.
	draining  chan struct{}
	drainOnce sync.Once
	ptys      sync.WaitGroup // open terminal sessions
	metrics   apiMetrics     // zero: none kept
	// nodeLost stands for Manager.NodeLost when set (tests).
	nodeLost func(url string) bool
}

// Stopping tells the open terminals that the server shuts down; they close
// with a reason. For http.Server.RegisterOnShutdown.
func (s *Server) Stopping() { s.stopOnce.Do(func() { close(s.stopping) }) }

// Draining tells the open directory watches that the server shuts down;
// they end with an error that says so. For http.Server.RegisterOnShutdown.
func (s *Server) Draining() { s.drainOnce.Do(func() { close(s.draining) }) }

// WaitTerminals waits, up to limit, for the open terminals to end (after
// Stopping: for their close frames to go out before the process exits).
func (s *Server) WaitTerminals(limit time.Duration) {
	done := make(chan struct{})
	go func() { s.ptys.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
	}
}

// New builds the API server.
func New(cfg Config, mgr *sandbox.Manager, store pandastack.Store, catalog Catalog, log *slog.Logger) *Server {
	d := DefaultConfig()
	if cfg.MaxUploadBytes == 0 {
		cfg.MaxUploadBytes = d.MaxUploadBytes
	}
	if cfg.ExecOutputCap == 0 {
		cfg.ExecOutputCap = d.ExecOutputCap
	}
	if cfg.DefaultExecTimeout == 0 {
		cfg.DefaultExecTimeout = d.DefaultExecTimeout
	}
	if cfg.MaxExecTimeout == 0 {
		cfg.MaxExecTimeout = d.MaxExecTimeout
	}
	if cfg.DefaultRunTimeout == 0 {
		cfg.DefaultRunTimeout = d.DefaultRunTimeout
	}
	if cfg.RunOutputCap == 0 {
		cfg.RunOutputCap = d.RunOutputCap
	}
	s := &Server{cfg: cfg, mgr: mgr, store: store, catalog: catalog, log: log, mux: http.NewServeMux(),
		history: history.New(history.Limits{}, store, log), stopping: make(chan struct{}), draining: make(chan struct{})}
	s.routes()
	if cfg.Metrics != nil {
		s.metrics = newAPIMetrics(cfg.Metrics)
	}
	return s
}

// readyWait bounds /readyz's look at the store.
const readyWait = 2 * time.Second

func (s *Server) routes() {
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	// Ready when the store answers: without it every API request fails
	// (a readiness probe; /healthz says only that the process runs).
	s.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-s.stopping:
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "the server is shutting down"})
			return
		default:
		}
		ctx, cancel := context.WithTimeout(r.Context(), readyWait)
		defer cancel()
		if _, err := s.store.GetSandbox(ctx, "", "sbx_readyz"); err != nil && !pandastack.IsCode(err, pandastack.ENotFound) {
			s.log.Warn("not ready: the store does not answer", "err", err)
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unavailable", "reason": "the store (database) does not answer"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	s.mux.HandleFunc("GET /v1/openapi.json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write(openAPI)
	})
	auth := func(pattern string, h func(http.ResponseWriter, *http.Request, string)) {
		s.mux.HandleFunc(pattern, s.authenticated(h))
	}
	auth("POST /v1/sandboxes", s.createSandbox)
	auth("GET /v1/sandboxes", s.listSandboxes)
	auth("GET /v1/sandboxes/{id}", s.getSandbox)
	auth("PATCH /v1/sandboxes/{id}", s.patchSandbox)
	auth("PUT /v1/sandboxes/{id}/network", s.putNetwork)
	auth("GET /v1/sandboxes/{id}/network/log", s.networkLog)
	s.portRoutes()
	auth("DELETE /v1/sandboxes/{id}", s.deleteSandbox)
	auth("POST /v1/sandboxes/{id}/exec", s.exec)
	auth("GET /v1/sandboxes/{id}/processes", s.listProcesses)
	auth("GET /v1/sandboxes/{id}/processes/{pid}/output", s.processOutput)
	auth("POST /v1/sandboxes/{id}/processes/{pid}/stdin", s.processStdin)
	auth("POST /v1/sandboxes/{id}/processes/{pid}/kill", bodiless(s.killProcess))
	auth("POST /v1/sandboxes/{id}/processes/kill", bodiless(s.killAllProcesses))
	auth("PUT /v1/sandboxes/{id}/files", s.putFile)
	auth("GET /v1/sandboxes/{id}/files", s.getFile)
	auth("DELETE /v1/sandboxes/{id}/files", s.deleteFile)
	auth("GET /v1/sandboxes/{id}/files/list", s.listFiles)
	auth("GET /v1/sandboxes/{id}/files/stat", s.statFile)
	auth("GET /v1/sandboxes/{id}/files/watch", s.watchFiles)
	auth("POST /v1/sandboxes/{id}/files/mkdir", s.mkdir)
	auth("POST /v1/sandboxes/{id}/files/rename", s.renameFile)
	auth("POST /v1/sandboxes/{id}/contexts", s.createContext)
	auth("GET /v1/sandboxes/{id}/contexts", s.listContexts)
	auth("DELETE /v1/sandboxes/{id}/contexts/{cid}", s.deleteContext)
	auth("POST /v1/sandboxes/{id}/contexts/{cid}/interrupt", bodiless(s.interruptContext))
	auth("POST /v1/sandboxes/{id}/contexts/{cid}/restart", bodiless(s.restartContext))
	auth("POST /v1/sandboxes/{id}/contexts/{cid}/run", s.runInContext)
	auth("POST /v1/sandboxes/{id}/run_code", s.runCode)
	auth("POST /v1/sandboxes/{id}/snapshots", s.createSnapshot)
	auth("POST /v1/sandboxes/{id}/fork", s.fork)
	auth("POST /v1/sandboxes/{id}/pause", bodiless(s.pause))
	auth("POST /v1/sandboxes/{id}/resume", bodiless(s.resume))
	auth("GET /v1/snapshots", s.listSnapshots)
	auth("GET /v1/snapshots/{sid}", s.getSnapshot)
	auth("DELETE /v1/snapshots/{sid}", s.deleteSnapshot)
	auth("GET /v1/templates", s.listTemplates)
	auth("GET /v1/sandboxes/{id}/pty", s.pty)
	auth("GET /v1/sandboxes/{id}/history", s.getHistory)
	auth("GET /v1/sandboxes/{id}/stats", s.stats)
	auth("GET /v1/lineage", s.getLineage)
	auth("GET /v1/api-keys", s.listKeys)
	auth("POST /v1/api-keys", s.createKey)
	auth("DELETE /v1/api-keys/{kid}", s.revokeKey)
}

// routeQuery is, for each route, the query parameters openapi.json says it
// takes; routes missing from it check their own (selfCheckedQuery).
var routeQuery = func() map[string]map[string]bool {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
		Comp  struct {
			Parameters map[string]struct {
				Name string `json:"name"`
				In   string `json:"in"`
			} `json:"parameters"`
		} `json:"components"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		panic("openapi.json: " + err.Error())
	}
	out := map[string]map[string]bool{}
	for path, ops := range doc.Paths {
		for method, raw := range ops {
			var op struct {
				Parameters []struct {
					Ref  string `json:"$ref"`
					Name string `json:"name"`
					In   string `json:"in"`
				} `json:"parameters"`
			}
			if json.Unmarshal(raw, &op) != nil {
				continue // "parameters" shared by the path's operations, say
			}
			names := map[string]bool{}
			for _, p := range op.Parameters {
				if p.Ref != "" {
					c := doc.Comp.Parameters[strings.TrimPrefix(p.Ref, "#/components/parameters/")]
					p.Name, p.In = c.Name, c.In
				}
				if p.In == "query" {
					names[p.Name] = true
				}
			}
			out[strings.ToUpper(method)+" "+path] = names
		}
	}
	return out
}()

// selfCheckedQuery are the routes whose handlers check their query
// themselves: the list filters take metadata.<key>, and the file routes'
// agent refuses what it does not know.
var selfCheckedQuery = map[string]bool{
	"GET /v1/sandboxes": true, "GET /v1/snapshots": true,
	"PUT /v1/sandboxes/{id}/files": true, "GET /v1/sandboxes/{id}/files": true, "DELETE /v1/sandboxes/{id}/files": true,
	"GET /v1/sandboxes/{id}/files/list": true, "GET /v1/sandboxes/{id}/files/stat": true, "POST /v1/sandboxes/{id}/files/mkdir": true,
	"POST /v1/sandboxes/{id}/files/rename": true, "GET /v1/sandboxes/{id}/files/watch": true,
}

// checkQuery refuses a query string that does not parse, a parameter
// given twice, and a parameter the request's route does not take, as the
// strict bodies refuse unknown fields: a typo, or a filter a route does
// not have (GET /v1/lineage?sandbox_id=…), was ignored, and the caller
// believed it had filtered. So was a pair Go's parser skips (a bad %
// escape, a ";"): GET /v1/sandboxes?metadata.job=50% listed every
// sandbox of the project.
func checkQuery(r *http.Request) error {
	if r.URL.RawQuery == "" || r.Pattern == "" || strings.HasSuffix(r.Pattern, "/{path...}") {
		// The port proxy's query is the sandbox server's: its path form,
		// and, with no route's pattern, its host form ({port}-{id}.domain,
		// hostRoute) and the methods the mux does not route
		// (otherMethodToPort).
		return nil
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return pandastack.Errorf(pandastack.EInvalid, "malformed query string: %v (in a value, write %% as %%25, ; as %%3B and & as %%26)", err)
	}
	if err := singleValued(q); err != nil {
		return err
	}
	allowed, ok := routeQuery[r.Pattern]
	if !ok || selfCheckedQuery[r.Pattern] {
		return nil
	}
	for k := range q {
		if allowed[k] {
			continue
		}
		takes := "no query parameters"
		if len(allowed) > 0 {
			names := make([]string, 0, len(allowed))
			for n := range allowed {
				names = append(names, n)
			}
			slices.Sort(names)
			takes = "only " + strings.Join(names, ", ")
		}
		return pandastack.Errorf(pandastack.EInvalid, "unknown query parameter %.40q; %s takes %s", k, r.Pattern, takes)
	}
	return nil
}

// Handler returns the API's root handler.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: 200, classify: s.classifyError}
		route := routeUnmatched
		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					// A deliberate abort (a download that broke off):
					// net/http must cut the connection, so pass it on.
					panic(p)
				}
				s.log.Error("panic in handler", "method", r.Method, "path", r.URL.Path, "panic", p)
				if !rec.wrote {
					writeError(rec, errors.New("panic"))
				}
			}
			if rec.err != nil && !rec.logged {
				s.logFailure(r, rec.err) // a handler that answered an error without logging it
			}
			s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", rec.status, "ms", time.Since(start).Milliseconds())
			s.metrics.request(route, rec, time.Since(start))
		}()
		r = r.WithContext(context.WithValue(r.Context(), recorderKey{}, rec))
		if r.ContentLength != 0 && r.Header.Get("Upgrade") == "" {
			r.Body = withBodyDeadline(w, r.Body)
		}
		if s.hostRoute(rec, r) || s.otherMethodToPort(rec, r) {
			route = routePortProxy
			return
		}
		if console.Serves(r.URL.Path) {
			route = routeConsole
			switch {
			case r.Method != http.MethodGet && r.Method != http.MethodHead:
				rec.Header().Set("Allow", "GET, HEAD")
				writeError(rec, &pandastack.Error{Code: pandastack.EMethod, Message: fmt.Sprintf("%s is not allowed on %s (the web console's)", r.Method, r.URL.Path)})
			case !console.Has(r.URL.Path):
				writeError(rec, pandastack.Errorf(pandastack.ENotFound, "the web console has no %s", r.URL.Path))
			default:
				console.Handler().ServeHTTP(rec, r)
			}
			return
		}
		_, pattern := s.mux.Handler(r)
		if pattern == "" {
			// Unknown path or method: answer in the API's error shape
			// rather than the mux's plain text.
			probe := &statusRecorder{ResponseWriter: discardWriter{h: http.Header{}}, status: 200}
			s.mux.ServeHTTP(probe, r)
			if probe.status == http.StatusMethodNotAllowed {
				rec.Header().Set("Allow", strings.Join(s.allowed(r), ", "))
				writeError(rec, &pandastack.Error{Code: pandastack.EMethod, Message: fmt.Sprintf("%s is not allowed on %s", r.Method, r.URL.Path)})
				return
			}
			writeError(rec, pandastack.Errorf(pandastack.ENotFound, "no route %s %s; see /v1/openapi.json", r.Method, r.URL.Path))
			return
		}
		route = pattern
		s.mux.ServeHTTP(rec, r)
	})
}

// allowed lists the methods r's path has routes for, for a 405's Allow.
func (s *Server) allowed(r *http.Request) []string {
	var out []string
	for _, m := range routedMethods {
		r2 := r.Clone(r.Context())
		r2.Method = m
		if _, pattern := s.mux.Handler(r2); pattern != "" {
			out = append(out, m)
		}
	}
	return out
}

// bodyReadTimeout bounds how long a request's body may take to arrive (a
// variable for tests). Without it, a client that announced a body and sent
// none held its connection forever: the handler waited in its read, or, once
// the handler had answered (a 401 needs no body), the server waited to drain
// it; no key was needed to hold every descriptor that way (probe Q). Uploads
// and proxied requests, whose bodies may take longer, lift it and keep
// their own (clearBodyDeadline).
var bodyReadTimeout = 2 * time.Minute

// withBodyDeadline sets the read deadline of w's connection for body, and
// lifts it once body has been read to its end: a deadline left on the
// connection would cut a long answer streamed after the body (the server's
// watch for a client that hangs up reads on, and cancels the request when
// that read fails).
func withBodyDeadline(w http.ResponseWriter, body io.ReadCloser) io.ReadCloser {
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(bodyReadTimeout))
	return &deadlineBody{ReadCloser: body, rc: rc}
}

type deadlineBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	done bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) && !b.done {
		b.done = true
		b.rc.SetReadDeadline(time.Time{})
	}
	return n, err
}

// clearBodyDeadline lifts the body's read deadline for a handler that reads
// a body for as long as it moves (an upload, with its own idle guard) or
// passes it on (a proxy, whose other end decides).
func clearBodyDeadline(w http.ResponseWriter) {
	http.NewResponseController(w).SetReadDeadline(time.Time{})
}

type discardWriter struct{ h http.Header }

func (d discardWriter) Header() http.Header         { return d.h }
func (d discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d discardWriter) WriteHeader(int)             {}

type statusRecorder struct {
	http.ResponseWriter
	status int
	wrote  bool
	err    error           // the error writeError answered with, if any
	logged bool            // logFailure saw this request's failure
	keyCtx context.Context // the request's context as its API key's revocation cuts it
	// classify gives a store's failure its code (Server.classifyError).
	classify func(error) error
}

// recorderKey is the request context's key of its statusRecorder.
type recorderKey struct{}

func (r *statusRecorder) WriteHeader(code int) {
	if !r.wrote {
		r.status, r.wrote = code, true
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *statusRecorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.ResponseWriter.Write(b)
}

func (r *statusRecorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// HashKey is how API keys are stored: hex SHA-256 of the secret. The secret
// has 160 random bits, so a fast hash is enough.
func HashKey(secret string) string {
	h := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(h[:])
}

func (s *Server) authenticated(h func(http.ResponseWriter, *http.Request, string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		secret := ""
		if a := r.Header.Get("Authorization"); a != "" {
			scheme, tok, ok := strings.Cut(a, " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") {
				refuse(w, r, pandastack.Errorf(pandastack.EUnauthorized, "the Authorization header must be \"Bearer pds_...\""))
				return
			}
			secret = strings.TrimSpace(tok)
		} else if secret = r.Header.Get("X-API-Key"); secret == "" {
			secret = wsKey(r)
		}
		if secret == "" {
			refuse(w, r, pandastack.Errorf(pandastack.EUnauthorized, "missing API key: send \"Authorization: Bearer pds_...\" (serve prints a key on first start and writes it to <data dir>/api-key)"))
			return
		}
		key, err := s.store.APIKeyByHash(r.Context(), HashKey(secret))
		if err != nil {
			if pandastack.IsCode(err, pandastack.ENotFound) {
				refuse(w, r, pandastack.Errorf(pandastack.EUnauthorized, "unknown API key"))
				return
			}
			writeError(w, err)
			return
		}
		if key.RevokedAt != nil {
			refuse(w, r, pandastack.Errorf(pandastack.EUnauthorized, "API key %s… was revoked", key.Prefix))
			return
		}
		if key.Scope == pandastack.ScopeSandboxes && (r.URL.Path == "/v1/api-keys" || strings.HasPrefix(r.URL.Path, "/v1/api-keys/")) {
			writeError(w, pandastack.Errorf(pandastack.EPermission, "API key %s… has scope %q: it may use sandboxes, snapshots and the rest of the API, not list, create or revoke the project's keys; use a key of scope %q", key.Prefix, key.Scope, pandastack.ScopeAll))
			return
		}
		if err := checkQuery(r); err != nil {
			writeError(w, err)
			return
		}
		ctx, done := s.trackKey(r.Context(), key.ID)
		defer done()
		r = r.WithContext(ctx)
		var local func(http.ResponseWriter, *http.Request)
		if storeAnswers(r) {
			// The owner answers with what is still running there; when it
			// cannot be reached, the store's record is the answer.
			local = func(w http.ResponseWriter, r *http.Request) { h(w, r, key.ProjectID) }
		}
		if id := r.PathValue("id"); id != "" && s.forwardSandbox(w, r, key.ProjectID, id, local) {
			return // another node's sandbox (forward.go)
		}
		if r.Method == http.MethodPost && r.URL.Path == "/v1/sandboxes" && s.placeCreate(w, r, key.ProjectID, h) {
			return // placed on another node (forward.go)
		}
		h(w, r, key.ProjectID)
	}
}

// statusOf maps an error code to its HTTP status: the only place that does.
func statusOf(code string) int { return pandastack.HTTPStatus(code) }

type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func errorJSON(err error) errorBody {
	var b errorBody
	b.Error.Code = pandastack.ErrorCode(err)
	b.Error.Message = pandastack.ErrorMessage(err)
	return b
}

func writeError(w http.ResponseWriter, err error) {
	if rec, ok := w.(*statusRecorder); ok {
		err = revokedErr(rec.keyCtx, err)
		if rec.classify != nil {
			err = rec.classify(err)
		}
		rec.err = err // logged once the handler returns, unless it was
	}
	b := errorJSON(err)
	if b.Error.Code == pandastack.EMemory {
		// Memory frees as sandboxes go quiet (10 s) or end.
		w.Header().Set("Retry-After", "10")
	}
	writeJSON(w, statusOf(b.Error.Code), b)
}

// refuse answers a caller without a valid key. A body it announced is not
// waited for (the server would drain it before reading the next request):
// the connection is cut once the answer is out. Only then: a read deadline
// that fires while the server watches an idle connection cancels every
// later request on it.
func refuse(w http.ResponseWriter, r *http.Request, err error) {
	if r.ContentLength != 0 {
		w.Header().Set("Connection", "close")
		http.NewResponseController(w).SetReadDeadline(time.Now())
	}
	writeError(w, err)
}

// classifyError gives an error that carries no code of its own the one
// the store finds for it (pandastack.StoreErrors): a database that cannot
// be reached answers 503, one without room 507, not 500.
func (s *Server) classifyError(err error) error {
	se, ok := s.store.(pandastack.StoreErrors)
	if !ok {
		return err
	}
	var e *pandastack.Error
	if errors.As(err, &e) {
		return err
	}
	return se.ClassifyError(err)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff") // an answer quoting input is never read as a page
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

// bodiless wraps the handler of a POST that takes nothing in its body: an
// empty body or {} goes through, anything else is refused as any other
// POST refuses a body it cannot use, rather than ignored.
func bodiless(h func(http.ResponseWriter, *http.Request, string)) func(http.ResponseWriter, *http.Request, string) {
	return func(w http.ResponseWriter, r *http.Request, project string) {
		if err := decode(r, &struct{}{}); err != nil {
			writeError(w, err)
			return
		}
		h(w, r, project)
	}
}

// decode reads a JSON request body strictly: one JSON object with known
// fields and nothing after it. An empty body decodes as {}; null, an array
// or any other value is refused.
func decode(r *http.Request, v any) error {
	body := http.MaxBytesReader(nil, r.Body, maxJSONBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return jsonError(err)
	}
	// Only white space may follow; dec.More() also said "no more" before a
	// stray '}' or ']', which then passed.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return pandastack.Errorf(pandastack.EInvalid, "request body has data after the JSON object")
	}
	return decodeObject(raw, v)
}

// maxJSONBody is the largest JSON request body the API reads.
const maxJSONBody = 8 << 20

// decodeRequired is decode for a route whose body is the whole request
// (PUT …/network): an empty body is refused rather than read as {}. The
// white space it skips counts toward maxJSONBody (500 MB of spaces were
// read to the end).
func decodeRequired(r *http.Request, v any, example string) error {
	br := bufio.NewReader(http.MaxBytesReader(nil, r.Body, maxJSONBody))
	for {
		c, err := br.ReadByte()
		if errors.Is(err, io.EOF) {
			return pandastack.Errorf(pandastack.EInvalid, "the request body is required: a JSON object, e.g. %s", example)
		}
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return jsonError(err)
		}
		if err != nil || !strings.ContainsRune(" \t\r\n", rune(c)) {
			if err == nil {
				br.UnreadByte()
			}
			break // decode says what is wrong, if anything
		}
	}
	r.Body = struct {
		io.Reader
		io.Closer
	}{br, r.Body}
	return decode(r, v)
}

// decodeObject decodes raw, which must be a JSON object, into v strictly.
func decodeObject(raw []byte, v any) error {
	if t := bytes.TrimLeft(raw, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		kind := "empty"
		if len(t) > 0 {
			kind = jsonValueKind(t[0])
		}
		return pandastack.Errorf(pandastack.EInvalid, "the request body must be a JSON object, got %s", kind)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	return nullInStringMaps(raw)
}

// nullInStringMaps refuses a null value inside a request's object of
// strings, which decoding alone would take for "".
func nullInStringMaps(raw []byte) error {
	if !bytes.Contains(raw, []byte("null")) {
		return nil
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(raw, &top) != nil {
		return nil
	}
	for name, raw := range top {
		field := strings.ToLower(name) // as the decoder matches fields
		var m map[string]json.RawMessage
		if !stringMaps[field] || json.Unmarshal(raw, &m) != nil {
			continue
		}
		for k, v := range m {
			if string(v) == "null" {
				return pandastack.Errorf(pandastack.EInvalid, "field %q must be an object whose values are strings, got null for %q", field, k)
			}
		}
	}
	return nil
}

func jsonValueKind(c byte) string {
	switch c {
	case 'n':
		return "null"
	case '[':
		return "an array"
	case '"':
		return "a string"
	case 't', 'f':
		return "a boolean"
	}
	return "a number"
}

func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &syn):
		return pandastack.Errorf(pandastack.EInvalid, "malformed JSON at byte %d: %v", syn.Offset, err)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			return pandastack.Errorf(pandastack.EInvalid, "the request body must be a JSON object, got %s", typ.Value)
		}
		kind := typ.Type.Kind()
		if i := strings.IndexByte(field, '.'); i > 0 && stringMaps[field[:i]] || stringMaps[field] {
			// A value inside an object of strings (Go names the field, or
			// the field and the key).
			return pandastack.Errorf(pandastack.EInvalid, "field %q must be an object whose values are strings, got %s", field, typ.Value)
		}
		if n, ok := strings.CutPrefix(typ.Value, "number "); ok && kind >= reflect.Int && kind <= reflect.Uint64 && isWhole(n) {
			return pandastack.Errorf(pandastack.EInvalid, "field %q is out of range: %s", field, n)
		}
		return pandastack.Errorf(pandastack.EInvalid, "field %q must be %s, got %s", field, jsonKind(kind.String()), typ.Value)
	case errors.As(err, &tooBig):
		return pandastack.Errorf(pandastack.ETooLarge, "JSON body larger than %d bytes", tooBig.Limit)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return pandastack.Errorf(pandastack.EInvalid, "malformed JSON: the body ends too early")
	case strings.HasPrefix(err.Error(), "json: unknown field"):
		return pandastack.Errorf(pandastack.EInvalid, "%s; see /v1/openapi.json for the accepted fields", strings.TrimPrefix(err.Error(), "json: "))
	}
	return pandastack.Errorf(pandastack.EInvalid, "invalid JSON body: %v", err)
}

// stringMaps are the request fields that are objects of strings.
var stringMaps = map[string]bool{"metadata": true, "env": true}

// isWhole reports whether a JSON number has no fraction or exponent.
func isWhole(n string) bool {
	n = strings.TrimPrefix(n, "-")
	return n != "" && strings.Trim(n, "0123456789") == ""
}

func jsonKind(k string) string {
	switch k {
	case "int", "int64", "int32", "uint32", "uint64":
		return "an integer"
	case "float64":
		return "a number"
	case "string":
		return "a string"
	case "map", "struct":
		return "a JSON object"
	case "slice":
		return "an array"
	case "bool":
		return "true or false"
	}
	return "a " + k
}
