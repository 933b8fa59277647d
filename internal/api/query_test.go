package api

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/pandastack/pandastack"
)

// keyStore knows one API key; anything past authentication panics (nil
// Store), which a refused request never reaches.
type keyStore struct{ pandastack.Store }

func (keyStore) APIKeyByHash(context.Context, string) (pandastack.APIKey, error) {
	return pandastack.APIKey{ID: "key_1", ProjectID: "prj_1", Prefix: "pds_0123"}, nil
}

// TestUnknownQueryRefused: on every route that checks no query of its own,
// a parameter openapi.json does not list is refused with invalid_request
// before anything else happens (they were ignored: ?sandbox_id= on the
// lineage looked like a filter and was not one).
func TestUnknownQueryRefused(t *testing.T) {
	s := New(Config{}, nil, keyStore{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	param := regexp.MustCompile(`\{[a-z]+(\.\.\.)?\}`)
	checked := 0
	for route, allowed := range routeQuery {
		method, path, _ := strings.Cut(route, " ")
		if selfCheckedQuery[route] || !strings.HasPrefix(path, "/v1/") || strings.Contains(path, "/ports/{port}/{path...}") || path == "/v1/openapi.json" {
			continue
		}
		url := param.ReplaceAllString(path, "x") + "?bogus=1"
		for name := range allowed {
			url += "&" + name + "=1"
		}
		req := httptest.NewRequest(method, url, nil)
		req.Header.Set("Authorization", "Bearer pds_0123456789abcdef")
		rec := httptest.NewRecorder()
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("%s: went past the query check (%v)", route, p)
				}
			}()
			s.Handler().ServeHTTP(rec, req)
		}()
		var body errorBody
		json.Unmarshal(rec.Body.Bytes(), &body)
		if rec.Code != http.StatusBadRequest || body.Error.Code != pandastack.EInvalid || !strings.Contains(body.Error.Message, `"bogus"`) {
			t.Errorf("%s ?bogus=1: %d %s, want 400 invalid_request naming it", route, rec.Code, rec.Body)
		}
		checked++
	}
	if checked < 30 {
		t.Fatalf("checked %d routes; the route table from openapi.json looks wrong", checked)
	}
	// A documented parameter alone passes the check (and reaches the
	// handler, which here has no manager).
	req := httptest.NewRequest("GET", "/v1/sandboxes/sbx_x/processes/1/output?follow=true", nil)
	req.Header.Set("Authorization", "Bearer pds_0123456789abcdef")
	if err := checkQuery(withPattern(s, req)); err != nil {
		t.Errorf("a documented parameter: %v", err)
	}
	// The port proxy passes any query on to the sandbox's server.
	for _, m := range []string{"GET", "POST", "DELETE"} {
		req = httptest.NewRequest(m, "/v1/sandboxes/sbx_x/ports/8000/a/b?a=1&q=x", nil)
		if err := checkQuery(withPattern(s, req)); err != nil || req.Pattern == "" {
			t.Errorf("%s through the port proxy (%q): %v", m, req.Pattern, err)
		}
	}
}

// withPattern returns r as the mux routes it, with its Pattern set.
func withPattern(s *Server, r *http.Request) *http.Request {
	_, pattern := s.mux.Handler(r)
	r.Pattern = pattern
	return r
}

