package api

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/sandbox"
	"github.com/pandastack/pandastack/internal/store/sqlite"
)

// forwarder is a Server with only what proxyTo uses: a manager that is
// node "node-x" (no store, runtime or templates: the proxy needs none).
func forwarder(t *testing.T) *Server {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	mgr := sandbox.New(sandbox.Config{Node: sandbox.NodeConfig{ID: "node-x"}}, nil, nil, nil, log)
	return &Server{mgr: mgr, log: log}
}

// serveProxied runs proxyTo for every request to a front server.
func serveProxied(t *testing.T, s *Server, target string, unreached func(http.ResponseWriter, *http.Request)) *httptest.Server {
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.proxyTo(w, r, target, unreached, true)
	}))
	t.Cleanup(front.Close)
	return front
}

// dialFront opens a raw connection to front, closed when the test ends.
func dialFront(t *testing.T, front *httptest.Server) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(front.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// A forwarded request keeps method, path, query, body, the caller's key
// and its Host, and says which node sent it; the answer comes back whole.
func TestProxyPassesRequest(t *testing.T) {
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		json.NewEncoder(w).Encode(map[string]string{
			"method": r.Method, "path": r.URL.RequestURI(), "body": string(body),
			"auth": r.Header.Get("Authorization"), "host": r.Host, "by": r.Header.Get(forwardedHeader),
		})
	}))
	defer owner.Close()
	front := serveProxied(t, forwarder(t), owner.URL, nil)
	// The query as sent, also what Go's parser would drop or reorder (a
	// port proxy's, which is the sandbox server's).
	req, _ := http.NewRequest("POST", front.URL+"/v1/sandboxes/sbx_a/exec?x=1&b=2;c&d=50%", strings.NewReader(`{"cmd":"true"}`))
	req.Header.Set("Authorization", "Bearer pds_secret")
	req.Host = "8080-sbxa.example.test"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got map[string]string
	json.NewDecoder(resp.Body).Decode(&got)
	want := map[string]string{"method": "POST", "path": "/v1/sandboxes/sbx_a/exec?x=1&b=2;c&d=50%", "body": `{"cmd":"true"}`,
		"auth": "Bearer pds_secret", "host": "8080-sbxa.example.test", "by": "node-x"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s at the owner = %q, want %q", k, got[k], v)
		}
	}
}

