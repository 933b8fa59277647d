//go:build !linux

package agent

import (
	"errors"
	"log/slog"
	"os"
	"syscall"
	"time"
)

// Reaper starts the agent's commands; the agent runs only on Linux, so
// elsewhere it refuses to start anything. This file keeps the module building.
type Reaper struct{}

// StartReaper returns a Reaper that starts nothing.
func StartReaper(log *slog.Logger) *Reaper { return &Reaper{} }

// Start fails: running commands needs linux.
func (r *Reaper) Start(path string, argv []string, attr *os.ProcAttr) (*Process, error) {
	return nil, errors.New("running commands needs linux")
}

func procAttr(asRoot bool) *syscall.SysProcAttr { return nil }

// KillTree does nothing here.
func KillTree(pid int, mark uint32) {}

func awaitReaped(mark uint32, limit time.Duration) {}

// KillGroupNow does nothing here.
func KillGroupNow(pgid int) {}

// KillDescendants does nothing here.
func KillDescendants(pid int, mark uint32, spareChildren bool) {}

// KillUser cannot here.
func KillUser(keep, keepChildrenOf []int) (killed []int, left int, ok bool) { return nil, 0, false }

// FreezeUserOnKill does nothing here.
func FreezeUserOnKill() {}

func openPTY(cols, rows uint16) (master, tty *os.File, err error) {
	return nil, nil, errors.New("terminals need linux")
}

func resizePTY(master *os.File, cols, rows uint16) {}

func ttyProcAttr() *syscall.SysProcAttr { return nil }

// unread cannot tell elsewhere: nothing waits.
func unread(files ...*os.File) int { return 0 }

// atProcessLimit cannot tell elsewhere.
func atProcessLimit() bool { return false }

// writerless cannot tell elsewhere.
func writerless(files ...*os.File) bool { return false }
