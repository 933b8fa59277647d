//go:build linux

package agent_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/agentproto"
)

func TestFilesPutGetRoundTrip(t *testing.T) {
	data := make([]byte, 20<<20)
	rand.Read(data)
	want := sha256.Sum256(data)
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		var info agentproto.FileInfo
		st.call(t, http.MethodPut, "/v1/files", q("path", "deep/er/blob.bin"), bytes.NewReader(data), http.StatusOK, &info)
		abs := filepath.Join(cfg.Home, "deep/er/blob.bin")
		if info.Path != abs || info.Name != "blob.bin" || info.Type != "file" || info.Size != int64(len(data)) || info.Mode != "0644" {
			t.Errorf("put answered %+v, want %s, a file of %d bytes, mode 0644", info, abs, len(data))
		}

		resp := st.request(t, context.Background(), http.MethodGet, "/v1/files", q("path", abs), nil)
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("get: status %d", resp.StatusCode)
		}
		if resp.ContentLength != int64(len(data)) {
			t.Errorf("get: Content-Length %d, want %d", resp.ContentLength, len(data))
		}
		h := sha256.New()
		n, err := io.Copy(h, resp.Body)
		if err != nil {
			t.Fatalf("get: %v", err)
		}
		if got := h.Sum(nil); n != int64(len(data)) || !bytes.Equal(got, want[:]) {
			t.Errorf("get: %d bytes with a different sha256", n)
		}

		if os.Geteuid() == 0 {
			for _, p := range []string{abs, filepath.Dir(abs), filepath.Dir(filepath.Dir(abs))} {
				fi, err := os.Stat(p)
				if err != nil {
					t.Fatal(err)
				}
				if sys := fi.Sys().(*syscall.Stat_t); sys.Uid != agentproto.UserUID || sys.Gid != agentproto.UserGID {
					t.Errorf("%s owned by %d:%d, want the sandbox user", p, sys.Uid, sys.Gid)
				}
			}
		}

		// Overwriting replaces the content, and no temp file is left behind.
		st.call(t, http.MethodPut, "/v1/files", q("path", abs), strings.NewReader("short"), http.StatusOK, &info)
		if info.Size != 5 {
			t.Errorf("overwrite: size %d, want 5", info.Size)
		}
		var list []agentproto.FileInfo
		st.call(t, http.MethodGet, "/v1/files/list", q("path", "deep/er"), nil, http.StatusOK, &list)
		if len(list) != 1 || list[0].Name != "blob.bin" {
			t.Errorf("after the uploads the directory holds %+v, want only blob.bin", list)
		}
		// A command run as the user can read and replace the file.
		res := st.exec(t, agentproto.ExecRequest{Cmd: "cat deep/er/blob.bin && echo more > deep/er/blob.bin"})
		if res.stdout.String() != "short" || res.exit.ExitCode != 0 {
			t.Errorf("user command: stdout %q stderr %q exit %d", res.stdout.String(), res.stderr.String(), res.exit.ExitCode)
		}

		st.call(t, http.MethodPut, "/v1/files", q("path", "empty"), nil, http.StatusOK, &info)
		if info.Size != 0 {
			t.Errorf("empty upload: size %d", info.Size)
		}
		resp = st.request(t, context.Background(), http.MethodGet, "/v1/files", q("path", "empty"), nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(b) != 0 {
			t.Errorf("empty download: status %d, %d bytes", resp.StatusCode, len(b))
		}
	})
}

