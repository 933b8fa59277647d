package api

import (
	"context"
	"crypto/subtle"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/sandbox"
)

// Exposed ports: /v1/sandboxes/{id}/ports/{port}/{path...} is a reverse
// proxy to a server listening on {port} on the sandbox's address (any
// method, streamed bodies, WebSocket upgrades). It takes the API key, or a
// port token (POST .../token) as ?pandastack_token= or, after a first
// request with it, the cookie that request set: so a token URL works in a
// browser. Tokens live in this server's memory: a restart revokes them.

const (
	tokenParam      = "pandastack_token"
	defaultTokenTTL = time.Hour
	maxTokenTTL     = 7 * 24 * time.Hour
	portTokenPrefix = "pst_"
	portTokenCookie = "pandastack_port_token"
	// hostCookiePrefix names a cookie a browser keeps only for the host
	// that set it over HTTPS (no Domain, Path=/).
	hostCookiePrefix = "__Host-"
)

type portToken struct {
	project, sandbox string
	port             int
	expires          time.Time
	keyID            string // the API key that made it: revoking the key drops it
}

type portTokens struct {
	mu sync.Mutex
	m  map[string]portToken
	// open holds the cuts of the proxied requests in flight by the token
	// that let them in: a revoked or expired token ends them (a
	// WebSocket, a stream), as a revoked key ends its own.
	open cuts
}

var (
	errTokenRevoked = pandastack.Errorf(pandastack.EUnauthorized, "the port token this request came with was revoked during it")
	errTokenExpired = pandastack.Errorf(pandastack.EUnauthorized, "the port token this request came with expired during it")
)

// use returns ctx, cut when the token secret (tok) is revoked or expires;
// done ends the tracking. A token revoked since the caller's get cuts it
// at once.
func (t *portTokens) use(ctx context.Context, secret string, tok portToken) (_ context.Context, done func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	t.mu.Lock()
	if _, live := t.m[secret]; !live {
		t.mu.Unlock()
		cancel(errTokenRevoked)
		return ctx, func() {}
	}
	t.open.add(secret, &cancel)
	t.mu.Unlock()
	timer := time.AfterFunc(time.Until(tok.expires), func() { cancel(errTokenExpired) })
	return ctx, func() {
		timer.Stop()
		t.mu.Lock()
		t.open.remove(secret, &cancel)
		t.mu.Unlock()
		cancel(nil)
	}
}

// dropLocked removes the token secret and cuts the requests it let in.
func (t *portTokens) dropLocked(secret string) {
	delete(t.m, secret)
	t.open.cut(secret, errTokenRevoked)
}

func (t *portTokens) add(secret string, tok portToken) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]portToken{}
	}
	now := time.Now()
	for k, v := range t.m { // drop expired ones as new ones come
		if now.After(v.expires) {
			delete(t.m, k)
		}
	}
	t.m[secret] = tok
}

func (t *portTokens) get(secret string) (portToken, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	tok, ok := t.m[secret]
	if !ok || time.Now().After(tok.expires) {
		return portToken{}, false
	}
	return tok, true
}

// revoke removes every token of the sandbox's port.
func (t *portTokens) revoke(sandbox string, port int) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for k, v := range t.m {
		if v.sandbox == sandbox && v.port == port {
			t.dropLocked(k)
			n++
		}
	}
	return n
}

// revokeKey removes every token the API key made.
func (t *portTokens) revokeKey(keyID string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for k, v := range t.m {
		if v.keyID == keyID {
			t.dropLocked(k)
			n++
		}
	}
	return n
}

// keys lists the ids of the API keys that made the live tokens.
func (t *portTokens) keys() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ids []string
	seen := map[string]bool{}
	now := time.Now()
	for k, v := range t.m {
		if now.After(v.expires) {
			delete(t.m, k)
		} else if !seen[v.keyID] {
			seen[v.keyID] = true
			ids = append(ids, v.keyID)
		}
	}
	return ids
}

func (s *Server) portRoutes() {
	route := func(pattern string, h http.HandlerFunc) { s.mux.HandleFunc(pattern, h) }
	route("GET /v1/sandboxes/{id}/ports/{port}/{path...}", s.portProxy)
	route("POST /v1/sandboxes/{id}/ports/{port}/{path...}", s.portProxy)
	route("PUT /v1/sandboxes/{id}/ports/{port}/{path...}", s.portProxy)
	route("PATCH /v1/sandboxes/{id}/ports/{port}/{path...}", s.portProxy)
	route("DELETE /v1/sandboxes/{id}/ports/{port}/{path...}", s.portProxy)
	route("OPTIONS /v1/sandboxes/{id}/ports/{port}/{path...}", s.portProxy)
	route("POST /v1/sandboxes/{id}/ports/{port}/token", s.authenticated(s.createPortToken))
	route("DELETE /v1/sandboxes/{id}/ports/{port}/token", s.authenticated(s.revokePortTokens))
}

