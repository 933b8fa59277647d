package mcpserver_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image/png"
	"log/slog"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/mcpserver"
)

// testLogger logs through t.Log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// mcpSession is one MCP client session against an in-process
// mcpserver.Server over the in-memory transport.
type mcpSession struct {
	*mcp.ClientSession
	served chan error // Serve's result, once the session is over
}

func connect(t *testing.T, api *apiServer) *mcpSession {
	t.Helper()
	return connectWith(t, api, mcpserver.Config{})
}

// connectWith is connect with cfg (its Client and Log are filled in).
func connectWith(t *testing.T, api *apiServer, cfg mcpserver.Config) *mcpSession {
	t.Helper()
	cfg.Client = api.client()
	return serveSession(t, cfg)
}

// serveSession serves one session of an mcpserver.Server with cfg (its Log
// filled in) and connects to it.
func serveSession(t *testing.T, cfg mcpserver.Config) *mcpSession {
	t.Helper()
	cfg.Log = testLogger(t)
	srv := mcpserver.New(cfg)
	st, ct := mcp.NewInMemoryTransports()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), st) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "mcpserver-test", Version: "0"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	s := &mcpSession{ClientSession: cs, served: served}
	t.Cleanup(func() { s.end(t) })
	return s
}

// end closes the client side and waits until the server has finished the
// session (and so has killed its sandbox). Idempotent.
func (s *mcpSession) end(t *testing.T) {
	t.Helper()
	if s.served == nil {
		return
	}
	s.Close()
	select {
	case err := <-s.served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(time.Minute):
		t.Errorf("Serve did not return after the client closed")
	}
	s.served = nil
}

// call calls a tool and fails the test on a protocol error (not on isError).
func (s *mcpSession) call(t *testing.T, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := s.CallTool(context.Background(), &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s %v: %v", tool, args, err)
	}
	return res
}

// ok calls a tool and fails the test when the result has isError.
func (s *mcpSession) ok(t *testing.T, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res := s.call(t, tool, args)
	if res.IsError {
		t.Fatalf("%s %v: isError: %s", tool, args, textOf(res))
	}
	return res
}

