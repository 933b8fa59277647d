package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// fileOpTimeout bounds the file operations that walk the filesystem (a
// recursive delete): none runs without a deadline.
const fileOpTimeout = 2 * time.Minute

// fileTarget is the path a file request acts on, and as whom.
type fileTarget struct {
	path string // absolute and clean
	root bool   // act as root (?user=root) instead of the sandbox user
}

// run runs f with the target's credentials. Acting as root, f reaches
// its paths through a place (t.place), never by the request's path.
func (t fileTarget) run(f func() error) error {
	if t.root {
		return f()
	}
	return asUser(f)
}

// place is where a request's operations reach its path: the path itself
// for the sandbox user (the kernel resolves it with the user's rights and
// refuses what they may not do), or, acting as root, the path's name in its
// parent directory held open (heldDir), which code in the sandbox cannot
// redirect once it is held.
type place struct {
	sys  string   // the path the operations use
	held *heldDir // root's parent directory; nil for the user
}

// place readies p for the request's operations. create makes p's missing
// parents, acting as root (the user's are made by mkdirAll in the
// operation, with the user's rights); follow and write are guard's, asked
// again of the held directory's real path. Close the place when done.
func (t fileTarget) place(p string, create, follow, write bool) (*place, error) {
	if !t.root {
		return &place{sys: p}, nil
	}
	// A file in the way of a parent is a conflict where the request makes
	// parents, else a miss, as for the user (mkdirAll, Lstat).
	h, err := holdDir(filepath.Dir(p), p, create, create)
	if err != nil {
		return nil, err
	}
	if rootPlaced != nil {
		rootPlaced(p)
	}
	real, err := h.real()
	if err == nil {
		err = guard(filepath.Join(real, filepath.Base(p)), follow, write)
	}
	if err != nil {
		h.unmake()
		h.close()
		return nil, fsError(err, p, write)
	}
	return &place{sys: h.at(filepath.Base(p)), held: h}, nil
}

// rootPlaced, when set (by tests), is called once a root request's place
// is held, before its operations.
var rootPlaced func(p string)

// dir is the path by which the operations reach the place's parent.
func (pl *place) dir() string { return filepath.Dir(pl.sys) }

// real is the path the place leads to with every link resolved, its last
// element's too.
func (pl *place) real() (string, error) {
	if pl.held == nil {
		return filepath.EvalSymlinks(pl.sys)
	}
	return realOf(pl.sys) // through the held directory, not by the path again
}

// unmake removes the parents the place made, as long as they are empty.
func (pl *place) unmake() {
	if pl.held != nil {
		pl.held.unmake()
	}
}

func (pl *place) close() {
	if pl.held != nil {
		pl.held.close()
	}
}

// target reads ?path= (resolved against the user's home) and ?user=, and
// refuses any query parameter but those and extra.
func (s *Server) target(r *http.Request, extra ...string) (fileTarget, error) {
	q := r.URL.Query()
	if err := agentproto.CheckQuery(q, append([]string{"path", "user"}, extra...)...); err != nil {
		return fileTarget{}, err
	}
	p := q.Get("path")
	if p == "" {
		return fileTarget{}, pandastack.Errorf(pandastack.EInvalid, "missing ?path=: give a path, absolute or relative to %s", s.home)
	}
	if err := agentproto.CheckPath(p); err != nil {
		return fileTarget{}, err
	}
	root, err := agentproto.CheckFileUser(q.Get("user"))
	if err != nil {
		return fileTarget{}, err
	}
	if !filepath.IsAbs(p) {
		p = filepath.Join(s.home, p)
	}
	return fileTarget{path: filepath.Clean(p), root: root}, nil
}

