package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/network/nettest"
	"github.com/pandastack/pandastack/internal/paths"
	"github.com/pandastack/pandastack/internal/testutil"
)

func TestExec(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	before := time.Now()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Metadata: map[string]string{"test": "exec"}})
	after := time.Now()
	if sb.State != "running" || !strings.HasPrefix(sb.ID, "sbx_") || sb.Template != "base" {
		t.Fatalf("created sandbox = %+v", sb)
	}
	// The expiry is stamped during the create, however long it took.
	if sb.ExpiresAt.Before(before.Add(299*time.Second)) || sb.ExpiresAt.After(after.Add(301*time.Second)) {
		t.Errorf("default TTL: expires at %s, want 300 s after the create (between %s and %s)", sb.ExpiresAt, before, after)
	}

	t.Run("echo", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo hello from $(whoami) in $(pwd)"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != "hello from user in /home/user\n" || res.ExitCode != 0 || res.TimedOut {
			t.Fatalf("exec = %+v", res)
		}
	})
	t.Run("failing command", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo oops >&2; exit 3"})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 3 || res.Stderr != "oops\n" {
			t.Fatalf("exec = %+v", res)
		}
	})
	t.Run("command not found in a shell", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "no-such-program"})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 127 || !strings.Contains(res.Stderr, "not found") {
			t.Fatalf("exec = %+v", res)
		}
	})
	t.Run("argv not found", func(t *testing.T) {
		_, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"no-such-program", "x"}})
		if !client.IsCode(err, "command_not_found") || !strings.Contains(err.Error(), "no-such-program") {
			t.Fatalf("err = %v, want command_not_found naming the program", err)
		}
	})
	t.Run("env and cwd", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{
			Argv: []string{"sh", "-c", `echo "$GREETING"; pwd`}, Env: map[string]string{"GREETING": "hi there"}, Cwd: "/tmp",
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != "hi there\n/tmp\n" {
			t.Fatalf("stdout = %q", res.Stdout)
		}
	})
	t.Run("stdin", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "tr a-z A-Z", Stdin: "shout\n"})
		if err != nil || res.Stdout != "SHOUT\n" {
			t.Fatalf("exec = %+v, %v", res, err)
		}
	})
	t.Run("user is not root and cannot see the host", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "id -u; id -un; test -e /work && echo HOST-VISIBLE; ls /.pandastack"})
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != "1000\nuser\nagent\n" {
			t.Fatalf("stdout = %q", res.Stdout)
		}
	})
	t.Run("no network", func(t *testing.T) {
		// A sandbox created with network none cannot reach a server (one
		// the test runs in a namespace of its own: nothing leaves the
		// machine) that a sandbox with the internet reaches.
		up := nettest.StartUpstream(t, "ex", 62, 62)
		none := newSandbox(t, s, client.CreateSandboxRequest{Network: &client.NetworkPolicy{AllowOut: []string{}, DenyOut: []string{}}})
		if got := fetch(t, s, sb.ID, up.PublicIP.String()); got != "upstream e2e.test" {
			t.Fatalf("a sandbox with the internet → test server: %q", got)
		}
		res, err := c.Exec(ctx, none.ID, client.ExecRequest{Cmd: `python3 -c "
import socket, sys
s = socket.socket()
s.settimeout(3)
try:
    s.connect((sys.argv[1], 80)); print('CONNECTED')
except OSError as e:
    print('refused', e)
" ` + up.PublicIP.String()})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(res.Stdout, "CONNECTED") || !strings.Contains(res.Stdout, "refused") {
			t.Fatalf("network reachable? %+v", res)
		}
	})
	t.Run("timeout kills the whole tree", func(t *testing.T) {
		start := time.Now()
		// Also a daemon that left the tree: setsid and a double fork.
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "(setsid sleep 62 &); sleep 60 & sleep 61; echo never", TimeoutSeconds: 1})
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		// Far sooner than the 60 s of the sleeps, even on a loaded host.
		if !res.TimedOut || took > 30*time.Second || strings.Contains(res.Stdout, "never") {
			t.Fatalf("exec = %+v after %s, want timed out after about 1 s", res, took)
		}
		ps, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "ps -eo args"})
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(ps.Stdout, "sleep 6") {
			t.Fatalf("sleeps survived the timeout:\n%s", ps.Stdout)
		}
	})
	t.Run("timeout stops a fork bomb", func(t *testing.T) {
		// Each of its shells forks two more and ends, until the user's
		// process limit makes forks fail; the survivors keep trying.
		// Before the group was stopped in rounds, the scans for the tree
		// ran beside it and a 3 s timeout took minutes.
		start := time.Now()
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "f() { f | f & }; f 2>/dev/null; sleep 100", TimeoutSeconds: 3})
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if !res.TimedOut || took > 60*time.Second {
			t.Fatalf("exec = %+v after %s, want timed out after about 3 s", res, took)
		}
		ps, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "ps -u user -o args="})
		if err != nil {
			t.Fatal(err)
		}
		if ps.ExitCode != 0 || strings.TrimSpace(ps.Stdout) != "ps -u user -o args=" {
			t.Fatalf("after the bomb the user runs:\n%s%s", ps.Stdout, ps.Stderr)
		}
	})
	t.Run("timeout stops a fork bomb that leaves its group", func(t *testing.T) {
		// Each shell starts two more in sessions of their own (setsid)
		// and ends: only the mark finds them, and they churn too fast
		// for their environs to be read while they run (a 3 s timeout
		// took 4-6 minutes). Another command of the user, stopped with
		// everything of the user while the bomb's processes are read and
		// killed, goes on after and ends as it would have.
		other := make(chan *client.ExecResult, 1)
		go func() {
			res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "sleep 10; echo alive", TimeoutSeconds: 120})
			if err != nil {
				t.Error(err)
			}
			other <- res
		}()
		start := time.Now()
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{
			Cmd:            `export BOMB='setsid sh -c "$BOMB" 2>/dev/null & setsid sh -c "$BOMB" 2>/dev/null &'; sh -c "$BOMB"; sleep 100`,
			TimeoutSeconds: 3,
		})
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		if !res.TimedOut || took > 60*time.Second {
			t.Fatalf("exec = %+v after %s, want timed out after about 3 s", res, took)
		}
		if o := <-other; o == nil || o.ExitCode != 0 || o.Stdout != "alive\n" {
			t.Fatalf("the other command: %+v, want it to end as it would have", o)
		}
		ps, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "ps -u user -o stat=,args="})
		if err != nil {
			t.Fatal(err)
		}
		if ps.ExitCode != 0 || !regexp.MustCompile(`^\S+ +ps -u user -o stat=,args=\n$`).MatchString(ps.Stdout) {
			t.Fatalf("after the bomb the user runs:\n%s%s", ps.Stdout, ps.Stderr)
		}
	})
	t.Run("streaming", func(t *testing.T) {
		start := time.Now()
		var firstAt time.Duration
		var chunks []string
		res, err := c.ExecStream(ctx, sb.ID, client.ExecRequest{Cmd: "for i in 1 2 3; do echo line$i; sleep 0.4; done"}, func(ev client.ExecEvent) {
			if ev.Type == "stdout" {
				if firstAt == 0 {
					firstAt = time.Since(start)
				}
				chunks = append(chunks, ev.Data)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		if res.Stdout != "line1\nline2\nline3\n" || len(chunks) < 2 {
			t.Fatalf("stream = %q in %d chunks", res.Stdout, len(chunks))
		}
		if total := time.Since(start); firstAt > total-600*time.Millisecond {
			t.Fatalf("first chunk came at %s of %s: not streamed", firstAt, total)
		}
		// Characters split between the stream's events come whole.
		res, err = c.ExecStream(ctx, sb.ID, client.ExecRequest{Cmd: "yes é | head -n 300000"}, func(client.ExecEvent) {})
		if err != nil || res.Stdout != strings.Repeat("é\n", 300000) {
			t.Fatalf("streamed UTF-8: %v, %d bytes, %d U+FFFD", err, len(res.Stdout), strings.Count(res.Stdout, "\uFFFD"))
		}
	})
	t.Run("huge output is capped", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "head -c 1000000000 /dev/zero | tr '\\0' x; echo done >&2", TimeoutSeconds: 300})
		if err != nil {
			t.Fatal(err)
		}
		if !res.StdoutTruncated || len(res.Stdout) > 5<<20 || !strings.Contains(res.Stdout, "output truncated") || res.Stderr != "done\n" {
			t.Fatalf("1 GB output: truncated=%v len=%d stderr=%q", res.StdoutTruncated, len(res.Stdout), res.Stderr)
		}
		// The sandbox still answers afterwards.
		if r2, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo ok"}); err != nil || r2.Stdout != "ok\n" {
			t.Fatalf("after big output: %+v %v", r2, err)
		}
	})
}