// NDJSON lines reach the caller as the owner writes them: the owner writes
// the second line only after the caller has read the first.
func TestProxyStreams(t *testing.T) {
	firstRead := make(chan struct{})
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"stdout","data":"1"}`+"\n")
		w.(http.Flusher).Flush()
		<-firstRead
		io.WriteString(w, `{"type":"exit"}`+"\n")
	}))
	defer owner.Close()
	front := serveProxied(t, forwarder(t), owner.URL, nil)
	resp, err := http.Get(front.URL + "/v1/sandboxes/sbx_a/exec")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || !strings.Contains(line, `"stdout"`) {
		t.Fatalf("first line %q, %v", line, err)
	}
	close(firstRead)
	if line, err = br.ReadString('\n'); err != nil || !strings.Contains(line, `"exit"`) {
		t.Fatalf("second line %q, %v", line, err)
	}
}

// The caller's body and the owner's answer pass each other: the owner
// answers a line before it has read the body, the caller sends its body
// only once that line has come through, and the owner echoes it. A proxy
// whose server drained and closed the caller's body on its first line of
// answer (net/http's default for HTTP/1) stalls here; worse, when the
// transport then reads that closed body, it drops its connection to the
// owner and the caller's stream breaks off ("unexpected EOF" in a
// streamed exec through another node, seen under load).
func TestProxyFullDuplex(t *testing.T) {
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, "first\n")
		w.(http.Flusher).Flush()
		body, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "body:%s %v\n", body, err)
	}))
	t.Cleanup(owner.Close) // after the connection's close: it may be what ends the owner's handler
	conn := dialFront(t, serveProxied(t, forwarder(t), owner.URL, nil))
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(conn, "POST /v1/sandboxes/sbx_a/exec HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("the owner's answer before the body was sent: %v", err)
	}
	defer resp.Body.Close()
	rd := bufio.NewReader(resp.Body)
	if line, err := rd.ReadString('\n'); err != nil || line != "first\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	io.WriteString(conn, `{"cmd":"true"}`)
	if line, err := rd.ReadString('\n'); err != nil || line != `body:{"cmd":"true"} <nil>`+"\n" {
		t.Fatalf("the owner read %q, %v", line, err)
	}
	if rest, err := io.ReadAll(rd); err != nil || len(rest) > 0 {
		t.Fatalf("after the echo: %q, %v", rest, err)
	}
}

// An upgrade (the terminal's and the port proxy's WebSockets) becomes one
// connection through to the owner, both ways.
func TestProxyUpgrades(t *testing.T) {
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "want an upgrade", http.StatusBadRequest)
			return
		}
		conn, rw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		rw.Flush()
		line, _ := rw.ReadString('\n')
		rw.WriteString("echo:" + line)
		rw.Flush()
	}))
	t.Cleanup(owner.Close) // after the connection's close: it may be what ends the owner's handler
	conn := dialFront(t, serveProxied(t, forwarder(t), owner.URL, nil))
	io.WriteString(conn, "GET /v1/sandboxes/sbx_a/pty HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade through the proxy: %v %v", resp, err)
	}
	io.WriteString(conn, "hello\n")
	if line, err := br.ReadString('\n'); err != nil || line != "echo:hello\n" {
		t.Fatalf("through the upgraded connection: %q %v", line, err)
	}
}

// A node that cannot be dialled: sandbox_unavailable, or the fallback
// (a create then runs on the node asked).
func TestProxyUnreachable(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	s := forwarder(t)
	resp, err := http.Get(serveProxied(t, s, dead, nil).URL + "/v1/sandboxes/sbx_a")
	if err != nil {
		t.Fatal(err)
	}
	var e errorBody
	json.NewDecoder(resp.Body).Decode(&e)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != "sandbox_unavailable" || !strings.Contains(e.Error.Message, "does not answer") {
		t.Errorf("proxy to a dead node: %d %+v", resp.StatusCode, e)
	}
	fell := false
	front := serveProxied(t, s, dead, func(w http.ResponseWriter, r *http.Request) {
		fell = true
		w.WriteHeader(http.StatusCreated)
	})
	resp, err = http.Post(front.URL+"/v1/sandboxes", "application/json", strings.NewReader("{}"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !fell || resp.StatusCode != http.StatusCreated {
		t.Errorf("fallback ran %v, status %d", fell, resp.StatusCode)
	}
}

// A request with a body that fails to reach its node (a dead node's
// sandbox_unavailable) leaves the caller's connection fit for the next
// request. In full duplex net/http drains an unread body after its last
// look for a background read, then panics on the connection's next
// request (golang/go#68560), which the caller saw as a reset.
func TestProxyFailureKeepsConnection(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := "http://" + ln.Addr().String()
	ln.Close()
	conn := dialFront(t, serveProxied(t, forwarder(t), dead, nil))
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	for i := range 3 {
		io.WriteString(conn, "POST /v1/sandboxes/sbx_a/exec HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n"+`{"cmd":"true"}`)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("request %d on one connection: %v", i+1, err)
		}
		var e errorBody
		json.NewDecoder(resp.Body).Decode(&e)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || e.Error.Code != "sandbox_unavailable" {
			t.Fatalf("request %d: %d %+v", i+1, resp.StatusCode, e)
		}
	}
}

// A placed create goes on a connection of its own, other requests on the
// kept-alive ones: a node that died since the last create then shows as a
// failed dial, and the create runs on the node asked instead of failing.
func TestProxyCreateOwnConnection(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]map[string]bool{} // path → the owner's peers
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if seen[r.URL.Path] == nil {
			seen[r.URL.Path] = map[string]bool{}
		}
		seen[r.URL.Path][r.RemoteAddr] = true
		mu.Unlock()
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(owner.Close)
	s := forwarder(t)
	creates := serveProxied(t, s, owner.URL, func(w http.ResponseWriter, r *http.Request) {
		t.Error("fell back with the owner up")
	})
	others := serveProxied(t, s, owner.URL, nil)
	for range 3 {
		for _, u := range []string{creates.URL + "/v1/sandboxes", others.URL + "/v1/sandboxes/sbx_a/exec"} {
			resp, err := http.Post(u, "application/json", strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n := len(seen["/v1/sandboxes"]); n != 3 {
		t.Errorf("3 creates came on %d connections, want 3", n)
	}
	if n := len(seen["/v1/sandboxes/sbx_a/exec"]); n != 1 {
		t.Errorf("3 execs came on %d connections, want 1 (kept alive)", n)
	}
}

// A request passed to a node that stalls (its process stopped: connections
// accepted, nothing answered, nothing cut) ends once that node is found
// lost: a plain request with 503 sandbox_unavailable saying so, a stream
// with that error event. Both waited for ever.
func TestProxyEndsWhenTheNodeIsLost(t *testing.T) {
	release := make(chan struct{})
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/stream" {
			w.Header().Set("Content-Type", "application/x-ndjson")
			io.WriteString(w, `{"type":"stdout","data":"1"}`+"\n")
			w.(http.Flusher).Flush()
		}
		<-release // stalled
	}))
	defer owner.Close()
	defer close(release)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	var mu sync.Mutex
	lost := false
	s := &Server{log: log, mgr: sandbox.New(sandbox.Config{Node: sandbox.NodeConfig{ID: "node-x", Heartbeat: 20 * time.Millisecond, Grace: time.Second}}, nil, nil, nil, log),
		nodeLost: func(url string) bool {
			mu.Lock()
			defer mu.Unlock()
			return lost && url == owner.URL
		}}
	front := serveProxied(t, s, owner.URL, nil)
	go func() {
		time.Sleep(300 * time.Millisecond)
		mu.Lock()
		lost = true
		mu.Unlock()
	}()
	resp, err := http.Post(front.URL+"/v1/sandboxes/sbx_a/exec", "application/json", strings.NewReader(`{"cmd":"true"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "was lost") {
		t.Errorf("a request to a stalled node found lost: %d %s", resp.StatusCode, body)
	}

	resp, err = http.Get(front.URL + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	all, _ := io.ReadAll(resp.Body)
	lines := strings.Split(strings.TrimSpace(string(all)), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], `"stdout"`) || !strings.Contains(lines[1], `"error"`) || !strings.Contains(lines[1], "was lost") {
		t.Errorf("a stream from a stalled node found lost: %q", all)
	}
	// A create placed there: its caller has no sandbox to look at.
	resp, err = http.Post(front.URL+"/v1/sandboxes", "application/json", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "create again") {
		t.Errorf("a create placed on a stalled node found lost: %d %s", resp.StatusCode, body)
	}
}

