package api

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/metrics"
)

// Each request is counted under its route's pattern (never its path, whose
// ids would make a series per sandbox) and status, and an error answer
// under its code too.
func TestRequestMetrics(t *testing.T) {
	reg := metrics.New()
	s := New(Config{Metrics: reg}, nil, keyStore{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/sandboxes/sbx_a/stats?bogus=1"}, // 400 before the handler: the route is known
		{"GET", "/v1/sandboxes/sbx_b/stats?bogus=1"},
		{"GET", "/nothing/here"},
		{"DELETE", "/healthz"},
		{"GET", "/healthz"},
	} {
		req := httptest.NewRequest(r.method, r.path, nil)
		req.Header.Set("Authorization", "Bearer pds_0123456789abcdef")
		s.Handler().ServeHTTP(httptest.NewRecorder(), req)
	}
	var b strings.Builder
	reg.WriteTo(&b)
	text := b.String()
	for _, want := range []string{
		`pandastack_http_requests_total{route="GET /v1/sandboxes/{id}/stats",code="400"} 2`,
		`pandastack_http_requests_total{route="unmatched",code="404"} 1`,
		`pandastack_http_requests_total{route="unmatched",code="405"} 1`,
		`pandastack_http_requests_total{route="GET /healthz",code="200"} 1`,
		`pandastack_http_request_duration_seconds_count{route="GET /v1/sandboxes/{id}/stats"} 2`,
		`pandastack_api_errors_total{code="invalid_request"} 2`,
		`pandastack_api_errors_total{code="not_found"} 1`,
		`pandastack_api_errors_total{code="method_not_allowed"} 1`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("no %s in\n%s", want, text)
		}
	}
	if strings.Contains(text, "sbx_a") {
		t.Errorf("a sandbox id in a label:\n%s", text)
	}

	// Without a registry nothing is kept, and nothing fails.
	quiet := New(Config{}, nil, keyStore{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	rec := httptest.NewRecorder()
	quiet.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("healthz without metrics: %d", rec.Code)
	}
}
