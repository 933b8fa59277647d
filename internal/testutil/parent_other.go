//go:build !linux

package testutil

import "os/exec"

// StartWithParent starts cmd; only Linux can tie its life to this
// process's.
func StartWithParent(cmd *exec.Cmd) error { return cmd.Start() }