func TestFilesListStatMkdirDelete(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		var info agentproto.FileInfo
		st.call(t, http.MethodPost, "/v1/files/mkdir", q("path", "proj/src"), nil, http.StatusOK, &info)
		if info.Type != "dir" || info.Path != filepath.Join(cfg.Home, "proj/src") {
			t.Errorf("mkdir answered %+v", info)
		}
		st.call(t, http.MethodPost, "/v1/files/mkdir", q("path", "proj/src"), nil, http.StatusOK, &info) // like mkdir -p
		for _, name := range []string{"b.txt", "a.txt"} {
			st.call(t, http.MethodPut, "/v1/files", q("path", "proj/"+name), strings.NewReader(name), http.StatusOK, nil)
		}
		if err := os.Symlink("a.txt", filepath.Join(cfg.Home, "proj/link")); err != nil {
			t.Fatal(err)
		}

		var list []agentproto.FileInfo
		st.call(t, http.MethodGet, "/v1/files/list", q("path", "proj"), nil, http.StatusOK, &list)
		var got []string
		for _, fi := range list {
			got = append(got, fi.Name+":"+fi.Type+":"+strconv.FormatInt(fi.Size, 10))
		}
		if want := "a.txt:file:5 b.txt:file:5 link:symlink:5 src:dir"; !strings.HasPrefix(strings.Join(got, " "), want) {
			t.Errorf("list: %v, want %s…", got, want)
		}

		st.call(t, http.MethodGet, "/v1/files/stat", q("path", filepath.Join(cfg.Home, "proj/a.txt")), nil, http.StatusOK, &info)
		if info.Name != "a.txt" || info.Type != "file" || info.Size != 5 || info.Mode != "0644" || info.ModTime.IsZero() {
			t.Errorf("stat: %+v", info)
		}

		st.callError(t, http.MethodPost, "/v1/files/mkdir", q("path", "proj/a.txt"), nil, http.StatusConflict, "conflict")
		st.callError(t, http.MethodPost, "/v1/files/mkdir", q("path", "proj/a.txt/sub"), nil, http.StatusConflict, "conflict")
		st.callError(t, http.MethodPut, "/v1/files", q("path", "proj/src"), strings.NewReader("x"), http.StatusConflict, "conflict")
		st.callError(t, http.MethodGet, "/v1/files/list", q("path", "proj/a.txt"), nil, http.StatusBadRequest, "invalid_request")

		st.call(t, http.MethodDelete, "/v1/files", q("path", "proj/b.txt"), nil, http.StatusNoContent, nil)
		st.callError(t, http.MethodGet, "/v1/files/stat", q("path", "proj/b.txt"), nil, http.StatusNotFound, "not_found")
		msg := st.callError(t, http.MethodDelete, "/v1/files", q("path", "proj"), nil, http.StatusConflict, "conflict")
		if !strings.Contains(msg, "recursive") {
			t.Errorf("deleting a full directory: message %q does not mention recursive", msg)
		}
		st.call(t, http.MethodDelete, "/v1/files", q("path", "proj/src"), nil, http.StatusNoContent, nil) // empty dir
		st.call(t, http.MethodDelete, "/v1/files", q("path", "proj", "recursive", "1"), nil, http.StatusNoContent, nil)
		if _, err := os.Lstat(filepath.Join(cfg.Home, "proj")); !os.IsNotExist(err) {
			t.Errorf("proj still there after a recursive delete: %v", err)
		}
		st.callError(t, http.MethodDelete, "/v1/files", q("path", "proj"), nil, http.StatusNotFound, "not_found")
		st.callError(t, http.MethodGet, "/v1/files/list", q("path", "proj"), nil, http.StatusNotFound, "not_found")
	})
}

// A file name of up to 255 bytes, the filesystem's own limit, uploads
// (the temp file beside it must not make a longer name); one over it is a
// clear 400.
func TestFilesLongNames(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		for _, name := range []string{strings.Repeat("a", 255), strings.Repeat("é", 127)} {
			var info agentproto.FileInfo
			st.call(t, http.MethodPut, "/v1/files", q("path", name), strings.NewReader("x"), http.StatusOK, &info)
			if b, err := os.ReadFile(filepath.Join(cfg.Home, name)); err != nil || string(b) != "x" {
				t.Errorf("a %d-byte name: %q %v", len(name), b, err)
			}
		}
		st.callError(t, http.MethodPut, "/v1/files", q("path", strings.Repeat("a", 256)), strings.NewReader("x"), http.StatusBadRequest, "invalid_request")
	})
}

