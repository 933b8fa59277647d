//go:build linux

package api

import (
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func init() { forwardDialer.Control = userTimeout(forwardUserTimeout) }

// userTimeout sets TCP_USER_TIMEOUT on the sockets a dialer makes: data
// left unacknowledged this long, or keep-alive probes unanswered, fail
// the connection.
func userTimeout(d time.Duration) func(network, address string, c syscall.RawConn) error {
	return func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT, int(d/time.Millisecond))
		}); err != nil {
			return err
		}
		return serr
	}
}
