//go:build pandastack_generated

// Like verify_test.go, this runs only inside the gVisor copy, after -patch:
// it drives the patched pages file reader through gVisor's own interface.

package main

import (
	"bytes"
	"math/rand"
	"os"
	"testing"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/sentry/memmap"
	"gvisor.dev/gvisor/pkg/sentry/state/stateio"
)

// A pages file's reader registers its destination and copies single and
// scattered reads into it with pwrite; a read past the pages file's end
// still ends at the end with an error, as gVisor's reads do. The mappings
// the reads are given are scratch memory, not the destination's, so each
// read shows which path it took: gVisor's reads fill the mapping.
func TestPagesFileReaderWritesIntoItsDestination(t *testing.T) {
	data := make([]byte, 3<<20)
	rand.New(rand.NewSource(1)).Read(data)
	path := t.TempDir() + "/pages"
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(path, unix.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	r := stateio.NewPagesFileFDReader(int32(fd), 256<<10, 2)
	defer r.Close()
	if !r.NeedRegisterDestinationFD() {
		t.Fatal("the pages file's reader does not take the pwrite path")
	}
	const size = 8 << 20
	mfd, err := unix.MemfdCreate("dst", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mfd)
	if err := unix.Ftruncate(mfd, size); err != nil {
		t.Fatal(err)
	}
	df, err := r.RegisterDestinationFD(int32(mfd), size, nil)
	if err != nil {
		t.Fatal(err)
	}
	m, err := unix.Mmap(mfd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(m)
	scratch := make([]byte, size)

	// Read 0: 64 KiB at 4 KiB to 1 MiB. Read 1: 192 KiB at 100 KiB to two
	// ranges, 64 KiB at 2 MiB and 128 KiB at 5 MiB.
	r.AddRead(0, 4<<10, df, memmap.FileRange{Start: 1 << 20, End: 1<<20 + 64<<10}, scratch[1<<20:1<<20+64<<10])
	frs := []memmap.FileRange{{Start: 2 << 20, End: 2<<20 + 64<<10}, {Start: 5 << 20, End: 5<<20 + 128<<10}}
	iov := []unix.Iovec{{Base: &scratch[2<<20]}, {Base: &scratch[5<<20]}}
	iov[0].SetLen(64 << 10)
	iov[1].SetLen(128 << 10)
	r.AddReadv(1, 100<<10, 192<<10, df, frs, iov)
	cs, err := r.Wait(nil, 2)
	if err != nil || len(cs) != 2 {
		t.Fatalf("Wait: %v, %v", cs, err)
	}
	for _, c := range cs {
		if c.Err != nil {
			t.Fatalf("read %d: %v", c.ID, c.Err)
		}
	}
	if !bytes.Equal(m[1<<20:1<<20+64<<10], data[4<<10:68<<10]) {
		t.Error("read 0 did not land at 1 MiB")
	}
	if !bytes.Equal(m[2<<20:2<<20+64<<10], data[100<<10:164<<10]) || !bytes.Equal(m[5<<20:5<<20+128<<10], data[164<<10:292<<10]) {
		t.Error("read 1 did not land in its two ranges")
	}
	if !bytes.Equal(m[:1<<20], make([]byte, 1<<20)) {
		t.Error("the destination changed outside the reads' ranges")
	}
	if !bytes.Equal(scratch, make([]byte, size)) {
		t.Error("a read took gVisor's path (it wrote to the mapping it was given)")
	}

	// Past the end: gVisor's path, into the mapping given.
	r.AddRead(0, int64(len(data))-4<<10, df, memmap.FileRange{Start: 0, End: 8 << 10}, scratch[:8<<10])
	cs, err = r.Wait(nil, 1)
	if err != nil || len(cs) != 1 || cs[0].N != 4<<10 || cs[0].Err == nil {
		t.Fatalf("a read past the end: %+v, %v; want 4096 bytes and an error", cs, err)
	}
	if !bytes.Equal(scratch[:4<<10], data[len(data)-4<<10:]) || !bytes.Equal(m[:8<<10], make([]byte, 8<<10)) {
		t.Error("a read past the end did not take gVisor's path")
	}

	// A destination with huge page settings is left to gVisor's reads,
	// which apply them.
	hfd, err := unix.MemfdCreate("huge", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(hfd)
	unix.Ftruncate(hfd, size)
	settings := []stateio.ClientFileRangeSetting{{FileRange: memmap.FileRange{Start: 0, End: size}, Property: stateio.PropertyHugepage}}
	if hdf, err := r.RegisterDestinationFD(int32(hfd), size, settings); err != nil || hdf != nil {
		t.Errorf("a destination with huge page settings was registered for writes: %v, %v", hdf, err)
	}
}
