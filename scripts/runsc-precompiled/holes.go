package main

// The save's scan for zeroed pages and the edit that has it skip the
// memory file's holes (see the package doc and holesSource).
const saveFile = "pkg/sentry/pgalloc/save_restore.go"

var saveEdits = []edit{
	{
		"\t\tf.forEachChunk(fr, func(chunk *chunkInfo, chunkFR memmap.FileRange) bool {\n" +
			"\t\t\tbs := chunk.sliceAt(chunkFR)\n" +
			"\t\t\tfor pgoff := 0; pgoff < len(bs); pgoff += hostarch.PageSize {\n" +
			"\t\t\t\tpg := bs[pgoff : pgoff+hostarch.PageSize]\n" +
			"\t\t\t\toff := chunkFR.Start + uint64(pgoff)\n",
		"\t\tf.forEachChunk(fr, func(chunk *chunkInfo, chunkFR memmap.FileRange) bool {\n" +
			"\t\t\tbs := chunk.sliceAt(chunkFR)\n" +
			"\t\t\t// PandaStack (scripts/runsc-precompiled): holes are zeroed pages\n" +
			"\t\t\t// that need no read (pandastack_holes.go); the scan reads only\n" +
			"\t\t\t// the file's data, up to dataEnd.\n" +
			"\t\t\tdataEnd := chunkFR.Start\n" +
			"\t\t\tfor pgoff := 0; pgoff < len(bs); pgoff += hostarch.PageSize {\n" +
			"\t\t\t\toff := chunkFR.Start + uint64(pgoff)\n" +
			"\t\t\t\tif off >= dataEnd {\n" +
			"\t\t\t\t\tvar dataStart uint64\n" +
			"\t\t\t\t\tdataStart, dataEnd = pandastackNextData(int(f.file.Fd()), off, chunkFR.End)\n" +
			"\t\t\t\t\tif dataStart > off {\n" +
			"\t\t\t\t\t\thole := memmap.FileRange{off, dataStart}\n" +
			"\t\t\t\t\t\tif wasCommitted {\n" +
			"\t\t\t\t\t\t\tnewUncommittedBytes += hole.Length()\n" +
			"\t\t\t\t\t\t} else {\n" +
			"\t\t\t\t\t\t\talreadyUncommittedBytes += hole.Length()\n" +
			"\t\t\t\t\t\t}\n" +
			"\t\t\t\t\t\tmaseg = updateAddRange(maseg, hole, wasCommitted, false)\n" +
			"\t\t\t\t\t\tif dataStart >= chunkFR.End {\n" +
			"\t\t\t\t\t\t\tbreak\n" +
			"\t\t\t\t\t\t}\n" +
			"\t\t\t\t\t\toff = dataStart\n" +
			"\t\t\t\t\t\tpgoff = int(off - chunkFR.Start)\n" +
			"\t\t\t\t\t}\n" +
			"\t\t\t\t}\n" +
			"\t\t\t\tpg := bs[pgoff : pgoff+hostarch.PageSize]\n",
	},
}

// holesFile is the file -patch adds to the memory file's package,
// holesSource its content.
const holesFile = "pkg/sentry/pgalloc/pandastack_holes.go"

const holesSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package pgalloc

import (
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/hostarch"
)

