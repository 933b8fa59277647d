package gvisor

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// testMemoryCgroup makes a memory cgroup of the test's own under
// /pandastack (v1 or v2, as the host has) and returns its rel path and
// limit file; cleanup removes it.
func testMemoryCgroup(t *testing.T, cid string) (rel, limit string) {
	t.Helper()
	rel = cgroupPath(cid)
	for _, root := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup"} {
		os.MkdirAll(filepath.Join(root, "pandastack"), 0o755)
		if err := os.Mkdir(filepath.Join(root, rel), 0o755); err == nil {
			dir := filepath.Join(root, rel)
			t.Cleanup(func() { syscall.Rmdir(dir) })
			break
		}
	}
	if limit, _ = memoryLimitFile(rel); limit == "" {
		t.Fatal("no memory cgroup could be made (run as root on a host with cgroups)")
	}
	return rel, limit
}

// A checkpoint widens a sandbox's memory limit from the one it was started
// with, whatever the cgroup says meanwhile, and the limit goes back when
// the checkpoint ends, whether it failed or not; checkpoints at once share
// one widening; a stop forgets it.
func TestCheckpointWidensTheMemoryLimit(t *testing.T) {
	id := fmt.Sprintf("sbx_rtmem%08x", rand.Uint32())
	r := &Runtime{sbxRoot: t.TempDir(), widened: map[string]*memWidening{}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), stopRotate: make(chan struct{})}
	defer close(r.stopRotate)
	rel, limit := testMemoryCgroup(t, id)
	const memMB = 64
	was := hostMemoryLimit(memMB)
	// The bundle's spec, as boot writes it.
	var spec ociSpec
	spec.Linux.Resources = &ociResources{Memory: &struct {
		Limit int64 `json:"limit"`
	}{memMB << 20}}
	b, _ := json.Marshal(spec)
	os.MkdirAll(r.dir(id), 0o755)
	if err := os.WriteFile(filepath.Join(r.dir(id), "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	if sandboxMemoryLimit(r.dir(id)) != was {
		t.Fatalf("limit from the spec: %d, want %d", sandboxMemoryLimit(r.dir(id)), was)
	}
	read := func() int64 {
		t.Helper()
		n, ok := readBytes(limit)
		if !ok {
			t.Fatalf("reading %s", limit)
		}
		return n
	}
	// narrowed waits for narrowLater, which runs at once when it can.
	narrowed := func(what string) {
		t.Helper()
		for range 200 {
			r.mu.Lock()
			_, pending := r.widened[rel]
			r.mu.Unlock()
			if !pending {
				break
			}
			syscall.Nanosleep(&syscall.Timespec{Nsec: 5e6}, nil)
		}
		if got := read(); got != was {
			t.Fatalf("%s: limit %d, want %d", what, got, was)
		}
	}
	setMemoryLimit(rel, was)

	ended := r.widenForCheckpoint(id, id)
	if got := read(); got != was*checkpointMemoryFactor {
		t.Fatalf("during a checkpoint: limit %d, want %d", got, was*checkpointMemoryFactor)
	}
	ended() // a failed checkpoint ends the same way
	narrowed("after a checkpoint")

	// Widened from the start's limit, not from what the cgroup says.
	setMemoryLimit(rel, 5*was)
	ended = r.widenForCheckpoint(id, id)
	if got := read(); got != was*checkpointMemoryFactor {
		t.Fatalf("widened from a cgroup left wide: %d, want %d", got, was*checkpointMemoryFactor)
	}
	second := r.widenForCheckpoint(id, id)
	ended()
	if got := read(); got != was*checkpointMemoryFactor {
		t.Fatalf("narrowed while another checkpoint ran: %d", got)
	}
	second()
	narrowed("after two checkpoints")

	// A run that ended with the limit widened (a shutdown before the
	// narrowing, a crash): the next run's adoption narrows it.
	setMemoryLimit(rel, was*checkpointMemoryFactor)
	r.narrowAdopted(id, id)
	narrowed("after an adoption")
	r.narrowAdopted(id, id) // at its limit: nothing to do
	if len(r.widened) != 0 {
		t.Fatalf("records after adopting a sandbox at its limit: %v", r.widened)
	}

	// A stop drops the record: nothing is written into the cgroup after.
	r.widenForCheckpoint(id, id)
	r.forgetWidened(id)
	if len(r.widened) != 0 {
		t.Fatalf("records after the stop: %v", r.widened)
	}
	// A sandbox started without a memory limit: nothing to widen.
	other := "sbx_rtnolimit"
	os.MkdirAll(r.dir(other), 0o755)
	r.widenForCheckpoint(other, other)()
	if len(r.widened) != 0 {
		t.Fatalf("a record for a sandbox without a limit: %v", r.widened)
	}
	// A cgroup gone: narrowing is done.
	if !narrowMemoryLimit("/pandastack/sbx_rtnone", was) {
		t.Fatal("narrowing a cgroup that is gone failed")
	}
}