func TestFiles(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{})

	t.Run("50 MB round trip", func(t *testing.T) {
		data := make([]byte, 50<<20)
		rand.Read(data)
		want := sha256.Sum256(data)
		fi, err := c.WriteFile(ctx, sb.ID, "data/blob.bin", bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Path != "/home/user/data/blob.bin" || fi.Size != int64(len(data)) || fi.Type != "file" {
			t.Fatalf("uploaded = %+v", fi)
		}
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "sha256sum data/blob.bin; stat -c %U data/blob.bin"})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(res.Stdout, fmt.Sprintf("%x ", want)) || !strings.HasSuffix(res.Stdout, "user\n") {
			t.Fatalf("in the sandbox: %q, want sha %x owned by user", res.Stdout, want)
		}
		rc, err := c.ReadFile(ctx, sb.ID, "/home/user/data/blob.bin")
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		n, err := io.Copy(h, rc)
		rc.Close()
		if err != nil || n != int64(len(data)) || !bytes.Equal(h.Sum(nil), want[:]) {
			t.Fatalf("download: %d bytes, err %v, sha mismatch=%v", n, err, !bytes.Equal(h.Sum(nil), want[:]))
		}
	})
	t.Run("list stat mkdir delete", func(t *testing.T) {
		if _, err := c.MakeDir(ctx, sb.ID, "/home/user/a/b/c"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.WriteFile(ctx, sb.ID, "/home/user/a/note.txt", strings.NewReader("hello")); err != nil {
			t.Fatal(err)
		}
		list, err := c.ListFiles(ctx, sb.ID, "/home/user/a")
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 2 || list[0].Name != "b" || list[0].Type != "dir" || list[1].Name != "note.txt" || list[1].Size != 5 {
			t.Fatalf("list = %+v", list)
		}
		fi, err := c.StatFile(ctx, sb.ID, "a/note.txt")
		if err != nil || fi.Size != 5 || fi.Type != "file" {
			t.Fatalf("stat = %+v, %v", fi, err)
		}
		fi, err = c.RenameFile(ctx, sb.ID, "a/note.txt", "a/b/moved.txt", false)
		if err != nil || fi.Path != "/home/user/a/b/moved.txt" || fi.Size != 5 {
			t.Fatalf("rename = %+v, %v", fi, err)
		}
		if _, err := c.StatFile(ctx, sb.ID, "a/note.txt"); !client.IsCode(err, "not_found") {
			t.Fatalf("stat of the old name after the rename: %v, want not_found", err)
		}
		if _, err := c.WriteFile(ctx, sb.ID, "/home/user/a/note.txt", strings.NewReader("hi")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.RenameFile(ctx, sb.ID, "a/note.txt", "a/b/moved.txt", false); !client.IsCode(err, "conflict") {
			t.Fatalf("rename onto an existing file: %v, want conflict", err)
		}
		if fi, err := c.RenameFile(ctx, sb.ID, "a/b/moved.txt", "a/note.txt", true); err != nil || fi.Size != 5 {
			t.Fatalf("rename with overwrite = %+v, %v", fi, err)
		}
		if err := c.RemoveFile(ctx, sb.ID, "/home/user/a/note.txt", false); err != nil {
			t.Fatal(err)
		}
		if _, err := c.StatFile(ctx, sb.ID, "a/note.txt"); !client.IsCode(err, "not_found") {
			t.Fatalf("stat after delete: %v, want not_found", err)
		}
		if err := c.RemoveFile(ctx, sb.ID, "/home/user/a", true); err != nil {
			t.Fatal(err)
		}
		if _, err := c.StatFile(ctx, sb.ID, "a"); !client.IsCode(err, "not_found") {
			t.Fatalf("stat after recursive delete: %v", err)
		}
	})
	t.Run("bad file requests", func(t *testing.T) {
		if _, err := c.ReadFile(ctx, sb.ID, "/home"); !client.IsCode(err, "invalid_request") || !strings.Contains(err.Error(), "directory") {
			t.Errorf("download of a directory: %v", err)
		}
		if _, err := c.ReadFile(ctx, sb.ID, "/nope"); !client.IsCode(err, "not_found") {
			t.Errorf("download of a missing file: %v", err)
		}
		if _, err := c.ReadFile(ctx, sb.ID, ""); !client.IsCode(err, "invalid_request") {
			t.Errorf("download without path: %v", err)
		}
	})
}

// api sends a raw request and decodes the error shape, for bad-input tests.
func api(t *testing.T, s *server, key, method, path, body string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest(method, s.url+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	json.Unmarshal(b, &eb)
	return resp.StatusCode, eb.Error.Code, eb.Error.Message
}

func TestBadInput(t *testing.T) {
	s := sharedServer(t)
	sb := newSandbox(t, s, client.CreateSandboxRequest{})
	arg := strings.Repeat("a", 128<<10)                                                 // one over the kernel's limit per argument
	args := `"` + strings.Join(slices.Repeat([]string{arg[:100<<10]}, 40), `","`) + `"` // each allowed, 4 MB in all
	cases := []struct {
		name, key, method, path, body string
		status                        int
		code, msg                     string
	}{
		{"malformed JSON", s.key, "POST", "/v1/sandboxes", `{"template":`, 400, "invalid_request", "malformed JSON"},
		{"a python context in a template without a kernel", s.key, "POST", "/v1/sandboxes/" + sb.ID + "/contexts", `{"language":"python"}`, 400, "invalid_request", "add ipykernel to the pip list"},
		{"wrong type", s.key, "POST", "/v1/sandboxes", `{"ttl_seconds":"ten"}`, 400, "invalid_request", "ttl_seconds"},
		{"unknown field", s.key, "POST", "/v1/sandboxes", `{"ttl":10}`, 400, "invalid_request", `"ttl"`},
		{"negative TTL", s.key, "POST", "/v1/sandboxes", `{"ttl_seconds":-5}`, 400, "invalid_request", "ttl_seconds"},
		{"huge TTL", s.key, "POST", "/v1/sandboxes", `{"ttl_seconds":99999999999}`, 400, "invalid_request", "ttl_seconds"},
		{"unknown template", s.key, "POST", "/v1/sandboxes", `{"template":"nope"}`, 404, "not_found", "base"},
		{"bad env name", s.key, "POST", "/v1/sandboxes", `{"env":{"1X":"y"}}`, 400, "invalid_request", "1X"},
		{"too much memory", s.key, "POST", "/v1/sandboxes", `{"memory_mb":999999}`, 400, "invalid_request", "memory_mb"},
		{"missing key", "", "GET", "/v1/sandboxes", "", 401, "unauthorized", "Bearer"},
		{"unknown key", "pds_notakey", "GET", "/v1/sandboxes", "", 401, "unauthorized", "unknown"},
		{"unknown sandbox", s.key, "GET", "/v1/sandboxes/sbx_nope", "", 404, "not_found", "sbx_nope"},
		{"exec on unknown sandbox", s.key, "POST", "/v1/sandboxes/sbx_nope/exec", `{"cmd":"true"}`, 404, "not_found", "sbx_nope"},
		{"exec without command", s.key, "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{}`, 400, "invalid_request", "cmd"},
		{"exec with both", s.key, "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":"x","argv":["y"]}`, 400, "invalid_request", "exactly one"},
		{"exec bad timeout", s.key, "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":"x","timeout_seconds":-1}`, 400, "invalid_request", "timeout_seconds"},
		{"exec bad cwd", s.key, "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":"x","cwd":"/nope"}`, 400, "invalid_request", "/nope"},
		{"patch without ttl", s.key, "PATCH", "/v1/sandboxes/" + sb.ID, `{}`, 400, "invalid_request", "ttl_seconds"},
		{"unknown route", s.key, "GET", "/v1/nothing", "", 404, "not_found", "no route"},
		{"wrong method", s.key, "PUT", "/v1/sandboxes", "", 405, "method_not_allowed", "PUT"},
		{"list with unknown filter", s.key, "GET", "/v1/sandboxes?foo=bar", "", 400, "invalid_request", "foo"},
		{"exec argument over 128 KiB", s.key, "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"argv":["echo","` + arg + `"]}`, 400, "invalid_request", "argv[1] is 131072 bytes"},
		{"exec command over 128 KiB", s.key, "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":"#` + arg + `"}`, 400, "invalid_request", "cmd is 131073 bytes"},
		{"exec arguments too large in all", s.key, "POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"argv":["true",` + args + `]}`, 400, "invalid_request", "too large in all"},
		{"pause with a body it cannot use", s.key, "POST", "/v1/sandboxes/" + sb.ID + "/pause", `garbage{`, 400, "invalid_request", "malformed JSON"},
		{"upload to a directory's path", s.key, "PUT", "/v1/sandboxes/" + sb.ID + "/files?path=zz/", "x", 400, "invalid_request", "ends with /"},
		{"NUL in a metadata value", s.key, "POST", "/v1/sandboxes", `{"metadata":{"a":"x\u0000y"}}`, 400, "invalid_request", `metadata "a"`},
		{"network not an object", s.key, "POST", "/v1/sandboxes", `{"network":[]}`, 400, "invalid_request", "must be a JSON object"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, code, msg := api(t, s, tc.key, tc.method, tc.path, tc.body)
			if status != tc.status || code != tc.code || !strings.Contains(msg, tc.msg) {
				t.Fatalf("%s %s %s → %d %s %q; want %d %s containing %q", tc.method, tc.path, tc.body, status, code, msg, tc.status, tc.code, tc.msg)
			}
		})
	}
	// The refused pause paused nothing.
	if got, err := s.client().GetSandbox(context.Background(), sb.ID); err != nil || got.State != "running" {
		t.Fatalf("after a refused pause: %v %v, want running", got.State, err)
	}
	// The server is still healthy after all that.
	if status, _, _ := api(t, s, "", "GET", "/healthz", ""); status != 200 {
		t.Fatalf("healthz = %d", status)
	}
	if status, _, _ := api(t, s, "", "GET", "/readyz", ""); status != 200 {
		t.Fatalf("readyz = %d", status)
	}
}

