package gvisor

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// The agent's pipes get room for many frames, and stay non-blocking (a
// read must still end when the channel closes).
func TestGrowPipe(t *testing.T) {
	p := filepath.Join(t.TempDir(), "out.fifo")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	growPipe(f)
	rc, err := f.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var size, flags int
	rc.Control(func(fd uintptr) {
		size, _ = unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0)
		flags, _ = unix.FcntlInt(fd, unix.F_GETFL, 0)
	})
	if size != channelPipeSize {
		t.Errorf("pipe capacity %d, want %d", size, channelPipeSize)
	}
	if flags&unix.O_NONBLOCK == 0 {
		t.Error("the pipe turned blocking")
	}
}