// guard refuses paths the file API must not touch: the kernel's
// pseudo-filesystems (their files block, fail midway or link back to /),
// and for writes and deletes the host's own mounts under /.pandastack.
// Symlinks are resolved first (all of p when the operation follows the last
// one, else only its parent), so a link cannot lead around the check.
func guard(p string, follow, write bool) error {
	real := resolve(p, follow)
	fsOf := real // statfs follows links: without follow, ask of the parent
	if !follow {
		fsOf = filepath.Dir(real)
	}
	pseudo := onPseudoFS(fsOf)
	for _, d := range agentproto.PseudoFS {
		if pseudo || agentproto.Under(p, d) || agentproto.Under(real, d) {
			return pandastack.Errorf(pandastack.EInvalid, "%s is on a pseudo-filesystem (%s): the file API serves regular files only; read such files with exec (e.g. cat)", p, strings.Join(agentproto.PseudoFS, ", "))
		}
	}
	if write && (agentproto.Under(p, agentproto.ProtectedPrefix) || agentproto.Under(real, agentproto.ProtectedPrefix)) {
		return pandastack.Errorf(pandastack.EInvalid, "%s is where PandaStack mounts its agent into the sandbox; it cannot be written or deleted", p)
	}
	return nil
}

// resolve returns p with the symlinks of its longest existing prefix
// resolved; with follow false the last element is kept as it is.
func resolve(p string, follow bool) string {
	dir, last := p, ""
	if !follow && p != "/" {
		dir, last = filepath.Dir(p), filepath.Base(p)
	}
	rest := ""
	for {
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			return filepath.Join(real, rest, last)
		}
		if dir == "/" || dir == "." {
			return p
		}
		rest = filepath.Join(filepath.Base(dir), rest)
		dir = filepath.Dir(dir)
	}
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
		return pandastack.Errorf(pandastack.EPermission, "%s: %v", p, errors.Unwrap(err))
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return pandastack.Errorf(pandastack.ETooLarge, "no space left on the sandbox's disk while writing %s; delete files or write less", p)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return pandastack.Errorf(pandastack.EInvalid, "path too long: %s", p)
	case errors.Is(err, syscall.EBUSY):
		return pandastack.Errorf(pandastack.EInvalid, "%s is a mount point or in use; it cannot be replaced or deleted", p)
	case errors.Is(err, syscall.ENXIO):
		return pandastack.Errorf(pandastack.EInvalid, "%s is not a regular file (a socket or a device)", p)
	case errors.Is(err, syscall.ELOOP):
		return pandastack.Errorf(pandastack.EInvalid, "%s: too many levels of symbolic links", p)
	}
	// Any other failure of the system call is about the user's own file
	// inside the sandbox: say which, rather than "internal".
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return pandastack.Errorf(pandastack.EInvalid, "%s: %v", p, errno)
	}
	return err
}

// fileType is the FileInfo type of a mode (its type bits are enough).
func fileType(m fs.FileMode) string {
	switch {
	case m&fs.ModeSymlink != 0:
		return "symlink"
	case m.IsDir():
		return "dir"
	case m.IsRegular():
		return "file"
	}
	return "other"
}

func fileInfo(p string, fi fs.FileInfo) agentproto.FileInfo {
	return agentproto.FileInfo{
		Name:    filepath.Base(p),
		Path:    p,
		Type:    fileType(fi.Mode()),
		Size:    fi.Size(),
		Mode:    fmt.Sprintf("%04o", fi.Mode().Perm()),
		ModTime: fi.ModTime().UTC(),
	}
}

// entryInfo describes an entry known only by its name and type.
func entryInfo(p string, t fs.FileMode) agentproto.FileInfo {
	return agentproto.FileInfo{Name: filepath.Base(p), Path: p, Type: fileType(t)}
}

// mkdirAll is mkdir -p; run under the target's credentials, what it creates
// belongs to whoever the request acts as.
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
	return nil
}

// topMissing is the outermost directory of dir's that does not exist (dir
// itself, or one of its parents), which mkdirAll(dir) would make first; ""
// when dir exists.
func topMissing(dir string) string {
	top := ""
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil || !errors.Is(err, fs.ErrNotExist) {
			return top
		}
		top = d
		if d == filepath.Dir(d) {
			return top
		}
	}
}

