//go:build !linux

package agent

import (
	"errors"
	"log/slog"
	"os"
)

// KeepAdminToItself does nothing here.
func KeepAdminToItself(*slog.Logger) {}

func canSetHostname() bool { return false }

var hostOps = hostnameOps{get: os.Hostname, set: func(string) error { return errors.ErrUnsupported }}
