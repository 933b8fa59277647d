package agent

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// heldDir is a directory a file request acting as root (?user=root)
// reached from / one component at a time, held open. The walk does not
// follow a symbolic link the sandbox's code controls: one the sandbox user
// owns, or one in a directory where the user may replace it. Code in the
// sandbox that turned ~/out into a link to /etc would otherwise have a root
// upload, delete or move land in /etc. Links root made where only root
// writes (/bin on a merged /usr, say) are followed as the kernel would.
//
// The request's operations then go through the open directory
// (/proc/self/fd/N/name), not through its path again: code that swaps a
// directory on the way for a link once the walk has passed it does not
// move where they land. Only the directories above the request's path are
// walked; its own last element is its operation's (an upload replaces a
// link there, a delete removes it).
type heldDir struct {
	f *os.File
	// made names the directories the walk made (create), outermost first,
	// each in the one before, the first in madeIn, held open: a failed
	// request removes them again by handle, never by a path the user
	// could redirect.
	madeIn *os.File
	made   []string
}

// at is the path by which name in the held directory is reached without
// resolving its path again; the directory itself for "".
func (d *heldDir) at(name string) string {
	p := "/proc/self/fd/" + strconv.Itoa(int(d.f.Fd()))
	if name == "" {
		return p
	}
	return p + "/" + name
}

// real is the directory's path as the kernel knows it now.
func (d *heldDir) real() (string, error) {
	return os.Readlink(d.at(""))
}

// unmake removes the directories the walk made, innermost first, as long as
// they are empty: a failed request leaves no trace of them. Each is opened
// from the one before without following links (root's own, 0755: nothing
// in the chain is the user's to swap, but a link found there ends it).
func (d *heldDir) unmake() {
	if d.madeIn == nil {
		return
	}
	parents := []int{int(d.madeIn.Fd())}
	defer func() {
		for _, fd := range parents[1:] {
			unix.Close(fd)
		}
	}()
	for _, name := range d.made[:len(d.made)-1] {
		fd, err := unix.Openat(parents[len(parents)-1], name, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			break
		}
		parents = append(parents, fd)
	}
	for i := len(parents) - 1; i >= 0; i-- {
		if unix.Unlinkat(parents[i], d.made[i], unix.AT_REMOVEDIR) != nil {
			return
		}
	}
}

func (d *heldDir) close() {
	if d.madeIn != nil {
		d.madeIn.Close()
		d.madeIn = nil
	}
	d.made = nil
	d.f.Close()
}

// maxLinkHops bounds the links one walk follows, as the kernel's ELOOP.
const maxLinkHops = 40

// holdDir walks to the directory dir as root and holds it open (heldDir).
// With create it makes missing directories, root's and mode 0755, as
// mkdir -p does. Errors name p, the request's path; write says whether the
// request writes (a file in the way is then a conflict, not a miss).
func holdDir(dir, p string, create, write bool) (held *heldDir, err error) {
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fsError(err, p, write)
	}
	h := &heldDir{}
	defer func() {
		if err != nil {
			h.unmake()
			if h.madeIn != nil {
				h.madeIn.Close()
			}
			unix.Close(fd)
		}
	}()
	step := func(next int) {
		unix.Close(fd)
		fd = next
	}
	rest := strings.Split(strings.Trim(dir, "/"), "/")
	cur := "/" // the path walked so far, for messages
	// fromLinks is how many of rest's first components came from links'
	// targets: those are not made (a link leading nowhere is an error, as
	// for mkdir -p), only the request's own.
	fromLinks := 0
	// chained says whether the directory walked to is the last one made:
	// made records a chain, each in the one before, and stops where
	// another made one.
	chained := false
	for hops := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		ownComponent := fromLinks == 0
		if !ownComponent {
			fromLinks--
		}
		switch c {
		case "", ".":
			continue
		case "..":
			next, err := unix.Openat(fd, "..", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, fsError(err, p, write)
			}
			step(next)
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		var st unix.Stat_t
		err := unix.Fstatat(fd, c, &st, unix.AT_SYMLINK_NOFOLLOW)
		recorded := false // made here, and in made's chain
		if errors.Is(err, unix.ENOENT) && create && ownComponent {
			if err = unix.Mkdirat(fd, c, 0o755); err == nil {
				switch {
				case h.madeIn == nil:
					parent, derr := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
					if derr != nil {
						unix.Unlinkat(fd, c, unix.AT_REMOVEDIR)
						return nil, fsError(derr, p, write)
					}
					h.madeIn = os.NewFile(uintptr(parent), cur)
					h.made, recorded = append(h.made, c), true
				case chained:
					h.made, recorded = append(h.made, c), true
				}
			}
			if err == nil || errors.Is(err, unix.EEXIST) { // or made meanwhile
				err = unix.Fstatat(fd, c, &st, unix.AT_SYMLINK_NOFOLLOW)
			}
		}
		if err != nil {
			return nil, fsError(err, p, write)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			opened, err := unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
				// Swapped for a link (or a file) since the look: look again.
				if hops++; hops > maxLinkHops {
					return nil, fsError(unix.ELOOP, p, write)
				}
				rest = append([]string{c}, rest...)
				if !ownComponent {
					fromLinks++
				}
				continue
			}
			if err != nil {
				return nil, fsError(err, p, write)
			}
			step(opened)
			cur = next
			chained = recorded
		case unix.S_IFLNK:
			if hops++; hops > maxLinkHops {
				return nil, fsError(unix.ELOOP, p, write)
			}
			var ds unix.Stat_t
			if err := unix.Fstat(fd, &ds); err != nil {
				return nil, fsError(err, p, write)
			}
			if userControls(&st, &ds) {
				return nil, pandastack.Errorf(pandastack.EPermission, "%s is reached through the symbolic link %s, which the sandbox's user can change: acting as root, the file API does not follow it; give the path it leads to", p, next)
			}
			target, err := readlinkat(fd, c)
			if err != nil {
				return nil, fsError(err, next, false)
			}
			if filepath.IsAbs(target) {
				root, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
				if err != nil {
					return nil, fsError(err, p, write)
				}
				step(root)
				cur = "/"
			}
			targetParts := strings.Split(strings.Trim(target, "/"), "/")
			rest = append(targetParts, rest...)
			fromLinks += len(targetParts)
		default:
			return nil, fsError(unix.ENOTDIR, p, write)
		}
	}
	h.f = os.NewFile(uintptr(fd), dir)
	return h, nil
}

// readlinkat is the target of the link name in the directory fd.
func readlinkat(fd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(fd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// userControls says whether the sandbox user owns the link whose lstat is
// link, or may replace it in its directory, whose stat is dir.
func userControls(link, dir *unix.Stat_t) bool {
	if link.Uid != 0 || dir.Uid == agentproto.UserUID {
		return true
	}
	if dir.Mode&syscall.S_ISVTX != 0 {
		return false // only an entry's owner may replace it, and root owns this one
	}
	return dir.Mode&0o002 != 0 || dir.Mode&0o020 != 0 && dir.Gid == agentproto.UserGID
}

// realOf is the path the kernel knows for what p leads to, links followed:
// p opened, then its descriptor's path.
func realOf(p string) (string, error) {
	fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", &fs.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(fd)
	return os.Readlink("/proc/self/fd/" + strconv.Itoa(fd))
}
