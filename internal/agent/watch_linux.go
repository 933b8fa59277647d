package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// watcher is one inotify instance following a directory, and with
// recursive the directories beneath it.
type watcher struct {
	t         fileTarget // the watched directory, and as whom watches are added
	recursive bool
	f         *os.File // the inotify descriptor, non-blocking, on Go's poller
	dirs      map[int32]string
	wds       map[string]int32
	// The creates reported lately, by path, with their inode: a file made
	// in a new directory between its watch's start and the walk of it
	// shows in both, and is reported once (see reportCreate).
	created map[string]uint64
	// Uploads: their temp files are left out, and the rename of one into
	// place (its cookie in moved, with whether it replaced a file) is a
	// create or a write of the file.
	uploads *uploadTemps
	moved   map[uint32]bool
}

// maxCreated bounds watcher.created; past it the record starts again.
const maxCreated = 4096

const watchMask = unix.IN_CREATE | unix.IN_MODIFY | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
	unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR | unix.IN_EXCL_UNLINK

// newWatcher watches t's directory, which exists. Call it with t's
// credentials (t.run): a watch needs read access to the directory.
func newWatcher(t fileTarget, recursive bool, uploads *uploadTemps) (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
			return nil, pandastack.Errorf(pandastack.EConflict, "the sandbox has no inotify instance to spare for a watch (%v)", err)
		}
		return nil, fmt.Errorf("inotify_init1: %w", err)
	}
	w := &watcher{t: t, recursive: recursive, f: os.NewFile(uintptr(fd), "inotify"), dirs: map[int32]string{}, wds: map[string]int32{}, created: map[string]uint64{}, uploads: uploads, moved: map[uint32]bool{}}
	if err := w.addTree(t.path, nil); err != nil {
		w.close()
		return nil, err
	}
	return w, nil
}

func (w *watcher) close() { w.f.Close() }

// maxFound bounds the creates one directory made or moved in reports
// for what it already held; past it an overflow says to list it.
const maxFound = 1000

// addTree watches dir, and with recursive every directory beneath it (as
// the caller's credentials allow: a directory the user may not read is
// left out, as are those a walk finds gone, and the kernel's
// pseudo-filesystems). With found, what the walk finds beneath dir is
// reported there as created: a directory made with files in it, or moved
// in whole, shows its contents, which were there before its watch was (at
// most maxFound, then an overflow).
func (w *watcher) addTree(dir string, found *[]agentproto.FileEvent) error {
	if err := w.add(dir); err != nil || !w.recursive {
		return err
	}
	reported := 0
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			if p == dir {
				return fsError(err, p, false)
			}
			return fs.SkipDir // unreadable or gone: not followed
		case p == dir:
			return nil
		case d.IsDir() && slices.ContainsFunc(agentproto.PseudoFS, func(pseudo string) bool { return p == pseudo }):
			return fs.SkipDir
		}
		if found != nil && !isUploadTemp(d.Name()) && w.reportCreate(p) {
			reported++
			switch {
			case reported <= maxFound:
				rel, _ := filepath.Rel(w.t.path, p)
				*found = append(*found, agentproto.FileEvent{Type: pandastack.FileEventCreate, Path: p, Name: rel, IsDir: d.IsDir()})
			case reported == maxFound+1:
				*found = append(*found, agentproto.FileEvent{Type: pandastack.FileEventOverflow})
			}
		}
		if !d.IsDir() {
			return nil
		}
		if err := w.add(p); err != nil {
			if pandastack.IsCode(err, pandastack.EConflict) {
				return err // over the limit: the watch cannot be whole
			}
			return fs.SkipDir
		}
		return nil
	})
}

// reportCreate says whether a create of p is news: not when the same file
// (its inode) was reported created at p already, by its event or by a
// walk, and nothing removed or renamed it since. One that is gone is
// reported (its removal follows).
func (w *watcher) reportCreate(p string) bool {
	var st unix.Stat_t
	if unix.Lstat(p, &st) != nil {
		delete(w.created, p)
		return true
	}
	if ino, ok := w.created[p]; ok && ino == st.Ino {
		return false
	}
	if len(w.created) >= maxCreated {
		clear(w.created)
	}
	w.created[p] = st.Ino
	return true
}

// forgetCreated drops the record of creates at p and beneath it (a
// directory removed or moved away: what comes back there is news).
func (w *watcher) forgetCreated(p string) {
	for q := range w.created {
		if q == p || isUnder(q, p) {
			delete(w.created, q)
		}
	}
}

// add watches one directory.
func (w *watcher) add(dir string) error {
	if _, ok := w.wds[dir]; ok {
		return nil
	}
	if len(w.dirs) >= maxWatchedDirs {
		return pandastack.Errorf(pandastack.EConflict, "%s holds more than %d directories, the most one watch follows: watch a directory deeper down, or without recursive", w.t.path, maxWatchedDirs)
	}
	wd, err := unix.InotifyAddWatch(int(w.f.Fd()), dir, watchMask)
	if err != nil {
		if errors.Is(err, unix.ENOSPC) {
			return pandastack.Errorf(pandastack.EConflict, "the sandbox's inotify watches are used up (%v): watch fewer directories", err)
		}
		return fsError(&os.PathError{Op: "watch", Path: dir, Err: err}, dir, false)
	}
	w.dirs[int32(wd)], w.wds[dir] = dir, int32(wd)
	return nil
}

