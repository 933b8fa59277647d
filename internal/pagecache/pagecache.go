// Package pagecache keeps files in the host's page cache and tells how much
// of a file is there.
//
// A host that pages out file pages nobody read for a while (a proactive
// reclaim such as DAMON's, or plain memory pressure) makes the next reader
// wait for the disk: a restore after a quiet spell of minutes reads its
// image, and every runsc started meanwhile reads its binary again.
package pagecache

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Held is a file mapped read-only and locked in memory (mlock): its pages
// stay in the page cache until Release, whatever the pressure.
type Held struct {
	m    []byte
	size int64
}

// Hold maps the file at path and locks it in memory, reading from disk
// what the page cache lacks. An empty file holds nothing and is no error.
func Hold(path string) (*Held, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() == 0 {
		return &Held{}, nil
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	if err := unix.Mlock(m); err != nil {
		unix.Munmap(m)
		return nil, fmt.Errorf("lock %s in memory: %w", path, err)
	}
	return &Held{m: m, size: fi.Size()}, nil
}

// Bytes is the size of the file held (0 once released).
func (h *Held) Bytes() int64 {
	if h == nil {
		return 0
	}
	return h.size
}

// Release unlocks and unmaps the file: its pages stay cached until the
// host wants the memory. Safe on nil and more than once.
func (h *Held) Release() {
	if h == nil || h.m == nil {
		return
	}
	unix.Munmap(h.m)
	h.m, h.size = nil, 0
}

// Resident is how many of f's bytes are in the page cache (mincore over a
// read-only mapping of it), and f's size.
func Resident(f *os.File) (cached, size int64, err error) {
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return 0, 0, err
	}
	m, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return 0, 0, fmt.Errorf("map %s: %w", f.Name(), err)
	}
	defer unix.Munmap(m)
	page := int64(os.Getpagesize())
	vec := make([]byte, (fi.Size()+page-1)/page)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return 0, 0, fmt.Errorf("mincore %s: %w", f.Name(), e)
	}
	for _, v := range vec {
		if v&1 != 0 {
			cached += page
		}
	}
	return min(cached, fi.Size()), fi.Size(), nil
}

// Drop asks the host to drop f's pages from the page cache
// (POSIX_FADV_DONTNEED): clean pages nobody locked or maps go, the rest
// stay.
func Drop(f *os.File) error {
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return fmt.Errorf("drop %s from the page cache: %w", f.Name(), err)
	}
	return nil
}
