package agent

import (
	"os"

	"golang.org/x/sys/unix"
)

// growPipe asks for size bytes of room in f's pipe (the default is 64 KiB).
// It is best effort: a smaller pipe still works, only with more wakeups.
func growPipe(f *os.File, size int) {
	// Not f.Fd(): that would turn the pipe blocking.
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, size) })
	}
}
