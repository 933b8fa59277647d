package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

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
	// A write to the caller's connection that found it gone: net/http has
	// ended the request's context, but the error is the write's.
	s.mux.HandleFunc("GET /test/pipe", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, fmt.Errorf("exec: %w", &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.EPIPE)}))
	})
	// The same kind of error with the caller still there came from
	// elsewhere (a sandbox's connection): a failure.
	s.mux.HandleFunc("GET /test/reset", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, fmt.Errorf("exec: %w", &net.OpError{Op: "read", Net: "unix", Err: os.NewSyscallError("read", syscall.ECONNRESET)}))
	})
	for _, path := range []string{"/test/silent", "/test/logged", "/test/caller", "/test/hangup", "/test/pipe", "/test/reset"} {
		rec := httptest.NewRecorder()
		ctx, cancel := context.WithCancel(context.Background())
		if path == "/test/hangup" || path == "/test/pipe" {
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
	if strings.Contains(log, "context canceled") || strings.Contains(log, "broken pipe") {
		t.Errorf("a caller that hung up was logged as a failure:\n%s", log)
	}
	if n := strings.Count(log, "connection reset by peer"); n != 1 {
		t.Errorf("a connection reset while the caller was there logged %d times:\n%s", n, log)
	}
}

// A caller that stops reading a stream (`pandastack sandbox exec ID -- yes
// | head -1`) is not logged as a failure of the server's: the handler's
// next write fails with EPIPE or ECONNRESET, not with the context's error.
func TestStreamReaderGoneIsNoFailure(t *testing.T) {
	var buf bytes.Buffer
	s := New(Config{}, nil, nil, nil, slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	wrote := make(chan error, 1)
	s.mux.HandleFunc("GET /test/stream", func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		chunk := bytes.Repeat([]byte("y\n"), 16<<10)
		var err error
		for err == nil {
			if _, err = w.Write(chunk); err == nil {
				err = rc.Flush()
			}
		}
		s.logFailure(r, fmt.Errorf("exec: %w", err)) // as the exec stream does
		wrote <- err
	})
	srv := httptest.NewServer(s.Handler())
	resp, err := http.Get(srv.URL + "/test/stream")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resp.Body.Read(make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // before its end: the connection is closed
	select {
	case err = <-wrote:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream's writes still succeed 10 s after its reader went away")
	}
	srv.Close() // the handler has returned, and logged all it will
	log := buf.String()
	if strings.Contains(log, "level=ERROR") || strings.Contains(log, "level=WARN") || !strings.Contains(log, "request ended by its caller") {
		t.Errorf("a reader that went away (the write said %v) was logged as:\n%s", err, log)
	}
}
