package gvisor

import (
	"io"
	"os"
	"path/filepath"
	"time"
)

// Each sandbox's agent.log is the stderr of runsc and of the agent inside,
// written through a descriptor the sandbox holds (opened O_APPEND), so it
// cannot be reopened under a new name. It is rotated the copytruncate way:
// copied to agent.log.1 (replacing the one kept before), then truncated;
// the sandbox's next write lands at the new end. Lines written between the
// copy and the truncation are lost; that is the price of not stopping the
// writer.

// DefaultMaxAgentLog is the size at which agent.log is rotated.
const DefaultMaxAgentLog = 8 << 20

// rotateLoop rotates every sandbox's agent.log that grew past max, every
// interval, until stop is closed.
func (r *Runtime) rotateLoop(max int64, interval time.Duration, stop <-chan struct{}) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		logs, _ := filepath.Glob(filepath.Join(r.sbxRoot, "*", "agent.log"))
		for _, p := range logs {
			if err := rotateLog(p, max); err != nil {
				r.log.Debug("rotate agent.log", "path", p, "err", err) // e.g. the sandbox went meanwhile
			}
		}
	}
}

// rotateLog keeps p under max bytes: past it, p's content moves to p.1
// (one old file is kept) and p is truncated.
func rotateLog(p string, max int64) error {
	fi, err := os.Stat(p)
	if err != nil || fi.Size() <= max {
		return err
	}
	src, err := os.Open(p)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp := p + ".1.tmp"
	dst, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(dst, src)
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p+".1")
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Truncate(p, 0)
}