// unmake removes the directories from dir up to top that mkdirAll made,
// as long as they are empty: a failed call leaves no trace of them. Does
// nothing when top is "".
func unmake(dir, top string) {
	if top == "" {
		return
	}
	for d := dir; agentproto.Under(d, top); d = filepath.Dir(d) {
		if os.Remove(d) != nil || d == top {
			return
		}
	}
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
	t, err := s.target(r)
	if err != nil {
		return err
	}
	p := t.path
	if raw := r.URL.Query().Get("path"); strings.HasSuffix(raw, "/") {
		return pandastack.Errorf(pandastack.EInvalid, "path %q ends with /, which names a directory; give the file's path (such as %sdata.csv)", raw, raw)
	}
	if err := guard(p, false, true); err != nil {
		return err
	}
	pl, err := t.place(p, true, false, true)
	if err != nil {
		return err
	}
	defer pl.close()
	var tmp *os.File
	mode := fs.FileMode(0o644)
	replaces := false
	err = t.run(func() error {
		if fi, err := os.Stat(pl.sys); err == nil {
			if fi.IsDir() {
				return pandastack.Errorf(pandastack.EConflict, "%s is a directory; delete it first or upload to a path inside it", p)
			}
			mode = fi.Mode().Perm() // overwriting keeps the mode
			replaces = true
		}
		if err := mkdirAll(pl.dir()); err != nil {
			return fsError(err, filepath.Dir(p), true)
		}
		// A temp file renamed into place: readers never see half an upload.
		var err error
		// Its name is short whatever the file's (a name of up to 255 bytes
		// must upload), with a bit of the file's to tell what it is for.
		if tmp, err = os.CreateTemp(pl.dir(), "."+truncName(filepath.Base(p), 32)+uploadTempMark+"*"); err != nil {
			return fsError(err, p, true)
		}
		s.uploads.add(filepath.Base(tmp.Name()), replaces)
		return nil
	})
	if err != nil {
		return err
	}
	defer func() {
		if tmp != nil {
			tmp.Close()
			t.run(func() error { return os.Remove(tmp.Name()) })
		}
	}()
	body := &bodyReader{r: r.Body}
	if _, err := io.Copy(tmp, body); err != nil {
		if body.err != nil {
			return pandastack.Errorf(pandastack.EInvalid, "upload of %s interrupted: %v", p, body.err)
		}
		return fsError(err, p, true)
	}
	var fi fs.FileInfo
	err = t.run(func() error {
		if err := tmp.Chmod(mode); err != nil {
			return fsError(err, p, true)
		}
		if err := tmp.Close(); err != nil {
			return fsError(err, p, true)
		}
		s.uploads.add(filepath.Base(tmp.Name()), replaces) // stamped afresh: a slow upload's record must outlast it
		if err := os.Rename(tmp.Name(), pl.sys); err != nil {
			return fsError(err, p, true)
		}
		tmp = nil
		var err error
		if fi, err = os.Lstat(pl.sys); err != nil {
			return fsError(err, p, false)
		}
		return nil
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fileInfo(p, fi))
	return nil
}

// getFile sends a regular file. It opens without blocking (a FIFO would
// otherwise wait for a writer forever) and refuses anything not regular.
// A read that fails before anything is sent is an error status; one that
// fails later aborts the response, so the host never takes a truncated
// file for a whole one.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request) error {
	t, err := s.target(r)
	if err != nil {
		return err
	}
	p := t.path
	if err := guard(p, true, false); err != nil {
		return err
	}
	pl, err := t.place(p, false, true, false)
	if err != nil {
		return err
	}
	defer pl.close()
	var f *os.File
	err = t.run(func() error {
		var err error
		f, err = os.OpenFile(pl.sys, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
		return err
	})
	if err != nil {
		return fsError(err, p, false)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fsError(err, p, false)
	}
	if fi.IsDir() {
		return pandastack.Errorf(pandastack.EInvalid, "%s is a directory, not a file; list it with GET /v1/sandboxes/{id}/files/list and download its files one by one", p)
	}
	if !fi.Mode().IsRegular() {
		return pandastack.Errorf(pandastack.EInvalid, "%s is not a regular file (%s); only regular files can be downloaded", p, fileKind(fi.Mode()))
	}
	size := fi.Size()
	var src io.Reader = f
	if size > 0 {
		src = io.LimitReader(f, size) // a file that grows is sent as it was
	}
	buf := make([]byte, 64<<10)
	n, err := io.ReadFull(src, buf)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return pandastack.Errorf(pandastack.EInvalid, "cannot read %s: %v", p, errors.Unwrap(err))
	}
	whole := err != nil // all of it is in buf
	w.Header().Set("Content-Type", "application/octet-stream")
	if size > 0 {
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	} else if whole {
		w.Header().Set("Content-Length", strconv.Itoa(n))
	}
	w.WriteHeader(http.StatusOK)
	sent := int64(n)
	if _, err := w.Write(buf[:n]); err != nil {
		panic(http.ErrAbortHandler)
	}
	if !whole {
		m, err := io.CopyBuffer(w, src, buf)
		sent += m
		if err != nil {
			s.log.Warn("download failed midway; aborting the response", "path", p, "sent", sent, "err", err)
			panic(http.ErrAbortHandler)
		}
	}
	if size > 0 && sent != size {
		s.log.Warn("file shrank during download; aborting the response", "path", p, "sent", sent, "size", size)
		panic(http.ErrAbortHandler)
	}
	return nil
}

