//go:build linux

package agent_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// Issue 11 item 7: a FIFO made to look like a file used to hang the download
// forever (open blocks for a writer).
func TestFilesDownloadFIFOIsRefused(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		if err := syscall.Mkfifo(filepath.Join(cfg.Home, "out.png"), 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		resp := st.request(t, ctx, http.MethodGet, "/v1/files", q("path", "out.png"), nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "not a regular file") {
			t.Fatalf("download of a FIFO: %d %s, want 400 not a regular file", resp.StatusCode, b)
		}
	})
}

// Issue 11 items 6 and 7: the kernel's pseudo-filesystems are refused up
// front, also through a symlink; /proc/self/mem answered 200 with an empty
// body, and a recursive delete under /proc followed its links to /.
func TestFilesPseudoFilesystemsAreRefused(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		if err := os.Symlink("/proc", filepath.Join(cfg.Home, "p")); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			method string
			q      map[string]string
		}{
			{http.MethodGet, map[string]string{"path": "/proc/self/mem"}},
			{http.MethodGet, map[string]string{"path": "p/self/status"}},
			{http.MethodDelete, map[string]string{"path": "/proc/1/task", "recursive": "true"}},
			{http.MethodDelete, map[string]string{"path": "p/self/task", "recursive": "true"}},
			{http.MethodPut, map[string]string{"path": "/sys/kernel/x"}},
			{http.MethodPost, map[string]string{"path": "/dev/newdir"}},
		} {
			path := "/v1/files"
			if c.method == http.MethodPost {
				path = "/v1/files/mkdir"
			}
			qv := q()
			for k, v := range c.q {
				qv.Set(k, v)
			}
			msg := st.callError(t, c.method, path, qv, strings.NewReader("x"), http.StatusBadRequest, "invalid_request")
			if !strings.Contains(msg, "pseudo-filesystem") {
				t.Errorf("%s %v: message %q does not name the pseudo-filesystem", c.method, c.q, msg)
			}
		}
		for _, p := range []string{"/proc", "/sys", "/dev/null"} {
			st.callError(t, http.MethodGet, "/v1/files/list", q("path", p), nil, http.StatusBadRequest, "invalid_request")
		}
		// The link itself is the user's, and can be deleted.
		st.call(t, http.MethodDelete, "/v1/files", q("path", "p"), nil, http.StatusNoContent, nil)
		if _, err := os.Stat("/proc/self/status"); err != nil {
			t.Fatalf("/proc damaged: %v", err)
		}
	})
}

// Issue 11 item 6: a recursive delete removes links, never what they lead to.
func TestFilesRecursiveDeleteKeepsLinkTargets(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		outside := t.TempDir()
		keep := filepath.Join(outside, "keep.txt")
		if err := os.WriteFile(keep, []byte("keep"), 0o666); err != nil {
			t.Fatal(err)
		}
		os.Chmod(outside, 0o777)
		tree := filepath.Join(cfg.Home, "tree")
		for _, d := range []string{"a/b", "c"} {
			st.call(t, http.MethodPost, "/v1/files/mkdir", q("path", filepath.Join(tree, d)), nil, http.StatusOK, nil)
		}
		st.call(t, http.MethodPut, "/v1/files", q("path", "tree/c/f.txt"), strings.NewReader("f"), http.StatusOK, nil)
		for _, l := range []string{"a/b/out", "c/out"} {
			if err := os.Symlink(outside, filepath.Join(tree, l)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink(keep, filepath.Join(tree, "keep-link")); err != nil {
			t.Fatal(err)
		}
		st.call(t, http.MethodDelete, "/v1/files", q("path", "tree", "recursive", "true"), nil, http.StatusNoContent, nil)
		if _, err := os.Lstat(tree); !os.IsNotExist(err) {
			t.Errorf("tree still there: %v", err)
		}
		if b, err := os.ReadFile(keep); err != nil || string(b) != "keep" {
			t.Errorf("the link target outside the tree: %q, %v", b, err)
		}
	})
}

// Issue 11 item 9: our own mounts are not the user's to replace.
func TestFilesOwnMountsAreRefused(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		st.callError(t, http.MethodPut, "/v1/files", q("path", agentproto.AgentPath), strings.NewReader("x"), http.StatusBadRequest, "invalid_request")
		st.callError(t, http.MethodPut, "/v1/files", q("path", agentproto.AgentPath, "user", "root"), strings.NewReader("x"), http.StatusBadRequest, "invalid_request")
		st.callError(t, http.MethodDelete, "/v1/files", q("path", agentproto.AgentPath), nil, http.StatusBadRequest, "invalid_request")
		st.callError(t, http.MethodDelete, "/v1/files", q("path", "/.pandastack", "recursive", "true", "user", "root"), nil, http.StatusBadRequest, "invalid_request")
	})
}