func TestFilesErrors(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		msg := st.callError(t, http.MethodGet, "/v1/files", q("path", cfg.Home), nil, http.StatusBadRequest, "invalid_request")
		if !strings.Contains(msg, "directory") || !strings.Contains(msg, "files/list") {
			t.Errorf("downloading a directory: message %q should say it is a directory and to use files/list", msg)
		}
		st.callError(t, http.MethodGet, "/v1/files", q("path", "nope.txt"), nil, http.StatusNotFound, "not_found")
		st.callError(t, http.MethodGet, "/v1/files/stat", q("path", "nope.txt"), nil, http.StatusNotFound, "not_found")
		st.callError(t, http.MethodGet, "/v1/files", nil, nil, http.StatusBadRequest, "invalid_request")
		st.callError(t, http.MethodPut, "/v1/files", q("path", ""), strings.NewReader("x"), http.StatusBadRequest, "invalid_request")
		// A path that names a directory makes no file of that name.
		for _, p := range []string{"zz/", filepath.Join(cfg.Home, "sub") + "/"} {
			msg = st.callError(t, http.MethodPut, "/v1/files", q("path", p), strings.NewReader("x"), http.StatusBadRequest, "invalid_request")
			if !strings.Contains(msg, "ends with /") {
				t.Errorf("PUT %s: %q", p, msg)
			}
			if _, err := os.Lstat(filepath.Join(cfg.Home, strings.TrimSuffix(filepath.Base(p), "/"))); err == nil {
				t.Errorf("PUT %s made a file", p)
			}
		}
		st.callError(t, http.MethodDelete, "/v1/files", q("path", "/", "recursive", "true"), nil, http.StatusBadRequest, "invalid_request")
		st.callError(t, http.MethodGet, "/v1/nothing", nil, nil, http.StatusNotFound, "not_found")
	})
}