func fileKind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "a FIFO"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeSymlink != 0:
		return "a symlink"
	}
	return "mode " + m.Type().String()
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request) error {
	t, err := s.target(r, "recursive")
	if err != nil {
		return err
	}
	p := t.path
	recursive, err := agentproto.ParseBool("recursive", r.URL.Query().Get("recursive"), false)
	if err != nil {
		return err
	}
	if p == "/" {
		return pandastack.Errorf(pandastack.EInvalid, "refusing to delete /")
	}
	if err := guard(p, false, true); err != nil {
		return err
	}
	pl, err := t.place(p, false, false, true)
	if err != nil {
		return err
	}
	defer pl.close()
	ctx, cancel := context.WithTimeout(r.Context(), fileOpTimeout)
	defer cancel()
	err = t.run(func() error {
		fi, err := os.Lstat(pl.sys)
		if err != nil {
			return fsError(err, p, false)
		}
		if fi.IsDir() && recursive {
			if err := mayRemove(pl.sys, fi); err != nil {
				if errors.Is(err, fs.ErrPermission) {
					who := "the sandbox user"
					if t.root {
						who = "root"
					}
					return pandastack.Errorf(pandastack.EPermission, "cannot delete %s: %s may not remove it from %s; nothing was deleted (delete what is in it one by one instead)", p, who, filepath.Dir(p))
				}
				return fsError(err, p, true)
			}
			if err = removeTree(ctx, pl.sys, p, fi); err != nil {
				return treeError(err, p)
			}
			return nil
		} else {
			err = os.Remove(pl.sys)
		}
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return pandastack.Errorf(pandastack.EConflict, "directory %s is not empty; pass recursive=true to delete it with its contents", p)
		}
		if err != nil {
			return fsError(err, p, true)
		}
		return nil
	})
	if err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// treeError says where a recursive delete of top stopped, and that what it
// deleted before stays deleted.
func treeError(err error, top string) error {
	var own *pandastack.Error
	var pe *fs.PathError
	if errors.As(err, &own) || !errors.As(err, &pe) {
		return err // its own message (the deadline), or no path to name
	}
	at := pe.Path
	if !filepath.IsAbs(at) {
		at = filepath.Join(top, at)
	}
	if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
		// Something was made inside while the delete ran.
		return pandastack.Errorf(pandastack.EConflict, "deleting %s stopped at %s: something was created in it meanwhile; what was deleted before that stays deleted", top, at)
	}
	if !errors.As(fsError(err, at, true), &own) {
		return err
	}
	return pandastack.Errorf(own.Code, "deleting %s stopped at %s; what was deleted before that stays deleted", top, own.Message)
}

