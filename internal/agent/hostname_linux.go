package agent

import (
	"log/slog"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// KeepAdminToItself takes CAP_SYS_ADMIN out of the bounding set of every
// thread of the agent: the agent keeps it (its hello sets the hostname
// with it), and no process it starts can have it, one run as root
// included (an exec's permitted set is within the bounding set). Called
// first thing in main: threads made later inherit the set.
func KeepAdminToItself(log *slog.Logger) {
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_CAPBSET_DROP, unix.CAP_SYS_ADMIN, 0); errno != 0 {
		log.Error("taking CAP_SYS_ADMIN out of the bounding set; the hostname is left to the container", "err", errno)
		return
	}
	adminKept = true
}

// adminKept: KeepAdminToItself took CAP_SYS_ADMIN out of the bounding set.
// Without that the hello does not use it (and does not say it names the
// sandbox), so the server resumes it only into its own container.
var adminKept bool

// canSetHostname reports whether the agent holds CAP_SYS_ADMIN, which
// sethostname(2) needs (an agent started by an older server does not),
// and kept it to itself.
func canSetHostname() bool {
	if !adminKept {
		return false
	}
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return false
	}
	return data[unix.CAP_SYS_ADMIN/32].Effective&(1<<(unix.CAP_SYS_ADMIN%32)) != 0
}

// hostOps are the system's hostname calls.
var hostOps = hostnameOps{get: os.Hostname, set: func(name string) error { return unix.Sethostname([]byte(name)) }}
