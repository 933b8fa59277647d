package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/sandbox"
)

// ended waits for ctx's end (bounded, so a failure does not hang) and
// returns its cause.
func ended(t *testing.T, ctx context.Context) error {
	t.Helper()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(10 * time.Second):
		t.Fatal("the request's context did not end")
		return nil
	}
}

// A request a port token let in (a WebSocket, a stream) ends when the
// token is revoked, by its port's DELETE or with its key, or expires, as
// one its API key let in ends with the key's revocation; one whose token
// was revoked between its check and its start ends at once.
func TestPortTokenEndsItsRequests(t *testing.T) {
	tok := func(key string, ttl time.Duration) portToken {
		return portToken{project: "prj_a", sandbox: "sbx_a", port: 8000, expires: time.Now().Add(ttl), keyID: key}
	}
	t.Run("revoked", func(t *testing.T) {
		var ts portTokens
		ts.add("pst_1", tok("key_1", time.Hour))
		ts.add("pst_2", portToken{project: "prj_a", sandbox: "sbx_a", port: 3000, expires: time.Now().Add(time.Hour), keyID: "key_1"})
		ctx, done := ts.use(context.Background(), "pst_1", tok("key_1", time.Hour))
		defer done()
		other, done2 := ts.use(context.Background(), "pst_2", tok("key_1", time.Hour))
		defer done2()
		if n := ts.revoke("sbx_a", 8000); n != 1 {
			t.Fatalf("revoked %d tokens, want 1", n)
		}
		if err := ended(t, ctx); err != errTokenRevoked {
			t.Fatalf("cause %v, want the revocation", err)
		}
		if other.Err() != nil {
			t.Fatal("revoking port 8000's tokens ended a request of port 3000")
		}
	})
	t.Run("with its key", func(t *testing.T) {
		var ts portTokens
		ts.add("pst_1", tok("key_1", time.Hour))
		ctx, done := ts.use(context.Background(), "pst_1", tok("key_1", time.Hour))
		defer done()
		ts.revokeKey("key_1")
		if err := ended(t, ctx); !pandastack.IsCode(err, pandastack.EUnauthorized) {
			t.Fatalf("cause %v, want unauthorized", err)
		}
	})
	t.Run("expired", func(t *testing.T) {
		var ts portTokens
		ts.add("pst_1", tok("key_1", 50*time.Millisecond))
		ctx, done := ts.use(context.Background(), "pst_1", tok("key_1", 50*time.Millisecond))
		defer done()
		if err := ended(t, ctx); err != errTokenExpired {
			t.Fatalf("cause %v, want the expiry", err)
		}
	})
	t.Run("revoked before its start", func(t *testing.T) {
		var ts portTokens
		ts.add("pst_1", tok("key_1", time.Hour))
		ts.revoke("sbx_a", 8000)
		ctx, done := ts.use(context.Background(), "pst_1", tok("key_1", time.Hour))
		defer done()
		if ctx.Err() == nil {
			t.Fatal("a request whose token was revoked since its check was let run")
		}
	})
	t.Run("done", func(t *testing.T) {
		var ts portTokens
		ts.add("pst_1", tok("key_1", time.Hour))
		_, done := ts.use(context.Background(), "pst_1", tok("key_1", time.Hour))
		done()
		ts.mu.Lock()
		defer ts.mu.Unlock()
		if len(ts.open) != 0 {
			t.Fatalf("%d tokens still hold ended requests", len(ts.open))
		}
	})
}