// removeTree deletes the directory dir (whose Lstat is fi) and everything in
// it. It never follows a symlink (links are deleted, not their targets),
// stays inside dir even if entries are swapped for links meanwhile (it works
// through an os.Root), does not cross into another filesystem, and stops at
// ctx's deadline. Messages name the directory shown.
func removeTree(ctx context.Context, dir, shown string, fi fs.FileInfo) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return shownAs(err, shown)
	}
	// OpenRoot follows a symlink: dir swapped for one since its Lstat
	// (by the sandbox user, under a delete as root) must not lead there.
	if opened, err := root.Stat("."); err != nil || !os.SameFile(opened, fi) {
		root.Close()
		return pandastack.Errorf(pandastack.EConflict, "%s changed while it was being deleted (replaced by a link?); nothing was deleted", shown)
	}
	err = removeIn(ctx, root, shown, ".", deviceOf(fi))
	root.Close()
	if err != nil {
		return err
	}
	return shownAs(os.Remove(dir), shown)
}

// shownAs names p in err, a failure on the path a place's operations use,
// where the caller must see the path it asked for.
func shownAs(err error, p string) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		pe.Path = p
	}
	return err
}

func removeIn(ctx context.Context, root *os.Root, top, rel string, dev uint64) error {
	d, err := root.Open(rel)
	if err != nil {
		return err
	}
	defer d.Close()
	for {
		ents, err := d.ReadDir(256)
		for _, e := range ents {
			if ctx.Err() != nil {
				return pandastack.Errorf(pandastack.ETimeout, "deleting %s did not finish within %s; what was deleted so far stays deleted", top, fileOpTimeout)
			}
			name := path.Join(rel, e.Name())
			if e.IsDir() { // from the directory entry: a symlink is never IsDir
				fi, err := root.Lstat(name)
				if err != nil {
					return err
				}
				if fi.IsDir() {
					if deviceOf(fi) != dev {
						return pandastack.Errorf(pandastack.EInvalid, "%s is a mount point of another filesystem; not deleting across it", filepath.Join(top, name))
					}
					if err := removeIn(ctx, root, top, name, dev); err != nil {
						return err
					}
				}
			}
			if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
		}
		if err == io.EOF || len(ents) == 0 {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// maxListed bounds the entries a listing answers: code in the sandbox can
// make millions of empty files, and their listing was held whole here, on
// the server and in the caller (a variable for tests).
var maxListed = 100_000

// maxListedBytes bounds a listing's JSON (long paths, names of bytes that
// are not UTF-8), below what the server reads of an agent's answer.
const maxListedBytes = 48 << 20

// readDirUpTo reads the entries of directory p, sorted by name, stopping
// once it has more than max.
func readDirUpTo(p string, max int) ([]fs.DirEntry, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var ents []fs.DirEntry
	for len(ents) <= max {
		batch, err := f.ReadDir(1024)
		ents = append(ents, batch...)
		if err == io.EOF || len(batch) == 0 {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return ents, nil
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) error {
	t, err := s.target(r)
	if err != nil {
		return err
	}
	p := t.path
	if err := guard(p, true, false); err != nil {
		return err
	}
	pl, err := t.place(p, false, true, false)
	if err != nil {
		return err
	}
	defer pl.close()
	var out []agentproto.FileInfo
	err = t.run(func() error {
		fi, err := os.Stat(pl.sys)
		if err != nil {
			return fsError(err, p, false)
		}
		if !fi.IsDir() {
			return pandastack.Errorf(pandastack.EInvalid, "%s is a file, not a directory; use GET /v1/sandboxes/{id}/files/stat for its details", p)
		}
		ents, err := readDirUpTo(pl.sys, maxListed)
		if err != nil {
			return fsError(err, p, false)
		}
		if len(ents) > maxListed {
			return pandastack.Errorf(pandastack.ETooLarge, "%s holds more than %d entries, more than a listing answers; list it with exec (ls -f %s | head), or list a directory below it", p, maxListed, p)
		}
		out = make([]agentproto.FileInfo, 0, len(ents))
		for _, e := range ents {
			info, err := e.Info()
			switch {
			case errors.Is(err, fs.ErrNotExist):
				continue // deleted while listing
			case err != nil:
				// Named but not described (a directory the user may read
				// but not enter): the name and its type, no size.
				out = append(out, entryInfo(filepath.Join(p, e.Name()), e.Type()))
				continue
			}
			out = append(out, fileInfo(filepath.Join(p, e.Name()), info))
		}
		return nil
	})
	if err != nil {
		return err
	}
	b, err := json.Marshal(out)
	if err != nil {
		return err
	}
	if len(b) > maxListedBytes {
		return pandastack.Errorf(pandastack.ETooLarge, "the listing of %s is %d MB, more than a listing answers (%d MB: long names); list it with exec (ls -f %s | head), or list a directory below it", p, len(b)>>20, maxListedBytes>>20, p)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(http.StatusOK)
	w.Write(append(b, '\n'))
	return nil
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) error {
	t, err := s.target(r)
	if err != nil {
		return err
	}
	p := t.path
	if err := guard(p, false, false); err != nil {
		return err
	}
	pl, err := t.place(p, false, false, false)
	if err != nil {
		return err
	}
	defer pl.close()
	var fi fs.FileInfo
	if err := t.run(func() (err error) { fi, err = os.Lstat(pl.sys); return }); err != nil {
		return fsError(err, p, false)
	}
	writeJSON(w, http.StatusOK, fileInfo(p, fi))
	return nil
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) error {
	t, err := s.target(r)
	if err != nil {
		return err
	}
	p := t.path
	if err := guard(p, false, true); err != nil {
		return err
	}
	pl, err := t.place(p, true, false, true)
	if err != nil {
		return err
	}
	defer pl.close()
	var fi fs.FileInfo
	err = t.run(func() error {
		if fi, err := os.Stat(pl.sys); err == nil && !fi.IsDir() {
			return pandastack.Errorf(pandastack.EConflict, "%s exists and is a file; delete it first or choose another path", p)
		}
		if err := mkdirAll(pl.sys); err != nil {
			return fsError(err, p, true)
		}
		var err error
		if fi, err = os.Lstat(pl.sys); err != nil {
			return fsError(err, p, false)
		}
		return nil
	})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, fileInfo(p, fi))
	return nil
}

// truncName is name cut to at most n bytes, on a UTF-8 boundary.
func truncName(name string, n int) string {
	if len(name) <= n {
		return name
	}
	for n > 0 && !utf8.RuneStart(name[n]) {
		n--
	}
	return name[:n]
}

// renameFile moves ?path= to ?to= (both resolved against the user's home)
// as a rename within one filesystem does: a file, a whole directory, or a
// symlink itself (never its target). Missing parents of the destination
// are made, as an upload makes them. An existing destination is refused
// unless ?overwrite=true; then a file replaces a file, and a directory an
// empty directory.
func (s *Server) renameFile(w http.ResponseWriter, r *http.Request) error {
	t, err := s.target(r, "to", "overwrite")
	if err != nil {
		return err
	}
	q := r.URL.Query()
	to := q.Get("to")
	if to == "" {
		return pandastack.Errorf(pandastack.EInvalid, "missing ?to=: give the new path, absolute or relative to %s", s.home)
	}
	if err := agentproto.CheckPath(to); err != nil {
		return err
	}
	if !filepath.IsAbs(to) {
		to = filepath.Join(s.home, to)
	}
	to = filepath.Clean(to)
	overwrite, err := agentproto.ParseBool("overwrite", q.Get("overwrite"), false)
	if err != nil {
		return err
	}
	from := t.path
	if from == "/" || to == "/" {
		return pandastack.Errorf(pandastack.EInvalid, "refusing to move / or onto /")
	}
	if to != from && agentproto.Under(to, from) {
		return pandastack.Errorf(pandastack.EInvalid, "cannot move %s into itself (%s)", from, to)
	}
	if err := guard(from, false, true); err != nil {
		return err
	}
	if err := guard(to, false, true); err != nil {
		return err
	}
	src, err := t.place(from, false, false, true)
	if err != nil {
		return err
	}
	defer src.close()
	dst, err := t.place(to, to != from, false, true)
	if err != nil {
		return err
	}
	defer dst.close()
	var fi fs.FileInfo
	err = t.run(func() error {
		if _, err := os.Lstat(src.sys); err != nil {
			return fsError(err, from, false)
		}
		if to != from {
			dir := dst.dir()
			made := topMissing(dir) // the user's; root's place made them
			if err := mkdirAll(dir); err != nil {
				return fsError(err, filepath.Dir(to), true)
			}
			if err := renameError(rename(src.sys, dst.sys, overwrite), from, to, src.sys, dst.sys); err != nil {
				unmake(dir, made)
				return err
			}
		}
		var err error
		if fi, err = os.Lstat(dst.sys); err != nil {
			return fsError(err, to, false)
		}
		return nil
	})
	if err != nil {
		dst.unmake() // the parents root's place made, if they stayed empty
		return err
	}
	writeJSON(w, http.StatusOK, fileInfo(to, fi))
	return nil
}

// rename renames from to to; without overwrite it fails with EEXIST when
// to exists (atomically where the filesystem can). Not os.Rename: it
// refuses any directory as the destination, an empty one included, which
// rename(2) replaces.
func rename(from, to string, overwrite bool) error {
	if !overwrite {
		return renameNoReplace(from, to)
	}
	if err := syscall.Rename(from, to); err != nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: err}
	}
	return nil
}

// renameError says what a failed rename of from to to means for the
// caller; sysFrom and sysTo are where the rename reached them (place.sys).
func renameError(err error, from, to, sysFrom, sysTo string) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, fs.ErrExist) && !errors.Is(err, syscall.ENOTEMPTY):
		fi, serr := os.Lstat(sysTo)
		src, derr := os.Lstat(sysFrom)
		switch {
		case serr == nil && derr == nil && fi.IsDir() && !src.IsDir():
			return pandastack.Errorf(pandastack.EConflict, "%s is a directory; a file cannot replace it (give a path inside it)", to)
		case serr == nil && derr == nil && !fi.IsDir() && src.IsDir():
			return pandastack.Errorf(pandastack.EConflict, "%s is not a directory; a directory cannot replace it", to)
		case serr == nil && fi.IsDir():
			return pandastack.Errorf(pandastack.EConflict, "%s already exists; pass overwrite=true to replace it (a directory replaces only an empty one)", to)
		}
		return pandastack.Errorf(pandastack.EConflict, "%s already exists; pass overwrite=true to replace it", to)
	case errors.Is(err, syscall.ENOTEMPTY):
		return pandastack.Errorf(pandastack.EConflict, "%s is a directory that is not empty; a directory replaces only an empty one", to)
	case errors.Is(err, syscall.EISDIR):
		return pandastack.Errorf(pandastack.EConflict, "%s is a directory; a file cannot replace it (give a path inside it)", to)
	case errors.Is(err, syscall.ENOTDIR):
		if fi, serr := os.Lstat(sysTo); serr == nil && !fi.IsDir() {
			return pandastack.Errorf(pandastack.EConflict, "%s is not a directory; a directory cannot replace it", to)
		}
		return pandastack.Errorf(pandastack.EConflict, "a parent of %s is a file, not a directory", to)
	case errors.Is(err, syscall.EXDEV):
		return pandastack.Errorf(pandastack.EInvalid, "%s and %s are on different filesystems, which a rename cannot cross; copy with exec (cp -a) and delete the original", from, to)
	}
	return fsError(err, to, true)
}

// renameUnlessThere is renameNoReplace where the filesystem cannot do it in
// one step: a look, then the rename (a file made between the two is
// replaced).
func renameUnlessThere(from, to string) error {
	if _, err := os.Lstat(to); err == nil {
		return &os.LinkError{Op: "rename", Old: from, New: to, Err: syscall.EEXIST}
	}
	return rename(from, to, true)
}
