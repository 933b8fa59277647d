package agent

import (
	"os"

	"golang.org/x/sys/unix"
)

// unread returns how many bytes wait unread in files (pipes, a terminal's
// master): FIONREAD, which Linux also names TIOCINQ. A file that cannot
// tell, or is closed, counts 0.
func unread(files ...*os.File) int {
	n := 0
	for _, f := range files {
		rc, err := f.SyscallConn()
		if err != nil {
			continue
		}
		rc.Control(func(fd uintptr) {
			if v, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ); err == nil && v > 0 {
				n += v
			}
		})
	}
	return n
}

// writerless reports whether every file of files has no writer left: a
// poll of its read end says POLLHUP. What such a pipe holds is all it will
// ever hold. False when it cannot tell.
func writerless(files ...*os.File) bool {
	for _, f := range files {
		rc, err := f.SyscallConn()
		if err != nil {
			return false
		}
		hup := false
		rc.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if n, err := unix.Poll(fds, 0); err == nil && n == 1 && fds[0].Revents&unix.POLLHUP != 0 {
				hup = true
			}
		})
		if !hup {
			return false
		}
	}
	return true
}
