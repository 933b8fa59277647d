package testutil

import (
	"os/exec"
	"runtime"
	"syscall"
)

// StartWithParent starts cmd so that it gets SIGTERM when this process
// ends, however it ends (a test's -timeout panic, a kill -9): a serve left
// running would keep its sandboxes, network and cgroups. The kernel sends
// the signal when the thread that started the child ends, so every child
// is started from one thread that lives as long as the process.
func StartWithParent(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGTERM
	errc := make(chan error, 1)
	spawner <- func() { errc <- cmd.Start() }
	return <-errc
}

var spawner = make(chan func())

func init() {
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the process
		for start := range spawner {
			start()
		}
	}()
}
