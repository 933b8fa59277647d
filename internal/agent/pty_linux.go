//go:build linux

package agent

import (
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// openPTY makes a pseudo-terminal of the given size and returns its master
// and its terminal end, owned by the sandbox user when the agent is root.
func openPTY(cols, rows uint16) (master, tty *os.File, err error) {
	master, err = os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	var n uint32
	err = control(master, func(fd int) error {
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return err
		}
		if n, err = unix.IoctlGetUint32(fd, unix.TIOCGPTN); err != nil {
			return err
		}
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows})
	})
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("set up the pseudo-terminal: %w", err)
	}
	name := "/dev/pts/" + strconv.FormatUint(uint64(n), 10)
	tty, err = os.OpenFile(name, os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("open %s: %w", name, err)
	}
	if runningAsRoot() {
		os.Chown(name, agentproto.UserUID, agentproto.UserGID)
	}
	return master, tty, nil
}

// resizePTY sets the terminal's size; the shell gets SIGWINCH.
func resizePTY(master *os.File, cols, rows uint16) {
	control(master, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows})
	})
}

// control runs f on the file's descriptor without switching it to blocking
// mode (as Fd would), so Close still interrupts a pending Read.
func control(f *os.File, fn func(fd int) error) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = fn(int(fd)) }); err != nil {
		return err
	}
	return ferr
}

// ttyProcAttr makes the shell a session leader with the terminal (its fd 0)
// as controlling terminal, and drops to the sandbox user.
func ttyProcAttr() *syscall.SysProcAttr {
	a := &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if runningAsRoot() {
		a.Credential = &syscall.Credential{Uid: agentproto.UserUID, Gid: agentproto.UserGID, Groups: []uint32{}}
	}
	return a
}
