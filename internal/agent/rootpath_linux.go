package agent

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// rootPathSafe refuses a path a file request acting as root (?user=root)
// would reach through a symbolic link the sandbox's code controls: one the
// sandbox user owns, or one in a directory where the user may replace it.
// Code in the sandbox that turned ~/out into a link to /etc would
// otherwise have a root upload, delete or move land in /etc. Only the
// directories above p are walked: the request's own last element is its
// operation's (an upload replaces a link there, a delete removes it).
// Links root made where only root writes (/bin on a merged /usr, say) are
// followed as the kernel would.
//
// This is a check before the operation: code racing it, swapping a
// directory for a link in between, is not stopped by it.
func rootPathSafe(p string) error {
	rest := strings.Split(strings.Trim(filepath.Dir(p), "/"), "/")
	cur := "/"
	for hops := 0; len(rest) > 0; {
		c := rest[0]
		rest = rest[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			cur = filepath.Dir(cur)
			continue
		}
		next := filepath.Join(cur, c)
		fi, err := os.Lstat(next)
		if err != nil {
			return nil // missing: made by root from here on, or the operation says so
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		if hops++; hops > 40 {
			return fsError(syscall.ELOOP, p, true)
		}
		if userControls(cur, fi) {
			return pandastack.Errorf(pandastack.EPermission, "%s is reached through the symbolic link %s, which the sandbox's user can change: acting as root, the file API does not follow it; give the path it leads to", p, next)
		}
		target, err := os.Readlink(next)
		if err != nil {
			return fsError(err, next, false)
		}
		if filepath.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(strings.Trim(target, "/"), "/"), rest...)
	}
	return nil
}

// userControls says whether the sandbox user owns link, an entry of dir,
// or may replace it there.
func userControls(dir string, link fs.FileInfo) bool {
	ls, ok := link.Sys().(*syscall.Stat_t)
	if !ok || ls.Uid != 0 {
		return true
	}
	var ds syscall.Stat_t
	if err := syscall.Stat(dir, &ds); err != nil {
		return true
	}
	if ds.Uid == agentproto.UserUID {
		return true
	}
	if ds.Mode&syscall.S_ISVTX != 0 {
		return false // only an entry's owner may replace it, and root owns this one
	}
	return ds.Mode&0o002 != 0 || ds.Mode&0o020 != 0 && ds.Gid == agentproto.UserGID
}