func TestFilesRename(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		home := cfg.Home
		read := func(p string) string {
			t.Helper()
			b, err := os.ReadFile(filepath.Join(home, p))
			if err != nil {
				t.Fatalf("read %s: %v", p, err)
			}
			return string(b)
		}
		gone := func(p string) {
			t.Helper()
			if _, err := os.Lstat(filepath.Join(home, p)); !os.IsNotExist(err) {
				t.Errorf("%s still there after the move: %v", p, err)
			}
		}
		put := func(p, s string) {
			st.call(t, http.MethodPut, "/v1/files", q("path", p), strings.NewReader(s), http.StatusOK, nil)
		}
		put("a.txt", "A")
		put("b.txt", "B")
		put("tree/sub/c.txt", "C")

		// A file, into a directory that does not exist yet.
		var info agentproto.FileInfo
		st.call(t, http.MethodPost, "/v1/files/rename", q("path", "a.txt", "to", "new/dir/a2.txt"), nil, http.StatusOK, &info)
		if want := filepath.Join(home, "new/dir/a2.txt"); info.Path != want || info.Type != "file" || info.Size != 1 {
			t.Errorf("rename answered %+v, want the file at %s", info, want)
		}
		if read("new/dir/a2.txt") != "A" {
			t.Error("the moved file lost its content")
		}
		gone("a.txt")

		// An existing destination is refused, and both files are kept.
		msg := st.callError(t, http.MethodPost, "/v1/files/rename", q("path", "b.txt", "to", "new/dir/a2.txt"), nil, http.StatusConflict, "conflict")
		if !strings.Contains(msg, "overwrite=true") {
			t.Errorf("refused move: %q does not say how to replace", msg)
		}
		if read("b.txt") != "B" || read("new/dir/a2.txt") != "A" {
			t.Error("a refused move changed a file")
		}
		st.call(t, http.MethodPost, "/v1/files/rename", q("path", "b.txt", "to", "new/dir/a2.txt", "overwrite", "true"), nil, http.StatusOK, &info)
		if read("new/dir/a2.txt") != "B" {
			t.Error("overwrite=true did not replace the file")
		}
		gone("b.txt")

		// A whole directory, absolute paths; a symlink moves as itself.
		if err := os.Symlink("sub/c.txt", filepath.Join(home, "tree/link")); err != nil {
			t.Fatal(err)
		}
		st.call(t, http.MethodPost, "/v1/files/rename", q("path", filepath.Join(home, "tree"), "to", filepath.Join(home, "moved")), nil, http.StatusOK, &info)
		if info.Type != "dir" || read("moved/sub/c.txt") != "C" || read("moved/link") != "C" {
			t.Errorf("directory move: %+v", info)
		}
		gone("tree")
		st.call(t, http.MethodPost, "/v1/files/rename", q("path", "moved/link", "to", "link2"), nil, http.StatusOK, &info)
		if info.Type != "symlink" {
			t.Errorf("a moved symlink answered as %q", info.Type)
		}
		if target, err := os.Readlink(filepath.Join(home, "link2")); err != nil || target != "sub/c.txt" {
			t.Errorf("the symlink's target became %q (%v)", target, err)
		}

		// A directory replaces only an empty directory, never a file.
		if err := os.Mkdir(filepath.Join(home, "empty"), 0o755); err != nil {
			t.Fatal(err)
		}
		st.callError(t, http.MethodPost, "/v1/files/rename", q("path", "moved", "to", "new", "overwrite", "true"), nil, http.StatusConflict, "conflict")
		st.callError(t, http.MethodPost, "/v1/files/rename", q("path", "moved", "to", "new/dir/a2.txt", "overwrite", "true"), nil, http.StatusConflict, "conflict")
		st.callError(t, http.MethodPost, "/v1/files/rename", q("path", "new/dir/a2.txt", "to", "moved", "overwrite", "true"), nil, http.StatusConflict, "conflict")
		st.call(t, http.MethodPost, "/v1/files/rename", q("path", "moved", "to", "empty", "overwrite", "true"), nil, http.StatusOK, nil)
		if read("empty/sub/c.txt") != "C" {
			t.Error("a directory did not replace the empty one")
		}

		// Into itself, a missing source, bad queries.
		msg = st.callError(t, http.MethodPost, "/v1/files/rename", q("path", "empty", "to", "empty/sub/x"), nil, http.StatusBadRequest, "invalid_request")
		if !strings.Contains(msg, "into itself") {
			t.Errorf("moving a directory into itself: %q", msg)
		}
		st.callError(t, http.MethodPost, "/v1/files/rename", q("path", "nope", "to", "x"), nil, http.StatusNotFound, "not_found")
		st.callError(t, http.MethodPost, "/v1/files/rename", q("path", "link2"), nil, http.StatusBadRequest, "invalid_request")
		st.callError(t, http.MethodPost, "/v1/files/rename", q("path", "link2", "to", "x", "overwrite", "maybe"), nil, http.StatusBadRequest, "invalid_request")
		st.callError(t, http.MethodPost, "/v1/files/rename", q("path", "link2", "to", "/"), nil, http.StatusBadRequest, "invalid_request")
		st.callError(t, http.MethodPost, "/v1/files/rename", q("path", "link2", "to", "/proc/x"), nil, http.StatusBadRequest, "invalid_request")
		st.callError(t, http.MethodPost, "/v1/files/rename", q("path", "link2", "to", "x", "mode", "1"), nil, http.StatusBadRequest, "invalid_request")

		// The same path: nothing moves, the answer describes it.
		st.call(t, http.MethodPost, "/v1/files/rename", q("path", "link2", "to", filepath.Join(home, "link2")), nil, http.StatusOK, &info)
		if info.Type != "symlink" {
			t.Errorf("a move onto itself answered %+v", info)
		}

		if os.Geteuid() == 0 {
			// As the user, a root-owned file cannot be moved out of a
			// root-owned directory; as root it can.
			dir := filepath.Join(home, "rootdir")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "f"), []byte("r"), 0o644); err != nil {
				t.Fatal(err)
			}
			// The refused move leaves no directory it made for the file.
			st.callError(t, http.MethodPost, "/v1/files/rename", q("path", "rootdir/f", "to", "made/for/it/f"), nil, http.StatusForbidden, "permission_denied")
			gone("made")
			st.call(t, http.MethodPost, "/v1/files/rename", q("path", "rootdir/f", "to", "rootdir/g", "user", "root"), nil, http.StatusOK, nil)
		}
	})
}