// A create placed on a node that has not built its template (a rollout
// node by node) is made by the node asked, which has it: nothing was made
// there. Any other refusal of the chosen node is the caller's answer.
func TestPlacedCreateOfATemplateNotBuiltThere(t *testing.T) {
	code := "template_not_built"
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		fmt.Fprintf(w, `{"error":{"code":%q,"message":"not here"}}`, code)
	}))
	defer owner.Close()
	fell := false
	front := serveProxied(t, forwarder(t), owner.URL, func(w http.ResponseWriter, r *http.Request) {
		fell = true // (placeCreate's fallback gives the local create the body again)
		w.WriteHeader(http.StatusCreated)
	})
	resp, err := http.Post(front.URL+"/v1/sandboxes", "application/json", strings.NewReader(`{"template":"t"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if !fell || resp.StatusCode != http.StatusCreated {
		t.Errorf("a create the chosen node has no build for: created here %v, status %d", fell, resp.StatusCode)
	}

	code, fell = "conflict", false
	resp, err = http.Post(front.URL+"/v1/sandboxes", "application/json", strings.NewReader(`{"template":"t"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if fell || resp.StatusCode != http.StatusConflict || !strings.Contains(string(b), `"conflict"`) {
		t.Errorf("another refusal of the chosen node: fell back %v, %d %s", fell, resp.StatusCode, b)
	}
}

// A terminal's WebSocket through this node whose owner's connection ends
// without a close frame (the node died) ends with one from this node,
// 1001 and why, as the owner's own shutdown closes it; one the owner
// closed properly gets nothing more.
func TestProxyEndsATerminalWithACloseFrame(t *testing.T) {
	for _, c := range []struct {
		name  string
		sends []byte
		want  []byte
	}{
		{"the owner dies", []byte{0x82, 2, 'h', 'i'}, append([]byte{0x82, 2, 'h', 'i', 0x88, byte(2 + len(wsNodeGone)), 0x03, 0xe9}, wsNodeGone...)},
		{"the owner closes", []byte{0x82, 2, 'h', 'i', 0x88, 2, 0x03, 0xe8}, []byte{0x82, 2, 'h', 'i', 0x88, 2, 0x03, 0xe8}},
	} {
		t.Run(c.name, func(t *testing.T) {
			owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				conn, rw, err := w.(http.Hijacker).Hijack()
				if err != nil {
					return
				}
				rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
				rw.Write(c.sends)
				rw.Flush()
				conn.Close() // no more: as a node that died
			}))
			t.Cleanup(owner.Close)
			conn := dialFront(t, serveProxied(t, forwarder(t), owner.URL, nil))
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(conn, "GET /v1/sandboxes/sbx_a/pty HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				t.Fatalf("upgrade through the proxy: %v %v", resp, err)
			}
			got, _ := io.ReadAll(br)
			if string(got) != string(c.want) {
				t.Errorf("the caller got %q, want %q", got, c.want)
			}
		})
	}
}

