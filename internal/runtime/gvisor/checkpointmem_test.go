package gvisor

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// A checkpoint's widening of a memory limit, and its undoing, on a memory
// cgroup of the test's own (v1 or v2, as the host has).
func TestWidenAndNarrowMemoryLimit(t *testing.T) {
	rel := fmt.Sprintf("/pandastack/sbx_rtmem%08x", rand.Uint32())
	var dir string
	for _, root := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup"} {
		if _, err := os.Stat(filepath.Join(root, "pandastack")); err != nil {
			if err := os.MkdirAll(filepath.Join(root, "pandastack"), 0o755); err != nil {
				continue
			}
		}
		if err := os.Mkdir(filepath.Join(root, rel), 0o755); err == nil {
			dir = filepath.Join(root, rel)
			break
		}
	}
	if dir == "" {
		t.Fatal("no memory cgroup could be made (run as root on a host with cgroups)")
	}
	t.Cleanup(func() { syscall.Rmdir(dir) })
	limit, _ := memoryLimitFile(rel)
	if limit == "" {
		t.Fatalf("no memory limit file in %s", dir)
	}
	const was = 64 << 20
	if err := os.WriteFile(limit, []byte(strconv.Itoa(was)), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := widenMemoryLimit(rel, 0)
	if err != nil || got != was {
		t.Fatalf("widen: %d %v, want %d", got, err, was)
	}
	if n, _ := readBytes(limit); n != was*checkpointMemoryFactor {
		t.Fatalf("widened limit %d, want %d", n, was*checkpointMemoryFactor)
	}
	// A second checkpoint widens from the limit out of checkpoints.
	if got, err := widenMemoryLimit(rel, was); err != nil || got != was {
		t.Fatalf("widen again: %d %v", got, err)
	}
	if n, _ := readBytes(limit); n != was*checkpointMemoryFactor {
		t.Fatalf("widened twice: limit %d, want %d", n, was*checkpointMemoryFactor)
	}
	if !narrowMemoryLimit(rel, was) {
		t.Fatal("narrowing an empty cgroup's limit failed")
	}
	if n, _ := readBytes(limit); n != was {
		t.Fatalf("narrowed limit %d, want %d", n, was)
	}
	// Not below what it uses (an empty cgroup uses 0 bytes or more).
	if narrowMemoryLimit(rel, 0) {
		t.Fatal("narrowed to below the cgroup's usage")
	}
	// A cgroup gone: nothing to do.
	if !narrowMemoryLimit("/pandastack/sbx_rtnone", was) {
		t.Fatal("narrowing a cgroup that is gone failed")
	}
	if got, err := widenMemoryLimit("/pandastack/sbx_rtnone", 0); got != 0 || err != nil {
		t.Fatalf("widening a cgroup that is gone: %d %v", got, err)
	}
}