// A recursive delete the user may not finish deletes nothing when the
// directory itself cannot go (its parent is root's, or sticky and
// another's), and says where it stopped when something inside cannot.
func TestFilesRecursiveDeleteRefusedUpFront(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agent acts as the sandbox user only as root")
	}
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		home := cfg.Home
		mk := func(p string, mode os.FileMode, uid int) {
			t.Helper()
			full := filepath.Join(home, p)
			if err := os.Mkdir(full, mode); err != nil {
				t.Fatal(err)
			}
			os.Chmod(full, mode) // past the umask
			if err := os.Chown(full, uid, uid); err != nil {
				t.Fatal(err)
			}
		}
		file := func(p string) {
			t.Helper()
			full := filepath.Join(home, p)
			if err := os.WriteFile(full, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			os.Chown(full, agentproto.UserUID, agentproto.UserGID)
		}
		kept := func(p string) {
			t.Helper()
			if _, err := os.Lstat(filepath.Join(home, p)); err != nil {
				t.Errorf("%s was deleted by a refused delete: %v", p, err)
			}
		}
		// The user's directory in a directory of root's, as the home in /home.
		mk("rootdir", 0o755, 0)
		mk("rootdir/mine", 0o755, agentproto.UserUID)
		file("rootdir/mine/a.txt")
		msg := st.callError(t, http.MethodDelete, "/v1/files", q("path", "rootdir/mine", "recursive", "true"), nil, http.StatusForbidden, "permission_denied")
		if !strings.Contains(msg, "nothing was deleted") {
			t.Errorf("refused delete: %q", msg)
		}
		kept("rootdir/mine/a.txt")
		// Another's directory in a sticky one, as in /tmp.
		mk("sticky", 0o777|os.ModeSticky, 0)
		mk("sticky/theirs", 0o777, 2000)
		file("sticky/theirs/b.txt")
		st.callError(t, http.MethodDelete, "/v1/files", q("path", "sticky/theirs", "recursive", "true"), nil, http.StatusForbidden, "permission_denied")
		kept("sticky/theirs/b.txt")
		// As root, both go.
		st.call(t, http.MethodDelete, "/v1/files", q("path", "rootdir/mine", "recursive", "true", "user", "root"), nil, http.StatusNoContent, nil)
		st.call(t, http.MethodDelete, "/v1/files", q("path", "sticky/theirs", "recursive", "true", "user", "root"), nil, http.StatusNoContent, nil)
		// Something inside that the user may not delete: where it stopped.
		mk("tree", 0o755, agentproto.UserUID)
		mk("tree/locked", 0o755, 0)
		if err := os.WriteFile(filepath.Join(home, "tree/locked/root.txt"), []byte("r"), 0o644); err != nil {
			t.Fatal(err)
		}
		msg = st.callError(t, http.MethodDelete, "/v1/files", q("path", "tree", "recursive", "true"), nil, http.StatusForbidden, "permission_denied")
		if !strings.Contains(msg, "stopped at "+filepath.Join(home, "tree/locked/root.txt")) || !strings.Contains(msg, "stays deleted") {
			t.Errorf("a delete stopped midway: %q", msg)
		}
	})
}