// routedMethods are the methods the API's routes name (GET routes take
// HEAD too): the port proxy's path form has a route for each.
var routedMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions}

// otherMethodToPort serves a request to the path form of the port proxy
// in a method the mux does not route (WebDAV's PROPFIND, MKCOL, REPORT,
// QUERY, ...): the proxy passes any method, as the host form does.
func (s *Server) otherMethodToPort(w http.ResponseWriter, r *http.Request) bool {
	if slices.Contains(routedMethods, r.Method) {
		return false
	}
	rest, ok := strings.CutPrefix(r.URL.Path, "/v1/sandboxes/")
	if !ok {
		return false
	}
	parts := strings.SplitN(rest, "/", 4)
	if len(parts) < 4 || parts[0] == "" || parts[1] != "ports" || parts[2] == "" {
		return false
	}
	r.SetPathValue("id", parts[0])
	r.SetPathValue("port", parts[2])
	r.SetPathValue("path", parts[3])
	s.portProxy(w, r)
	return true
}

// parsePort reads the {port} of r: 1 to 65535, written as the token URLs
// write it. "+8000" and "08000" are refused rather than taken for 8000: a
// port has one path, the one its token's cookie is scoped to.
func parsePort(r *http.Request) (int, error) {
	v := r.PathValue("port")
	p, err := strconv.Atoi(v)
	if err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != v {
		return 0, pandastack.Errorf(pandastack.EInvalid, "port must be a number between 1 and 65535 without a sign or leading zeros, such as 8000, got %q", v)
	}
	return p, nil
}

type portTokenRequest struct {
	TTLSeconds *int64 `json:"ttl_seconds"`
}