// forget stops following dir and the directories beneath it (moved out of
// the watch: inotify would follow them to their new place).
func (w *watcher) forget(dir string) {
	for p, wd := range w.wds {
		if p == dir || isUnder(p, dir) {
			unix.InotifyRmWatch(int(w.f.Fd()), uint32(wd))
			delete(w.wds, p)
			delete(w.dirs, wd)
		}
	}
}

func isUnder(p, dir string) bool {
	return len(p) > len(dir) && p[len(dir)] == '/' && p[:len(dir)] == dir
}

// run reads changes and hands them to emit, a batch at a time, until ctx
// ends (nil), the watched directory goes (nil, after its event), a new
// directory puts the watch over its limit (EConflict), or emit or a read
// fails.
func (w *watcher) run(ctx context.Context, emit func([]agentproto.FileEvent) error) error {
	stop := context.AfterFunc(ctx, func() { w.f.SetReadDeadline(time.Now()) })
	defer stop()
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reading inotify events: %w", err)
		}
		evs, ended, perr := w.parse(buf[:n])
		if len(evs) > 0 {
			if err := emit(evs); err != nil {
				return err
			}
		}
		if ended || perr != nil {
			return perr
		}
	}
}

// parse turns a read's inotify records into events; ended says the watched
// directory itself went, err that the watch cannot go on whole.
func (w *watcher) parse(b []byte) (evs []agentproto.FileEvent, ended bool, err error) {
	var added []string // directories made or moved in, to follow once parsed
	overflowed := false
	for off := 0; off+unix.SizeofInotifyEvent <= len(b); {
		raw := (*unix.InotifyEvent)(unsafe.Pointer(&b[off]))
		end := off + unix.SizeofInotifyEvent + int(raw.Len)
		if end > len(b) {
			break
		}
		name := string(bytes.TrimRight(b[off+unix.SizeofInotifyEvent:end], "\x00"))
		off = end
		mask := raw.Mask
		if mask&unix.IN_Q_OVERFLOW != 0 {
			evs = append(evs, agentproto.FileEvent{Type: pandastack.FileEventOverflow})
			overflowed = true
			clear(w.created) // removals were lost too
			continue
		}
		dir, ok := w.dirs[raw.Wd]
		if !ok {
			continue
		}
		if mask&unix.IN_IGNORED != 0 {
			delete(w.dirs, raw.Wd)
			delete(w.wds, dir)
			if dir == w.t.path {
				return evs, true, nil
			}
			continue
		}
		p := dir
		if name != "" {
			p = filepath.Join(dir, name)
		}
		isDir := mask&unix.IN_ISDIR != 0
		if !isDir && isUploadTemp(name) {
			if mask&unix.IN_MOVED_FROM != 0 && raw.Cookie != 0 {
				if len(w.moved) >= maxCreated {
					clear(w.moved)
				}
				w.moved[raw.Cookie] = w.uploads.replaces(name)
			}
			continue // an upload's temp file: its rename into place says it
		}
		replaced, uploaded := w.moved[raw.Cookie]
		if uploaded {
			delete(w.moved, raw.Cookie)
		}
		typ := ""
		switch {
		case uploaded && replaced && mask&unix.IN_MOVED_TO != 0:
			w.reportCreate(p) // its new inode
			typ = pandastack.FileEventWrite
		case mask&(unix.IN_DELETE_SELF|unix.IN_MOVE_SELF) != 0:
			if dir != w.t.path {
				continue // its parent's watch said so
			}
			typ = pandastack.FileEventRemove
			if mask&unix.IN_MOVE_SELF != 0 {
				typ = pandastack.FileEventRename
			}
			evs = append(evs, agentproto.FileEvent{Type: typ, Path: p, IsDir: true})
			return evs, true, nil
		case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
			if !w.reportCreate(p) {
				continue // a walk of its new directory reported it
			}
			typ = pandastack.FileEventCreate
		case mask&unix.IN_MODIFY != 0:
			typ = pandastack.FileEventWrite
		case mask&unix.IN_DELETE != 0:
			typ = pandastack.FileEventRemove
			w.forgetCreated(p)
		case mask&unix.IN_MOVED_FROM != 0:
			typ = pandastack.FileEventRename
			w.forgetCreated(p)
			if isDir {
				w.forget(p)
			}
		case mask&unix.IN_ATTRIB != 0:
			typ = pandastack.FileEventChmod
		default:
			continue
		}
		if isDir && w.recursive && typ == pandastack.FileEventCreate {
			added = append(added, p)
		}
		rel, _ := filepath.Rel(w.t.path, p)
		ev := agentproto.FileEvent{Type: typ, Path: p, Name: rel, IsDir: isDir}
		if n := len(evs); n > 0 && typ == pandastack.FileEventWrite && evs[n-1] == ev {
			continue // writes in a row: one event
		}
		evs = append(evs, ev)
	}
	for _, d := range added {
		// As whom the watch acts; a directory it cannot read is left out,
		// its siblings still followed; one over the limit ends the watch,
		// which would no longer be whole.
		if err := w.t.run(func() error { return w.addTree(d, &evs) }); pandastack.IsCode(err, pandastack.EConflict) {
			return evs, false, err
		}
	}
	if overflowed && w.recursive {
		// Directories made while events were lost are followed from now
		// on (the overflow told the caller to list what is there).
		if err := w.t.run(func() error { return w.addTree(w.t.path, nil) }); pandastack.IsCode(err, pandastack.EConflict) {
			return evs, false, err
		}
	}
	return evs, false, nil
}