// textOf joins a result's text blocks.
func textOf(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func imagesOf(res *mcp.CallToolResult) []*mcp.ImageContent {
	var out []*mcp.ImageContent
	for _, c := range res.Content {
		if ic, ok := c.(*mcp.ImageContent); ok {
			out = append(out, ic)
		}
	}
	return out
}

// sessionSandboxes lists the running sandboxes MCP sessions made for themselves.
func sessionSandboxes(t *testing.T, api *apiServer) []string {
	t.Helper()
	list, err := api.client().ListSandboxes(context.Background(), mcpserver.SessionMetadata, "running")
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, sb := range list {
		ids = append(ids, sb.ID)
	}
	return ids
}

// newSessionSandbox returns the one session sandbox in after that is not in before.
func newSessionSandbox(t *testing.T, before, after []string) string {
	t.Helper()
	var added []string
	for _, id := range after {
		if !slices.Contains(before, id) {
			added = append(added, id)
		}
	}
	if len(added) != 1 {
		t.Fatalf("want one new session sandbox, got %v (before %v)", added, before)
	}
	return added[0]
}

// assertStopped checks that a user no longer sees sandbox id running:
// GET answers 404 or state stopped, and the running list leaves it out.
func assertStopped(t *testing.T, api *apiServer, id string) {
	t.Helper()
	c := api.client()
	sb, err := c.GetSandbox(context.Background(), id)
	switch {
	case client.IsCode(err, "not_found"):
	case err != nil:
		t.Fatalf("get %s: %v", id, err)
	case sb.State != pandastack.StateStopped:
		t.Fatalf("sandbox %s is %s, want stopped or gone", id, sb.State)
	}
	list, err := c.ListSandboxes(context.Background(), nil, "running")
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range list {
		if sb.ID == id {
			t.Fatalf("sandbox %s still listed as running", id)
		}
	}
}

// A tool's error goes through Config.Explain before the client sees it
// (pandastack mcp's says what an unreachable server means), and is as the
// API client gave it without one. No server runs here: every call fails.
func TestToolErrorsExplained(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	explain := func(err error) error {
		var ue *url.Error
		if !errors.As(err, &ue) {
			return err
		}
		return fmt.Errorf("explained: %v", ue.Err)
	}
	calls := []*mcp.CallToolParams{
		{Name: "run_code", Arguments: map[string]any{"code": "1"}},
		{Name: "exec", Arguments: map[string]any{"cmd": "true", "sandbox_id": "sbx_x"}},
		{Name: "list_snapshots", Arguments: map[string]any{}},
		{Name: "create_sandbox", Arguments: map[string]any{}},
	}
	for _, withExplain := range []bool{true, false} {
		cfg := mcpserver.Config{Client: client.New(down, "pds_test")}
		if withExplain {
			cfg.Explain = explain
		}
		s := serveSession(t, cfg)
		for _, p := range calls {
			res := s.call(t, p.Name, p.Arguments.(map[string]any))
			txt := textOf(res)
			if !res.IsError || !strings.Contains(txt, "connection refused") || strings.HasPrefix(txt, "explained: ") != withExplain {
				t.Errorf("%s with the server down (Explain set: %v): isError %v, %q", p.Name, withExplain, res.IsError, txt)
			}
		}
		s.end(t)
	}
}

func TestTools(t *testing.T) {
	api := server(t)
	before := sessionSandboxes(t, api)
	s := connect(t, api)
	var sessionSandbox string

	t.Run("list tools", func(t *testing.T) {
		res, err := s.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tool := range res.Tools {
			names = append(names, tool.Name)
			if tool.Description == "" || tool.InputSchema == nil {
				t.Errorf("tool %s has no description or input schema", tool.Name)
			}
		}
		slices.Sort(names)
		want := []string{"create_sandbox", "delete_snapshot", "download_file", "exec", "kill_processes", "kill_sandbox", "list_snapshots", "run_code", "snapshot", "upload_file"}
		if !slices.Equal(names, want) {
			t.Fatalf("tools %v, want %v", names, want)
		}
	})

	t.Run("state persists in the session sandbox", func(t *testing.T) {
		if got := sessionSandboxes(t, api); len(got) != len(before) {
			t.Fatalf("a session sandbox exists before any call: %v", got)
		}
		s.ok(t, "run_code", map[string]any{"code": "x = 41"})
		sessionSandbox = newSessionSandbox(t, before, sessionSandboxes(t, api))
		res := s.ok(t, "run_code", map[string]any{"code": "x + 1"})
		if txt := textOf(res); !strings.Contains(txt, "42") {
			t.Fatalf("x + 1 gave %q", txt)
		}
		s.ok(t, "run_code", map[string]any{"code": "print('hello'); x * 2"})
		if got := newSessionSandbox(t, before, sessionSandboxes(t, api)); got != sessionSandbox {
			t.Fatalf("the session switched sandboxes: %s then %s", sessionSandbox, got)
		}
	})

	t.Run("stdout, stderr and result", func(t *testing.T) {
		res := s.ok(t, "run_code", map[string]any{"code": "import sys\nprint('out line')\nprint('err line', file=sys.stderr)\n'the' + ' value'"})
		txt := textOf(res)
		for _, want := range []string{"out line", "[stderr]\nerr line", "[result] 'the value'"} {
			if !strings.Contains(txt, want) {
				t.Errorf("text lacks %q:\n%s", want, txt)
			}
		}
	})

	t.Run("exception sets isError", func(t *testing.T) {
		res := s.call(t, "run_code", map[string]any{"code": "print('before')\n1 / 0"})
		txt := textOf(res)
		if !res.IsError {
			t.Fatalf("isError not set:\n%s", txt)
		}
		if !strings.HasPrefix(txt, "ERROR: ZeroDivisionError") || !strings.Contains(txt, "division by zero") || !strings.Contains(txt, "before") {
			t.Fatalf("text does not name the exception and keep stdout:\n%s", txt)
		}
		// The kernel lives on after an exception.
		if txt := textOf(s.ok(t, "run_code", map[string]any{"code": "x"})); !strings.Contains(txt, "41") {
			t.Fatalf("x after the exception: %q", txt)
		}
	})

	t.Run("timeout sets isError", func(t *testing.T) {
		res := s.call(t, "run_code", map[string]any{"code": "import time\ntime.sleep(30)", "timeout_seconds": 1})
		if txt := textOf(res); !res.IsError || !strings.Contains(txt, "TimeoutError") {
			t.Fatalf("isError %v:\n%s", res.IsError, txt)
		}
	})

	t.Run("parallel runs take turns", func(t *testing.T) {
		// Clients make parallel tool calls; both go to the session's one
		// context, which runs one cell at a time.
		var wg sync.WaitGroup
		res := make([]*mcp.CallToolResult, 2)
		for i, code := range []string{"import time\ntime.sleep(1)\n'first'", "'second'"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i == 1 {
					time.Sleep(200 * time.Millisecond) // while the first runs
				}
				res[i] = s.call(t, "run_code", map[string]any{"code": code})
			}()
		}
		wg.Wait()
		for i, want := range []string{"'first'", "'second'"} {
			if txt := textOf(res[i]); res[i].IsError || !strings.Contains(txt, want) {
				t.Errorf("run %d: isError %v:\n%s", i, res[i].IsError, txt)
			}
		}
	})

	t.Run("an HTML display gives its HTML", func(t *testing.T) {
		res := s.ok(t, "run_code", map[string]any{"code": "from IPython.display import HTML, display\ndisplay(HTML('<b>hi</b>'))"})
		if txt := textOf(res); !strings.Contains(txt, "[display] <b>hi</b>") {
			t.Fatalf("text:\n%s", txt)
		}
	})

	t.Run("chart comes back as a PNG image", func(t *testing.T) {
		res := s.ok(t, "run_code", map[string]any{"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()"})
		imgs := imagesOf(res)
		if len(imgs) != 1 {
			t.Fatalf("want 1 image block, got %d; text:\n%s", len(imgs), textOf(res))
		}
		if imgs[0].MIMEType != "image/png" {
			t.Fatalf("mime type %q", imgs[0].MIMEType)
		}
		cfg, err := png.DecodeConfig(bytes.NewReader(imgs[0].Data))
		if err != nil || cfg.Width < 100 || cfg.Height < 100 {
			t.Fatalf("image data is not a chart PNG: %v, %dx%d", err, cfg.Width, cfg.Height)
		}
		if !strings.Contains(textOf(res), "[chart] image/png") {
			t.Fatalf("text does not mention the chart:\n%s", textOf(res))
		}
		res = s.ok(t, "run_code", map[string]any{"code": "for i in range(2):\n    plt.figure(); plt.plot([i, 1]); plt.show()"})
		if n := len(imagesOf(res)); n != 2 {
			t.Fatalf("two charts gave %d image blocks", n)
		}
	})

	t.Run("exec", func(t *testing.T) {
		res := s.ok(t, "exec", map[string]any{"cmd": "echo hello from $(uname -s); echo warn >&2"})
		txt := textOf(res)
		if !strings.Contains(txt, "exit code 0") || !strings.Contains(txt, "hello from Linux") || !strings.Contains(txt, "[stderr]\nwarn") {
			t.Fatalf("exec text:\n%s", txt)
		}
		res = s.call(t, "exec", map[string]any{"cmd": "echo failing; exit 3"})
		if txt := textOf(res); !res.IsError || !strings.Contains(txt, "exit code 3") || !strings.Contains(txt, "failing") {
			t.Fatalf("exit 3: isError %v:\n%s", res.IsError, txt)
		}
	})

	t.Run("kill_processes ends what commands left, not the kernel", func(t *testing.T) {
		s.ok(t, "exec", map[string]any{"cmd": "setsid sleep 604 </dev/null >/dev/null 2>&1 &"})
		if txt := textOf(s.ok(t, "kill_processes", map[string]any{})); !regexp.MustCompile(`^killed [1-9][0-9]* process(es)?; the kernels and their variables are kept$`).MatchString(txt) {
			t.Fatalf("kill_processes: %q", txt)
		}
		if txt := textOf(s.ok(t, "exec", map[string]any{"cmd": `for p in /proc/[0-9]*; do tr '\0' ' ' < $p/cmdline; echo; done 2>/dev/null | grep -c '^sleep 604' || true`})); !strings.Contains(txt, "[stdout]\n0") {
			t.Fatalf("sleeps left: %q", txt)
		}
		if txt := textOf(s.ok(t, "run_code", map[string]any{"code": "x"})); !strings.Contains(txt, "41") {
			t.Fatalf("x after kill_processes: %q", txt)
		}
	})

	t.Run("upload and download", func(t *testing.T) {
		const body = "héllo\nwörld\n"
		s.ok(t, "upload_file", map[string]any{"path": "/tmp/mcp/notes.txt", "content": body})
		if got := textOf(s.ok(t, "download_file", map[string]any{"path": "/tmp/mcp/notes.txt"})); got != body {
			t.Fatalf("download gave %q, want %q", got, body)
		}
		// The kernel sees the file: tools share the session sandbox.
		if txt := textOf(s.ok(t, "run_code", map[string]any{"code": "open('/tmp/mcp/notes.txt').read().split()[1]"})); !strings.Contains(txt, "wörld") {
			t.Fatalf("kernel read %q", txt)
		}

		bin := make([]byte, 256)
		for i := range bin {
			bin[i] = byte(i)
		}
		b64 := "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3BxcnN0dXZ3eHl6e3x9fn+AgYKDhIWGh4iJiouMjY6PkJGSk5SVlpeYmZqbnJ2en6ChoqOkpaanqKmqq6ytrq+wsbKztLW2t7i5uru8vb6/wMHCw8TFxsfIycrLzM3Oz9DR0tPU1dbX2Nna29zd3t/g4eLj5OXm5+jp6uvs7e7v8PHy8/T19vf4+fr7/P3+/w=="
		s.ok(t, "upload_file", map[string]any{"path": "/tmp/mcp/bytes.bin", "content": b64, "base64": true})
		// Said to be base64 in an item of its own, then the data.
		res := s.ok(t, "download_file", map[string]any{"path": "/tmp/mcp/bytes.bin"})
		if len(res.Content) != 2 || !strings.HasPrefix(textOf(&mcp.CallToolResult{Content: res.Content[:1]}), "[base64 of the 256 bytes of /tmp/mcp/bytes.bin (binary") ||
			textOf(&mcp.CallToolResult{Content: res.Content[1:]}) != b64 {
			t.Fatalf("binary download gave %q", textOf(res))
		}
		if txt := textOf(s.ok(t, "exec", map[string]any{"cmd": "wc -c < /tmp/mcp/bytes.bin"})); !strings.Contains(txt, "256") {
			t.Fatalf("uploaded size: %s", txt)
		}
		res = s.call(t, "download_file", map[string]any{"path": "/tmp/mcp/missing.txt"})
		if !res.IsError || !strings.Contains(textOf(res), "not_found") {
			t.Fatalf("missing file: isError %v: %s", res.IsError, textOf(res))
		}
		if got := newSessionSandbox(t, before, sessionSandboxes(t, api)); got != sessionSandbox {
			t.Fatalf("a missing file cost the session its sandbox: %s then %s", sessionSandbox, got)
		}
	})

	t.Run("snapshot and restore", func(t *testing.T) {
		res := s.ok(t, "snapshot", map[string]any{"metadata": map[string]string{"test": "mcp"}})
		snap := textOf(res)
		if !strings.HasPrefix(snap, "snap_") {
			t.Fatalf("snapshot gave %q", snap)
		}
		t.Cleanup(func() { api.client().DeleteSnapshot(context.Background(), snap) })
		// Restored with a network policy of its own, which replaces the
		// snapshot's (the session's sandbox has the server's default).
		res = s.ok(t, "create_sandbox", map[string]any{"snapshot_id": snap, "ttl_seconds": 300, "internet": false, "allow_out": []string{"api.example.com"}})
		restored := textOf(res)
		if txt := textOf(s.ok(t, "run_code", map[string]any{"code": "x", "sandbox_id": restored})); !strings.Contains(txt, "41") {
			t.Fatalf("x in the restored sandbox: %q", txt)
		}
		if sb, err := api.client().GetSandbox(context.Background(), restored); err != nil || sb.Network == nil || sb.Network.AllowInternetAccess || strings.Join(sb.Network.AllowOut, " ") != "api.example.com" {
			t.Errorf("network of the restored sandbox: %+v (%v), want no internet but api.example.com", sb, err)
		}
		s.ok(t, "kill_sandbox", map[string]any{"sandbox_id": restored})
		assertStopped(t, api, restored)

		// Listed (by its metadata), newest first, then deleted.
		later := textOf(s.ok(t, "snapshot", map[string]any{"metadata": map[string]string{"test": "mcp"}}))
		t.Cleanup(func() { api.client().DeleteSnapshot(context.Background(), later) })
		txt := textOf(s.ok(t, "list_snapshots", map[string]any{"metadata": map[string]string{"test": "mcp"}}))
		if !strings.HasPrefix(txt, "2 snapshot(s)") || !strings.Contains(txt, "test=mcp") || strings.Index(txt, later) < 0 || strings.Index(txt, later) > strings.Index(txt, snap) {
			t.Fatalf("list_snapshots: %q, want %s then %s", txt, later, snap)
		}
		s.ok(t, "delete_snapshot", map[string]any{"snapshot_id": later})
		if txt := textOf(s.ok(t, "list_snapshots", map[string]any{"metadata": map[string]string{"test": "other"}})); !strings.HasPrefix(txt, "0 snapshot(s)") {
			t.Fatalf("list_snapshots of other metadata: %q", txt)
		}
		s.ok(t, "delete_snapshot", map[string]any{"snapshot_id": snap})
		if _, err := api.client().GetSnapshot(context.Background(), snap); !client.IsCode(err, "not_found") {
			t.Fatalf("the snapshot after delete_snapshot: %v", err)
		}
		if res := s.call(t, "delete_snapshot", map[string]any{"snapshot_id": snap}); !res.IsError || !strings.Contains(textOf(res), "not_found") {
			t.Fatalf("deleting it again: isError %v: %s", res.IsError, textOf(res))
		}
	})

	t.Run("create_sandbox gives a separate sandbox", func(t *testing.T) {
		res := s.ok(t, "create_sandbox", map[string]any{"ttl_seconds": 300, "metadata": map[string]string{"who": "mcp-test"}})
		id := textOf(res)
		sb, err := api.client().GetSandbox(context.Background(), id)
		if err != nil {
			t.Fatalf("get %q: %v", id, err)
		}
		if sb.Template != "code-interpreter" || sb.Metadata["who"] != "mcp-test" {
			t.Fatalf("created %+v", sb)
		}
		res = s.call(t, "run_code", map[string]any{"code": "x", "sandbox_id": id})
		if !res.IsError || !strings.Contains(textOf(res), "NameError") {
			t.Fatalf("x in a new sandbox: %s", textOf(res))
		}
		if txt := textOf(s.ok(t, "exec", map[string]any{"cmd": "test -e /tmp/mcp/notes.txt && echo shared || echo separate", "sandbox_id": id})); !strings.Contains(txt, "separate") {
			t.Fatalf("files leak between sandboxes: %s", txt)
		}
		s.ok(t, "kill_sandbox", map[string]any{"sandbox_id": id})
		assertStopped(t, api, id)
	})

	t.Run("create_sandbox with a network policy", func(t *testing.T) {
		res := s.ok(t, "create_sandbox", map[string]any{"ttl_seconds": 300, "internet": false, "allow_out": []string{"198.51.100.0/24", "api.example.com"}})
		id := textOf(res)
		sb, err := api.client().GetSandbox(context.Background(), id)
		if err != nil {
			t.Fatalf("get %q: %v", id, err)
		}
		if sb.Network == nil || sb.Network.AllowInternetAccess || strings.Join(sb.Network.AllowOut, " ") != "198.51.100.0/24 api.example.com" {
			t.Errorf("network of the created sandbox: %+v", sb.Network)
		}
		s.ok(t, "kill_sandbox", map[string]any{"sandbox_id": id})
		assertStopped(t, api, id)
		// allow_out alone: only those, no internet (as in the API).
		id = textOf(s.ok(t, "create_sandbox", map[string]any{"ttl_seconds": 300, "allow_out": []string{"api.example.com"}}))
		if sb, err := api.client().GetSandbox(context.Background(), id); err != nil || sb.Network == nil || sb.Network.AllowInternetAccess {
			t.Errorf("allow_out alone gave %+v (%v)", sb, err)
		}
		s.ok(t, "kill_sandbox", map[string]any{"sandbox_id": id})
		if res := s.call(t, "create_sandbox", map[string]any{"allow_out": []string{"10.0.0.1"}}); !res.IsError || !strings.Contains(textOf(res), "allow_out[0]") {
			t.Errorf("allow_out into the platform deny set: %s", textOf(res))
		}
	})

	t.Run("session sandbox is killed when the client closes", func(t *testing.T) {
		s.end(t)
		assertStopped(t, api, sessionSandbox)
	})
}