// PortToken answers POST /v1/sandboxes/{id}/ports/{port}/token.
type PortToken struct {
	URL       string    `json:"url"` // works in a browser with no header
	Token     string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

func (s *Server) createPortToken(w http.ResponseWriter, r *http.Request, project string) {
	port, err := parsePort(r)
	if err != nil {
		writeError(w, err)
		return
	}
	var req portTokenRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	ttl := defaultTokenTTL
	if req.TTLSeconds != nil {
		if *req.TTLSeconds < 1 || *req.TTLSeconds > int64(maxTokenTTL/time.Second) {
			writeError(w, pandastack.Errorf(pandastack.EInvalid, "ttl_seconds must be between 1 and %d", int64(maxTokenTTL/time.Second)))
			return
		}
		ttl = time.Duration(*req.TTLSeconds) * time.Second
	}
	id := r.PathValue("id")
	sb, err := s.mgr.Get(r.Context(), project, id)
	if err != nil {
		writeError(w, err)
		return
	}
	if sb.State == pandastack.StateStopped {
		// A URL that can only ever answer "stopped" is no use to hand out.
		writeError(w, sandbox.StoppedError(sb))
		return
	}
	if !s.mgr.Networking() {
		writeError(w, pandastack.Errorf(pandastack.EInvalid, "this server runs without sandbox networking (serve --network-default off): no port of a sandbox can be reached, so no token is made"))
		return
	}
	secret := portTokenPrefix + strings.TrimPrefix(pandastack.NewAPIKeySecret(), "pds_")
	exp := time.Now().Add(ttl).UTC().Truncate(time.Second)
	s.tokens.add(secret, portToken{project: project, sandbox: id, port: port, expires: exp, keyID: keyIDOf(r.Context())})
	u := s.portURL(r, id, port, "/", tokenParam+"="+secret)
	writeJSON(w, http.StatusCreated, PortToken{URL: u, Token: secret, ExpiresAt: exp})
}

// publicBase is the scheme and host clients reach this server at: the
// configured public URL's (serve --public-url: behind a proxy that ends
// TLS, the request alone says http and maybe another host), else the
// request's own.
func (s *Server) publicBase(r *http.Request) (scheme, host string) {
	if u, err := url.Parse(s.cfg.PublicURL); err == nil && s.cfg.PublicURL != "" {
		return u.Scheme, u.Host
	}
	if r.TLS != nil {
		return "https", r.Host
	}
	return "http", r.Host
}

// portURL is the URL of path (escaped) and rawQuery on sandbox id's port
// as a browser should open it: with --public-domain D the port's own
// origin, {port}-sbx-….D on the public URL's port (or the one the request
// came to), not the console's, so that what the page runs stays there;
// else the path form on the public URL.
func (s *Server) portURL(r *http.Request, id string, port int, path, rawQuery string) string {
	scheme, host := s.publicBase(r)
	u := scheme + "://" + host + "/v1/sandboxes/" + id + "/ports/" + strconv.Itoa(port) + path
	if d := s.cfg.PublicDomain; d != "" {
		listen := ""
		if _, p, err := net.SplitHostPort(host); err == nil {
			listen = ":" + p
		}
		u = scheme + "://" + strconv.Itoa(port) + "-sbx-" + strings.TrimPrefix(id, "sbx_") + "." + d + listen + path
	}
	if rawQuery != "" {
		u += "?" + rawQuery
	}
	return u
}

// tokenCookieOf is the port token r carries as a cookie, under either
// name (tokenCookie), or "".
func tokenCookieOf(r *http.Request) string {
	for _, name := range []string{hostCookiePrefix + portTokenCookie, portTokenCookie} {
		if c, err := r.Cookie(name); err == nil && c.Value != "" {
			return c.Value
		}
	}
	return ""
}

// tokenCookie is the port-token cookie's name for r: on the host form
// over HTTPS the __Host- name, which a browser takes only from the host
// itself with Secure and no Domain, so that another sandbox's page (the
// same site) cannot set one that shadows it.
func (s *Server) tokenCookie(r *http.Request) (name string, secure bool) {
	scheme, _ := s.publicBase(r)
	secure = scheme == "https"
	if secure && hostRouted(r) {
		return hostCookiePrefix + portTokenCookie, true
	}
	return portTokenCookie, secure
}

func (s *Server) revokePortTokens(w http.ResponseWriter, r *http.Request, project string) {
	port, err := parsePort(r)
	if err != nil {
		writeError(w, err)
		return
	}
	id := r.PathValue("id")
	if _, err := s.mgr.Get(r.Context(), project, id); err != nil {
		writeError(w, err)
		return
	}
	n := s.tokens.revoke(id, port)
	writeJSON(w, http.StatusOK, map[string]int{"revoked": n})
}

// portProxy authorises by port token (query or cookie) or API key, then
// proxies to the sandbox's port.
func (s *Server) portProxy(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if s.forwardSandbox(w, r, "", id, nil) {
		return // its node checks the token (forward.go)
	}
	port, err := parsePort(r)
	if err != nil {
		writeError(w, err)
		return
	}
	secret := r.URL.Query().Get(tokenParam)
	fromQuery := secret != ""
	if !fromQuery {
		secret = tokenCookieOf(r)
	}
	if secret != "" && r.Header.Get("Authorization") == "" && r.Header.Get("X-API-Key") == "" {
		tok, ok := s.tokens.get(secret)
		if !ok || subtle.ConstantTimeCompare([]byte(tok.sandbox), []byte(id)) != 1 || tok.port != port {
			refuse(w, r, pandastack.Errorf(pandastack.EUnauthorized, "this port token is unknown, expired, revoked or for another sandbox port"))
			return
		}
		if s.cfg.PublicDomain != "" && !hostRouted(r) {
			// Ports have origins of their own here: a page opened by
			// token on the path form would run on the API's and the
			// console's origin, where it could script the console. A
			// browser's GET goes to the port's own host; the rest is
			// refused (an API key still reaches the path form).
			if fromQuery && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
				http.Redirect(w, r, s.portURL(r, id, port, proxiedPath(r), r.URL.RawQuery), http.StatusTemporaryRedirect)
				return
			}
			refuse(w, r, pandastack.Errorf(pandastack.EPermission, "this server serves sandbox ports to browsers on their own hosts (%s): a port token is taken there, not on the API's path form; open the URL POST …/ports/%d/token answers, or send an API key", s.portURL(r, id, port, "/", ""), port))
			return
		}
		if !fromQuery && s.foreignPage(r, id) {
			refuse(w, r, pandastack.Errorf(pandastack.EPermission, "this request was sent by a page of another origin than sandbox %s's, and carries the port token only as the browser's cookie: refused, so that another sandbox's page cannot act with it; open the port's URL itself, or send the token in ?%s=", id, tokenParam))
			return
		}
		var setCookie func() bool
		if fromQuery {
			// Later requests of the page (scripts, images) carry the cookie.
			path := "/v1/sandboxes/" + id + "/ports/" + strconv.Itoa(port) + "/"
			if hostRouted(r) {
				path = "/" // the whole host is the port's
			}
			name, secure := s.tokenCookie(r)
			setCookie = func() bool {
				http.SetCookie(w, &http.Cookie{Name: name, Value: secret, Path: path,
					HttpOnly: true, Secure: secure, SameSite: http.SameSiteLaxMode, Expires: tok.expires})
				return s.stripToken(w, r)
			}
		}
		ctx, done := s.trackKey(r.Context(), tok.keyID)
		defer done()
		ctx, unuse := s.tokens.use(ctx, secret, tok)
		defer unuse()
		s.proxyPort(w, r.WithContext(ctx), tok.project, id, port, setCookie)
		return
	}
	s.authenticated(func(w http.ResponseWriter, r *http.Request, project string) {
		s.proxyPort(w, r, project, id, port, nil)
	})(w, r)
}

