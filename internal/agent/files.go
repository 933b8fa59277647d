package agent

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// pathParam resolves ?path= against the user's home.
func (s *Server) pathParam(r *http.Request) (string, error) {
	p := r.URL.Query().Get("path")
	if p == "" {
		return "", pandastack.Errorf(pandastack.EInvalid, "missing ?path=: give a path, absolute or relative to %s", s.home)
	}
	if strings.IndexByte(p, 0) >= 0 {
		return "", pandastack.Errorf(pandastack.EInvalid, "path holds a NUL byte")
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(s.home, p)
	}
	return filepath.Clean(p), nil
}

// fsError turns a filesystem error on path p into a user-facing one. A
// missing parent directory is "not found" when reading but a "conflict" when
// writing, where a file stands in the way.
func fsError(err error, p string, writing bool) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return pandastack.Errorf(pandastack.ENotFound, "no such file or directory: %s", p)
	case errors.Is(err, syscall.ENOTDIR):
		if writing {
			return pandastack.Errorf(pandastack.EConflict, "a parent of %s is a file, not a directory", p)
		}
		return pandastack.Errorf(pandastack.ENotFound, "no such file or directory: %s (a parent of it is a file)", p)
	case errors.Is(err, fs.ErrExist):
		return pandastack.Errorf(pandastack.EConflict, "%s already exists", p)
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return pandastack.Errorf(pandastack.EConflict, "%s: %v", p, errors.Unwrap(err))
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return pandastack.Errorf(pandastack.ETooLarge, "no space left on the sandbox's disk while writing %s; delete files or write less", p)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return pandastack.Errorf(pandastack.EInvalid, "path too long: %s", p)
	}
	return err
}

func fileInfo(p string, fi fs.FileInfo) agentproto.FileInfo {
	typ := "other"
	switch m := fi.Mode(); {
	case m&fs.ModeSymlink != 0:
		typ = "symlink"
	case m.IsDir():
		typ = "dir"
	case m.IsRegular():
		typ = "file"
	}
	return agentproto.FileInfo{
		Name:    filepath.Base(p),
		Path:    p,
		Type:    typ,
		Size:    fi.Size(),
		Mode:    fmt.Sprintf("%04o", fi.Mode().Perm()),
		ModTime: fi.ModTime().UTC(),
	}
}

// chown gives p to the sandbox user; only a root agent can, and must, since
// the user's commands run unprivileged.
func chown(p string) error {
	if !runningAsRoot() {
		return nil
	}
	return os.Lchown(p, agentproto.UserUID, agentproto.UserGID)
}