// A session whose sandbox was killed from elsewhere says so once, then
// carries on in a new one.
func TestSessionSandboxReplaced(t *testing.T) {
	api := server(t)
	before := sessionSandboxes(t, api)
	s := connect(t, api)
	s.ok(t, "run_code", map[string]any{"code": "y = 1"})
	first := newSessionSandbox(t, before, sessionSandboxes(t, api))
	if err := api.client().KillSandbox(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	res := s.call(t, "run_code", map[string]any{"code": "y"})
	if txt := textOf(res); !res.IsError || !strings.Contains(txt, "state is lost") {
		t.Fatalf("run on a killed session sandbox: isError %v: %s", res.IsError, txt)
	}
	res = s.call(t, "run_code", map[string]any{"code": "y"})
	if txt := textOf(res); !res.IsError || !strings.Contains(txt, "NameError") {
		t.Fatalf("y in the new sandbox: %s", txt)
	}
	second := newSessionSandbox(t, before, sessionSandboxes(t, api))
	if second == first {
		t.Fatal("no new sandbox")
	}
	// kill_sandbox without an id ends the session sandbox too.
	s.ok(t, "kill_sandbox", nil)
	assertStopped(t, api, second)
	if got := sessionSandboxes(t, api); len(got) != len(before) {
		t.Fatalf("session sandboxes after kill_sandbox: %v", got)
	}
	// kill_sandbox of a session sandbox gone already is done, not an
	// error, and the next call starts a new one without a word of lost state.
	s.ok(t, "run_code", map[string]any{"code": "z = 1"})
	third := newSessionSandbox(t, before, sessionSandboxes(t, api))
	if err := api.client().KillSandbox(context.Background(), third); err != nil {
		t.Fatal(err)
	}
	if txt := textOf(s.ok(t, "kill_sandbox", nil)); !strings.Contains(txt, "already gone") {
		t.Fatalf("kill_sandbox of a sandbox gone already: %s", txt)
	}
	if txt := textOf(s.ok(t, "run_code", map[string]any{"code": "6*7"})); !strings.Contains(txt, "42") || strings.Contains(txt, "lost") {
		t.Fatalf("the call after: %s", txt)
	}
	s.end(t)
}

// A session TTL shorter than the minute between expiry pushes still keeps
// the sandbox in use alive: calls 1.5 s apart over twice an 8 s TTL run in
// one sandbox with its state (the sandbox expired between calls), and so
// does one call longer than the TTL (it expired halfway).
func TestShortSessionTTL(t *testing.T) {
	api := server(t)
	before := sessionSandboxes(t, api)
	s := connectWith(t, api, mcpserver.Config{SessionTTL: 8 * time.Second})
	s.ok(t, "run_code", map[string]any{"code": "n = 0"})
	first := newSessionSandbox(t, before, sessionSandboxes(t, api))
	for i := 1; i <= 11; i++ {
		time.Sleep(1500 * time.Millisecond)
		res := s.ok(t, "run_code", map[string]any{"code": "n += 1; n"})
		if txt := textOf(res); !strings.Contains(txt, fmt.Sprintf("[result] %d", i)) || strings.Contains(txt, "[note]") {
			t.Fatalf("call %d, %.1f s into an 8 s TTL: %s", i, float64(i)*1.5, txt)
		}
	}
	// One call longer than the TTL keeps it too.
	res := s.ok(t, "run_code", map[string]any{"code": "import time; time.sleep(14); n += 1; n"})
	if txt := textOf(res); !strings.Contains(txt, "[result] 12") {
		t.Fatalf("a 14 s call under an 8 s TTL: %s", txt)
	}
	if got := newSessionSandbox(t, before, sessionSandboxes(t, api)); got != first {
		t.Fatalf("the session moved from %s to %s", first, got)
	}
	s.end(t)
}

// startStdio starts the real `pandastack mcp` against api, as an MCP
// client such as Claude Desktop runs it, and connects to it over stdio;
// stderr collects what it logs.
func startStdio(t *testing.T, api *apiServer) (*exec.Cmd, *mcp.ClientSession, *syncBuffer) {
	t.Helper()
	stderr := &syncBuffer{}
	cmd := exec.Command(filepath.Join(api.bin, "pandastack"), "mcp")
	cmd.Env = append(os.Environ(), "PANDASTACK_API="+api.url, "PANDASTACK_API_KEY="+api.key)
	cmd.Stderr = stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "stdio-test", Version: "0"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd, TerminateDuration: 30 * time.Second}, nil)
	if err != nil {
		t.Fatalf("initialize: %v\n%s", err, stderr.String())
	}
	return cmd, cs, stderr
}