func TestProjectsAreIsolated(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Metadata: map[string]string{"owner": "a"}})
	other := client.New(s.url, s.newKey("other-project"))

	if _, err := other.GetSandbox(ctx, sb.ID); !client.IsCode(err, "not_found") {
		t.Fatalf("other project GET: %v, want not_found", err)
	}
	if _, err := other.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "true"}); !client.IsCode(err, "not_found") {
		t.Fatalf("other project exec: %v, want not_found", err)
	}
	if err := other.KillSandbox(ctx, sb.ID); !client.IsCode(err, "not_found") {
		t.Fatalf("other project kill: %v, want not_found", err)
	}
	list, err := other.ListSandboxes(ctx, nil, "all")
	if err != nil || len(list) != 0 {
		t.Fatalf("other project sees %d sandboxes (%v)", len(list), err)
	}
	mine, err := s.client().ListSandboxes(ctx, map[string]string{"owner": "a"}, "")
	if err != nil || len(mine) != 1 || mine[0].ID != sb.ID {
		t.Fatalf("metadata filter: %+v, %v", mine, err)
	}

	// A revoked key stops working at once: revoked by its prefix, or by
	// the whole key (as someone revoking a leaked one has it).
	for _, form := range []string{"prefix", "listed", "whole"} {
		key := s.newKey("short-lived")
		which := map[string]string{"prefix": key[:10], "listed": key[:10] + "…", "whole": key}[form]
		if _, errOut, err := s.cli("keys", "revoke", which); err != nil {
			t.Fatalf("keys revoke by its %s: %v %s", form, err, errOut)
		}
		if status, code, msg := api(t, s, key, "GET", "/v1/sandboxes", ""); status != 401 || code != "unauthorized" || !strings.Contains(msg, "revoked") {
			t.Fatalf("revoked key: %d %s %s", status, code, msg)
		}
		if form == "prefix" {
			// Again: it is there, revoked, not unknown.
			if _, errOut, err := s.cli("keys", "revoke", which); err != nil || !strings.Contains(errOut, "already revoked") {
				t.Errorf("a second revoke by its prefix: %v %q, want already revoked", err, errOut)
			}
		}
	}
	if _, errOut, err := s.cli("keys", "revoke", "pds_nosuchkeyatall"); err == nil || !strings.Contains(errOut, "the whole key") {
		t.Fatalf("revoke of an unknown key: %v %q", err, errOut)
	}
}