// mkdirAll is mkdir -p that gives each directory it creates to the user.
func mkdirAll(dir string) error {
	fi, err := os.Stat(dir)
	if err == nil {
		if fi.IsDir() {
			return nil
		}
		return &fs.PathError{Op: "mkdir", Path: dir, Err: syscall.ENOTDIR}
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := mkdirAll(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		if fi, serr := os.Stat(dir); serr == nil && fi.IsDir() {
			return nil // made concurrently
		}
		return err
	}
	return chown(dir)
}

// bodyReader records a failure to read the upload, to tell it from a failure
// to write the file.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

func (s *Server) putFile(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pathParam(r)
	if err != nil {
		return err
	}
	mode := fs.FileMode(0o644)
	if fi, err := os.Stat(p); err == nil {
		if fi.IsDir() {
			return pandastack.Errorf(pandastack.EConflict, "%s is a directory; delete it first or upload to a path inside it", p)
		}
		mode = fi.Mode().Perm() // overwriting keeps the mode
	}
	dir := filepath.Dir(p)
	if err := mkdirAll(dir); err != nil {
		return fsError(err, dir, true)
	}
	// A temp file renamed into place: readers never see half an upload.
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(p)+".upload-*")
	if err != nil {
		return fsError(err, p, true)
	}
	defer func() {
		if tmp != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	body := &bodyReader{r: r.Body}
	if _, err := io.Copy(tmp, body); err != nil {
		if body.err != nil {
			return pandastack.Errorf(pandastack.EInvalid, "upload of %s interrupted: %v", p, body.err)
		}
		return fsError(err, p, true)
	}
	if err := tmp.Chmod(mode); err != nil {
		return fsError(err, p, true)
	}
	if runningAsRoot() {
		if err := tmp.Chown(agentproto.UserUID, agentproto.UserGID); err != nil {
			return fsError(err, p, true)
		}
	}
	if err := tmp.Close(); err != nil {
		return fsError(err, p, true)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fsError(err, p, true)
	}
	tmp = nil
	fi, err := os.Lstat(p)
	if err != nil {
		return fsError(err, p, false)
	}
	writeJSON(w, http.StatusOK, fileInfo(p, fi))
	return nil
}

func (s *Server) getFile(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pathParam(r)
	if err != nil {
		return err
	}
	f, err := os.Open(p)
	if err != nil {
		return fsError(err, p, false)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fsError(err, p, false)
	}
	if fi.IsDir() {
		return pandastack.Errorf(pandastack.EInvalid, "%s is a directory, not a file; list it with GET /v1/files/list and download its files one by one", p)
	}
	if !fi.Mode().IsRegular() {
		return pandastack.Errorf(pandastack.EInvalid, "%s is not a regular file (mode %s); only regular files can be downloaded", p, fi.Mode().Type())
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	if fi.Size() > 0 {
		// Files such as those in /proc report size 0 and are sent unsized.
		w.Header().Set("Content-Length", strconv.FormatInt(fi.Size(), 10))
		w.WriteHeader(http.StatusOK)
		io.CopyN(w, f, fi.Size())
		return nil
	}
	w.WriteHeader(http.StatusOK)
	io.Copy(w, f)
	return nil
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pathParam(r)
	if err != nil {
		return err
	}
	recursive := false
	if v := r.URL.Query().Get("recursive"); v != "" {
		if recursive, err = strconv.ParseBool(v); err != nil {
			return pandastack.Errorf(pandastack.EInvalid, "recursive=%q: give 1 or true to delete a directory with its contents", v)
		}
	}
	if p == "/" {
		return pandastack.Errorf(pandastack.EInvalid, "refusing to delete /")
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return fsError(err, p, false)
	}
	if fi.IsDir() && recursive {
		err = os.RemoveAll(p)
	} else {
		err = os.Remove(p)
	}
	if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
		return pandastack.Errorf(pandastack.EConflict, "directory %s is not empty; pass recursive=1 to delete it with its contents", p)
	}
	if err != nil {
		return fsError(err, p, true)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pathParam(r)
	if err != nil {
		return err
	}
	fi, err := os.Stat(p)
	if err != nil {
		return fsError(err, p, false)
	}
	if !fi.IsDir() {
		return pandastack.Errorf(pandastack.EInvalid, "%s is a file, not a directory; use GET /v1/files/stat for its details", p)
	}
	ents, err := os.ReadDir(p) // sorted by name
	if err != nil {
		return fsError(err, p, false)
	}
	out := make([]agentproto.FileInfo, 0, len(ents))
	for _, e := range ents {
		info, err := e.Info()
		if err != nil {
			continue // deleted while listing
		}
		out = append(out, fileInfo(filepath.Join(p, e.Name()), info))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pathParam(r)
	if err != nil {
		return err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return fsError(err, p, false)
	}
	writeJSON(w, http.StatusOK, fileInfo(p, fi))
	return nil
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) error {
	p, err := s.pathParam(r)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
		return pandastack.Errorf(pandastack.EConflict, "%s exists and is a file; delete it first or choose another path", p)
	}
	if err := mkdirAll(p); err != nil {
		return fsError(err, p, true)
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return fsError(err, p, false)
	}
	writeJSON(w, http.StatusOK, fileInfo(p, fi))
	return nil
}
