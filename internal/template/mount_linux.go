package template

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/mountinfo"
)

// inMountNS runs fn on its own OS thread in a new, private mount namespace.
// Whatever fn mounts, and whatever the processes it starts mount (they
// inherit the thread's namespace), never shows on the host, and the kernel
// drops it all when the thread and those processes end, even if fn's own
// unmounting fails or the builder is killed.
func inMountNS(fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if syscall.Gettid() == syscall.Getpid() {
			// The main thread is never discarded, so never alter it: keep it
			// locked (busy) so the retry lands on another thread.
			defer runtime.UnlockOSThread()
			errc <- inMountNS(fn)
			return
		}
		// No UnlockOSThread from here on: the runtime then ends this thread
		// with the goroutine instead of reusing it in our namespace.
		if err := syscall.Unshare(syscall.CLONE_NEWNS); err != nil {
			errc <- fmt.Errorf("unshare mount namespace: %w", err)
			return
		}
		if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
			errc <- fmt.Errorf("make mounts private: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// mountBuildFS mounts sysfs (read-only) and a minimal /dev into the rootfs
// for package scripts (each command mounts its own proc: chrootProc). Call it inside inMountNS; the returned undo
// unmounts them all and reports anything left mounted.
func mountBuildFS(rootfs string) (undo func() error, err error) {
	var targets []string
	undo = func() error {
		var errs []error
		for i := len(targets) - 1; i >= 0; i-- {
			if err := syscall.Unmount(targets[i], 0); err != nil {
				if err2 := syscall.Unmount(targets[i], syscall.MNT_DETACH); err2 != nil {
					errs = append(errs, fmt.Errorf("unmount %s: %w", targets[i], err))
				}
			}
		}
		if left, err := mountsUnder(rootfs); err != nil {
			errs = append(errs, err)
		} else if len(left) > 0 {
			errs = append(errs, fmt.Errorf("still mounted: %s", strings.Join(left, ", ")))
		}
		return errors.Join(errs...)
	}
	mount := func(source, rel, fstype string, flags uintptr, data string) error {
		target := filepath.Join(rootfs, rel)
		// A symlink here would let the mount land outside the rootfs.
		if st, err := os.Lstat(target); err == nil && !st.IsDir() {
			return fmt.Errorf("mount %s: %s is not a directory", fstype, target)
		}
		if err := os.MkdirAll(target, 0o755); err != nil {
			return err
		}
		if err := syscall.Mount(source, target, fstype, flags, data); err != nil {
			return fmt.Errorf("mount %s on %s: %w", fstype, target, err)
		}
		targets = append(targets, target)
		return nil
	}
	fail := func(err error) (func() error, error) {
		return nil, errors.Join(err, undo())
	}
	const safe = syscall.MS_NOSUID | syscall.MS_NODEV | syscall.MS_NOEXEC
	// No proc here: one mounted by the builder is the host's. Each command
	// in the chroot mounts its own (chrootProc); the directory must be
	// there, and not a symlink out of the rootfs.
	if st, err := os.Lstat(filepath.Join(rootfs, "proc")); err == nil && !st.IsDir() {
		return fail(fmt.Errorf("%s is not a directory", filepath.Join(rootfs, "proc")))
	}
	if err := os.MkdirAll(filepath.Join(rootfs, "proc"), 0o555); err != nil {
		return fail(err)
	}
	if err := mount("sysfs", "sys", "sysfs", safe|syscall.MS_RDONLY, ""); err != nil {
		return fail(err)
	}
	// A fresh tmpfs with the usual nodes, not a bind of the host's /dev, so
	// package scripts cannot touch the host's devices.
	if err := mount("tmpfs", "dev", "tmpfs", syscall.MS_NOSUID|syscall.MS_NOEXEC, "mode=755,size=16m"); err != nil {
		return fail(err)
	}
	dev := filepath.Join(rootfs, "dev")
	for _, d := range []struct {
		name         string
		major, minor uint32
	}{{"null", 1, 3}, {"zero", 1, 5}, {"full", 1, 7}, {"random", 1, 8}, {"urandom", 1, 9}, {"tty", 5, 0}} {
		p := filepath.Join(dev, d.name)
		if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, int(d.major<<8|d.minor)); err != nil {
			return fail(fmt.Errorf("mknod %s: %w", p, err))
		}
		if err := os.Chmod(p, 0o666); err != nil { // mknod honours the umask
			return fail(err)
		}
	}
	for name, target := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1",
		"stderr": "/proc/self/fd/2", "ptmx": "pts/ptmx",
	} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return fail(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dev, "shm"), 0o777); err != nil {
		return fail(err)
	}
	if err := os.Chmod(filepath.Join(dev, "shm"), os.ModeSticky|0o777); err != nil {
		return fail(err)
	}
	if err := mount("devpts", "dev/pts", "devpts", syscall.MS_NOSUID|syscall.MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620"); err != nil {
		return fail(err)
	}
	return undo, nil
}

// mountsUnder lists the mount points at or below dir as the calling thread
// sees them (inside inMountNS that is the private namespace).
func mountsUnder(dir string) ([]string, error) { return mountinfo.Under(dir) }

// lockFile takes an exclusive flock on path, polling so that ctx can cancel
// the wait; waiting is called once if another process holds the lock.
func lockFile(ctx context.Context, path string, waiting func()) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("lock: %w", err)
	}
	for told := false; ; {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing releases the lock
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if !told && waiting != nil {
			waiting()
			told = true
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("waiting for another build: %w", errInterrupted{ctx.Err()})
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// tryLock takes the lock on path if nobody holds it.
func tryLock(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// lockHeld reports whether a process holds the lock file path, without
// making it when it is missing (that is, not held).
func lockHeld(path string) bool {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return true
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}

// syncFS flushes the disks, so the done marker never reaches the disk
// before the files it vouches for. (syncfs(2) would do for one filesystem,
// but package syscall lacks it; a build is rare enough for a full sync.)
func syncFS() { syscall.Sync() }
