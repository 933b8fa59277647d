package main

// gcFile is the file -patch adds to the kernel's package, gcSource its
// content; gcTestFile and gcTestSource its test, which scripts/setup.sh
// runs before it builds runsc.
const (
	gcFile     = "pkg/sentry/kernel/pandastack_gc.go"
	gcTestFile = "pkg/sentry/kernel/pandastack_gc_test.go"
)

const gcSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package kernel

import (
	"math"
	"runtime/debug"
	"runtime/metrics"
)

// pandastackEncodeHeadroom is how far above the live heap a checkpoint's
// encode may take the heap before the collector runs.
const pandastackEncodeHeadroom = 256 << 20

// pandastackEncodeGC sets the collector's percent (GOGC) for a
// checkpoint's encode of the kernel's state, and returns the percent to
// put back after it and whether it set one. The encode allocates as it
// goes, and at the usual percent the collector ran beside it, on its
// thread (assists) and on the CPU the pages' write needs. The percent it
// sets puts the heap's goal 256 MiB above the live heap the last cycle
// marked, so that a sentry of a usual size encodes without a cycle; no
// memory limit is involved, so a heap that outgrows that goal is paced
// by the percent as before rather than collected over and over.
func pandastackEncodeGC() (restore int, set bool) {
	s := []metrics.Sample{
		{Name: "/gc/gogc:percent"},
		{Name: "/gc/heap/live:bytes"},
	}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 || s[1].Value.Kind() != metrics.KindUint64 {
		return 0, false
	}
	current := int(int32(s[0].Value.Uint64())) // -1: off
	return debug.SetGCPercent(pandastackEncodePercent(current, s[1].Value.Uint64())), true
}

// pandastackEncodePercent is the percent for an encode, given the current
// one and the live heap: the current one if it is off or already puts
// the goal that far (a live heap of 256 MiB or more at 100), or if the
// live heap is not known yet.
func pandastackEncodePercent(current int, live uint64) int {
	if current < 0 || live == 0 {
		return current
	}
	return max(current, int(min(100*pandastackEncodeHeadroom/live, math.MaxInt32)))
}
`

const gcTestSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package kernel

import (
	"math"
	"runtime"
	"runtime/debug"
	"testing"
)

func TestPandastackEncodePercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		current int
		live    uint64
		want    int
	}{
		{100, 32 * mib, 800},    // the goal 256 MiB above 32
		{100, 256 * mib, 100},   // as far already
		{100, 1024 * mib, 100},  // further: the percent stays
		{1000, 32 * mib, 1000},  // higher already
		{-1, 32 * mib, -1},      // off stays off
		{100, 0, 100},           // no cycle yet: as it is
		{100, 1, math.MaxInt32}, // bounded
	} {
		if got := pandastackEncodePercent(c.current, c.live); got != c.want {
			t.Errorf("pandastackEncodePercent(%d, %d) = %d, want %d", c.current, c.live, got, c.want)
		}
	}
}

// TestPandastackEncodeGC: with a small live heap the encode's percent
// puts the goal about 256 MiB above it; with a live heap of 300 MiB the
// percent stays; either way the one returned is the one before.
func TestPandastackEncodeGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	var ms runtime.MemStats
	for _, hold := range []int{0, 300} {
		keep := make([][]byte, hold)
		for i := range keep {
			keep[i] = make([]byte, 1<<20)
		}
		runtime.GC()
		runtime.ReadMemStats(&ms)
		restore, set := pandastackEncodeGC()
		got := debug.SetGCPercent(100)
		if !set || restore != 100 {
			t.Fatalf("holding %d MiB: pandastackEncodeGC() = %d, %v; want 100, true", hold, restore, set)
		}
		goal := ms.HeapAlloc + ms.HeapAlloc*uint64(got)/100
		switch {
		case hold == 0 && (goal < ms.HeapAlloc+200<<20 || goal > ms.HeapAlloc+300<<20):
			t.Errorf("a live heap of %d bytes: percent %d, a goal of %d bytes, not about 256 MiB above it", ms.HeapAlloc, got, goal)
		case hold > 0 && got != 100:
			t.Errorf("a live heap of %d bytes: percent %d, want 100", ms.HeapAlloc, got)
		}
		runtime.KeepAlive(keep)
	}
}
`