// The real binary over stdio, as an MCP client such as Claude Desktop runs it.
func TestStdioBinary(t *testing.T) {
	api := server(t)
	before := sessionSandboxes(t, api)
	cmd, cs, stderr := startStdio(t, api)
	if name := cs.InitializeResult().ServerInfo.Name; name != "pandastack" {
		t.Errorf("server name %q", name)
	}
	tools, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatalf("tools/list: %v\n%s", err, stderr.String())
	}
	if len(tools.Tools) != 10 {
		t.Errorf("%d tools", len(tools.Tools))
	}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"code": "print(6 * 7)"}})
	if err != nil {
		t.Fatalf("run_code: %v\n%s", err, stderr.String())
	}
	if txt := textOf(res); res.IsError || txt != "42" {
		t.Fatalf("run_code: isError %v, text %q", res.IsError, txt)
	}
	id := newSessionSandbox(t, before, sessionSandboxes(t, api))
	// Closing stdin ends the session; the process kills its sandbox and exits 0.
	if err := cs.Close(); err != nil {
		t.Errorf("close: %v\n%s", err, stderr.String())
	}
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Errorf("pandastack mcp exited with %v\n%s", cmd.ProcessState, stderr.String())
	}
	assertStopped(t, api, id)
}

// A key or a template that cannot work stops `pandastack mcp` at its start,
// where the MCP client shows it, rather than failing every tool call.
func TestStdioBinaryRefusesBadSettings(t *testing.T) {
	api := server(t)
	for _, c := range []struct {
		args []string
		key  string
		want string
	}{
		{[]string{"mcp", "--template", "nope"}, api.key, "--template nope: the server has no such template built"},
		{[]string{"mcp"}, "pds_notakey", "unauthorized (401)"},
	} {
		cmd := exec.Command(filepath.Join(api.bin, "pandastack"), c.args...)
		cmd.Env = append(os.Environ(), "PANDASTACK_API="+api.url, "PANDASTACK_API_KEY="+c.key)
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%v with key %.8s…: %v %q, want it to stop saying %q", c.args, c.key, err, out, c.want)
		}
	}
}

