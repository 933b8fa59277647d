package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
)

// rawFile sends a file request with the raw query q and returns the status
// and body; the request has a deadline so a hang fails the test.
func rawFile(t *testing.T, s *server, method, route string, q url.Values, body string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, s.url+route+"?"+q.Encode(), strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, route, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", method, route, err)
	}
	return resp.StatusCode, string(b)
}

func mustExec(t *testing.T, s *server, id, cmd string) string {
	t.Helper()
	res, err := s.client().Exec(context.Background(), id, client.ExecRequest{Cmd: cmd})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec %q: exit %d, stderr %s", cmd, res.ExitCode, res.Stderr)
	}
	return res.Stdout
}

// Issue 11 items 6, 7, 9, 10 and 12, through the real binary and a real
// sandbox.
func TestFileAPIHardening(t *testing.T) {
	s := sharedServer(t)
	sb := newSandbox(t, s, client.CreateSandboxRequest{})
	files := "/v1/sandboxes/" + sb.ID + "/files"
	qv := func(kv ...string) url.Values {
		v := url.Values{}
		for i := 0; i+1 < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	expect := func(t *testing.T, method, route string, q url.Values, body string, status int, want string) {
		t.Helper()
		got, b := rawFile(t, s, method, route, q, body)
		if got != status || !strings.Contains(b, want) {
			t.Errorf("%s %s?%.120s → %d %.300s; want %d with %q", method, route, q.Encode(), got, b, status, want)
		}
	}

	t.Run("FIFO download is refused, not hung", func(t *testing.T) {
		mustExec(t, s, sb.ID, "mkfifo /home/user/out.png")
		expect(t, "GET", files, qv("path", "/home/user/out.png"), "", 400, "not a regular file")
	})
	t.Run("pseudo-filesystems are refused", func(t *testing.T) {
		expect(t, "GET", files, qv("path", "/proc/self/mem"), "", 400, "pseudo-filesystem")
		expect(t, "DELETE", files, qv("path", "/proc/1/task", "recursive", "true"), "", 400, "pseudo-filesystem")
		expect(t, "DELETE", files, qv("path", "/proc/1/task", "recursive", "true", "user", "root"), "", 400, "pseudo-filesystem")
		mustExec(t, s, sb.ID, "ln -s /proc /home/user/p")
		expect(t, "GET", files, qv("path", "p/self/status"), "", 400, "pseudo-filesystem")
		expect(t, "GET", files+"/list", qv("path", "/sys"), "", 400, "pseudo-filesystem")
		// The sandbox's filesystem is whole.
		if out := mustExec(t, s, sb.ID, "ls /usr/bin | wc -l"); strings.TrimSpace(out) == "0" {
			t.Fatal("/usr/bin is empty")
		}
	})
	t.Run("recursive delete does not follow links", func(t *testing.T) {
		mustExec(t, s, sb.ID, "mkdir -p tree/a keep && echo k > keep/k.txt && ln -s /home/user/keep tree/a/link && ln -s / tree/root")
		expect(t, "DELETE", files, qv("path", "tree", "recursive", "true"), "", 204, "")
		if out := mustExec(t, s, sb.ID, "cat keep/k.txt; test ! -e tree && echo gone; ls / | wc -l"); !strings.HasPrefix(out, "k\ngone\n") {
			t.Fatalf("after the delete: %q", out)
		}
	})
	t.Run("our own mounts are refused", func(t *testing.T) {
		for _, user := range []string{"user", "root"} {
			expect(t, "PUT", files, qv("path", "/.pandastack/agent", "user", user), "x", 400, "agent")
			expect(t, "DELETE", files, qv("path", "/.pandastack/agent", "user", user), "", 400, "agent")
			expect(t, "DELETE", files, qv("path", "/.pandastack", "recursive", "true", "user", user), "", 400, "agent")
		}
		if out := mustExec(t, s, sb.ID, "test -x /.pandastack/agent && echo ok"); out != "ok\n" {
			t.Fatalf("agent binary: %q", out)
		}
	})
	t.Run("strict queries and paths", func(t *testing.T) {
		mustExec(t, s, sb.ID, "mkdir -p d/e")
		expect(t, "DELETE", files, qv("path", "d", "recursive", "maybe"), "", 400, "recursive")
		expect(t, "DELETE", files, qv("path", "d", "recursiv", "true"), "", 400, "recursiv")
		expect(t, "GET", files+"/stat", qv("path", "d", "user", "bob"), "", 400, "user")
		long := strings.Repeat("x/", 50000)
		expect(t, "PUT", files, qv("path", long), "x", 400, "4096")
		expect(t, "DELETE", files, qv("path", long), "", 400, "4096")
		if !strings.Contains(s.out.String(), "bad path") {
			t.Error("the refused 100 kB path is not in the server log")
		}
		if out := mustExec(t, s, sb.ID, "test -d d/e && echo kept"); out != "kept\n" {
			t.Fatalf("a refused delete deleted: %q", out)
		}
	})
	t.Run("a recursive delete of the home is refused before anything goes", func(t *testing.T) {
		mustExec(t, s, sb.ID, "echo keep > /home/user/.keepme && mkdir -p /home/user/deep/er && echo k > /home/user/deep/er/k")
		expect(t, "DELETE", files, qv("path", "/home/user", "recursive", "true"), "", 403, "nothing was deleted")
		expect(t, "DELETE", files, qv("path", "/tmp", "recursive", "true"), "", 403, "nothing was deleted")
		if out := mustExec(t, s, sb.ID, "cat /home/user/.keepme /home/user/deep/er/k"); out != "keep\nk\n" {
			t.Fatalf("after the refused deletes: %q", out)
		}
	})
	t.Run("a malformed upload body is the client's error, not the sandbox's", func(t *testing.T) {
		c, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		fmt.Fprintf(c, "PUT %s?path=broken.bin HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n%s\r\nzz\r\n", files, s.key, strings.Repeat("y", 16))
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 400 || !strings.Contains(string(b), "invalid_request") {
			t.Fatalf("a malformed chunked upload: %d %s, want 400 invalid_request", resp.StatusCode, b)
		}
		if out := mustExec(t, s, sb.ID, "ls -a /home/user | grep -c broken || true"); strings.TrimSpace(out) != "0" {
			t.Fatalf("the broken upload left a file: %q", out)
		}
	})
	t.Run("rename", func(t *testing.T) {
		mustExec(t, s, sb.ID, "mkdir -p r/d && echo 1 > r/d/one && echo 2 > r/two")
		// The parameters in a JSON body, as mkdir takes its path.
		expect(t, "POST", files+"/rename", nil, `{"path":"r/d","to":"r/e/f"}`, 200, `"path":"/home/user/r/e/f"`)
		expect(t, "POST", files+"/rename", nil, `{"path":"r/two","to":"r/e/f/one"}`, 409, "overwrite=true")
		expect(t, "POST", files+"/rename", nil, `{"path":"r/two","to":"r/e/f/one","overwrite":true}`, 200, `"size":2`)
		expect(t, "POST", files+"/rename", nil, `{"path":"r/e","to":"r/x","force":true}`, 400, "force")
		expect(t, "POST", files+"/rename", qv("path", "r/e", "to", "r/x", "mode", "1"), "", 400, "mode")
		expect(t, "POST", files+"/rename", qv("path", "r/e"), "", 400, "to query parameter")
		expect(t, "POST", files+"/rename", qv("path", "r/e", "to", "r/e/in"), "", 400, "into itself")
		expect(t, "POST", files+"/rename", qv("path", "r/e", "to", "/dev/shm/e"), "", 400, "pseudo-filesystem")
		// The parameters in the query or in the body, never half from each.
		expect(t, "POST", files+"/rename", qv("path", "r/e", "to", "r/x"), `{"to":"r/y"}`, 400, "one or the other")
		expect(t, "POST", files+"/mkdir", qv("path", "r/m"), `{"path":"r/n"}`, 400, "one or the other")
		// Half in the query, half in the body, is refused too.
		expect(t, "POST", files+"/rename", qv("to", "r/x"), `{"path":"r/e"}`, 400, "one or the other")
		expect(t, "POST", files+"/rename", qv("overwrite", "true"), `{"path":"r/e","to":"r/x"}`, 400, "one or the other")
		expect(t, "POST", files+"/mkdir", qv("path", "r/m"), `not json`, 400, "invalid_request")
		if out := mustExec(t, s, sb.ID, "cat r/e/f/one; test ! -e r/two && test ! -e r/d && test ! -e r/m && test ! -e r/n && test ! -e r/x && echo moved"); out != "2\nmoved\n" {
			t.Fatalf("after the renames: %q", out)
		}
	})
	t.Run("uploads act as the sandbox user", func(t *testing.T) {
		mustExec(t, s, sb.ID, "ln -s /etc /home/user/link")
		expect(t, "PUT", files, qv("path", "/home/user/link/pwned"), "x", 403, `"code":"permission_denied"`)
		expect(t, "POST", files+"/mkdir", qv("path", "/home/user/link/pwned.d"), "", 403, `"code":"permission_denied"`)
		mustExec(t, s, sb.ID, "echo m > /home/user/moveme")
		expect(t, "POST", files+"/rename", qv("path", "moveme", "to", "/home/user/link/pwned"), "", 403, `"code":"permission_denied"`)
		expect(t, "POST", files+"/rename", qv("path", "/etc/hostname", "to", "stolen"), "", 403, `"code":"permission_denied"`)
		expect(t, "GET", files, qv("path", "/etc/shadow"), "", 403, `"code":"permission_denied"`)
		if out := mustExec(t, s, sb.ID, "ls /etc | grep -c pwned || true"); strings.TrimSpace(out) != "0" {
			t.Fatalf("the upload wrote into /etc as root: %q", out)
		}
		// Asked for, root may, at the path itself; and the file is root's.
		// Not through the user's link: the user's code could have
		// planted it to steer root's writes.
		expect(t, "PUT", files, qv("path", "/home/user/link/asroot", "user", "root"), "r", 403, "which the sandbox's user can change")
		expect(t, "PUT", files, qv("path", "/etc/asroot", "user", "root"), "r", 200, `"path":"/etc/asroot"`)
		if out := mustExec(t, s, sb.ID, "stat -c %U /etc/asroot"); out != "root\n" {
			t.Fatalf("owner of a file uploaded as root: %q", out)
		}
		expect(t, "PUT", files, qv("path", "mine.txt"), "m", 200, "mine.txt")
		if out := mustExec(t, s, sb.ID, "stat -c %U:%G mine.txt"); out != "user:user\n" {
			t.Fatalf("owner of an upload: %q", out)
		}
	})
	// Acting as root, every operation goes through the directory it
	// walked to, held open: in gVisor as on Linux.
	t.Run("every operation as root", func(t *testing.T) {
		root := func(kv ...string) url.Values { return qv(append(kv, "user", "root")...) }
		expect(t, "PUT", files, root("path", "/opt/made/deep/f.txt"), "deep", 200, `"path":"/opt/made/deep/f.txt"`)
		expect(t, "GET", files, root("path", "/opt/made/deep/f.txt"), "", 200, "deep")
		expect(t, "GET", files+"/stat", root("path", "/opt/made/deep"), "", 200, `"type":"dir"`)
		expect(t, "GET", files+"/list", root("path", "/opt/made/deep"), "", 200, `"path":"/opt/made/deep/f.txt"`)
		expect(t, "POST", files+"/mkdir", root("path", "/opt/made/other/d"), "", 200, `"path":"/opt/made/other/d"`)
		expect(t, "POST", files+"/rename", root("path", "/opt/made/deep/f.txt", "to", "/opt/made/other/d/g.txt"), "", 200, `"path":"/opt/made/other/d/g.txt"`)
		expect(t, "POST", files+"/rename", root("path", "/opt/absent", "to", "/opt/never/x"), "", 404, "not_found")
		// Through root's own link in a directory only root writes (/bin on
		// the image's merged /usr), as the kernel follows it.
		expect(t, "GET", files+"/stat", root("path", "/bin/sh"), "", 200, `"path":"/bin/sh"`)
		expect(t, "GET", files, root("path", "/etc/shadow"), "", 200, "root:")
		expect(t, "DELETE", files, root("path", "/opt/made", "recursive", "true"), "", 204, "")
		expect(t, "DELETE", files, root("path", "/opt/made"), "", 404, "no such file or directory: /opt/made")
		if out := mustExec(t, s, sb.ID, "ls /opt | grep -c 'made\\|never' || true"); strings.TrimSpace(out) != "0" {
			t.Fatalf("after the deletes, /opt holds: %q", out)
		}
	})
}

// Issue 11 item 10: the same strict reading of bodies and env everywhere.
func TestStrictBodies(t *testing.T) {
	s := sharedServer(t)
	sb := newSandbox(t, s, client.CreateSandboxRequest{})
	for _, c := range []struct{ method, path, body, want string }{
		{"POST", "/v1/sandboxes", `null`, "JSON object"},
		{"POST", "/v1/sandboxes", `[]`, "JSON object"},
		{"POST", "/v1/sandboxes", `{"env":{"A":"x\u0000y"}}`, "NUL"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `null`, "JSON object"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/exec", `{"cmd":"true","env":{"A":"x\u0000y"}}`, "NUL"},
		{"PATCH", "/v1/sandboxes/" + sb.ID, `null`, "JSON object"},
		{"POST", "/v1/sandboxes/" + sb.ID + "/snapshots", `"x"`, "JSON object"},
	} {
		status, code, msg := api(t, s, s.key, c.method, c.path, c.body)
		if status != 400 || code != "invalid_request" || !strings.Contains(msg, c.want) {
			t.Errorf("%s %s %s → %d %s %q; want 400 invalid_request with %q", c.method, c.path, c.body, status, code, msg, c.want)
		}
	}
	// No sandbox came of the refused creates.
	list, err := s.client().ListSandboxes(context.Background(), nil, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range list {
		if x.ID != sb.ID && x.CreatedAt.After(sb.CreatedAt) {
			t.Errorf("a refused create made sandbox %s", x.ID)
		}
	}
}

// Issue 11 item 7: a download whose file shrinks midway ends in an error
// for the client, never in a short body taken for the whole file.
func TestDownloadBrokenMidwayIsAnError(t *testing.T) {
	s := sharedServer(t)
	sb := newSandbox(t, s, client.CreateSandboxRequest{})
	ctx := context.Background()
	c := s.client()
	if _, err := c.WriteFile(ctx, sb.ID, "big.bin", bytes.NewReader(make([]byte, 96<<20))); err != nil {
		t.Fatal(err)
	}
	rc, err := c.ReadFile(ctx, sb.ID, "big.bin")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, make([]byte, 1<<10)); err != nil {
		t.Fatal(err)
	}
	mustExec(t, s, sb.ID, "truncate -s 1M big.bin")
	n, err := io.Copy(io.Discard, rc)
	if err == nil {
		t.Fatalf("the download of a file that shrank midway ended cleanly after %d bytes", n+1<<10)
	}
}