// Issue 11 items 9 and 10: one strict reading of every query parameter.
func TestFilesStrictQuery(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		st.call(t, http.MethodPost, "/v1/files/mkdir", q("path", "d/e"), nil, http.StatusOK, nil)
		for _, qv := range []map[string]string{
			{"path": "d", "recursive": "maybe"},
			{"path": "d", "recursiv": "true"},
			{"path": "d", "user": "bob"},
			{"path": strings.Repeat("a/", 50000)},
			{"path": strings.Repeat("x", 300)},
		} {
			v := q()
			for k, x := range qv {
				v.Set(k, x)
			}
			st.callError(t, http.MethodDelete, "/v1/files", v, nil, http.StatusBadRequest, "invalid_request")
		}
		if _, err := os.Stat(filepath.Join(cfg.Home, "d/e")); err != nil {
			t.Fatalf("a refused delete deleted: %v", err)
		}
		st.call(t, http.MethodDelete, "/v1/files", q("path", "d", "recursive", "1"), nil, http.StatusNoContent, nil)
	})
}

// Issue 11 item 12: the file API acts as the sandbox user unless asked to
// act as root, so a link the user planted towards a directory of root's does
// not let an upload write there.
func TestFilesActAsTheSandboxUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to switch to the sandbox user")
	}
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		etc := t.TempDir() // root's, 0755: like /etc
		os.Chmod(etc, 0o755)
		if err := os.Symlink(etc, filepath.Join(cfg.Home, "link")); err != nil {
			t.Fatal(err)
		}
		st.callError(t, http.MethodPut, "/v1/files", q("path", "link/x"), strings.NewReader("owned"), http.StatusForbidden, "permission_denied")
		st.callError(t, http.MethodPost, "/v1/files/mkdir", q("path", "link/dir"), nil, http.StatusForbidden, "permission_denied")
		if ents, _ := os.ReadDir(etc); len(ents) != 0 {
			t.Fatalf("an upload as the user wrote into root's directory: %v", ents)
		}
		// Root's file cannot be read or deleted by the user either.
		if err := os.WriteFile(filepath.Join(etc, "secret"), []byte("s"), 0o600); err != nil {
			t.Fatal(err)
		}
		st.callError(t, http.MethodGet, "/v1/files", q("path", "link/secret"), nil, http.StatusForbidden, "permission_denied")
		st.callError(t, http.MethodDelete, "/v1/files", q("path", "link/secret"), nil, http.StatusForbidden, "permission_denied")

		// Asked for, root may: at the path itself (through a link in the
		// user's home it does not go, TestFilesAsRootRefuseTheUsersLinks).
		st.call(t, http.MethodPut, "/v1/files", q("path", filepath.Join(etc, "x"), "user", "root"), strings.NewReader("root"), http.StatusOK, nil)
		fi, err := os.Stat(filepath.Join(etc, "x"))
		if err != nil {
			t.Fatal(err)
		}
		if sys := fi.Sys().(*syscall.Stat_t); sys.Uid != 0 {
			t.Errorf("upload as root: owned by uid %d", sys.Uid)
		}
		// What the user uploads is the user's.
		var info agentproto.FileInfo
		st.call(t, http.MethodPut, "/v1/files", q("path", "mine/f"), strings.NewReader("m"), http.StatusOK, &info)
		for _, p := range []string{info.Path, filepath.Dir(info.Path)} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if sys := fi.Sys().(*syscall.Stat_t); sys.Uid != agentproto.UserUID || sys.Gid != agentproto.UserGID {
				t.Errorf("%s owned by %d:%d, want the sandbox user", p, sys.Uid, sys.Gid)
			}
		}
		// The agent is still root afterwards: exec as root works.
		res := st.exec(t, agentproto.ExecRequest{Argv: []string{"id", "-u"}, Root: true})
		if strings.TrimSpace(res.stdout.String()) != "0" {
			t.Errorf("after file operations, exec as root runs as uid %q", res.stdout.String())
		}
		if os.Geteuid() != 0 {
			t.Fatalf("the test process lost root: euid %d", os.Geteuid())
		}
	})
}

// A file that shrinks while it is sent aborts the download: the client
// sees an error, never a short body taken for the whole file.
func TestFilesDownloadAbortsWhenTheFileShrinks(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		p := filepath.Join(cfg.Home, "big.bin")
		if err := os.WriteFile(p, make([]byte, 64<<20), 0o644); err != nil {
			t.Fatal(err)
		}
		resp := st.request(t, context.Background(), http.MethodGet, "/v1/files", q("path", p), nil)
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		if err := os.Truncate(p, 1<<20); err != nil {
			t.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		if err == nil {
			t.Fatalf("read %d bytes of a file that shrank mid-download without an error", n)
		}
	})
}