// stripToken answers a browser's navigation to a token URL, once its
// cookie is set, with a redirect to the same URL without the token, and
// reports whether it did: the token then stays out of the address bar,
// the history, and the Referer of what the page loads. Browsers say a
// navigation (Sec-Fetch-*) only over HTTPS; other callers (curl, an SDK)
// are answered at once, as they may keep no cookie.
func (s *Server) stripToken(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodGet || r.Header.Get("Sec-Fetch-Mode") != "navigate" || r.Header.Get("Sec-Fetch-Dest") != "document" {
		return false
	}
	loc := r.URL.EscapedPath()
	if strings.HasPrefix(loc, "//") {
		// A path the host form passes on whole: alone, //x would name
		// another host; /.//x is this host's //x (the dot segment goes
		// when the browser resolves it), on the scheme the browser used.
		loc = "/." + loc
	}
	if q := withoutParam(r.URL.RawQuery, tokenParam); q != "" {
		loc += "?" + q
	}
	// Not http.Redirect, which cleans the path (a // the host form
	// passes on would become /).
	w.Header().Set("Location", loc)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusSeeOther)
	return true
}

// proxyPort passes r to the sandbox's port; setCookie, if not nil, is
// called once the sandbox is found running, before the answer, and may
// answer itself (true: stripToken's redirect).
func (s *Server) proxyPort(w http.ResponseWriter, r *http.Request, project, id string, port int, setCookie func() bool) {
	clearBodyDeadline(w) // the sandbox's server decides how long a body may take
	// A proxied request or connection is work in flight: the sandbox is
	// not idle (nor suspended under it) until it ends.
	c, done, err := s.mgr.Hold(r.Context(), project, id)
	if err != nil {
		writeError(w, err)
		return
	}
	defer done()
	// A pause or kill of the sandbox ends what is proxied to it at once:
	// its network stack goes with it and sends no reset, so a stream or a
	// WebSocket would otherwise hang until TCP gives up (minutes).
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	if c != nil {
		go func() {
			select {
			case <-c.Done():
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	r = r.WithContext(ctx)
	target, err := s.mgr.PortAddr(r.Context(), project, id, port)
	if err != nil {
		writeError(w, err)
		return
	}
	if setCookie != nil && setCookie() { // not for a sandbox that is gone
		return
	}
	rawPath := proxiedPath(r)
	// A body the caller broke (malformed chunks, cut off) is the caller's
	// fault, not the sandbox's server's.
	var body *sandbox.BodyReader
	if r.Body != nil && r.Body != http.NoBody {
		body = &sandbox.BodyReader{R: r.Body}
		r.Body = struct {
			io.Reader
			io.Closer
		}{body, r.Body}
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = target.String()
			// The path and query as the caller wrote them (%2F, order,
			// flags without =), less our token.
			pr.Out.URL.Path, _ = url.PathUnescape(rawPath)
			pr.Out.URL.RawPath = rawPath
			pr.Out.URL.RawQuery = withoutParam(r.URL.RawQuery, tokenParam)
			// The API key and our cookie are for us, not for the sandbox.
			pr.Out.Header.Del("Authorization")
			pr.Out.Header.Del("X-API-Key")
			removeCookie(pr.Out, portTokenCookie)
			removeCookie(pr.Out, hostCookiePrefix+portTokenCookie)
			removeBearerProtocols(pr.Out.Header)
			pr.SetXForwarded()
		},
		ModifyResponse: func(res *http.Response) error {
			if !hostRouted(r) {
				sameOriginResponse(res.Header)
			}
			return nil
		},
		Transport: &http.Transport{
			DialContext: (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
			// A sandbox may stream (SSE, long polls): no overall timeout.
			ResponseHeaderTimeout: 0,
			DisableCompression:    true,
			DisableKeepAlives:     true, // one transport per request: keep nothing open
		},
		FlushInterval: -1,
		ErrorLog:      slog.NewLogLogger(s.log.Handler(), slog.LevelDebug), // the sandbox's server broke off
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() == context.Canceled {
				if cause := context.Cause(r.Context()); pandastack.IsCode(cause, pandastack.EUnauthorized) {
					writeError(w, cause) // its key or token revoked (or expired) during it
					return
				}
				if c != nil && !c.Alive() {
					writeError(w, pandastack.Errorf(pandastack.EUnavailable, "sandbox %s was paused or stopped during the request to its port %d", id, port))
				}
				return
			}
			if body != nil && body.Err() != nil {
				writeError(w, pandastack.Errorf(pandastack.EInvalid, "the request's body could not be read: %v", body.Err()))
				return
			}
			var op *net.OpError
			if errors.As(err, &op) && op.Op == "dial" {
				writeError(w, pandastack.Errorf(pandastack.EPortClosed, "nothing answers on port %d of sandbox %s (a server must listen on 0.0.0.0:%d inside it): %v", port, id, port, shortNetErr(err)))
				return
			}
			writeError(w, pandastack.Errorf(pandastack.EPortClosed, "the server on port %d of sandbox %s broke off or did not answer in HTTP: %v", port, id, shortNetErr(err)))
		},
	}
	serveProxy(rp, w, r)
}

// proxiedPath is the escaped path a proxied request goes to in the
// sandbox, as the caller wrote it: what follows /v1/sandboxes/{id}/ports/
// {port}, or the whole path of a host route ({port}-{id}.PublicDomain).
func proxiedPath(r *http.Request) string {
	p := r.URL.EscapedPath()
	// The prefix's segments as the caller wrote them, escaped or not
	// (%38000 is 8000).
	segs := strings.SplitN(p, "/", 7) // "", v1, sandboxes, {id}, ports, {port}, rest
	unesc := func(s string) string {
		u, err := url.PathUnescape(s)
		if err != nil {
			return s
		}
		return u
	}
	if len(segs) < 6 || segs[0] != "" || segs[1] != "v1" || segs[2] != "sandboxes" || segs[4] != "ports" ||
		unesc(segs[3]) != r.PathValue("id") || unesc(segs[5]) != r.PathValue("port") {
		return p // a host route: the whole path
	}
	if len(segs) == 6 {
		return "/"
	}
	return "/" + segs[6]
}

// withoutParam removes the parameter name from a raw query, leaving every
// other one as it was written.
func withoutParam(raw, name string) string {
	if raw == "" {
		return ""
	}
	kept := make([]string, 0, strings.Count(raw, "&")+1)
	for _, kv := range strings.Split(raw, "&") {
		k, _, _ := strings.Cut(kv, "=")
		if uk, err := url.QueryUnescape(k); err == nil && uk == name {
			continue
		}
		kept = append(kept, kv)
	}
	return strings.Join(kept, "&")
}

func shortNetErr(err error) string {
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}

// removeBearerProtocols drops the "bearer.<key>" entries a browser's
// WebSocket sends its API key in (wsKey), keeping the others.
func removeBearerProtocols(h http.Header) {
	var kept []string
	for _, v := range h.Values("Sec-WebSocket-Protocol") {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" && !strings.HasPrefix(p, bearerProtocol) {
				kept = append(kept, p)
			}
		}
	}
	h.Del("Sec-WebSocket-Protocol")
	if len(kept) > 0 {
		h.Set("Sec-WebSocket-Protocol", strings.Join(kept, ", "))
	}
}

