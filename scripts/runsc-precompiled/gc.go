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

import "runtime/metrics"

// pandastackMemory returns the memory the Go runtime holds as its memory
// limit counts it (mapped and not released to the host), or 0 if the
// runtime cannot say. A checkpoint turns the collector off while it
// encodes the kernel's state, with a limit 256 MiB above this: the
// encode's garbage waits for the next cycle, and a sentry whose memory
// grows by that much meanwhile is collected as before.
func pandastackMemory() int64 {
	s := []metrics.Sample{
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
	}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 || s[1].Value.Kind() != metrics.KindUint64 {
		return 0
	}
	return int64(s[0].Value.Uint64() - s[1].Value.Uint64())
}
`

const gcTestSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package kernel

import (
	"runtime"
	"testing"
)

// TestPandastackMemory: what pandastackMemory reports holds the heap's
// objects and grows with them, and stays within what the runtime has
// taken from the host.
func TestPandastackMemory(t *testing.T) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	before := pandastackMemory()
	if before < int64(ms.HeapAlloc) || before > int64(ms.Sys) {
		t.Fatalf("pandastackMemory() = %d, want between the heap's %d and the runtime's %d", before, ms.HeapAlloc, ms.Sys)
	}
	keep := make([][]byte, 64)
	for i := range keep {
		keep[i] = make([]byte, 1<<20)
	}
	if after := pandastackMemory(); after < before+int64(len(keep))<<20 {
		t.Errorf("pandastackMemory() = %d after 64 MiB more allocated, was %d", after, before)
	}
	runtime.KeepAlive(keep)
}
`