func TestKillLeavesNothing(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "sleep 1000 &"}); err != nil {
		t.Fatal(err)
	}
	if err := c.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s.assertGone(t, sb.ID)
	if _, err := c.GetSandbox(ctx, sb.ID); !client.IsCode(err, "not_found") {
		t.Fatalf("GET after kill: %v", err)
	}
	if err := c.KillSandbox(ctx, sb.ID); !client.IsCode(err, "not_found") {
		t.Fatalf("second kill: %v", err)
	}
}

func TestTTLExpiry(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	// Created with a TTL long enough for a slow create on a loaded host
	// (the TTL counts from the request), then shortened.
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{TTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	// Setting it works and is measured from now.
	before := time.Now()
	ext, err := c.SetTTL(ctx, sb.ID, 3*time.Second)
	if err != nil || ext.ExpiresAt.Before(before.Add(2*time.Second)) || ext.ExpiresAt.After(time.Now().Add(4*time.Second)) {
		t.Fatalf("set TTL 3 s at %v: %+v %v", before, ext, err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, err := c.GetSandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == "stopped" {
			if got.StopReason != "expired" {
				t.Fatalf("stopped for %q, want expired", got.StopReason)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox still %s 20 s after its TTL", got.State)
		}
		time.Sleep(200 * time.Millisecond)
	}
	s.assertGone(t, sb.ID)
	if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "true"}); !client.IsCode(err, "sandbox_stopped") || !strings.Contains(err.Error(), "expired") {
		t.Fatalf("exec on expired sandbox: %v", err)
	}
	// Whatever is asked of it, the answer is the permanent one, never a
	// 503 that tells clients to retry.
	for _, call := range []struct{ method, path, body string }{
		{"PATCH", "", `{"ttl_seconds": 100}`},
		{"PATCH", "", `{"idle_timeout_seconds": 10}`},
		{"POST", "/pause", ""},
		{"POST", "/resume", ""},
		{"POST", "/snapshots", ""},
		{"POST", "/fork", ""},
		{"POST", "/run_code", `{"code": "1"}`},
		{"POST", "/contexts", `{}`},
		{"GET", "/stats", ""},
		{"GET", "/files?path=/tmp", ""},
		{"PUT", "/network", `{"allow_out": []}`},
	} {
		status, body := rawCall(t, s, call.method, "/v1/sandboxes/"+sb.ID+call.path, call.body)
		if status != http.StatusGone || !strings.Contains(string(body), `"sandbox_stopped"`) || !strings.Contains(string(body), "expired") {
			t.Errorf("%s %s on an expired sandbox: %d %s, want 410 sandbox_stopped saying it expired", call.method, call.path, status, body)
		}
	}
	if list, _ := c.ListSandboxes(ctx, nil, ""); containsID(list, sb.ID) {
		t.Fatal("expired sandbox still listed as running")
	}
	if list, err := c.ListSandboxes(ctx, nil, "stopped"); err != nil || !containsID(list, sb.ID) {
		t.Fatalf("state=stopped does not list the expired sandbox: %v", err)
	}
	if _, err := c.ListSandboxes(ctx, nil, "bogus"); !client.IsCode(err, "invalid_request") {
		t.Fatalf("state=bogus: %v", err)
	}
	// "all" stands alone: with another state it listed only that one.
	if _, err := c.ListSandboxes(ctx, nil, "all,running"); !client.IsCode(err, "invalid_request") {
		t.Fatalf("state=all,running: %v", err)
	}
	if list, err := c.ListSandboxes(ctx, nil, "all"); err != nil || !containsID(list, sb.ID) {
		t.Fatalf("state=all does not list the expired sandbox: %v", err)
	}
	// No port URL for it either (one was handed out that could only fail).
	if status, body := rawCall(t, s, "POST", "/v1/sandboxes/"+sb.ID+"/ports/8000/token", ""); status != http.StatusGone || !strings.Contains(string(body), "expired") {
		t.Fatalf("port token of an expired sandbox: %d %s, want 410 saying it expired", status, body)
	}
}

func containsID(list []client.Sandbox, id string) bool {
	for _, sb := range list {
		if sb.ID == id {
			return true
		}
	}
	return false
}

func TestConcurrentExecs(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	var sbs []*client.Sandbox
	for i := 0; i < 5; i++ {
		sbs = append(sbs, newSandbox(t, s, client.CreateSandboxRequest{}))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sb := sbs[i%5]
			res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: fmt.Sprintf("sleep 0.2; echo %d-$PANDASTACK_SANDBOX_ID", i)})
			if err != nil {
				errs <- err
				return
			}
			if want := fmt.Sprintf("%d-%s\n", i, sb.ID); res.Stdout != want {
				errs <- fmt.Errorf("exec %d: got %q want %q", i, res.Stdout, want)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestCLI(t *testing.T) {
	s := sharedServer(t)
	out, errOut, err := s.cli("sandbox", "create", "--metadata", "via=cli", "--ttl", "2m")
	if err != nil {
		t.Fatalf("create: %v %s", err, errOut)
	}
	id := strings.TrimSpace(out)
	if !strings.HasPrefix(id, "sbx_") {
		t.Fatalf("create printed %q", out)
	}
	out, _, err = s.cli("sandbox", "ls", "--metadata", "via=cli")
	if err != nil || !strings.Contains(out, id) {
		t.Fatalf("ls: %v %q", err, out)
	}
	out, _, err = s.cli("sandbox", "exec", id, "--", "echo", "hi", "from", "cli")
	if err != nil || out != "hi from cli\n" {
		t.Fatalf("exec: %v %q", err, out)
	}
	exitCode := func(err error) int {
		if ee, ok := err.(interface{ ExitCode() int }); ok {
			return ee.ExitCode()
		}
		return -1
	}
	_, _, err = s.cli("sandbox", "exec", id, "--", "exit 7")
	if exitCode(err) != 7 {
		t.Fatalf("exec exit code: %v", err)
	}
	// An unknown verb is a command line it cannot parse: 2, as the README says.
	for _, args := range [][]string{{"sandbox", "frob"}, {"keys", "frob"}, {"template", "frob"}} {
		if _, errOut, err := s.cli(args...); exitCode(err) != 2 || !strings.Contains(errOut, "unknown verb") {
			t.Errorf("pandastack %v: %v %q, want exit 2 naming the unknown verb", args, err, errOut)
		}
	}
	// A wrong server or key says which the CLI used; a URL with the
	// routes' /v1 works.
	host := strings.TrimPrefix(s.url, "http://")
	for _, c := range []struct {
		env  []string
		want string
	}{
		{[]string{"PANDASTACK_API_KEY=pds_notakey"}, "(the key from PANDASTACK_API_KEY, sent to " + s.url + ")"},
		{[]string{"PANDASTACK_API=" + host}, "want the server's URL, such as http://" + host},
		{[]string{"PANDASTACK_API=http://127.0.0.1:1"}, "cannot reach the PandaStack server at http://127.0.0.1:1"},
	} {
		if _, errOut, err := s.cliEnv(c.env, "sandbox", "ls"); err == nil || !strings.Contains(errOut, c.want) {
			t.Errorf("sandbox ls with %v: %v %q, want %q", c.env, err, errOut, c.want)
		}
	}
	if out, errOut, err := s.cliEnv([]string{"PANDASTACK_API=" + s.url + "/v1/"}, "sandbox", "ls"); err != nil || !strings.Contains(out, id) {
		t.Errorf("sandbox ls with PANDASTACK_API ending in /v1/: %v %q %q", err, out, errOut)
	}
	// The API's create fields, a pause and a resume, a restore: from the
	// CLI too.
	out, errOut, err = s.cli("sandbox", "create", "--ttl", "600", "--idle-timeout", "0", "--auto-resume", "--disk-mb", "256", "--metadata", "via=cli")
	if err != nil {
		t.Fatalf("create with the API's fields: %v %s", err, errOut)
	}
	other := strings.TrimSpace(out)
	got, err := s.client().GetSandbox(context.Background(), other)
	if err != nil || got.IdleTimeoutSeconds != 0 || !got.AutoResume || time.Until(got.ExpiresAt) < 500*time.Second {
		t.Fatalf("created with --ttl 600 --idle-timeout 0 --auto-resume: %+v %v", got, err)
	}
	if out, _, err := s.cli("sandbox", "exec", other, "--", "df -m / | awk 'NR==2 {print $2}'"); err != nil {
		t.Errorf("df: %v", err)
	} else if mb, _ := strconv.Atoi(strings.TrimSpace(out)); mb < 200 || mb > 256 {
		t.Errorf("--disk-mb 256: the root filesystem has %q MiB", out)
	}
	for _, verb := range []string{"pause", "resume"} {
		if _, errOut, err := s.cli("sandbox", verb, other); err != nil || !strings.Contains(errOut, map[string]string{"pause": "paused", "resume": "running"}[verb]) {
			t.Fatalf("sandbox %s: %v %q", verb, err, errOut)
		}
	}
	snap, err := s.client().CreateSnapshot(context.Background(), other, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.client().DeleteSnapshot(context.Background(), snap.ID) })
	if _, errOut, err := s.cli("sandbox", "create", "--snapshot", snap.ID, "--cpu", "1"); exitCode(err) != 1 || !strings.Contains(errOut, "--cpu with --snapshot") {
		t.Errorf("create --snapshot --cpu: %v %q, want a refusal", err, errOut)
	}
	out, errOut, err = s.cli("sandbox", "create", "--snapshot", snap.ID, "--ttl", "2m")
	if err != nil || !strings.HasPrefix(out, "sbx_") {
		t.Fatalf("create --snapshot: %v %q %q", err, out, errOut)
	}
	restored := strings.TrimSpace(out)
	if _, _, err := s.cli("sandbox", "kill", other, restored); err != nil {
		t.Errorf("kill: %v", err)
	}
	// The way out of a runaway, from the CLI too.
	if _, _, err := s.cli("sandbox", "exec", id, "--", "setsid sleep 605 </dev/null >/dev/null 2>&1 &"); err != nil {
		t.Fatal(err)
	}
	if out, errOut, err := s.cli("sandbox", "kill-processes", id); err != nil || !strings.HasPrefix(out, "killed 1 process;") {
		t.Errorf("sandbox kill-processes: %v %q %q", err, out, errOut)
	}
	// A flag of exec's after the id would run as the command (127).
	for _, flag := range []string{"--timeout", "-h"} {
		if _, errOut, err := s.cli("sandbox", "exec", id, flag, "1s", "--", "echo ran"); exitCode(err) != 2 || !strings.Contains(errOut, "goes before the sandbox id") {
			t.Errorf("exec with %s after the id: %v %q, want exit 2 saying where it goes", flag, err, errOut)
		}
	}
	if _, errOut, err := s.cli("template", "gc", "--dry-run", "--min-age", "-5s"); exitCode(err) == 0 || !strings.Contains(errOut, "negative") {
		t.Errorf("template gc --min-age -5s: %v %q, want a refusal", err, errOut)
	}
	// Output comes back byte for byte; a command killed by a signal exits
	// as a shell's would, 128+N, and says so; --stdin feeds the command.
	out, _, err = s.cli("sandbox", "exec", id, "--", `printf '\377\376\n'`)
	if err != nil || out != "\xff\xfe\n" {
		t.Fatalf("binary output: %v %q", err, out)
	}
	_, errOut, err = s.cli("sandbox", "exec", id, "--", "kill -9 $$")
	if exitCode(err) != 137 || !strings.Contains(errOut, "SIGKILL") {
		t.Fatalf("a command killed by SIGKILL: %v %q", err, errOut)
	}
	cmd := exec.Command(filepath.Join(s.bin, "pandastack"), "sandbox", "exec", "--stdin", id, "--", "tr a-z A-Z")
	cmd.Env = append(os.Environ(), "PANDASTACK_API="+s.url, "PANDASTACK_API_KEY="+s.key)
	cmd.Stdin = strings.NewReader("piped in\n")
	if b, err := cmd.Output(); err != nil || string(b) != "PIPED IN\n" {
		t.Fatalf("exec --stdin: %v %q", err, b)
	}
	// Ctrl-C ends the CLI with 130 and the command in the sandbox with it.
	cmd = exec.Command(filepath.Join(s.bin, "pandastack"), "sandbox", "exec", id, "--", "echo started; sleep 30; touch /tmp/not-stopped")
	cmd.Env = append(os.Environ(), "PANDASTACK_API="+s.url, "PANDASTACK_API_KEY="+s.key)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "started\n" {
		t.Fatalf("exec before Ctrl-C: %q %v", line, err)
	}
	cmd.Process.Signal(os.Interrupt)
	if err := cmd.Wait(); exitCode(err) != 130 {
		t.Fatalf("exec after Ctrl-C: %v, want exit 130", err)
	}
	if out, _, err := s.cli("sandbox", "exec", id, "--", "sleep 1; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done 2>/dev/null | grep -c '^sleep 30' || true"); err != nil || out != "0\n" {
		t.Fatalf("the command after Ctrl-C of its exec: %q %v", out, err)
	}
	// Mistakes in the command line are refused before anything is made:
	// a command line that does not parse (an argument too many or
	// missing) exits 2, one that asks for what cannot be 1.
	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"sandbox", "create", "code-interpreter", "--ttl", "1m"}, 2}, // a template given as an argument
		{[]string{"sandbox", "kill"}, 2},
		{[]string{"sandbox", "create", "--ttl", "500ms"}, 1}, // less than the API's second
		{[]string{"sandbox", "create", "--ttl", "0"}, 1},     // not the server's default, which leaving it out gives
	} {
		if out, errOut, err := s.cli(c.args...); exitCode(err) != c.code || out != "" || errOut == "" {
			t.Errorf("%q: exit %d, %q %q; want exit %d", c.args, exitCode(err), out, errOut, c.code)
		}
	}
	if out, _, err := s.cli("sandbox", "-h"); err != nil || !strings.Contains(out, "create|ls|exec|kill-processes|pause|resume|kill") {
		t.Errorf("sandbox -h: %v %q", err, out)
	}
	if out, _, err := s.cli("sandbox", "kill", "-h"); err != nil || !strings.Contains(out, "usage: pandastack sandbox kill ID") {
		t.Errorf("sandbox kill -h: %v %q", err, out)
	}
	// A command that did not run exits as docker exec's does, apart from
	// the command's own statuses: 127 no such program, 126 one the user may
	// not run, 125 no such sandbox.
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"sandbox", "exec", id, "--", "no-such-program", "x"}, 127, "command_not_found"},
		{[]string{"sandbox", "exec", id, "--", "/etc/passwd", "x"}, 126, "permission_denied"},
		{[]string{"sandbox", "exec", id, "--", "/tmp", "x"}, 126, "it is a directory"},
		{[]string{"sandbox", "exec", "sbx_nosuchsandbox0000", "--", "true"}, 125, "not_found"},
	} {
		if _, errOut, err := s.cli(c.args...); exitCode(err) != c.code || !strings.Contains(errOut, c.says) {
			t.Errorf("%q: exit %d, %q; want %d saying %s", c.args, exitCode(err), errOut, c.code, c.says)
		}
	}
	if _, errOut, err := s.cli("sandbox", "kill", id); err != nil {
		t.Fatalf("kill: %v %s", err, errOut)
	}
	s.assertGone(t, id)
}

