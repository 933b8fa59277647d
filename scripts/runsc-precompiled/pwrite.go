package main

// pwriteFile is the file -patch adds to the pages file reader's package,
// pwriteSource its content (see the package doc and fdreaderEdits).
const pwriteFile = "pkg/sentry/state/stateio/pandastack_pwrite.go"

const pwriteSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package stateio

import (
	"sync"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/aio"
	"gvisor.dev/gvisor/pkg/sentry/memmap"
)

// PandaStack (scripts/runsc-precompiled): a pages file's FDReader copies
// pages into a registered destination file (a restore's MemoryFile) with
// pwrite(2) from a read-only shared mapping of the pages file, instead of
// pread(2) into a mapping of the destination. A write fills each page of
// the destination as it allocates it; a read into the mapping takes a page
// fault for every page and zeroes it before the copy. Reads the mapping
// cannot serve (a pages file that is not a regular file or cannot be
// mapped, a range past its end, a destination never registered or one
// with huge page settings) take gVisor's own path. (The faults move rather
// than vanish: minor ones on the pages file's mapping, which the kernel
// maps some pages at a time, and the sentry's first touch of a written
// page, which zeroes nothing.)
type pandastackPwrite struct {
	src []byte // the whole pages file, mapped read-only; nil: not in use

	// mu guards dsts and released: a failed load may close the reader
	// while a memory file registers.
	mu       sync.Mutex
	dsts     []int32 // the registered destinations' duplicates, closed with the reader
	released bool
}

// pandastackPwriteRead is an inflight read's state on the pwrite path.
type pandastackPwriteRead struct {
	active bool
	dstFD  int32
	// frs are the destination ranges not written yet; the write in flight
	// is of the first.
	frs []memmap.FileRange
}

// pandastackDest is a DestinationFile of a reader on the pwrite path.
type pandastackDest int32

// mapSource maps the pages file fd, if it can be.
func (p *pandastackPwrite) mapSource(fd int32) {
	var st unix.Stat_t
	if err := unix.Fstat(int(fd), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size <= 0 || int64(int(st.Size)) != st.Size {
		return
	}
	m, err := unix.Mmap(int(fd), 0, int(st.Size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return
	}
	p.src = m
}

// NeedRegisterDestinationFD implements AsyncReader.NeedRegisterDestinationFD.
func (r *FDReader) NeedRegisterDestinationFD() bool {
	return r.pw.src != nil
}

// RegisterDestinationFD implements AsyncReader.RegisterDestinationFD. A
// destination with settings (huge pages advised or not, per range) gets
// none: gVisor's reads apply them through the advised mappings they fill,
// which a write does not go through, so its reads take gVisor's path.
func (r *FDReader) RegisterDestinationFD(fd int32, size uint64, settings []ClientFileRangeSetting) (DestinationFile, error) {
	if r.pw.src == nil || len(settings) != 0 {
		return nil, nil
	}
	r.pw.mu.Lock()
	defer r.pw.mu.Unlock()
	if r.pw.released {
		return nil, nil
	}
	// dup, not fcntl(F_DUPFD_CLOEXEC): the sentry's seccomp filter allows
	// the one and not the other, and the sentry never execs.
	d, err := unix.Dup(int(fd))
	if err != nil {
		return nil, err
	}
	r.pw.dsts = append(r.pw.dsts, int32(d))
	return pandastackDest(d), nil
}

// add starts the read of total bytes of the pages file at off into the
// destination ranges frs on the pwrite path, and reports whether it did.
func (p *pandastackPwrite) add(r *FDReader, id int, off int64, total uint64, df DestinationFile, frs []memmap.FileRange) bool {
	d, ok := df.(pandastackDest)
	if !ok || p.src == nil || len(frs) == 0 || off < 0 || uint64(off)+total > uint64(len(p.src)) {
		return false
	}
	in := &r.inflight[id]
	buf := in.pw.frs[:0]
	*in = fdRead{off: off, total: total}
	in.pw = pandastackPwriteRead{active: true, dstFD: int32(d), frs: append(buf, frs...)}
	p.write(r.q, uint64(id), in)
	return true
}

// next goes on with a read on the pwrite path after n more of its bytes
// were written (in.off has moved past them already).
func (p *pandastackPwrite) next(q *aio.GoQueue, id uint64, in *fdRead, n uint64) {
	in.pw.advance(n)
	p.write(q, id, in)
}

// advance drops the first n bytes of the destination ranges left.
func (pw *pandastackPwriteRead) advance(n uint64) {
	for n > 0 {
		fr := &pw.frs[0]
		if l := fr.Length(); n >= l {
			n -= l
			pw.frs = pw.frs[1:]
		} else {
			fr.Start += n
			n = 0
		}
	}
}

// write enqueues the write of in's first destination range.
func (p *pandastackPwrite) write(q *aio.GoQueue, id uint64, in *fdRead) {
	fr := in.pw.frs[0]
	aio.Write(q, id, in.pw.dstFD, int64(fr.Start), p.src[in.off:in.off+int64(fr.Length())])
}

// release unmaps the pages file and closes the destinations' duplicates,
// once the reader's writes are done (Close destroys its queue first). src
// stays set: a late RegisterDestinationFD sees released, not src.
func (p *pandastackPwrite) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.released {
		return
	}
	p.released = true
	for _, d := range p.dsts {
		unix.Close(int(d))
	}
	p.dsts = nil
	if p.src != nil {
		unix.Munmap(p.src)
	}
}
`

// pwriteTestFile is a test -patch adds beside pwriteFile, run by
// scripts/setup.sh before runsc is built; pwriteTestSource its content.
const pwriteTestFile = "pkg/sentry/state/stateio/pandastack_pwrite_test.go"

const pwriteTestSource = `// Added by PandaStack's scripts/runsc-precompiled (-patch); not part of
// gVisor.

package stateio

import (
	"reflect"
	"testing"

	"gvisor.dev/gvisor/pkg/sentry/memmap"
)

// A write that comes back short, or ends a range, moves the read on by
// what was written, across ranges. (A write to a memory file never comes
// back short, so only this test takes the short branch.)
func TestPandastackPwriteAdvance(t *testing.T) {
	pw := pandastackPwriteRead{frs: []memmap.FileRange{{Start: 0, End: 16 << 10}, {Start: 100 << 10, End: 132 << 10}}}
	for _, step := range []struct {
		n    uint64
		want []memmap.FileRange
	}{
		{4 << 10, []memmap.FileRange{{Start: 4 << 10, End: 16 << 10}, {Start: 100 << 10, End: 132 << 10}}},
		{12 << 10, []memmap.FileRange{{Start: 100 << 10, End: 132 << 10}}},
		{10 << 10, []memmap.FileRange{{Start: 110 << 10, End: 132 << 10}}},
	} {
		pw.advance(step.n)
		if !reflect.DeepEqual(pw.frs, step.want) {
			t.Fatalf("after %d more bytes: %v, want %v", step.n, pw.frs, step.want)
		}
	}
	pw = pandastackPwriteRead{frs: []memmap.FileRange{{Start: 0, End: 4 << 10}, {Start: 8 << 10, End: 12 << 10}, {Start: 20 << 10, End: 28 << 10}}}
	pw.advance(10 << 10) // the first range, the second, and 2 KiB of the third
	if want := []memmap.FileRange{{Start: 22 << 10, End: 28 << 10}}; !reflect.DeepEqual(pw.frs, want) {
		t.Fatalf("across two ranges: %v, want %v", pw.frs, want)
	}
}
`
