//go:build linux

package agent

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// asUser runs f with the sandbox user's effective uid and gid (and no
// supplementary groups), so that the kernel checks f's file operations as it
// would the user's own: a symlink the user planted towards /etc leads to a
// permission error, not to a write as root.
//
// Credentials are per thread in the kernel (Go's syscall.Setuid changes every
// thread; the raw system calls do not), so f runs on a goroutine locked to
// its own OS thread that switches, runs f and switches back. Only the
// effective ids change, so the saved root uid can switch back. Go starts new
// threads from a clean template thread, never from a locked one, so nothing
// inherits the switched credentials; if switching back fails the goroutine
// exits still locked and Go discards the thread.
func asUser(f func() error) error {
	if !runningAsRoot() {
		return f()
	}
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := setEffective(agentproto.UserUID, agentproto.UserGID, false); err != nil {
			// Partly switched, perhaps: never reuse this thread.
			done <- fmt.Errorf("switch to the sandbox user: %w", err)
			return
		}
		err := f()
		if rerr := setEffective(0, 0, true); rerr != nil {
			done <- fmt.Errorf("switch back to root: %w", rerr)
			return // the thread dies with this goroutine
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}

// setEffective sets this thread's effective uid and gid. Going to a user it
// drops the supplementary groups first (that needs root); going back to root
// it restores the uid first (the gid and groups need it).
func setEffective(uid, gid int, toRoot bool) error {
	call := func(nr, a1, a2, a3 uintptr) error {
		if _, _, e := syscall.RawSyscall(nr, a1, a2, a3); e != 0 {
			return e
		}
		return nil
	}
	keep := ^uintptr(0) // -1: leave unchanged
	steps := []func() error{
		func() error { return call(syscall.SYS_SETGROUPS, 0, 0, 0) },
		func() error { return call(syscall.SYS_SETRESGID, keep, uintptr(gid), keep) },
		func() error { return call(syscall.SYS_SETRESUID, keep, uintptr(uid), keep) },
	}
	if toRoot {
		steps[0], steps[2] = steps[2], steps[0]
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	if toRoot {
		return setAdminHere(false) // root again: CAP_SYS_ADMIN effective again
	}
	return nil
}

// Magic numbers of the pseudo-filesystems, from statfs(2).
const (
	procSuperMagic    = 0x9fa0
	sysfsMagic        = 0x62656572
	devptsSuperMagic  = 0x1cd1
	cgroupSuperMagic  = 0x27e0eb
	cgroup2SuperMagic = 0x63677270
)

// onPseudoFS reports whether the existing path p lies on a kernel
// pseudo-filesystem, wherever it is mounted.
func onPseudoFS(p string) bool {
	var st syscall.Statfs_t
	if syscall.Statfs(p, &st) != nil {
		return false
	}
	switch st.Type {
	case procSuperMagic, sysfsMagic, devptsSuperMagic, cgroupSuperMagic, cgroup2SuperMagic:
		return true
	}
	return false
}

// deviceOf returns the device a file is on, to keep a recursive delete on
// one filesystem.
func deviceOf(fi fs.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Dev)
	}
	return 0
}

// mayRemove says why p (whose Lstat is fi) could not be removed from its
// directory by this thread's effective user, nil if it could: asked
// before a recursive delete empties it. One that emptied the user's home,
// then could not remove it (its parent is root's), destroyed everything it
// then answered was refused.
func mayRemove(p string, fi fs.FileInfo) error {
	parent := filepath.Dir(p)
	pfi, err := os.Stat(parent)
	if err != nil {
		return err
	}
	if deviceOf(pfi) != deviceOf(fi) {
		return &fs.PathError{Op: "remove", Path: p, Err: syscall.EBUSY} // a mount point
	}
	if err := unix.Faccessat(unix.AT_FDCWD, parent, unix.W_OK|unix.X_OK, unix.AT_EACCESS); err != nil {
		return &fs.PathError{Op: "remove", Path: p, Err: err}
	}
	// In a sticky directory (/tmp) only the owner of the entry or of the
	// directory removes it.
	if pfi.Mode()&fs.ModeSticky != 0 {
		euid := uint32(unix.Geteuid())
		owner := func(fi fs.FileInfo) uint32 { return fi.Sys().(*syscall.Stat_t).Uid }
		if euid != 0 && euid != owner(fi) && euid != owner(pfi) {
			return &fs.PathError{Op: "remove", Path: p, Err: syscall.EPERM}
		}
	}
	return nil
}