// A sandbox resumed into a container prepared for creates (no prepared
// resumes here) is taken over too, by its own id.
func TestServerRestartReadoptsSandboxes(t *testing.T) {
	// Sandboxes outlive serve here, as they do for an operator.
	s := startServer(t, "", "PANDASTACK_KILL_ON_EXIT=0", "PANDASTACK_PREPARED_RESUMES=0")
	defer func() { s.stop(); os.RemoveAll(s.dataDir) }()
	ctx := context.Background()
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	waitWarmTemplate(t, s, "code-interpreter")
	moved, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 600, IdleTimeoutSeconds: idleSeconds(1)})
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, s, moved.ID, "echo moved > state.txt")
	waitState(t, s, moved.ID, "suspended", suspended)
	var standby string
	eventually(t, "a container prepared for creates of code-interpreter", func() bool {
		standby = s.standbyOf("code-interpreter")
		return standby != ""
	})
	if _, err := c.SetIdleTimeout(ctx, moved.ID, 0); err != nil { // it stays up once resumed
		t.Fatal(err)
	}
	if out := mustExec(t, s, moved.ID, "cat state.txt"); out != "moved\n" { // resumes it, into that container
		t.Fatalf("after the resume: %q", out)
	}
	if !strings.Contains(linesWith(s.out.String(), `msg="sandbox resumed" sandbox=`+moved.ID), "standby="+standby) {
		t.Fatalf("the resume did not take the prepared container %s:\n%s", standby, linesWith(s.out.String(), moved.ID))
	}
	short, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{TTLSeconds: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo remembered > state.txt"}); err != nil {
		t.Fatal(err)
	}
	s.stop()
	time.Sleep(4 * time.Second) // the short one expires while the server is down
	s.start()
	c = s.client()

	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "cat state.txt"})
	if err != nil || res.Stdout != "remembered\n" {
		t.Fatalf("after restart: %+v %v\n%s", res, err, tail(s.out.String(), 30))
	}
	res, err = c.Exec(ctx, moved.ID, client.ExecRequest{Cmd: "cat state.txt; hostname"})
	if want := "moved\n" + strings.ReplaceAll(moved.ID, "_", "-") + "\n"; err != nil || res.Stdout != want {
		t.Fatalf("the sandbox in a renamed container after restart: %+v %v, want %q\n%s", res, err, want, tail(s.out.String(), 30))
	}
	if err := c.KillSandbox(ctx, moved.ID); err != nil {
		t.Fatal(err)
	}
	s.assertGone(t, moved.ID)
	s.assertGone(t, standby)
	got, err := c.GetSandbox(ctx, short.ID)
	if err != nil || got.State != "stopped" || got.StopReason != "expired" {
		t.Fatalf("short-lived sandbox after restart: %+v %v", got, err)
	}
	s.assertGone(t, short.ID)
	if err := c.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s.assertGone(t, sb.ID)
	s.stop()
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), s.dataDir) {
		t.Fatalf("mounts under the data dir left after serve stopped:\n%s", mounts)
	}
}