// A port has one path: /ports/8000/, not /ports/+8000/ or /ports/08000/,
// which reached port 8000 under paths its token's cookie is not scoped to.
// Those get the 400 any bad port gets, in the path form and the host form
// ({port}-{id}.PublicDomain) alike; a good port goes on to the key check.
func TestPortOnlyInItsOwnForm(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := New(Config{PublicDomain: "example.test"}, sandbox.New(sandbox.Config{}, nil, nil, nil, log), keyStore{}, nil, log)
	for _, tc := range []struct {
		port string
		want int
	}{
		{"8000", http.StatusUnauthorized},
		{"1", http.StatusUnauthorized},
		{"65535", http.StatusUnauthorized},
		{"+8000", http.StatusBadRequest},
		{"08000", http.StatusBadRequest},
		{"008000", http.StatusBadRequest},
		{"-8000", http.StatusBadRequest},
		{"0", http.StatusBadRequest},
		{"00", http.StatusBadRequest},
		{"65536", http.StatusBadRequest},
		{"0x1f40", http.StatusBadRequest},
	} {
		reqs := []*http.Request{httptest.NewRequest("GET", "/v1/sandboxes/sbx_aaaaaaaaaaaaaaaa/ports/"+tc.port+"/", nil)}
		if strings.Trim(tc.port, "0123456789") == "" && len(tc.port) <= 5 { // what a host label may hold
			host := httptest.NewRequest("GET", "/", nil)
			host.Host = tc.port + "-sbx-aaaaaaaaaaaaaaaa.example.test"
			reqs = append(reqs, host)
		}
		for _, req := range reqs {
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, req)
			var body errorBody
			json.Unmarshal(rec.Body.Bytes(), &body)
			if rec.Code != tc.want || tc.want == http.StatusBadRequest && (body.Error.Code != "invalid_request" || !strings.Contains(body.Error.Message, "port must be")) {
				t.Errorf("port %q (host %s, path %s): %d %s, want %d", tc.port, req.Host, req.URL.Path, rec.Code, rec.Body, tc.want)
			}
		}
	}
}

// What a node answers from the store when a sandbox's own node cannot be
// reached: its record and its history, nothing that needs the sandbox.
func TestStoreAnswers(t *testing.T) {
	for path, want := range map[string]bool{
		"/v1/sandboxes/sbx_a":          true,
		"/v1/sandboxes/sbx_a/history":  true,
		"/v1/sandboxes/sbx_a/files":    false,
		"/v1/sandboxes/sbx_a/stats":    false,
		"/v1/sandboxes/sbx_a/contexts": false,
		"/v1/snapshots/snap_a":         false,
	} {
		r := httptest.NewRequest(http.MethodGet, path, nil)
		if got := storeAnswers(r); got != want {
			t.Errorf("GET %s: %v, want %v", path, got, want)
		}
	}
	if storeAnswers(httptest.NewRequest(http.MethodDelete, "/v1/sandboxes/sbx_a", nil)) {
		t.Error("a DELETE answered from the store")
	}
}