// A directory the user may read but not enter lists its names (and the
// types its entries give), not an empty list.
func TestFilesListOfADirectoryNotEntered(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the agent acts as the sandbox user only as root")
	}
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		dir := filepath.Join(cfg.Home, "nox")
		if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644)
		os.Chown(dir, agentproto.UserUID, agentproto.UserGID)
		os.Chmod(dir, 0o600)
		var list []agentproto.FileInfo
		st.call(t, http.MethodGet, "/v1/files/list", q("path", "nox"), nil, http.StatusOK, &list)
		var got []string
		for _, fi := range list {
			got = append(got, fi.Name+":"+fi.Type)
		}
		if strings.Join(got, " ") != "a:file sub:dir" {
			t.Errorf("listing a directory not entered: %v, want a:file sub:dir", got)
		}
	})
}

// As root (?user=root) the file API does not follow a link the sandbox's
// code controls: ~/out turned into a link to a directory of root's would
// have a root upload, move or delete land there. A link root made where
// only root writes is followed.
func TestFilesAsRootRefuseTheUsersLinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the user's links and root's differ by owner")
	}
	cfg := testConfig(t)
	st := directStack(t, cfg, 1)
	home := cfg.Home
	protected := t.TempDir() // root's, as /etc
	if err := os.WriteFile(filepath.Join(protected, "kept"), []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	userLink := filepath.Join(home, "out")
	if err := os.Symlink(protected, userLink); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(userLink, agentproto.UserUID, agentproto.UserGID); err != nil {
		t.Fatal(err)
	}
	// Root's own link, but in the user's home: the user may replace it.
	rootLinkInHome := filepath.Join(home, "rootlink")
	if err := os.Symlink(protected, rootLinkInHome); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		method, path string
		q            url.Values
	}{
		{http.MethodPut, "/v1/files", q("path", "out/motd", "user", "root")},
		{http.MethodPut, "/v1/files", q("path", "out/sub/motd", "user", "root")},
		{http.MethodPut, "/v1/files", q("path", "rootlink/motd", "user", "root")},
		{http.MethodDelete, "/v1/files", q("path", "out/kept", "user", "root")},
		{http.MethodPost, "/v1/files/mkdir", q("path", "out/d", "user", "root")},
		{http.MethodPost, "/v1/files/rename", q("path", "mine", "to", "out/moved", "user", "root")},
		{http.MethodGet, "/v1/files/watch", q("path", "out/sub", "user", "root")},
		{http.MethodGet, "/v1/files/stat", q("path", "out/kept", "user", "root")},
		{http.MethodGet, "/v1/files/list", q("path", "out/sub", "user", "root")},
		{http.MethodGet, "/v1/files", q("path", "out/kept", "user", "root")},
	} {
		if c.method == http.MethodPost && c.path == "/v1/files/rename" {
			if err := os.WriteFile(filepath.Join(home, "mine"), []byte("m"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		st.callError(t, c.method, c.path, c.q, strings.NewReader("x"), http.StatusForbidden, "permission_denied")
	}
	ents, _ := os.ReadDir(protected)
	if len(ents) != 1 || ents[0].Name() != "kept" {
		t.Fatalf("root's directory holds %v after the refused requests, want only kept", ents)
	}
	// Root's link in a directory only root writes: followed.
	rootDir := t.TempDir()
	if err := os.Symlink(protected, filepath.Join(rootDir, "etc")); err != nil {
		t.Fatal(err)
	}
	st.call(t, http.MethodPut, "/v1/files", q("path", filepath.Join(rootDir, "etc", "motd"), "user", "root"), strings.NewReader("hello"), http.StatusOK, nil)
	if b, err := os.ReadFile(filepath.Join(protected, "motd")); err != nil || string(b) != "hello" {
		t.Fatalf("through root's link: %q, %v", b, err)
	}
	// As the user, the user's own link is theirs to follow (and root's
	// directory refuses the write, as before).
	st.callError(t, http.MethodPut, "/v1/files", q("path", "out/motd2"), strings.NewReader("x"), http.StatusForbidden, "permission_denied")
}

// Code in the sandbox that swaps a directory on a root request's path for a
// link to root's files after the request looked at the path moves nothing:
// the request goes on in the directory it walked to, held open.
func TestFilesAsRootHoldTheirDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the user's links and root's differ by owner")
	}
	cfg := testConfig(t)
	st := directStack(t, cfg, 1)
	home := cfg.Home
	protected := t.TempDir() // root's, as /etc
	for _, name := range []string{"kept", "secret"} {
		if err := os.WriteFile(filepath.Join(protected, name), []byte("root's"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, moved := filepath.Join(home, "out"), filepath.Join(home, "out.real")
	for _, c := range []struct {
		name, method, path string
		q                  url.Values
		body               string
		// check looks at the directory the request walked to, moved away.
		check func(t *testing.T)
	}{
		{"upload", http.MethodPut, "/v1/files", q("path", "out/motd", "user", "root"), "hello", func(t *testing.T) {
			if b, err := os.ReadFile(filepath.Join(moved, "motd")); err != nil || string(b) != "hello" {
				t.Errorf("the upload is not in the directory walked to: %q, %v", b, err)
			}
		}},
		{"delete", http.MethodDelete, "/v1/files", q("path", "out/kept", "user", "root"), "", func(t *testing.T) {
			if _, err := os.Lstat(filepath.Join(moved, "kept")); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("the delete did not delete in the directory walked to: %v", err)
			}
		}},
		{"mkdir", http.MethodPost, "/v1/files/mkdir", q("path", "out/d", "user", "root"), "", func(t *testing.T) {
			if fi, err := os.Stat(filepath.Join(moved, "d")); err != nil || !fi.IsDir() {
				t.Errorf("mkdir did not make the directory where it walked: %v", err)
			}
		}},
		{"rename", http.MethodPost, "/v1/files/rename", q("path", "mine", "to", "out/moved", "user", "root"), "", func(t *testing.T) {
			if _, err := os.Stat(filepath.Join(moved, "moved")); err != nil {
				t.Errorf("the rename did not land where it walked: %v", err)
			}
		}},
		{"download", http.MethodGet, "/v1/files", q("path", "out/secret", "user", "root"), "", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			os.RemoveAll(moved)
			os.Remove(out)
			if err := os.Mkdir(out, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"kept", "secret"} {
				if err := os.WriteFile(filepath.Join(out, name), []byte("user's"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(home, "mine"), []byte("m"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(out, agentproto.UserUID, agentproto.UserGID); err != nil {
				t.Fatal(err)
			}
			swapped := false
			defer agent.SetRootPlaced(func(p string) {
				if swapped || !strings.HasPrefix(p, out+"/") {
					return // a rename's source, in the home
				}
				swapped = true
				// The user's code: ~/out becomes a link to root's directory.
				if err := os.Rename(out, moved); err != nil {
					t.Error(err)
				}
				if err := os.Symlink(protected, out); err != nil {
					t.Error(err)
				}
				os.Lchown(out, agentproto.UserUID, agentproto.UserGID)
			})()
			resp := st.request(t, t.Context(), c.method, c.path, c.q, strings.NewReader(c.body))
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !swapped {
				t.Fatal("the request never held its directory")
			}
			if resp.StatusCode/100 != 2 {
				t.Fatalf("%s: %d %s", c.name, resp.StatusCode, b)
			}
			if c.method == http.MethodGet && string(b) != "user's" {
				t.Errorf("the download read %q, want the file of the directory walked to", b)
			}
			if c.check != nil {
				c.check(t)
			}
			ents, _ := os.ReadDir(protected)
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			if strings.Join(names, " ") != "kept secret" {
				t.Errorf("root's directory holds %v after the request, want only kept and secret", names)
			}
		})
	}
}

// A rename as root that fails leaves none of the destination's parents it
// made.
func TestFilesAsRootFailedRenameUnmakes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	cfg := testConfig(t)
	st := directStack(t, cfg, 1)
	st.callError(t, http.MethodPost, "/v1/files/rename", q("path", "absent", "to", "new/sub/x", "user", "root"), nil, http.StatusNotFound, "not_found")
	if _, err := os.Lstat(filepath.Join(cfg.Home, "new")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the failed rename left its parents: %v", err)
	}
	// Through a link root made where only root writes, with a "..": the
	// walk follows it as the kernel would.
	rootDir := t.TempDir()
	target := filepath.Join(rootDir, "a", "b")
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a/b/../b", filepath.Join(rootDir, "l")); err != nil {
		t.Fatal(err)
	}
	var fi agentproto.FileInfo
	st.call(t, http.MethodPut, "/v1/files", q("path", filepath.Join(rootDir, "l", "f"), "user", "root"), strings.NewReader("v"), http.StatusOK, &fi)
	if b, err := os.ReadFile(filepath.Join(target, "f")); err != nil || string(b) != "v" {
		t.Fatalf("through root's link: %q, %v", b, err)
	}
	if fi.Path != filepath.Join(rootDir, "l", "f") {
		t.Errorf("the answer names %s, want the path asked for", fi.Path)
	}
	// A link leading nowhere: its target is not made, as mkdir -p makes
	// none.
	if err := os.Symlink(filepath.Join(rootDir, "nowhere"), filepath.Join(rootDir, "dangling")); err != nil {
		t.Fatal(err)
	}
	resp := st.request(t, t.Context(), http.MethodPut, "/v1/files", q("path", filepath.Join(rootDir, "dangling", "f"), "user", "root"), strings.NewReader("v"))
	resp.Body.Close()
	if resp.StatusCode < 400 || resp.StatusCode >= 500 {
		t.Errorf("an upload through a link leading nowhere: %d, want a refusal", resp.StatusCode)
	}
	if _, err := os.Lstat(filepath.Join(rootDir, "nowhere")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the link's target was made: %v", err)
	}
	// A parent that is a file: a delete misses, as the user's does.
	if err := os.WriteFile(filepath.Join(cfg.Home, "afile"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"root", "user"} {
		st.callError(t, http.MethodDelete, "/v1/files", q("path", "afile/x", "user", user), nil, http.StatusNotFound, "not_found")
	}
}

// A listing answers at most maxListed entries, sorted by name; a directory
// that holds more is refused with payload_too_large, saying how to list it.
func TestFilesListBounded(t *testing.T) {
	defer agent.SetMaxListed(2500)()
	cfg := testConfig(t)
	st := directStack(t, cfg, 1)
	dir := filepath.Join(cfg.Home, "many")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	add := func(from, to int) {
		for i := from; i < to; i++ {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("f%05d", i)), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	add(0, 2500)
	var list []agentproto.FileInfo
	st.call(t, http.MethodGet, "/v1/files/list", q("path", "many"), nil, http.StatusOK, &list)
	if len(list) != 2500 || list[0].Name != "f00000" || list[2499].Name != "f02499" {
		t.Fatalf("listed %d entries, first %q", len(list), list[0].Name)
	}
	for i := 1; i < len(list); i++ {
		if list[i-1].Name >= list[i].Name {
			t.Fatalf("not sorted at %d: %q, %q", i, list[i-1].Name, list[i].Name)
		}
	}
	add(2500, 2501)
	st.callError(t, http.MethodGet, "/v1/files/list", q("path", "many"), nil, http.StatusRequestEntityTooLarge, "payload_too_large")
}