// A SIGTERM while a request runs past serve's 10 s of grace: the caller is
// told the server is shutting down (not that its sandbox died), serve exits
// 0, and the sandbox is there after the restart.
func TestShutdownCutsALongRequestOff(t *testing.T) {
	s := startServer(t, "", "PANDASTACK_KILL_ON_EXIT=0", "PANDASTACK_WARM=0")
	defer func() { s.stop(); os.RemoveAll(s.dataDir) }()
	ctx := context.Background()
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "sleep 60", TimeoutSeconds: 120})
		done <- err
	}()
	time.Sleep(time.Second)
	cmd := s.cmd
	cmd.Process.Signal(syscall.SIGTERM)
	werr := cmd.Wait()
	s.cmd = nil
	if werr != nil {
		t.Errorf("serve after SIGTERM: %v, want exit status 0\n%s", werr, tail(s.out.String(), 20))
	}
	if err := <-done; !client.IsCode(err, "sandbox_unavailable") || !strings.Contains(err.Error(), "shutting down") {
		t.Errorf("the long exec: %v, want sandbox_unavailable saying the server is shutting down", err)
	}
	s.start()
	c = s.client()
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo back"}); err != nil || res.Stdout != "back\n" {
		t.Errorf("the sandbox after the restart: %+v %v", res, err)
	}
	c.KillSandbox(ctx, sb.ID)
}