// rwc is an io.ReadWriteCloser that reads r and swallows writes.
type rwc struct{ io.Reader }

func (rwc) Write(p []byte) (int, error) { return len(p), nil }
func (rwc) Close() error                { return nil }

// A terminal passed through this node whose key is revoked here ends with
// the owner's close for it, 1008 and why, not "the node stopped answering".
func TestProxiedTerminalOfARevokedKey(t *testing.T) {
	ctx, cancel := context.WithCancelCause(context.Background())
	cause := pandastack.Errorf(pandastack.EUnauthorized, "API key pds_x… was revoked")
	cancel(cause)
	tail := &wsTail{ReadWriteCloser: rwc{strings.NewReader("\x82\x02hi")}, ctx: ctx}
	got, _ := io.ReadAll(tail)
	want := append([]byte{0x82, 2, 'h', 'i', 0x88, byte(2 + len(pandastack.ErrorMessage(cause))), 0x03, 0xf0}, pandastack.ErrorMessage(cause)...)
	if string(got) != string(want) {
		t.Errorf("the caller got %q, want %q", got, want)
	}
}

// A request the owner refuses before its body (a 401 for a port proxy's
// caller without a valid token, a 400 for a bad port) ends here at once,
// though its caller announced a body it never sends: the body's read
// deadline, lifted for the owner to bound, would have let it hold this
// node's handler and connection for ever.
func TestRefusedForwardDoesNotWaitForTheBody(t *testing.T) {
	for _, status := range []int{http.StatusUnauthorized, http.StatusBadRequest} {
		// It answers at once, before the body, as the owner does once its
		// own deadline for the body passed, or for a body too large to
		// discard.
		owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", status, http.StatusText(status))
			buf.Flush()
			conn.Close()
		}))
		t.Cleanup(owner.Close)
		ended := make(chan struct{})
		s := forwarder(t)
		front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			defer close(ended)
			s.proxyTo(w, r, owner.URL, nil, false)
		}))
		t.Cleanup(front.Close) // after the connection's close (cleanups run last first)
		conn := dialFront(t, front)
		fmt.Fprintf(conn, "POST /v1/sandboxes/sbx_a/ports/80/?pandastack_token=pst_x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != status {
			t.Fatalf("status %d, want %d", resp.StatusCode, status)
		}
		select {
		case <-ended:
		case <-time.After(5 * time.Second):
			conn.Close()
			t.Fatalf("answered %d: the handler still waits for the body its caller never sends", status)
		}
	}
}

