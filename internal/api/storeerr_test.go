package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/pandastack/pandastack"
)

// downStore is a store whose database is gone: every key lookup fails with
// a plain driver error, which its ClassifyError knows.
type downStore struct{ pandastack.Store }

var errDriver = errors.New("dial tcp 127.0.0.1:5432: connect: connection refused")

func (downStore) APIKeyByHash(context.Context, string) (pandastack.APIKey, error) {
	return pandastack.APIKey{}, errDriver
}

type classifyingStore struct{ downStore }

func (classifyingStore) ClassifyError(err error) error {
	if errors.Is(err, errDriver) {
		return errors.Join(pandastack.Errorf(pandastack.EUnavailable, "the server's database cannot be reached; retry"), err)
	}
	return err
}

// A store failure the store can name answers with its code (503 here);
// one it cannot, or a store without a classifier, stays a 500 with the
// generic message.
func TestStoreErrorsKeepTheirCode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		store  pandastack.Store
		status int
		code   string
	}{
		{"classified", classifyingStore{}, http.StatusServiceUnavailable, pandastack.EUnavailable},
		{"no classifier", downStore{}, http.StatusInternalServerError, pandastack.EInternal},
	} {
		s := New(Config{}, nil, tc.store, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
		req := httptest.NewRequest("GET", "/v1/sandboxes", nil)
		req.Header.Set("Authorization", "Bearer pds_0123456789abcdef")
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, req)
		var body errorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: %v: %s", tc.name, err, rec.Body)
		}
		if rec.Code != tc.status || body.Error.Code != tc.code {
			t.Errorf("%s: %d %+v, want %d %s", tc.name, rec.Code, body.Error, tc.status, tc.code)
		}
		if tc.code == pandastack.EInternal && body.Error.Message != "internal error; see the server log" {
			t.Errorf("%s: the driver's text reached the caller: %q", tc.name, body.Error.Message)
		}
	}
}

// insufficient_memory is a 503 that says when to try again; other errors
// say nothing of the kind.
func TestInsufficientMemoryHasRetryAfter(t *testing.T) {
	rec := httptest.NewRecorder()
	writeError(rec, pandastack.Errorf(pandastack.EMemory, "no room for a new sandbox"))
	var body errorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || rec.Code != http.StatusServiceUnavailable || body.Error.Code != pandastack.EMemory || rec.Header().Get("Retry-After") != "10" {
		t.Fatalf("got %d %q Retry-After %q (%v)", rec.Code, rec.Body.String(), rec.Header().Get("Retry-After"), err)
	}
	rec = httptest.NewRecorder()
	writeError(rec, pandastack.Errorf(pandastack.EUnavailable, "shutting down"))
	if rec.Header().Get("Retry-After") != "" {
		t.Fatalf("Retry-After on %s", rec.Body.String())
	}
}