// Serve's log reader goes away (a `serve | tee log` whose tee was killed):
// serve goes on, and a SIGTERM later still stops its sandboxes (kill on
// exit) and ends it with status 0. Its writes to the closed pipe fail
// instead of killing it with SIGPIPE halfway through its work.
func TestServeOutlivesItsLogReader(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s := newServer(t, "")
	s.logTo = w
	defer os.RemoveAll(s.dataDir)
	var logged syncBuffer
	copied := make(chan struct{})
	go func() { io.Copy(&logged, r); close(copied) }()
	s.start()
	w.Close() // serve holds its own
	defer s.stop()
	ctx := context.Background()
	c := s.client()
	first, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	<-copied
	// Each of these logs lines (at debug level) into the closed pipe.
	second, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", TTLSeconds: 600})
	if err != nil {
		t.Fatalf("a create after the log's reader went away: %v\nlogged before:\n%s", err, tail(logged.String(), 20))
	}
	if res, err := c.Exec(ctx, first.ID, client.ExecRequest{Cmd: "echo still"}); err != nil || res.Stdout != "still\n" {
		t.Fatalf("an exec after the log's reader went away: %+v %v", res, err)
	}
	cmd := s.cmd
	cmd.Process.Signal(syscall.SIGTERM)
	werr := cmd.Wait()
	s.cmd = nil
	if werr != nil {
		t.Errorf("serve after SIGTERM: %v, want exit status 0", werr)
	}
	s.assertGone(t, first.ID)
	s.assertGone(t, second.ID)
}

