package gvisor

import (
	"encoding/json"
	"errors"
	"io/fs"
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

// sandboxMemoryLimit is the host memory limit a sandbox was started with
// (hostMemoryLimit of its spec's memory), read from its bundle in dir; 0
// for none.
func sandboxMemoryLimit(dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return 0
	}
	var spec struct {
		Linux ociLinux `json:"linux"`
	}
	if json.Unmarshal(b, &spec) != nil || spec.Linux.Resources == nil || spec.Linux.Resources.Memory == nil || spec.Linux.Resources.Memory.Limit <= 0 {
		return 0
	}
	return hostMemoryLimit(int(spec.Linux.Resources.Memory.Limit >> 20))
}

// setMemoryLimit writes the memory limit of cgroup rel.
func setMemoryLimit(rel string, limit int64) error {
	f, _ := memoryLimitFile(rel)
	if f == "" {
		return fs.ErrNotExist
	}
	return os.WriteFile(f, []byte(strconv.FormatInt(limit, 10)), 0o644)
}

// narrowMemoryLimit sets the memory limit of cgroup rel back to was. Under
// cgroup v1 the kernel reclaims what it can (the page cache of the image
// just written) and refuses with EBUSY what it cannot; under v2 a limit
// below what cannot be reclaimed is an OOM kill, so it is written only
// once the sandbox's memory less its file cache is below was. It reports
// whether the limit is was, or the cgroup gone.
func narrowMemoryLimit(rel string, was int64) bool {
	limit, usage := memoryLimitFile(rel)
	if limit == "" {
		return true
	}
	if strings.HasSuffix(limit, "memory.max") {
		n, ok := readBytes(usage)
		if !ok || n-statBytes(filepath.Join(filepath.Dir(limit), "memory.stat"), "file") >= was {
			return false
		}
	}
	err := os.WriteFile(limit, []byte(strconv.FormatInt(was, 10)), 0o644)
	return err == nil || errors.Is(err, fs.ErrNotExist)
}

// statBytes reads one key of a cgroup's memory.stat; 0 for none.
func statBytes(f, key string) int64 {
	b, err := os.ReadFile(f)
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(l, " "); ok && k == key {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// memWidening is a sandbox's memory limit widened for checkpoints.
type memWidening struct {
	was         int64 // its limit out of checkpoints, as it was started
	checkpoints int   // under way
	narrowing   bool  // a narrowLater is trying
}

// widenForCheckpoint widens the memory limit of sandbox id (container
// cid) for a checkpoint; call the returned func when the checkpoint has
// ended, however it ended. The limit then goes back to the one the sandbox
// was started with (narrowLater), at once when the kernel can reclaim what
// is over it; the sentry keeps some of what the checkpoint took for a
// while, and a limit written below what it holds would be an OOM kill.
func (r *Runtime) widenForCheckpoint(id, cid string) func() {
	rel := cgroupPath(cid)
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.widened[rel]
	if w == nil {
		was := sandboxMemoryLimit(r.dir(id))
		if was == 0 {
			return func() {} // no limit of ours to widen
		}
		w = &memWidening{was: was}
		r.widened[rel] = w
	}
	if err := setMemoryLimit(rel, w.was*checkpointMemoryFactor); err != nil {
		r.log.Warn("widening a sandbox's memory limit for a checkpoint", "container", cid, "err", err)
	}
	w.checkpoints++
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		w.checkpoints--
		if w.checkpoints == 0 && !w.narrowing && r.widened[rel] == w {
			w.narrowing = true
			go r.narrowLater(rel, w)
		}
	}
}

// narrowEvery paces narrowLater's tries.
const narrowEvery = 10 * time.Second

// narrowLater sets the memory limit of cgroup rel back to w.was: at once
// if it can, else every narrowEvery until it can, the sandbox stops
// (forgetWidened), a checkpoint begins (whose end tries again), or the
// runtime closes.
func (r *Runtime) narrowLater(rel string, w *memWidening) {
	logged := false
	for {
		r.mu.Lock()
		switch {
		case r.widened[rel] != w: // the sandbox stopped
			r.mu.Unlock()
			return
		case w.checkpoints > 0:
			w.narrowing = false
			r.mu.Unlock()
			return
		case narrowMemoryLimit(rel, w.was):
			delete(r.widened, rel)
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		if !logged {
			logged = true
			r.log.Info("a sandbox holds more memory than its limit since a checkpoint; its limit stays widened until it holds less", "cgroup", rel, "limit_bytes", w.was)
		}
		select {
		case <-time.After(narrowEvery):
		case <-r.stopRotate:
			return
		}
	}
}

// narrowAdopted sets the memory limit of sandbox id (container cid), one
// an earlier run of the server started, back to the one it was started
// with when a checkpoint of that run widened it and the run ended (a
// shutdown, a crash) before narrowLater could: it kept three times its
// limit for the rest of its life.
func (r *Runtime) narrowAdopted(id, cid string) {
	rel := cgroupPath(cid)
	was := sandboxMemoryLimit(r.dir(id))
	if was == 0 {
		return
	}
	f, _ := memoryLimitFile(rel)
	if now, ok := readBytes(f); !ok || now <= was {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.widened[rel] != nil {
		return // this run widened it itself: its checkpoint's end narrows it
	}
	w := &memWidening{was: was, narrowing: true}
	r.widened[rel] = w
	go r.narrowLater(rel, w)
}

// forgetWidened drops the widening record of container cid, which stops.
func (r *Runtime) forgetWidened(cid string) {
	r.mu.Lock()
	delete(r.widened, cgroupPath(cid))
	r.mu.Unlock()
}
