//go:build !linux

package agent

import "log/slog"

// LimitProcesses does nothing here.
func LimitProcesses(log *slog.Logger) {}

func userCanEnter(dir string, uid, gid int) error { return nil }

func (cs *Contexts) watchMemory(log *slog.Logger) {}

func nprocLimit() uint64 { return 0 }