// TestErrorShapesOutsideTheRoutes: the console's paths and wrong methods
// answer in the API's error shape too, and a 405 says what is allowed (the
// console answered plain text, POST / was a 404, and no 405 had Allow).
func TestErrorShapesOutsideTheRoutes(t *testing.T) {
	s := New(Config{}, nil, keyStore{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, c := range []struct {
		method, path string
		status       int
		code, allow  string
	}{
		{"GET", "/ui/nope.js", 404, pandastack.ENotFound, ""},
		{"GET", "/ui/", 404, pandastack.ENotFound, ""},
		{"POST", "/", 405, pandastack.EMethod, "GET, HEAD"},
		{"DELETE", "/ui/app.js", 405, pandastack.EMethod, "GET, HEAD"},
		{"PUT", "/v1/sandboxes", 405, pandastack.EMethod, "GET, HEAD, POST"},
		{"POST", "/v1/sandboxes/sbx_x/history", 405, pandastack.EMethod, "GET, HEAD"},
	} {
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(c.method, c.path, nil))
		var body errorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != c.status || body.Error.Code != c.code || rec.Header().Get("Allow") != c.allow {
			t.Errorf("%s %s: %d Allow %q %s, want %d %s Allow %q", c.method, c.path, rec.Code, rec.Header().Get("Allow"), rec.Body, c.status, c.code, c.allow)
		}
	}
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != 200 || !strings.Contains(rec.Header().Get("Content-Type"), "text/html") {
		t.Errorf("GET /: %d %s", rec.Code, rec.Header().Get("Content-Type"))
	}
}

// TestRepeatedFilterRefused: a list filter given twice is refused before
// the store is asked (the second value was silently dropped).
func TestRepeatedFilterRefused(t *testing.T) {
	s := New(Config{}, nil, keyStore{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, u := range []string{"/v1/sandboxes?metadata.x=y&metadata.x=z", "/v1/snapshots?metadata.x=y&metadata.x=z", "/v1/sandboxes?state=running&state=paused"} {
		req := httptest.NewRequest(http.MethodGet, u, nil)
		req.Header.Set("Authorization", "Bearer pds_0123456789abcdef")
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "give it once") {
			t.Errorf("GET %s: %d %s, want 400 saying to give it once", u, rec.Code, rec.Body.String())
		}
	}
}

// A query string Go's parser cannot read whole is refused, not read in
// part: the pairs it skips (a bad % escape, a ";") were dropped, and
// GET /v1/sandboxes?metadata.job=50% listed every sandbox of the project.
// So is a parameter given twice on a route that takes one (the first
// value won). The port proxy's query is the sandbox server's, whatever it
// holds.
func TestMalformedQueryRefused(t *testing.T) {
	s := New(Config{}, nil, keyStore{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, c := range []struct{ method, url, says string }{
		{"GET", "/v1/sandboxes?metadata.job=50%", `malformed query string: invalid URL escape "%"`},
		{"GET", "/v1/snapshots?metadata.tag=a%zz", "malformed query string"},
		{"GET", "/v1/lineage?sandbox_id=x;", "malformed query string: invalid semicolon separator"},
		{"GET", "/v1/sandboxes/sbx_x/processes/1/output?follow=true;", "malformed query string"},
		{"PUT", "/v1/sandboxes/sbx_x/files?path=/etc/app.conf&user=root%", "malformed query string"},
		{"GET", "/v1/sandboxes?" + strings.Repeat("a=1&", 10001), "malformed query string"},
		{"GET", "/v1/sandboxes/sbx_x/pty?cols=80&cols=200", `query parameter "cols" is given 2 times; give it once`},
		{"GET", "/v1/sandboxes/sbx_x/files?path=/a&path=/b", `query parameter "path" is given 2 times`},
	} {
		req := httptest.NewRequest(c.method, c.url, nil)
		req.Header.Set("Authorization", "Bearer pds_0123456789abcdef")
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		var body errorBody
		json.Unmarshal(rec.Body.Bytes(), &body)
		if rec.Code != http.StatusBadRequest || body.Error.Code != pandastack.EInvalid || !strings.Contains(body.Error.Message, c.says) {
			t.Errorf("%s %.80s: %d %s, want 400 invalid_request saying %q", c.method, c.url, rec.Code, rec.Body, c.says)
		}
	}
	for _, u := range []string{"/v1/sandboxes/sbx_x/ports/8000/app?q=50%&x=1;y=2&x=3", "/v1/sandboxes/sbx_x/ports/8000/?a=%zz"} {
		req := httptest.NewRequest("GET", u, nil)
		if err := checkQuery(withPattern(s, req)); err != nil {
			t.Errorf("the port proxy's %s: %v, want it passed on", u, err)
		}
	}
	// The host form ({port}-{id}.domain) and a method the mux does not
	// route reach the API key's check with no route's pattern.
	req := httptest.NewRequest("PROPFIND", "/search?tag=a&tag=b&q=50%;x", nil)
	if err := checkQuery(req); err != nil {
		t.Errorf("the port proxy's host form: %v, want its query passed on", err)
	}
}
