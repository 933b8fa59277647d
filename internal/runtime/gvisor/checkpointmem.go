package gvisor

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// checkpointMemoryFactor is how many times its limit a sandbox's cgroup
// may hold while runsc checkpoints it. The sentry encodes the sandbox's
// kernel state in its own memory, charged to the sandbox: measured here,
// a 512 MiB sandbox (a limit of 576) holding 100,000 empty files used 275
// MB, and 876 MB during its snapshot; at its limit the host's OOM killer
// stopped it, on a snapshot, a fork, or an idle suspend nobody asked for.
const checkpointMemoryFactor = 3

// memoryLimitFile is the memory limit file of cgroup rel (v1 or v2), and
// the file of its usage; "" when there is none.
func memoryLimitFile(rel string) (limit, usage string) {
	for _, f := range [][2]string{
		{filepath.Join("/sys/fs/cgroup/memory", rel, "memory.limit_in_bytes"), filepath.Join("/sys/fs/cgroup/memory", rel, "memory.usage_in_bytes")},
		{filepath.Join("/sys/fs/cgroup", rel, "memory.max"), filepath.Join("/sys/fs/cgroup", rel, "memory.current")},
	} {
		if _, err := os.Stat(f[0]); err == nil {
			return f[0], f[1]
		}
	}
	return "", ""
}

// readBytes reads a cgroup file of one number of bytes; false for none
// ("max", a missing file).
func readBytes(f string) (int64, bool) {
	b, err := os.ReadFile(f)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

// widenMemoryLimit raises the memory limit of cgroup rel to
// checkpointMemoryFactor times was, its limit out of checkpoints (read
// from the cgroup when was is 0). It returns was; 0 when the cgroup has
// no limit to raise.
func widenMemoryLimit(rel string, was int64) (int64, error) {
	limit, _ := memoryLimitFile(rel)
	if limit == "" {
		return 0, nil
	}
	if was == 0 {
		n, ok := readBytes(limit)
		if !ok || n <= 0 || n > math.MaxInt64/checkpointMemoryFactor {
			return 0, nil // unlimited
		}
		was = n
	}
	return was, os.WriteFile(limit, []byte(strconv.FormatInt(was*checkpointMemoryFactor, 10)), 0o644)
}

// narrowMemoryLimit sets the memory limit of cgroup rel back to was, once
// its usage is below was (a v2 cgroup over a lowered limit is OOM-killed;
// v1 refuses with EBUSY). It reports whether the limit is was, or the
// cgroup gone.
func narrowMemoryLimit(rel string, was int64) bool {
	limit, usage := memoryLimitFile(rel)
	if limit == "" {
		return true
	}
	if n, ok := readBytes(usage); ok && n >= was {
		return false
	}
	err := os.WriteFile(limit, []byte(strconv.FormatInt(was, 10)), 0o644)
	return err == nil || errors.Is(err, fs.ErrNotExist)
}

// memWidening is a sandbox's memory limit widened for checkpoints.
type memWidening struct {
	was         int64 // its limit out of checkpoints
	checkpoints int   // under way
	narrowing   bool  // narrowLater is trying
}

// widenForCheckpoint widens the memory limit of container cid for a
// checkpoint; call the returned func when the checkpoint has ended, with
// whether the sandbox runs on (the limit then goes back once its usage
// allows: the sentry keeps some of what the checkpoint took for a while).
func (r *Runtime) widenForCheckpoint(cid string) func(runsOn bool) {
	rel := cgroupPath(cid)
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.widened[rel]
	if w == nil {
		w = &memWidening{}
	}
	was, err := widenMemoryLimit(rel, w.was)
	if err != nil || was == 0 {
		if err != nil {
			r.log.Warn("widening a sandbox's memory limit for a checkpoint", "container", cid, "err", err)
		}
		return func(bool) {}
	}
	w.was = was
	w.checkpoints++
	r.widened[rel] = w
	return func(runsOn bool) {
		r.mu.Lock()
		defer r.mu.Unlock()
		w.checkpoints--
		switch {
		case !runsOn:
			delete(r.widened, rel)
		case !w.narrowing:
			w.narrowing = true
			go r.narrowLater(rel, w)
		}
	}
}

// narrowTries and narrowEvery pace narrowLater: ten minutes, then the
// limit stays wide until the next checkpoint's end tries again.
const (
	narrowTries = 60
	narrowEvery = 10 * time.Second
)

// narrowLater sets the memory limit of cgroup rel back to w.was once no
// checkpoint is under way and the usage is below it.
func (r *Runtime) narrowLater(rel string, w *memWidening) {
	for try := 0; ; try++ {
		r.mu.Lock()
		if w.checkpoints == 0 && narrowMemoryLimit(rel, w.was) {
			if r.widened[rel] == w {
				delete(r.widened, rel)
			}
			r.mu.Unlock()
			return
		}
		if try == narrowTries {
			w.narrowing = false
			r.mu.Unlock()
			r.log.Info("a sandbox's memory stays above its limit since a checkpoint; its limit stays widened", "cgroup", rel, "limit_bytes", w.was*checkpointMemoryFactor)
			return
		}
		r.mu.Unlock()
		select {
		case <-time.After(narrowEvery):
		case <-r.stopRotate:
			return
		}
	}
}
