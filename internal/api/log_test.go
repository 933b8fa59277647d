package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pandastack/pandastack"
)

// An internal error a handler answers without logging it is logged once
// the handler returns; one it logged itself is not logged twice; a
// caller's mistake is not logged at all.
func TestFailuresAreLoggedOnce(t *testing.T) {
	var buf bytes.Buffer
	s := New(Config{}, nil, nil, nil, slog.New(slog.NewTextHandler(&buf, nil)))
	s.mux.HandleFunc("GET /test/silent", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errors.New("resume sbx_a: runsc restore failed"))
	})
	s.mux.HandleFunc("GET /test/logged", func(w http.ResponseWriter, r *http.Request) {
		err := errors.New("already said")
		s.logFailure(r, err)
		writeError(w, err)
	})
	s.mux.HandleFunc("GET /test/caller", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, pandastack.Errorf(pandastack.EInvalid, "bad input"))
	})
	s.mux.HandleFunc("GET /test/hangup", func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		writeError(w, fmt.Errorf("exec: %w", r.Context().Err()))
	})
	for _, path := range []string{"/test/silent", "/test/logged", "/test/caller", "/test/hangup"} {
		rec := httptest.NewRecorder()
		ctx, cancel := context.WithCancel(context.Background())
		if path == "/test/hangup" {
			cancel() // the caller is gone
		}
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil).WithContext(ctx))
		cancel()
	}
	log := buf.String()
	if n := strings.Count(log, "runsc restore failed"); n != 1 {
		t.Errorf("a silent internal error logged %d times:\n%s", n, log)
	}
	if n := strings.Count(log, "already said"); n != 1 {
		t.Errorf("a logged internal error logged %d times:\n%s", n, log)
	}
	if strings.Contains(log, "bad input") {
		t.Errorf("a caller's mistake was logged as a failure:\n%s", log)
	}
	if strings.Contains(log, "context canceled") {
		t.Errorf("a caller that hung up was logged as a failure:\n%s", log)
	}
}
