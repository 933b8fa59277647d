//go:build !linux

package jupyter

import "errors"

// signalInterrupt is not supported here; the caller falls back to an
// interrupt_request on the control channel.
func signalInterrupt(pid int) error {
	return errors.New("interrupt by signal is not supported on this platform")
}
