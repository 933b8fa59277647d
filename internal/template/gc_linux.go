package template

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/pandastack/pandastack/internal/mountinfo"
)

// mountEntry is one line of a mountinfo file (proc(5)): the device, the
// directory of that filesystem it shows (root) and where (point).
type mountEntry struct{ dev, root, point string }

// inUseBy returns a function that reports a mount, in any mount namespace
// on this machine, of dir or of something beneath it, or "" when there is
// none. A runsc gofer serves a sandbox's root filesystem from a bind mount
// of the template's rootfs in a namespace of its own, where the mount point
// is "/" and only the (device, root) pair names the rootfs; dir is
// therefore translated to its own filesystem's terms through this
// process's mount table. Processes that are gone or unreadable are skipped.
func inUseBy() (func(dir string) string, error) {
	self, err := readMountinfo("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var all []mountEntry
	for _, p := range procs {
		if c := p.Name()[0]; c < '0' || c > '9' {
			continue
		}
		ns, err := os.Readlink(filepath.Join("/proc", p.Name(), "ns", "mnt"))
		if err != nil || seen[ns] {
			continue
		}
		seen[ns] = true
		ents, _ := readMountinfo(filepath.Join("/proc", p.Name(), "mountinfo"))
		all = append(all, ents...)
	}
	return func(dir string) string {
		dir = filepath.Clean(dir)
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			dir = real
		}
		for _, e := range self {
			if under(e.point, dir) {
				return e.point
			}
		}
		// The filesystem dir lives on: the longest mount point above it.
		var host mountEntry
		for _, e := range self {
			if under(dir, e.point) && len(e.point) >= len(host.point) {
				host = e
			}
		}
		if host.point == "" {
			return ""
		}
		rel := filepath.Join(host.root, strings.TrimPrefix(dir, host.point))
		for _, e := range all {
			if e.dev == host.dev && under(e.root, rel) {
				return e.root
			}
		}
		return ""
	}, nil
}

func readMountinfo(path string) ([]mountEntry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		out = append(out, mountEntry{dev: fields[2], root: filepath.Clean(mountinfo.Unescape(fields[3])), point: filepath.Clean(mountinfo.Unescape(fields[4]))})
	}
	return out, sc.Err()
}

// tryLockName takes the build lock of a template name without waiting.
func tryLockName(cacheDir, name string) (func(), error) {
	return tryLock(filepath.Join(cacheDir, templatesDir, "."+name+".lock"))
}

// Hold marks b in use by this process until release is called or the
// process exits, however it exits: a shared flock(2) on its template.json,
// which GC takes for a running server's build and keeps. It fails when b
// is no longer at its place (removed, or replaced by a --force rebuild), or
// a gc is removing it right then. It costs an open file per build held.
func Hold(b Built) (release func(), err error) {
	marker := filepath.Join(b.Dir, markerFile)
	f, err := os.Open(marker)
	if err != nil {
		return nil, fmt.Errorf("hold template build: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("hold template build %s: %w", b.Dir, err)
	}
	// gc renames a build away while it holds the lock exclusively: the
	// marker locked must still be the one at b's place, of b.
	held, err1 := f.Stat()
	now, err2 := os.Stat(marker)
	cur, err3 := readBuilt(b.Dir)
	if err := errors.Join(err1, err2, err3); err != nil || !os.SameFile(held, now) || cur.ID() != b.ID() {
		f.Close()
		return nil, fmt.Errorf("hold template build %s: replaced or removed (%v)", b.Dir, err)
	}
	return func() { f.Close() }, nil
}

// errHeld: a running server holds the build (Hold).
var errHeld = errors.New("in use by a running server (it has resolved the build since it started)")

// lockBuild takes b's template.json exclusively, without waiting: while it
// is held no server takes a Hold of b. It fails with errHeld when one has.
func lockBuild(b Built) (unlock func(), err error) {
	f, err := os.Open(filepath.Join(b.Dir, markerFile))
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, errHeld
		}
		return nil, err
	}
	return func() { f.Close() }, nil
}