// sameOriginResponse removes, from an answer of a sandbox's server on the
// path form (/v1/sandboxes/{id}/ports/{port}/), the headers that act on the
// whole origin, which that form shares with the API and the console: a
// service worker's scope widened beyond the port's path (it would see the
// console's requests and their key) and an order to clear the origin's data.
func sameOriginResponse(h http.Header) {
	h.Del("Service-Worker-Allowed")
	h.Del("Clear-Site-Data")
}

// removeCookie drops the pairs named name from r's Cookie header and
// leaves every other pair as the client sent it. Parsing the header and
// writing it again (Request.Cookies, AddCookie) dropped the sandbox
// app's cookies whose values Go's parser refuses (a quote, a backslash,
// a non-ASCII byte: prefs={"theme":"dark"}), quoted others, and dropped
// them all past 3000.
func removeCookie(r *http.Request, name string) {
	lines := r.Header.Values("Cookie")
	if !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, name) }) {
		return
	}
	var kept []string
	for _, l := range lines {
		for _, pair := range strings.Split(l, ";") {
			pair = strings.TrimSpace(pair)
			if n, _, _ := strings.Cut(pair, "="); pair == "" || strings.TrimSpace(n) == name {
				continue
			}
			kept = append(kept, pair)
		}
	}
	r.Header.Del("Cookie")
	if len(kept) > 0 {
		r.Header.Set("Cookie", strings.Join(kept, "; "))
	}
}

