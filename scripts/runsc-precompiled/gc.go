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
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
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
// memory limit is involved, and the caller puts the percent back after
// the first cycle (pandastackAfterFirstCycle), so a heap that outgrows
// that goal is paced as before rather than let grow by the raised percent.
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

// pandastackAfterFirstCycle calls reset once a cycle of the collector that
// began after this call has been swept (from the runtime's cleanup
// goroutine; with cycles back to back, about one cycle later), unless stop,
// which it returns, was called first: once stop has returned, reset neither
// runs nor will. The decode turns the collector off under a memory limit of
// 256 MiB, which counts all of the sentry's Go memory (live objects, the
// garbage made along the way, stacks); the encode raises the percent so
// that the heap's goal is 256 MiB past its live objects. A sandbox of
// 100 000 files (a live heap of about 200 MiB after its decode) outgrew the
// first: under the limit alone it was collected over and over (21 cycles,
// 4 s of a restore); and a heap that outgrew the encode's goal would next
// have been let grow to many times its live size at the raised percent.
// reset puts the settings from before back, so the rest is paced as
// without the change.
func pandastackAfterFirstCycle(reset func()) (stop func()) {
	var mu sync.Mutex
	stopped := false
	// Not a tiny allocation (those share a block with others and may stay
	// reachable), and not reachable from the cleanup.
	sentinel := new([64]byte)
	runtime.AddCleanup(sentinel, func(struct{}) {
		mu.Lock()
		defer mu.Unlock()
		if !stopped {
			reset()
		}
	}, struct{}{})
	return func() {
		mu.Lock()
		stopped = true
		mu.Unlock()
	}
}
`

const gcTestSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package kernel

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"
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

// TestPandastackAfterFirstCycle: reset runs once a cycle has run, and not
// after stop, while one registered beside it and not stopped runs.
func TestPandastackAfterFirstCycle(t *testing.T) {
	ran := make(chan struct{})
	pandastackAfterFirstCycle(func() { close(ran) })
	select {
	case <-ran:
		t.Fatal("reset ran before any cycle")
	case <-time.After(50 * time.Millisecond):
	}
	runtime.GC()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("reset did not run within 10 s of a cycle")
	}

	stoppedRan := make(chan struct{}, 1)
	stop := pandastackAfterFirstCycle(func() { stoppedRan <- struct{}{} })
	stop()
	control := make(chan struct{})
	pandastackAfterFirstCycle(func() { close(control) })
	runtime.GC()
	select {
	case <-control:
	case <-time.After(10 * time.Second):
		t.Fatal("a reset not stopped did not run within 10 s of a cycle")
	}
	select {
	case <-stoppedRan:
		t.Fatal("reset ran after stop")
	case <-time.After(100 * time.Millisecond):
	}
}

func gcSetting(t *testing.T, name string) uint64 {
	t.Helper()
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		t.Fatalf("no metric %s", name)
	}
	return s[0].Value.Uint64()
}

// TestPandastackDecodeOfALargeHeap: with the decode's settings (the
// collector off under a limit of 256 MiB) and the reset, as the kernel's
// LoadFrom sets them, a heap that grows past the limit is collected, the
// settings from before come back, and its growth to 400 MiB live takes at
// most two more cycles (under the limit alone, one every MiB or so).
func TestPandastackDecodeOfALargeHeap(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(math.MaxInt64))
	runtime.GC()

	gc := debug.SetGCPercent(-1)
	limit := debug.SetMemoryLimit(256 << 20)
	reset := make(chan struct{})
	stop := pandastackAfterFirstCycle(func() {
		debug.SetMemoryLimit(limit)
		debug.SetGCPercent(gc)
		close(reset)
	})
	defer func() {
		stop()
		debug.SetMemoryLimit(limit)
		debug.SetGCPercent(gc)
	}()

	// Grow the heap as a decode does, until the limit brings a cycle and
	// the reset follows it.
	var keep [][]byte
	deadline := time.Now().Add(30 * time.Second)
	for waiting := true; waiting; {
		select {
		case <-reset:
			waiting = false
		default:
			if len(keep) >= 1024 || time.Now().After(deadline) {
				t.Fatalf("no reset with %d MiB live", len(keep))
			}
			keep = append(keep, make([]byte, 1<<20))
		}
	}
	if got := gcSetting(t, "/gc/gogc:percent"); got != 100 {
		t.Errorf("the percent is %d after the reset, want 100", got)
	}
	if got := gcSetting(t, "/gc/gomemlimit:bytes"); got != math.MaxInt64 {
		t.Errorf("the memory limit is %d after the reset, want none", got)
	}
	before := gcSetting(t, "/gc/cycles/total:gc-cycles")
	for len(keep) < 400 {
		keep = append(keep, make([]byte, 1<<20))
	}
	if n := gcSetting(t, "/gc/cycles/total:gc-cycles") - before; n > 2 {
		t.Errorf("%d cycles from the reset (%d MiB live then) to 400 MiB live, want at most 2", n, len(keep))
	}
	runtime.KeepAlive(keep)
}
`
