//go:build linux

package jupyter

import "syscall"

// signalInterrupt sends SIGINT the way a terminal would: to the whole
// process group when the kernel leads one (so a shell command the cell
// started stops too), else to the kernel alone. ipykernel does the same
// for an interrupt_request.
func signalInterrupt(pid int) error {
	if pgid, err := syscall.Getpgid(pid); err == nil && pgid == pid {
		if err := syscall.Kill(-pid, syscall.SIGINT); err == nil {
			return nil
		}
	}
	return syscall.Kill(pid, syscall.SIGINT)
}
