package api

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// TestStalledUploadIsCut: an upload whose client sent part of its body and
// went quiet is abandoned once no bytes moved for fileIdle, with 504
// timeout: the handler's read of the body is cut, not only its context (it
// stayed blocked, and the sandbox busy, for as long as the client waited).
func TestStalledUploadIsCut(t *testing.T) {
	defer func(d time.Duration) { fileIdle = d }(fileIdle)
	fileIdle = 300 * time.Millisecond
	read := make(chan int, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, idle := newUploadGuard(w, r)
		defer idle.stop()
		n, err := io.Copy(io.Discard, idle.reader(r.Body))
		read <- int(n)
		writeError(w, fileError(ctx, err, "the upload (no data moved for a while)", fileIdle))
	}))
	defer srv.Close()

	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("PUT /files HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc"))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled upload: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(body), `"timeout"`) {
		t.Fatalf("stalled upload: %d %s, want 504 timeout", resp.StatusCode, body)
	}
	if n := <-read; n != 3 {
		t.Errorf("the handler read %d bytes, want the 3 sent", n)
	}
}

// TestHeldBackBodies: a client that announces a body and sends none no
// longer holds its connection: without a key it is answered 401 and the
// connection closed at once (the server waited forever to drain the body);
// with one, the handler's read ends at bodyReadTimeout with 400 (it waited
// forever). A body sent in full lifts the deadline, so a long answer after
// it is not cut.
func TestHeldBackBodies(t *testing.T) {
	defer func(d time.Duration) { bodyReadTimeout = d }(bodyReadTimeout)
	bodyReadTimeout = 300 * time.Millisecond
	s := New(Config{}, nil, keyStore{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	held := func(auth string) (string, error) {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write([]byte("POST /v1/api-keys HTTP/1.1\r\nHost: x\r\n" + auth + "Content-Length: 10\r\n\r\n{"))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return "", fmt.Errorf("no answer: %w", err)
		}
		body, _ := io.ReadAll(resp.Body)
		if _, err := br.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
			return "", fmt.Errorf("answered %d %s, and the connection stayed open", resp.StatusCode, body)
		}
		return fmt.Sprintf("%d %s", resp.StatusCode, body), nil
	}
	if got, err := held(""); err != nil || !strings.HasPrefix(got, "401 ") {
		t.Errorf("no key, body held back: %q %v, want 401 and the connection closed", got, err)
	}
	if got, err := held("Authorization: Bearer pds_0123456789abcdef\r\n"); err != nil || !strings.HasPrefix(got, "400 ") {
		t.Errorf("a key, body held back: %q %v, want 400 and the connection closed", got, err)
	}

	// A whole body lifts the deadline: the handler may answer much later.
	late := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body := withBodyDeadline(w, r.Body)
		io.ReadAll(body)
		time.Sleep(3 * bodyReadTimeout)
		if r.Context().Err() != nil {
			t.Error("the request was cancelled after its body arrived whole")
		}
		w.Write([]byte("late"))
	}))
	defer late.Close()
	resp, err := http.Post(late.URL, "text/plain", strings.NewReader("whole"))
	if err != nil {
		t.Fatalf("a long answer after a whole body: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "late" {
		t.Errorf("a long answer after a whole body: %q", b)
	}
}

// ctxKeyStore knows one key, and fails as a database would when the
// request's context is cancelled.
type ctxKeyStore struct{ keyStore }

func (s ctxKeyStore) APIKeyByHash(ctx context.Context, h string) (pandastack.APIKey, error) {
	if err := ctx.Err(); err != nil {
		return pandastack.APIKey{}, fmt.Errorf("API key by hash: %w", err)
	}
	return s.keyStore.APIKeyByHash(ctx, h)
}