// Token URLs are made on the public URL when one is set (behind a proxy
// that ends TLS the request says http, and maybe another host), and on
// the port's own host with --public-domain.
func TestPortTokenURL(t *testing.T) {
	const id = "sbx_abcdefghijklmnop"
	for _, c := range []struct {
		name, publicURL, domain, host string
		want                          string
	}{
		{"the request's own", "", "", "localhost:8080", "http://localhost:8080/v1/sandboxes/" + id + "/ports/8000/?pandastack_token=pst_x"},
		{"behind a TLS proxy", "https://sandboxes.example.test", "", "10.0.0.5:8080", "https://sandboxes.example.test/v1/sandboxes/" + id + "/ports/8000/?pandastack_token=pst_x"},
		{"host form", "", "ports.example.test", "api.example.test:8080", "http://8000-sbx-abcdefghijklmnop.ports.example.test:8080/?pandastack_token=pst_x"},
		{"host form behind a TLS proxy", "https://sandboxes.example.test", "ports.example.test", "10.0.0.5:8080", "https://8000-sbx-abcdefghijklmnop.ports.example.test/?pandastack_token=pst_x"},
		{"host form, the public URL's port", "https://sandboxes.example.test:8443", "ports.example.test", "10.0.0.5:8080", "https://8000-sbx-abcdefghijklmnop.ports.example.test:8443/?pandastack_token=pst_x"},
	} {
		s := &Server{cfg: Config{PublicURL: c.publicURL, PublicDomain: c.domain}}
		r := httptest.NewRequest("POST", "/v1/sandboxes/"+id+"/ports/8000/token", nil)
		r.Host = c.host
		if got := s.portURL(r, id, 8000, "/", "pandastack_token=pst_x"); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

// The token's cookie is Secure when the server is reached over HTTPS,
// and on a port's own host it is a __Host- cookie, which another
// sandbox's page (the same site) cannot shadow with one of its own.
func TestPortTokenCookie(t *testing.T) {
	for _, c := range []struct {
		name, publicURL string
		host            bool
		want            string
		secure          bool
	}{
		{"plain HTTP", "", false, portTokenCookie, false},
		{"plain HTTP, host form", "", true, portTokenCookie, false},
		{"HTTPS, path form", "https://sandboxes.example.test", false, portTokenCookie, true},
		{"HTTPS, host form", "https://sandboxes.example.test", true, "__Host-" + portTokenCookie, true},
	} {
		s := &Server{cfg: Config{PublicURL: c.publicURL, PublicDomain: "ports.example.test"}}
		r := httptest.NewRequest("GET", "/", nil)
		if c.host {
			r = r.WithContext(context.WithValue(r.Context(), hostRoutedKey{}, true))
		}
		if name, secure := s.tokenCookie(r); name != c.want || secure != c.secure {
			t.Errorf("%s: %s secure %v, want %s secure %v", c.name, name, secure, c.want, c.secure)
		}
	}
}

// With --public-domain, ports have origins of their own, and a port
// token does not open the path form, which shares the API's and the
// console's origin (a page there could script the console and read a key
// typed into it): a browser's GET is sent to the port's own host, with
// its path and query; anything else is refused. An API key still reaches
// the path form (past the check, it fails here for want of a store).
func TestPathFormSendsTokensToThePortsHost(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := New(Config{PublicDomain: "ports.example.test", PublicURL: "https://sandboxes.example.test"}, sandbox.New(sandbox.Config{}, nil, nil, nil, log), keyStore{}, nil, log)
	const id = "sbx_abcdefghijklmnop"
	s.tokens.add("pst_x", portToken{project: "prj_a", sandbox: id, port: 8000, expires: time.Now().Add(time.Hour), keyID: "key_1"})
	path := "/v1/sandboxes/" + id + "/ports/8000/app/a%2Fb?q=1&pandastack_token=pst_x"
	for _, c := range []struct {
		name, method, cookie, auth string
		want                       int
		code, location             string
	}{
		{"a browser's GET", "GET", "", "", http.StatusTemporaryRedirect, "", "https://8000-sbx-abcdefghijklmnop.ports.example.test/app/a%2Fb?q=1&pandastack_token=pst_x"},
		{"a POST", "POST", "", "", http.StatusForbidden, "permission_denied", ""},
		{"the cookie alone", "GET", portTokenCookie + "=pst_x", "", http.StatusForbidden, "permission_denied", ""},
		{"an API key", "GET", "", "Bearer pds_0123456789abcdef", 0, "", ""},
	} {
		p := path
		if c.cookie != "" || c.auth != "" {
			p = strings.TrimSuffix(path, "&pandastack_token=pst_x")
		}
		r := httptest.NewRequest(c.method, p, nil)
		if c.cookie != "" {
			r.Header.Set("Cookie", c.cookie)
		}
		if c.auth != "" {
			r.Header.Set("Authorization", c.auth)
		}
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, r)
		var body errorBody
		json.Unmarshal(rec.Body.Bytes(), &body)
		if c.want == 0 {
			if rec.Code == http.StatusTemporaryRedirect || rec.Code == http.StatusForbidden {
				t.Errorf("%s: %d %s, want it past the token's check", c.name, rec.Code, rec.Body)
			}
			continue
		}
		if rec.Code != c.want || body.Error.Code != c.code || rec.Header().Get("Location") != c.location {
			t.Errorf("%s: %d %q %s, want %d %q %s", c.name, rec.Code, body.Error.Code, rec.Header().Get("Location"), c.want, c.code, c.location)
		}
	}
}

// A browser's navigation to a token URL, once its cookie is set, is sent
// to the same URL without the token (path as written, the other
// parameters kept), so the token leaves the address bar, the history and
// the Referer; a page's own requests and non-browser callers are not.
func TestStripToken(t *testing.T) {
	const u = "/v1/sandboxes/sbx_a/ports/8000/a//b%2Fc?x=1&pandastack_token=pst_y&flag"
	for _, c := range []struct {
		name    string
		method  string
		headers map[string]string
		want    string // Location; "": not answered
	}{
		{"a navigation", "GET", map[string]string{"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, "/v1/sandboxes/sbx_a/ports/8000/a//b%2Fc?x=1&flag"},
		{"a frame", "GET", map[string]string{"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe"}, ""},
		{"a script's fetch", "GET", map[string]string{"Sec-Fetch-Mode": "cors", "Sec-Fetch-Dest": "empty"}, ""},
		{"curl, or a browser over plain HTTP", "GET", nil, ""},
		{"a form's POST", "POST", map[string]string{"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "document"}, ""},
	} {
		r := httptest.NewRequest(c.method, u, nil)
		for k, v := range c.headers {
			r.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		answered := (&Server{}).stripToken(rec, r)
		if c.want == "" {
			if answered || rec.Code != http.StatusOK || rec.Header().Get("Location") != "" {
				t.Errorf("%s: answered %v, %d %s", c.name, answered, rec.Code, rec.Header().Get("Location"))
			}
			continue
		}
		if !answered || rec.Code != http.StatusSeeOther || rec.Header().Get("Location") != c.want {
			t.Errorf("%s: answered %v, %d to %s, want 303 to %s", c.name, answered, rec.Code, rec.Header().Get("Location"), c.want)
		}
	}
}

// A token URL with only the token in its query loses the "?" too.
func TestStripTokenAlone(t *testing.T) {
	r := httptest.NewRequest("GET", "/?pandastack_token=pst_y", nil)
	r.Header.Set("Sec-Fetch-Mode", "navigate")
	r.Header.Set("Sec-Fetch-Dest", "document")
	rec := httptest.NewRecorder()
	if !(&Server{}).stripToken(rec, r) || rec.Header().Get("Location") != "/" {
		t.Errorf("%d to %q, want 303 to /", rec.Code, rec.Header().Get("Location"))
	}
}

// On a port's own host the whole path is the app's: one that starts with
// // is sent back to this host, not (as //x alone would say) to host x.
func TestStripTokenKeepsTheHost(t *testing.T) {
	r := httptest.NewRequest("GET", "/", nil)
	r.URL.Path, r.URL.RawPath, r.URL.RawQuery = "//evil.example/x", "", "pandastack_token=pst_y"
	r.Host = "8000-sbx-abcdefghijklmnop.ports.example.test"
	r.Header.Set("Sec-Fetch-Mode", "navigate")
	r.Header.Set("Sec-Fetch-Dest", "document")
	rec := httptest.NewRecorder()
	if !(&Server{}).stripToken(rec, r) {
		t.Fatal("not redirected")
	}
	base, _ := url.Parse("https://8000-sbx-abcdefghijklmnop.ports.example.test//evil.example/x?pandastack_token=pst_y")
	loc, err := url.Parse(rec.Header().Get("Location"))
	if err != nil {
		t.Fatal(err)
	}
	if got := base.ResolveReference(loc); got.Host != base.Host || got.Scheme != "https" || got.EscapedPath() != "//evil.example/x" || got.RawQuery != "" {
		t.Errorf("Location %q resolves to %s, want this host's //evil.example/x", loc, got)
	}
}
