package main

// The sentry's boot and the edits that size its host fd table ahead, off
// the path of a restore (see the package doc and fdtableSource).
const bootFile = "runsc/cmd/sentry/sentrycmd/boot.go"

var bootEdits = []edit{
	{
		"\t\"gvisor.dev/gvisor/pkg/metric\"\n\t\"gvisor.dev/gvisor/pkg/prometheus\"\n",
		"\t\"gvisor.dev/gvisor/pkg/metric\"\n\t\"gvisor.dev/gvisor/pkg/pandastackfd\"\n\t\"gvisor.dev/gvisor/pkg/prometheus\"\n",
	},
	{
		"\t\ttimer.Reached(\"FD limit applied\")\n\t}\n",
		"\t\ttimer.Reached(\"FD limit applied\")\n\t}\n" +
			"\t// PandaStack (scripts/runsc-precompiled): the host fd table sized\n" +
			"\t// ahead, so that a restore's reopening of the sandbox's files does\n" +
			"\t// not wait for the host to grow it (pkg/pandastackfd).\n" +
			"\tif n, err := pandastackfd.GrowTable(pandastackfd.TableSize); err != nil {\n" +
			"\t\tlog.Warningf(\"Growing the host fd table to %d: %v\", n, err)\n\t}\n",
	},
}

// fdtableFile is the package -patch adds to gVisor's tree, fdtableSource
// its content; fdtableTestFile and fdtableTestSource its tests, which
// scripts/setup.sh runs before it builds runsc.
const (
	fdtableFile     = "pkg/pandastackfd/fdtable.go"
	fdtableTestFile = "pkg/pandastackfd/fdtable_test.go"
)

const fdtableSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

// Package pandastackfd sizes a process's host fd table ahead of need.
//
// Linux grows a process's fd table when a new fd does not fit (64 slots,
// then 128, 256, 512, ...), and in a process whose threads share the table,
// as every Go program's do, each growth waits for an RCU grace period
// (expand_files → expand_fdtable → synchronize_rcu) before the open that
// needed it returns: 7 ms in a scheduler trace on PandaStack's 2-core
// host. A restore reopens every file the sandbox holds, about 360 host fds
// for a warm code-interpreter sandbox whose sentry held 25 in a table of
// 256 before, and so waited for a growth partway through its reopening, in
// the path of every create, fork and resume. Grown once at the sentry's
// boot, the table is big enough before the restore; for a container
// prepared ahead, the wait is long before it is used.
package pandastackfd

import (
	"golang.org/x/sys/unix"
)

// TableSize is the number of fd slots the sentry's boot asks for: several
// times what a warm code-interpreter sandbox's sentry holds, 16 KiB of
// pointers in the host kernel.
const TableSize = 2048

// GrowTable grows the calling process's fd table to hold at least n fds
// (fewer if RLIMIT_NOFILE is lower), by duplicating a descriptor to the
// last of them and closing it again: no fd of the caller's is touched and
// none is left open. It returns the size asked of the host. The sentry
// calls it before it installs its seccomp filters, which would refuse
// eventfd2.
func GrowTable(n int) (int, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < uint64(n) {
		n = int(rl.Cur)
	}
	if n < 2 {
		return n, nil
	}
	efd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if err != nil {
		return n, err
	}
	defer unix.Close(efd)
	// F_DUPFD takes the lowest free fd at or above n-1, and grows the
	// table to hold it.
	hi, err := unix.FcntlInt(uintptr(efd), unix.F_DUPFD_CLOEXEC, n-1)
	if err != nil {
		return n, err
	}
	return n, unix.Close(hi)
}
`

const fdtableTestSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package pandastackfd

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fdSize is the number of fd slots the host has allocated for this
// process (FDSize in /proc/self/status).
func fdSize(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "FDSize:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no FDSize in /proc/self/status")
	return 0
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestPandastackGrowTable(t *testing.T) {
	before := fdSize(t)
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	// Four times the table, within the limit (Go raises the soft limit
	// to the hard one at its start).
	want := int(min(uint64(max(4*before, 1024)), rl.Cur))
	if want <= before {
		t.Fatalf("RLIMIT_NOFILE %d leaves no room to grow a table of %d", rl.Cur, before)
	}
	open := openFDs(t)
	n, err := GrowTable(want)
	if err != nil || n != want {
		t.Fatalf("GrowTable(%d) = %d, %v", want, n, err)
	}
	if got := fdSize(t); got < want {
		t.Errorf("the fd table holds %d slots after GrowTable(%d) (%d before)", got, want, before)
	}
	if got := openFDs(t); got != open {
		t.Errorf("%d fds open after GrowTable, %d before", got, open)
	}
	// Asking again for no more than the table holds is harmless.
	if _, err := GrowTable(want / 2); err != nil {
		t.Errorf("GrowTable(%d) on a table of %d: %v", want/2, fdSize(t), err)
	}
}

// A soft RLIMIT_NOFILE below the size asked for caps it: the call asks for
// the limit and does not fail (an fd at 1<<20-1 is past any limit: F_DUPFD
// fails there), and the table holds the limit's slots.
func TestPandastackGrowTableStopsAtTheLimit(t *testing.T) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	limit := int(min(rl.Max, 768))
	if openFDs(t) >= limit/2 {
		t.Fatalf("this test process has %d fds open already, its hard RLIMIT_NOFILE is %d", openFDs(t), rl.Max)
	}
	low := unix.Rlimit{Cur: uint64(limit), Max: rl.Max}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &rl)
	n, err := GrowTable(1 << 20)
	if err != nil || n != limit {
		t.Fatalf("GrowTable(1 << 20) under a limit of %d = %d, %v", limit, n, err)
	}
	if got := fdSize(t); got < limit {
		t.Errorf("the fd table holds %d slots, want at least %d", got, limit)
	}
}
`
