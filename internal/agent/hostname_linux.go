package agent

import (
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
// effective set. The thread is never unlocked: its goroutine ends locked
// to it, and Go then ends the thread, capability and all. A locked thread
// does not start others (Go has its template thread do that), so none
// inherits the raised set.
func withAdmin(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		data[adminWord].Effective |= adminBit
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
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
