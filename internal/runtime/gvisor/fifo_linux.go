package gvisor

import (
	"os"

	"golang.org/x/sys/unix"
)

// channelPipeSize is the capacity asked for the agent's pipes (the
// kernel's default is 64 KiB). Streamed output crosses out.fifo in frames
// of up to 64 KiB; with room for several, gVisor's writes seldom wait for
// the server to be scheduled to drain one, which on a busy machine is
// what bounds an exec's output rate.
const channelPipeSize = 1 << 20

// growPipe raises f's pipe capacity to channelPipeSize. It is best effort:
// an unprivileged server may be held to fs.pipe-max-size, and a smaller
// pipe still works.
func growPipe(f *os.File) {
	// Not f.Fd(): that would turn the pipe blocking, and a blocked read
	// would then no longer end when the channel is closed.
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, channelPipeSize) })
	}
}