// hasCredential tells a port proxy's request with a key or a token, which
// its node may let in, from one with none, which it refuses: only the
// first gets its body's deadline lifted when passed on.
func TestHasCredential(t *testing.T) {
	for _, c := range []struct {
		name string
		mod  func(r *http.Request)
		want bool
	}{
		{"none", func(r *http.Request) {}, false},
		{"a key", func(r *http.Request) { r.Header.Set("Authorization", "Bearer pds_x") }, true},
		{"a key header", func(r *http.Request) { r.Header.Set("X-API-Key", "pds_x") }, true},
		{"a token in the query", func(r *http.Request) { r.URL.RawQuery = "pandastack_token=pst_x" }, true},
		{"the port's cookie", func(r *http.Request) { r.AddCookie(&http.Cookie{Name: portTokenCookie, Value: "pst_x"}) }, true},
		{"the port's __Host- cookie (HTTPS)", func(r *http.Request) {
			r.AddCookie(&http.Cookie{Name: hostCookiePrefix + portTokenCookie, Value: "pst_x"})
		}, true},
		{"another cookie", func(r *http.Request) { r.AddCookie(&http.Cookie{Name: "sid", Value: "1"}) }, false},
	} {
		r := httptest.NewRequest("POST", "/v1/sandboxes/sbx_a/ports/80/", nil)
		c.mod(r)
		if got := hasCredential(r); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// A port proxy's request that says it was forwarded, with no credential
// that checks out, about a sandbox that runs on another node gets the
// answer it gets about a sandbox that does not exist: a made-up token or
// key told it (503, "runs on another node") that the sandbox lives.
func TestForwardedPortRequestSaysNothingOfWhereASandboxRuns(t *testing.T) {
	ctx := t.Context()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now()
	if _, err := st.Heartbeat(ctx, pandastack.Node{ID: "node-y", URL: "http://node-y.invalid", StartedAt: now, HeartbeatAt: now, CPUs: 1, MemoryMB: 1024}); err != nil {
		t.Fatal(err)
	}
	far := pandastack.Sandbox{ID: "sbx_far", ProjectID: "prj_1", Template: "base", State: pandastack.StateRunning, CPU: 1, MemoryMB: 256,
		CreatedAt: now, ExpiresAt: now.Add(time.Hour), NodeID: "node-y"}
	if err := st.CreateSandbox(ctx, far); err != nil {
		t.Fatal(err)
	}
	const stranger = "pds_stranger0123456789"
	if err := st.CreateProject(ctx, pandastack.Project{ID: "prj_2", Name: "other", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateAPIKey(ctx, pandastack.APIKey{ID: "key_2", ProjectID: "prj_2", Name: "stranger", Prefix: stranger[:8], Hash: HashKey(stranger), CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	mgr := sandbox.New(sandbox.Config{Node: sandbox.NodeConfig{ID: "node-x", URL: "http://node-x.invalid"}}, st, nil, nil, log)
	if url, err := mgr.Remote(ctx, "", far.ID); err != nil || url != "http://node-y.invalid" {
		t.Fatalf("Remote(%s) = %q, %v: the test needs it on node-y", far.ID, url, err)
	}
	s := New(Config{}, mgr, st, nil, log)
	for _, c := range []struct {
		name string
		mod  func(r *http.Request)
	}{
		{"no credential", func(r *http.Request) {}},
		{"a made-up cookie", func(r *http.Request) { r.AddCookie(&http.Cookie{Name: portTokenCookie, Value: "pst_junk"}) }},
		{"a made-up token", func(r *http.Request) { r.URL.RawQuery = tokenParam + "=pst_junk" }},
		{"a made-up key", func(r *http.Request) { r.Header.Set("Authorization", "Bearer pds_junk") }},
		{"a made-up key header", func(r *http.Request) { r.Header.Set("X-API-Key", "pds_junk") }},
		{"another project's key", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+stranger) }},
	} {
		answer := func(id string) (int, string) {
			r := httptest.NewRequest("GET", "/v1/sandboxes/"+id+"/ports/80/", nil)
			r.Header.Set(forwardedHeader, "node-made-up")
			c.mod(r)
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, r)
			return rec.Code, strings.ReplaceAll(rec.Body.String(), id, "{id}")
		}
		farCode, farBody := answer(far.ID)
		noneCode, noneBody := answer("sbx_nonesuch")
		if farCode != noneCode || farBody != noneBody {
			t.Errorf("%s: another node's sandbox answers %d %s; one that does not exist %d %s", c.name, farCode, farBody, noneCode, noneBody)
		}
	}
	// A key of the sandbox's own project is told why this node does not
	// act on it: it is not handled here as if it ran here.
	const owner = "pds_owner0123456789"
	if err := st.CreateProject(ctx, pandastack.Project{ID: "prj_1", Name: "owner", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateAPIKey(ctx, pandastack.APIKey{ID: "key_1", ProjectID: "prj_1", Name: "owner", Prefix: owner[:8], Hash: HashKey(owner), CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("GET", "/v1/sandboxes/"+far.ID+"/ports/80/", nil)
	r.Header.Set(forwardedHeader, "node-made-up")
	r.Header.Set("Authorization", "Bearer "+owner)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, r)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "runs on another node") {
		t.Errorf("the sandbox's project's key: %d %s, want 503 saying it runs on another node", rec.Code, rec.Body)
	}
}