// TestRefusalKeepsTheConnectionUsable: a 401 without a body leaves its
// keep-alive connection serving the next request. Cutting the read there
// (for a body nobody waits for) cancelled every later request on it: the
// e2e suite's client got 500s "context canceled" from then on.
func TestRefusalKeepsTheConnectionUsable(t *testing.T) {
	s := New(Config{}, nil, ctxKeyStore{}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	send := func(req string) (int, string) {
		t.Helper()
		c.Write([]byte(req))
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("no answer on the connection: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := send("GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n"); code != 401 {
		t.Fatalf("without a key: %d %s", code, body)
	}
	time.Sleep(50 * time.Millisecond) // the server's watch of the idle connection runs
	for i := range 3 {
		// Authenticated, then refused for the unknown parameter: 400.
		if code, body := send("GET /v1/sandboxes?bogus=1 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer pds_0123456789abcdef\r\n\r\n"); code != 400 {
			t.Fatalf("request %d after a 401 on the same connection: %d %s, want 400", i, code, body)
		}
	}
}

// A file route's parameters come from the query or from a JSON body, never
// half from each; ?user= goes with either.
func TestQueryOrBody(t *testing.T) {
	for _, c := range []struct {
		query, body string
		ok          bool
	}{
		{"path=a&to=b", "", true},
		{"", `{"path":"a","to":"b"}`, true},
		{"user=root", `{"path":"a","to":"b"}`, true},
		{"path=a&to=b", `{"to":"c"}`, false},
		{"to=b", `{"path":"a"}`, false},
		{"overwrite=true", `{"path":"a","to":"b"}`, false},
	} {
		r := httptest.NewRequest(http.MethodPost, "/v1/sandboxes/x/files/rename?"+c.query, strings.NewReader(c.body))
		var body struct {
			Path string `json:"path"`
			To   string `json:"to"`
		}
		err := queryOrBody(r, &body, func() bool { return body.Path != "" || body.To != "" })
		if (err == nil) != c.ok || (err != nil && !strings.Contains(err.Error(), "one or the other")) {
			t.Errorf("query %q, body %q: %v, want ok %v", c.query, c.body, err, c.ok)
		}
	}
}

// A route whose body is the whole request refuses an empty one, and
// decodes any other as decode does.
func TestDecodeRequired(t *testing.T) {
	for _, c := range []struct {
		body, want string
	}{
		{"", "body is required"},
		{" \r\n\t", "body is required"},
		{"null", "must be a JSON object"},
		{`{"x": 1}`, "unknown field"},
		{` {"a": "b"}`, ""},
		// The white space before the object counts toward the limit.
		{strings.Repeat(" ", maxJSONBody+1) + "{}", "larger than"},
	} {
		r := httptest.NewRequest(http.MethodPut, "/", strings.NewReader(c.body))
		var v struct {
			A string `json:"a"`
		}
		err := decodeRequired(r, &v, "{}")
		if c.want == "" && (err != nil || v.A != "b") || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("body %q: %+v %v, want %q", c.body, v, err, c.want)
		}
	}
}

// storeAnswering is a store whose GetSandbox fails with err (the rest is
// never called by /readyz).
type storeAnswering struct {
	pandastack.Store
	err error
}

func (s storeAnswering) GetSandbox(context.Context, string, string) (pandastack.Sandbox, error) {
	return pandastack.Sandbox{}, s.err
}

// /readyz is 503 while the store does not answer (every API request would
// fail), 200 when it does; /healthz says only that the process runs.
func TestReadyz(t *testing.T) {
	for _, c := range []struct {
		err  error
		want int
	}{
		{pandastack.Errorf(pandastack.ENotFound, "no sandbox"), http.StatusOK},
		{errors.New("dial tcp 10.0.0.5:5432: connection refused"), http.StatusServiceUnavailable},
	} {
		s := New(Config{}, nil, storeAnswering{err: c.err}, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
		rec := httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		if rec.Code != c.want || strings.Contains(rec.Body.String(), "10.0.0.5") {
			t.Errorf("store answering %v: %d %s, want %d and no detail of the store", c.err, rec.Code, rec.Body, c.want)
		}
		rec = httptest.NewRecorder()
		s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
		if rec.Code != http.StatusOK {
			t.Errorf("healthz with the store answering %v: %d", c.err, rec.Code)
		}
	}
}

// A download's guard is for a sandbox that stops sending, not for a client
// that reads slowly: it waits while a write to the client is under way,
// and gives up once the sandbox sends nothing for fileIdle after it.
func TestDownloadGuardWaitsForASlowClient(t *testing.T) {
	defer func(d time.Duration) { fileIdle = d }(fileIdle)
	fileIdle = 100 * time.Millisecond
	ctx, g := newIdleGuard(context.Background())
	defer g.stop()
	slowClient := writerFunc(func(p []byte) (int, error) {
		time.Sleep(3 * fileIdle)
		return len(p), nil
	})
	if _, err := g.writer(slowClient).Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if ctx.Err() != nil {
		t.Fatal("the guard gave the download up while its client was reading")
	}
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the guard no longer ends a download whose sandbox sends nothing")
	}
}
