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