// /dev/shm holds at most half the sandbox's memory: filling it is ENOSPC
// to the writer, and the sandbox lives on (it was stopped out_of_memory),
// in a sandbox booted cold and in one restored from the warm image alike.
func TestSharedMemoryFillsUp(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	for _, template := range []string{"base", "code-interpreter"} {
		// The template's memory: a create that sets none restores the
		// warm image (code-interpreter's), one that does boots cold.
		sb := newSandbox(t, s, client.CreateSandboxRequest{Template: template})
		// Three quarters of its memory: past /dev/shm's half.
		fill := "dd if=/dev/zero of=/dev/shm/big bs=1M count=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) * 3 / 4 / 1024 )); echo rc=$?"
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: fill, TimeoutSeconds: 60})
		if err != nil || !strings.Contains(res.Stderr, "No space left on device") || !strings.Contains(res.Stdout, "rc=1") {
			t.Fatalf("%s: filling /dev/shm: %+v %v; want ENOSPC", template, res, err)
		}
		res, err = c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "rm /dev/shm/big; echo alive"})
		if err != nil || strings.TrimSpace(res.Stdout) != "alive" {
			t.Fatalf("%s: after /dev/shm filled up: %+v %v", template, res, err)
		}
	}
}

// TestOutOfMemoryInASmallSandbox: a sandbox under 384 MiB has no memory
// watch, so a command allocating more than it holds meets the host's
// limit: the host's out-of-memory killer takes the command, not the
// sandbox (it stopped the whole sandbox, out_of_memory, before the
// stubs went first), and its stderr says so.
func TestOutOfMemoryInASmallSandbox(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{MemoryMB: 256})
	dir, _ := sandboxCgroup(t, s, sb.ID)
	testutil.WaitStubRaised(t, dir)
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: `python3 -c "x = bytearray(700*1024*1024); print(len(x))"`, TimeoutSeconds: 120})
	if err != nil || res.ExitCode != -1 || res.Signal != "SIGKILL" || res.Stdout != "" || !strings.Contains(res.Stderr, "the host's out-of-memory killer killed this command") {
		t.Fatalf("allocating 700 MB in a 256 MB sandbox: %+v %v; want SIGKILL, the host's note on stderr", res, err)
	}
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo alive"}); err != nil || res.Stdout != "alive\n" {
		t.Fatalf("after the host killed the command: %+v %v", res, err)
	}
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != "running" {
		t.Fatalf("after the host killed the command: %+v %v", got, err)
	}
}

// TestCreateCallerHangsUp: a create whose caller hangs up before the
// sandbox is ready leaves no sandbox running: nobody would learn its id.
func TestCreateCallerHangsUp(t *testing.T) {
	s := sharedServer(t)
	tag := map[string]string{"test": "caller-hangs-up-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
	body, _ := json.Marshal(map[string]any{"template": "base", "env": map[string]string{"COLD": "1"}, "metadata": tag}) // own env: a cold boot, long enough to hang up during
	c := s.client()
	// A quiet host may boot it within the first wait: then a shorter one.
	hungUp := false
	for _, wait := range []time.Duration{150 * time.Millisecond, 60 * time.Millisecond, 25 * time.Millisecond, 10 * time.Millisecond} {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		req, _ := http.NewRequestWithContext(ctx, "POST", s.url+"/v1/sandboxes", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+s.key)
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err != nil {
			hungUp = true
			break
		}
		var sb client.Sandbox
		json.NewDecoder(resp.Body).Decode(&sb)
		resp.Body.Close()
		if sb.ID == "" {
			t.Fatalf("create: %d", resp.StatusCode)
		}
		if err := c.KillSandbox(context.Background(), sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if !hungUp {
		t.Fatal("every create answered before the caller hung up, even within 10 ms")
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		list, err := c.ListSandboxes(context.Background(), tag, "all")
		if err != nil {
			t.Fatal(err)
		}
		var live []string
		for _, sb := range list {
			if sb.State != "stopped" {
				live = append(live, sb.ID+" "+string(sb.State))
			}
		}
		if len(list) > 0 && len(live) == 0 {
			s.assertGone(t, list[0].ID)
			return
		}
		if len(list) == 0 && time.Until(deadline) < 50*time.Second {
			return // the create stopped before it made a record
		}
		if time.Now().After(deadline) {
			t.Fatalf("a minute after the caller hung up: %v (%d records)", live, len(list))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A sandbox's env applies to what runs in it, not to the platform's own
// setup: a create whose env has a PATH of its own succeeds (it failed with
// a 500), and HOME, USER and LOGNAME stay the sandbox user's.
func TestSandboxEnv(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "base", TTLSeconds: 120, Env: map[string]string{"PATH": "/nowhere", "GREETING": "hi", "HOME": "/tmp"}})
	res, err := c.Exec(context.Background(), sb.ID, client.ExecRequest{Argv: []string{"/bin/sh", "-c", `echo "$PATH $GREETING $HOME"`}})
	if err != nil || res.Stdout != "/nowhere hi /home/user\n" {
		t.Fatalf("the sandbox's env: %+v %v", res, err)
	}
}

// A serve that cannot start (an address it cannot listen on, one in use,
// a template to build that does not exist) says so before it makes and
// prints the first API key, which a start that fails would show for
// nothing and the next start no longer shows.
func TestServeRefusesBeforeTheFirstKey(t *testing.T) {
	s := sharedServer(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "bogus"}, "--listen bogus"},
		{[]string{"--listen", strings.TrimPrefix(s.url, "http://")}, "address already in use"},
		{[]string{"--listen", "127.0.0.1:0", "--build-on-start", "no-such-template"}, `no template "no-such-template"`},
	} {
		dir := t.TempDir()
		cmd := exec.Command(filepath.Join(s.bin, "pandastack"), append([]string{"serve", "--data-dir", dir, "--warm=false"}, c.args...)...)
		cmd.Env = append(os.Environ(), "PANDASTACK_CACHE_DIR="+paths.CacheDir(), "PANDASTACK_NETWORK_DEFAULT=off")
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) || strings.Contains(string(out), "API key") {
			t.Errorf("serve %v: %v\n%s\nwant a refusal saying %q, and no key", c.args, err, out, c.want)
		}
		if _, err := os.Stat(filepath.Join(dir, "api-key")); !os.IsNotExist(err) {
			t.Errorf("serve %v made a key file: %v", c.args, err)
		}
	}
}