// foreignPage reports whether r, let in by its port-token cookie, was
// sent by a browser for a page of another origin than sandbox id's ports:
// every {port}-{id}.PublicDomain host is one site, so another sandbox's
// page gets the cookie sent along (SameSite counts sites, not origins),
// and its script could drive this port's app (a WebSocket) or post to it.
// The page is the request's Origin, or its Referer without one (an image,
// a script); "null" (a page behind a redirect, a sandboxed frame) is
// foreign. A link followed to a top-level page is let through, as Lax
// lets it, when the browser says so (Sec-Fetch-Dest: document; a frame is
// not); so is a page of another port of the same sandbox, on the host
// form. A request without Origin, Referer or Sec-Fetch-Site (curl, an
// SDK, a bookmark) is not a page's.
func (s *Server) foreignPage(r *http.Request, id string) bool {
	if (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Header.Get("Sec-Fetch-Mode") == "navigate" && r.Header.Get("Sec-Fetch-Dest") == "document" {
		return false
	}
	page := r.Header.Get("Origin")
	if page == "" {
		page = r.Header.Get("Referer")
	}
	if page != "" {
		u, err := url.Parse(page)
		if err != nil || page == "null" || u.Host == "" {
			return true
		}
		if strings.EqualFold(u.Host, r.Host) {
			return false
		}
		_, pageID, ok := s.portHost(u.Host)
		return !hostRouted(r) || !ok || pageID != id
	}
	switch r.Header.Get("Sec-Fetch-Site") {
	case "cross-site", "same-site":
		return true // a page's, which does not say which
	}
	return false
}

// portHost parses host as {port}-{id}.PublicDomain: the port and the
// sandbox id; ok false when it is not one (or there is no PublicDomain).
func (s *Server) portHost(host string) (port, id string, ok bool) {
	if s.cfg.PublicDomain == "" {
		return "", "", false
	}
	host = strings.ToLower(host)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(host, "."+strings.ToLower(s.cfg.PublicDomain))
	m := hostRouteRE.FindStringSubmatch(label)
	if !ok || m == nil {
		return "", "", false
	}
	return m[1], "sbx_" + m[2][4:], true
}

// hostRouteRE matches the first label of {port}-{id}.PublicDomain; the id
// may be written with "-" for its "_", which some clients refuse in hosts.
var hostRouteRE = regexp.MustCompile(`^([0-9]{1,5})-(sbx[_-][a-z2-7]{16})$`)

// hostRoute serves {port}-{id}.PublicDomain as the port proxy of that
// sandbox port, the whole path passed on; false when r is not for one.
func (s *Server) hostRoute(w http.ResponseWriter, r *http.Request) bool {
	port, id, ok := s.portHost(r.Host)
	if !ok {
		return false
	}
	r = r.WithContext(context.WithValue(r.Context(), hostRoutedKey{}, true))
	r.SetPathValue("port", port)
	r.SetPathValue("id", id)
	r.SetPathValue("path", strings.TrimPrefix(r.URL.Path, "/"))
	s.portProxy(w, r)
	return true
}

// hostRoutedKey marks a request hostRoute serves: its whole host is the
// port's (an origin of its own), unlike the path form's, which shares the
// API's and the console's origin.
type hostRoutedKey struct{}

// hostRouted reports whether r came through hostRoute. Not r.Pattern:
// the path form in a method the mux does not route (otherMethodToPort)
// has none either.
func hostRouted(r *http.Request) bool {
	v, _ := r.Context().Value(hostRoutedKey{}).(bool)
	return v
}