// pandastackNextData returns the first byte of the memory file fd at or
// after off that is not in a hole, and the end of the data there, both
// within [off, end) and page-aligned (end when there is no data before
// it). A hole reads as zeroes: the save's scan for zeroed pages counts
// it as such without reading it, which would allocate each of its
// pages, zero it, and then give it back. If the file cannot say
// (lseek fails other than for no data), all of [off, end) is data.
func pandastackNextData(fd int, off, end uint64) (data, dataEnd uint64) {
	d, err := unix.Seek(fd, int64(off), unix.SEEK_DATA)
	if err == unix.ENXIO {
		return end, end
	}
	if err != nil || d < int64(off) {
		return off, end
	}
	data = hostarch.PageRoundDown(uint64(d))
	if data >= end {
		return end, end
	}
	h, err := unix.Seek(fd, int64(data), unix.SEEK_HOLE)
	if err != nil || h <= int64(data) {
		return data, end
	}
	dataEnd, ok := hostarch.PageRoundUp(uint64(h))
	if !ok || dataEnd > end {
		dataEnd = end
	}
	return data, dataEnd
}
`

// holesTestFile is a test -patch adds beside holesFile, run by
// scripts/setup.sh before runsc is built; holesTestSource its content.
const holesTestFile = "pkg/sentry/pgalloc/pandastack_holes_test.go"

const holesTestSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package pgalloc

import (
	"bytes"
	"os"
	"testing"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/context"
	"gvisor.dev/gvisor/pkg/hostarch"
	"gvisor.dev/gvisor/pkg/sentry/usage"
)

func pandastackMemfd(t *testing.T) *os.File {
	t.Helper()
	fd, err := unix.MemfdCreate("pandastack-test", 0)
	if err != nil {
		t.Fatalf("memfd_create: %v", err)
	}
	return os.NewFile(uintptr(fd), "pandastack-test")
}

func TestPandastackNextData(t *testing.T) {
	f := pandastackMemfd(t)
	defer f.Close()
	const pg = hostarch.PageSize
	if err := f.Truncate(64 * pg); err != nil {
		t.Fatal(err)
	}
	// Data at pages 3-4 and 10; the rest holes.
	for _, p := range []int64{3, 4, 10} {
		if _, err := f.WriteAt([]byte{1}, p*pg+7); err != nil {
			t.Fatal(err)
		}
	}
	fd := int(f.Fd())
	for _, c := range []struct{ off, end, data, dataEnd uint64 }{
		{0, 64 * pg, 3 * pg, 5 * pg},
		{3 * pg, 64 * pg, 3 * pg, 5 * pg},
		{4 * pg, 64 * pg, 4 * pg, 5 * pg},
		{5 * pg, 64 * pg, 10 * pg, 11 * pg},
		{11 * pg, 64 * pg, 64 * pg, 64 * pg},
		{0, 2 * pg, 2 * pg, 2 * pg},
		{0, 4 * pg, 3 * pg, 4 * pg},
	} {
		data, dataEnd := pandastackNextData(fd, c.off, c.end)
		if data != c.data || dataEnd != c.dataEnd {
			t.Errorf("pandastackNextData(%#x, %#x) = %#x, %#x; want %#x, %#x", c.off, c.end, data, dataEnd, c.data, c.dataEnd)
		}
	}
	// A descriptor lseek refuses: everything is data.
	if data, dataEnd := pandastackNextData(-1, pg, 8*pg); data != pg || dataEnd != 8*pg {
		t.Errorf("on a bad descriptor: %#x, %#x; want all data", data, dataEnd)
	}
}

// TestPandastackSaveSkipsHoles saves a memory file whose allocation holds
// data, pages written with zeroes, and pages never touched (holes), with
// zeroed pages excluded, loads it into a new memory file, and checks that
// every byte came back.
func TestPandastackSaveSkipsHoles(t *testing.T) {
	ctx := context.Background()
	const pg = hostarch.PageSize
	const n = 600 // more than one huge page
	mf, err := NewMemoryFile(pandastackMemfd(t), MemoryFileOpts{DelayedEviction: DelayedEvictionDisabled, DisableMemoryAccounting: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Destroy()
	for _, mode := range []AllocationMode{AllocateUncommitted, AllocateAndCommit} {
		fr, err := mf.Allocate(n*pg, AllocOpts{Kind: usage.Anonymous, Mode: mode})
		if err != nil {
			t.Fatal(err)
		}
		want := make([]byte, n*pg)
		for p := uint64(0); p < n; p++ {
			switch {
			case p%7 == 0 || (p >= 100 && p < 140):
				want[p*pg+p%pg] = byte(p) | 1
			case p%5 == 0:
				// written, but zeroes
			default:
				continue // a hole, unless committed at allocation
			}
			if _, err := mf.file.WriteAt(want[p*pg:(p+1)*pg], int64(fr.Start+p*pg)); err != nil {
				t.Fatal(err)
			}
		}
		var state bytes.Buffer
		if err := mf.SaveTo(ctx, &state, &SaveOpts{ExcludeCommittedZeroPages: true}); err != nil {
			t.Fatalf("mode %v: SaveTo: %v", mode, err)
		}
		mf2, err := NewMemoryFile(pandastackMemfd(t), MemoryFileOpts{DelayedEviction: DelayedEvictionDisabled, DisableMemoryAccounting: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := mf2.LoadFrom(ctx, &state, &LoadOpts{}); err != nil {
			mf2.Destroy()
			t.Fatalf("mode %v: LoadFrom: %v", mode, err)
		}
		got := make([]byte, n*pg)
		if _, err := mf2.file.ReadAt(got, int64(fr.Start)); err != nil {
			mf2.Destroy()
			t.Fatal(err)
		}
		mf2.Destroy()
		if !bytes.Equal(got, want) {
			for p := uint64(0); p < n; p++ {
				if !bytes.Equal(got[p*pg:(p+1)*pg], want[p*pg:(p+1)*pg]) {
					t.Fatalf("mode %v: page %d differs after the round trip", mode, p)
				}
			}
		}
		mf.DecRef(fr)
	}
}

// TestPandastackSaveReadsNoHole saves a memory file of 64 MiB allocated
// and a page written, and counts the process's page faults meanwhile:
// reading each page of a hole to compare it with zeroes would fault in
// (allocate) every one of the 16384.
func TestPandastackSaveReadsNoHole(t *testing.T) {
	ctx := context.Background()
	const pg = hostarch.PageSize
	const n = 16384
	mf, err := NewMemoryFile(pandastackMemfd(t), MemoryFileOpts{DelayedEviction: DelayedEvictionDisabled, DisableMemoryAccounting: true})
	if err != nil {
		t.Fatal(err)
	}
	defer mf.Destroy()
	fr, err := mf.Allocate(n*pg, AllocOpts{Kind: usage.Anonymous, Mode: AllocateUncommitted})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mf.file.WriteAt([]byte{1}, int64(fr.Start+n/2*pg)); err != nil {
		t.Fatal(err)
	}
	var before, after unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &before)
	var state bytes.Buffer
	if err := mf.SaveTo(ctx, &state, &SaveOpts{ExcludeCommittedZeroPages: true}); err != nil {
		t.Fatalf("SaveTo: %v", err)
	}
	unix.Getrusage(unix.RUSAGE_SELF, &after)
	if faults := after.Minflt - before.Minflt; faults > n/8 {
		t.Errorf("the save took %d page faults for %d pages allocated and 1 written", faults, n)
	}
	mf.DecRef(fr)
}
`
