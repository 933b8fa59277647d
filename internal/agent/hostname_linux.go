package agent

import (
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// KeepAdminToItself takes CAP_SYS_ADMIN out of the bounding set of every
// thread of the agent, and out of their effective sets: the agent keeps it
// only in its permitted set, and raises it on one thread for the moment it
// sets the hostname (withAdmin). So no process it starts can have it, one
// run as root included (an exec's permitted set is within the bounding
// set), and nothing else the agent does as root (a file request of
// ?user=root) has it. Called first thing in main: threads made later
// inherit the sets.
func KeepAdminToItself(log *slog.Logger) {
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0); errno != 0 {
		log.Error("taking CAP_SYS_ADMIN out of the bounding set; the hostname is left to the container", "err", errno)
		return
	}
	if err := unix.Capget(&capsHdr, &capsData[0]); err != nil {
		log.Error("reading the agent's capabilities; the hostname is left to the container", "err", err)
		return
	}
	capsData[adminWord].Effective &^= adminBit
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_CAPSET, uintptr(unsafe.Pointer(&capsHdr)), uintptr(unsafe.Pointer(&capsData[0])), 0); errno != 0 {
		log.Error("lowering CAP_SYS_ADMIN; the hostname is left to the container", "err", errno)
		return
	}
	adminKept = true
}

const (
	adminWord = unix.CAP_SYS_ADMIN / 32
	adminBit  = 1 << (unix.CAP_SYS_ADMIN % 32)
)

// capsHdr and capsData are KeepAdminToItself's capset(2) arguments, in
// variables of their own so that they stay where the raw call points.
var (
	capsHdr  = unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	capsData [2]unix.CapUserData
)

// withAdmin runs f on a thread of its own with CAP_SYS_ADMIN raised in its
// effective set, and lowers it again before the thread runs anything else.
// Locked, the thread runs no other goroutine, and Go starts no thread from
// it (its template thread does that), so none inherits the raised set. A
// thread where lowering fails is never unlocked: its goroutine ends locked
// to it, and Go ends the thread. Not on the main thread, which Go would
// keep parked instead (asRealUser has the same guard).
func withAdmin(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if syscall.Gettid() == os.Getpid() {
			errc <- withAdmin(f)
			runtime.UnlockOSThread()
			return
		}
		if err := setAdminHere(true); err != nil {
			if setAdminHere(false) == nil {
				runtime.UnlockOSThread()
			}
			errc <- err
			return
		}
		err := f()
		if lerr := setAdminHere(false); lerr != nil {
			errc <- fmt.Errorf("lowering CAP_SYS_ADMIN: %w", lerr)
			return // the thread ends with this goroutine
		}
		runtime.UnlockOSThread()
		errc <- err
	}()
	return <-errc
}

// setAdminHere raises or lowers CAP_SYS_ADMIN in the calling thread's
// effective set (call it locked to its thread). Lowering also undoes what
// Linux and gVisor do when a thread's effective uid goes back to 0 (its
// permitted set, CAP_SYS_ADMIN included, becomes effective again): every
// switch back to root calls it (setEffective, setThreadIDs).
func setAdminHere(raise bool) error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return err
	}
	has := data[adminWord].Effective&adminBit != 0
	if has == raise {
		return nil
	}
	if raise {
		data[adminWord].Effective |= adminBit
	} else {
		data[adminWord].Effective &^= adminBit
	}
	return unix.Capset(&hdr, &data[0])
}

// adminKept: KeepAdminToItself took CAP_SYS_ADMIN out of the bounding set.
// Without that the hello does not use it (and does not say it names the
// sandbox), so the server resumes it only into its own container.
var adminKept bool

// canSetHostname reports whether the agent holds CAP_SYS_ADMIN, which
// sethostname(2) needs (an agent started by an older server does not),
// and kept it to itself: in its permitted set, to raise it when it does.
func canSetHostname() bool {
	if !adminKept {
		return false
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[adminWord].Permitted&adminBit != 0
}

// hostOps are the system's hostname calls.
var hostOps = hostnameOps{get: os.Hostname, set: func(name string) error {
	return withAdmin(func() error { return unix.Sethostname([]byte(name)) })
}}