// SIGTERM ends `pandastack mcp` cleanly, session sandbox included, even
// while the client keeps stdin open.
func TestStdioBinarySignal(t *testing.T) {
	api := server(t)
	before := sessionSandboxes(t, api)
	cmd, cs, stderr := startStdio(t, api)
	defer cs.Close()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"cmd": "true"}})
	if err != nil || res.IsError {
		t.Fatalf("exec: %v %s\n%s", err, textOf(res), stderr.String())
	}
	id := newSessionSandbox(t, before, sessionSandboxes(t, api))
	// A call in flight does not hold the exit up: the session's sandbox is
	// killed, and the process exits, at once (it waited for the call, so a
	// client's SIGKILL a few seconds later left the sandbox running).
	go cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"code": "import time; time.sleep(120)"}})
	time.Sleep(2 * time.Second)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cs.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("pandastack mcp did not exit on SIGTERM with a call in flight\n%s", stderr.String())
	}
	assertStopped(t, api, id)
}

// SIGHUP (the terminal of the client that started `pandastack mcp` closed)
// ends it as SIGTERM does: the session's sandbox is killed, not left
// running to its TTL.
func TestStdioBinaryHangup(t *testing.T) {
	api := server(t)
	// Under nohup this process ignores SIGHUP, and so would the one it
	// starts (which then rightly keeps running): caught here instead, the
	// signal is at its default in the child.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	before := sessionSandboxes(t, api)
	cmd, cs, stderr := startStdio(t, api)
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"cmd": "true"}})
	if err != nil || res.IsError {
		t.Fatalf("exec: %v %s\n%s", err, textOf(res), stderr.String())
	}
	id := newSessionSandbox(t, before, sessionSandboxes(t, api))
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	cs.Wait()
	cs.Close()
	if cmd.ProcessState == nil || !cmd.ProcessState.Success() {
		t.Errorf("pandastack mcp ended %v on SIGHUP, want a clean exit\n%s", cmd.ProcessState, stderr.String())
	}
	assertStopped(t, api, id)
}
