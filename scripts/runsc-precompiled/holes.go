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
			"\t\t\t// the file's data, up to dataEnd. Not for a file on disk, whose\n" +
			"\t\t\t// file system may count pages written through a mapping and not\n" +
			"\t\t\t// yet written back as holes.\n" +
			"\t\t\tdataEnd := chunkFR.Start\n" +
			"\t\t\tif f.opts.DiskBackedFile {\n" +
			"\t\t\t\tdataEnd = chunkFR.End\n" +
			"\t\t\t}\n" +
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
// within [off, end] and page-aligned (end and end when there is no data
// before end). A hole reads as zeroes: the save's scan for zeroed pages
// counts it as such without reading it, which would allocate each of its
// pages, zero it, and then give it back. If the file cannot say (lseek
// fails other than for no data), all of [off, end) is data. The scan asks
// only for a memory file in memory (a memfd): a file system on disk may
// count pages written through a mapping, not yet written back, as holes.
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
	f := os.NewFile(uintptr(fd), "pandastack-test")
	t.Cleanup(func() { f.Close() })
	return f
}

func TestPandastackNextData(t *testing.T) {
	f := pandastackMemfd(t)
	defer f.Close()
	const pg = hostarch.PageSize
	const huge = hostarch.HugePageSize
	if err := f.Truncate(8 * huge); err != nil {
		t.Fatal(err)
	}
	// Data at pages 3-4 of the third huge page and page 10 of the fifth;
	// the rest holes. A host that gives memfds huge pages (shmem_enabled
	// always) makes each written huge page data whole: the checks allow
	// the data to start at its huge page and end at the next.
	at := func(h, p uint64) uint64 { return h*huge + p*pg }
	for _, off := range []uint64{at(2, 3), at(2, 4), at(4, 10)} {
		if _, err := f.WriteAt([]byte{1}, int64(off)+7); err != nil {
			t.Fatal(err)
		}
	}
	fd := int(f.Fd())
	for _, c := range []struct{ off, end, data, dataEnd uint64 }{
		{0, 8 * huge, at(2, 3), at(2, 5)},
		{at(2, 3), 8 * huge, at(2, 3), at(2, 5)},
		{at(2, 4), 8 * huge, at(2, 4), at(2, 5)},
		{at(3, 0), 8 * huge, at(4, 10), at(4, 11)},
		{at(5, 0), 8 * huge, 8 * huge, 8 * huge},
		{0, at(1, 0), at(1, 0), at(1, 0)},
		{0, at(2, 4), at(2, 3), at(2, 4)},
	} {
		data, dataEnd := pandastackNextData(fd, c.off, c.end)
		lo := max(c.off, hostarch.HugePageRoundDown(c.data))
		hi := min(c.end, hostarch.MustHugePageRoundUp(c.dataEnd))
		if data < lo || data > c.data || dataEnd < c.dataEnd || dataEnd > hi || data%pg != 0 || dataEnd%pg != 0 {
			t.Errorf("pandastackNextData(%#x, %#x) = %#x, %#x; want %#x, %#x (or their huge pages)", c.off, c.end, data, dataEnd, c.data, c.dataEnd)
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
// every byte came back. The loaded file's pages are known to be committed:
// a hole punched in one of them, saved and loaded again, comes back as
// zeroes and the rest as they were. A disk-backed memory file (never
// looked at for holes) does the same.
func TestPandastackSaveSkipsHoles(t *testing.T) {
	ctx := context.Background()
	const pg = hostarch.PageSize
	const n = 600 // more than one huge page
	for _, disk := range []bool{false, true} {
		opts := MemoryFileOpts{DelayedEviction: DelayedEvictionDisabled, DisableMemoryAccounting: true, DiskBackedFile: disk}
		file := pandastackMemfd(t)
		if disk {
			var err error
			if file, err = os.CreateTemp(t.TempDir(), "mf"); err != nil {
				t.Fatal(err)
			}
		}
		mf, err := NewMemoryFile(file, opts)
		if err != nil {
			t.Fatal(err)
		}
		fr, err := mf.Allocate(n*pg, AllocOpts{Kind: usage.Anonymous, Mode: AllocateUncommitted})
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
				continue // a hole
			}
			if _, err := mf.file.WriteAt(want[p*pg:(p+1)*pg], int64(fr.Start+p*pg)); err != nil {
				t.Fatal(err)
			}
		}
		// The first round trip; the second from the loaded file, whose
		// pages are all known to be committed, with a hole punched in one.
		for round := 1; round <= 2; round++ {
			var state bytes.Buffer
			if err := mf.SaveTo(ctx, &state, &SaveOpts{ExcludeCommittedZeroPages: true}); err != nil {
				t.Fatalf("disk %v, round %d: SaveTo: %v", disk, round, err)
			}
			mf.Destroy()
			mf, err = NewMemoryFile(pandastackMemfd(t), opts)
			if err != nil {
				t.Fatal(err)
			}
			if err := mf.LoadFrom(ctx, &state, &LoadOpts{}); err != nil {
				t.Fatalf("disk %v, round %d: LoadFrom: %v", disk, round, err)
			}
			got := make([]byte, n*pg)
			if _, err := mf.file.ReadAt(got, int64(fr.Start)); err != nil {
				t.Fatal(err)
			}
			for p := uint64(0); p < n; p++ {
				if !bytes.Equal(got[p*pg:(p+1)*pg], want[p*pg:(p+1)*pg]) {
					t.Fatalf("disk %v, round %d: page %d differs after the round trip", disk, round, p)
				}
			}
			const punched = 120
			if err := unix.Fallocate(int(mf.file.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, int64(fr.Start+punched*pg), pg); err != nil {
				t.Fatal(err)
			}
			clear(want[punched*pg : (punched+1)*pg])
		}
		mf.Destroy()
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
