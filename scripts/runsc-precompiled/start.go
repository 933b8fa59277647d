package main

// startFile is the file -patch adds to the kernel's package, startSource
// its content; startTestFile and startTestSource its test, which
// scripts/setup.sh runs before it builds runsc. kernelEdits calls it from
// Kernel.Start.
const (
	startFile     = "pkg/sentry/kernel/pandastack_start.go"
	startTestFile = "pkg/sentry/kernel/pandastack_start_test.go"
)

const startSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package kernel

import (
	"time"

	"gvisor.dev/gvisor/pkg/gomaxprocs"
)

const (
	// pandastackStartProcs is how many Ps a kernel's start adds to Go's
	// scheduler, and pandastackStartSpan for how long.
	pandastackStartProcs = 2
	pandastackStartSpan  = 250 * time.Millisecond
)

// pandastackBoostProcs adds n Ps to the sentry's GOMAXPROCS for d, then
// takes them back; it composes with gVisor's other temporary Ps (its
// asynchronous page loader's), which gomaxprocs counts apart from the
// base.
//
// Kernel.Start calls it before it starts the task goroutines. The sentry
// runs as many Ps as the host has CPUs (2 on PandaStack's host), and a
// goroutine that enters a blocking system call (the control server's
// ppoll after it answers the restore, a task waiting on its stub thread's
// futex) keeps its P until the runtime's monitor takes it back, which in
// an idle sentry, whose monitor wakes every 10 ms, can take two of its
// ticks. With both Ps held so, the task goroutines a start made runnable
// waited in a run queue with both CPUs idle: runsc's debug log of fork
// children put 0.2 to 17.5 ms between the end of the start and the first
// task goroutine running (9 restores, log lines added there), and a
// scheduler trace showed the monitor's wake ending the wait. With more Ps
// than goroutines in such calls, a new goroutine finds an idle P and runs
// at once: the same log then read 0 to 1.3 ms (9 restores). After the
// span the sandbox runs with the usual Ps.
//
// Setting GOMAXPROCS stops the world, and so waits for a collection in
// progress to end: a very large sandbox whose restore's decode ended in a
// collection (pandastack_gc.go) starts its tasks after it, with the
// kernel's extMu held meanwhile. In runsc's debug logs of four
// code-interpreter restores the addition and the tasks' start together
// took 0.06-0.15 ms.
func pandastackBoostProcs(n int, d time.Duration) {
	gomaxprocs.Add(n)
	time.AfterFunc(d, func() { gomaxprocs.Add(-n) })
}
`

const startTestSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package kernel

import (
	"runtime"
	"testing"
	"time"

	"gvisor.dev/gvisor/pkg/gomaxprocs"
)

// pandastackWaitProcs waits up to 5 s for GOMAXPROCS to read want.
func pandastackWaitProcs(t *testing.T, want int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); runtime.GOMAXPROCS(0) != want; {
		if time.Now().After(deadline) {
			t.Fatalf("GOMAXPROCS = %d, want %d", runtime.GOMAXPROCS(0), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestPandastackBoostProcs: the Ps are there at once and gone after the
// span, not before it, and another temporary addition made meanwhile (as
// the page loader's) outlives the boost rather than being undone by it.
func TestPandastackBoostProcs(t *testing.T) {
	const span = 500 * time.Millisecond
	base := runtime.GOMAXPROCS(0)
	gomaxprocs.SetBase(base)
	t.Cleanup(func() { runtime.GOMAXPROCS(base) })
	start := time.Now()
	pandastackBoostProcs(2, span)
	if got := runtime.GOMAXPROCS(0); got != base+2 {
		t.Fatalf("GOMAXPROCS = %d right after the boost, want %d", got, base+2)
	}
	gomaxprocs.Add(3)
	if got := runtime.GOMAXPROCS(0); got != base+5 {
		t.Fatalf("GOMAXPROCS = %d with another 3 added, want %d", got, base+5)
	}
	pandastackWaitProcs(t, base+3)
	if took := time.Since(start); took < span {
		t.Fatalf("the boost's Ps were gone after %v, before its span of %v", took, span)
	}
	gomaxprocs.Add(-3)
	if got := runtime.GOMAXPROCS(0); got != base {
		t.Fatalf("GOMAXPROCS = %d after both, want %d", got, base)
	}
}

// TestPandastackStartProcsConstants: the start's boost adds Ps, for a
// span that covers a restored sandbox's hello and first cell (tens of ms)
// and is not the sandbox's whole life.
func TestPandastackStartProcsConstants(t *testing.T) {
	if pandastackStartProcs < 1 || pandastackStartSpan < 100*time.Millisecond || pandastackStartSpan > time.Second {
		t.Fatalf("boost %d Ps for %v", pandastackStartProcs, pandastackStartSpan)
	}
}
`
