package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// lockDataDir takes an exclusive lock on the data directory for the life of
// this process, so that a second serve on the same directory cannot run
// recovery over the first one's sandboxes. The lock is an flock on
// <dir>/serve.lock, which holds the holder's pid; the kernel drops it when
// the process exits, however it exits. Call release on a clean stop.
func lockDataDir(dir string) (release func(), err error) {
	path := filepath.Join(dir, "serve.lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock the data directory %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		b, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := "another process"
			if pid, perr := strconv.Atoi(string(bytes.TrimSpace(b))); perr == nil {
				holder = fmt.Sprintf("another pandastack serve (pid %d)", pid)
			}
			return nil, fmt.Errorf("the data directory %s is in use by %s; stop it first, or give this server its own --data-dir", dir, holder)
		}
		return nil, fmt.Errorf("lock the data directory %s: %w", dir, err)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { f.Close() }, nil
}
