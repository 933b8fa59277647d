package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"
)

// pinnedImage keeps a checkpoint image's files in the host's page cache:
// each is mapped and locked (mlock), so neither memory pressure nor a
// proactive reclaim drops them while the image waits for its restore.
// Without it a resume minutes after the suspend reads its image from disk
// (on the project's VM the kernel pages out file pages unread for 60 s):
// side by side, with the image dropped from the cache by the bench before
// the resume, the restore step took 274 ms p50 held against 405 ms not
// (go run ./bench -only idle-cold, docs/code-and-snapshots.md).
type pinnedImage struct {
	maps  [][]byte
	bytes int64
}

// pinnedFiles are the files of an image that a restore reads in full: the
// kernel's state, the memory pages and their index.
var pinnedFiles = []string{"checkpoint.img", "pages_meta.img", "pages.img"}

// pinImage maps and locks the files of the image in dir; locking reads
// those not in the page cache from disk. A missing file is skipped.
func pinImage(dir string) (*pinnedImage, error) {
	p := &pinnedImage{}
	for _, name := range pinnedFiles {
		if err := p.pin(filepath.Join(dir, name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			p.release()
			return nil, err
		}
	}
	return p, nil
}

func (p *pinnedImage) pin(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || fi.Size() == 0 {
		return err
	}
	b, err := unix.Mmap(int(f.Fd()), 0, int(fi.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("map %s: %w", path, err)
	}
	if err := unix.Mlock(b); err != nil {
		unix.Munmap(b)
		return fmt.Errorf("lock %s in memory: %w", path, err)
	}
	p.maps = append(p.maps, b)
	p.bytes += fi.Size()
	return nil
}

// release unlocks and unmaps the files: their pages stay cached until the
// host needs the memory. Safe on nil and more than once.
func (p *pinnedImage) release() {
	if p == nil {
		return
	}
	for _, b := range p.maps {
		unix.Munmap(b)
	}
	p.maps, p.bytes = nil, 0
}

// heldImages are the warm images a manager holds in the page cache while
// it runs, by directory: every create that no pool sandbox serves, and
// every pool refill, restores one, and the first create after a quiet
// spell of minutes would read it from disk.
type heldImages struct {
	mu   sync.Mutex
	pins map[string]*pinnedImage
}

// hold pins the image in dir unless it is held already.
func (h *heldImages) hold(dir string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pins[dir] != nil {
		return nil
	}
	pin, err := pinImage(dir)
	if err != nil {
		return err
	}
	if h.pins == nil {
		h.pins = map[string]*pinnedImage{}
	}
	h.pins[dir] = pin
	return nil
}

func (h *heldImages) bytes() int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return heldBytes(h.pins)
}

// heldBytes sums the bytes of pins (nil ones hold none).
func heldBytes(pins map[string]*pinnedImage) int64 {
	var n int64
	for _, p := range pins {
		if p != nil {
			n += p.bytes
		}
	}
	return n
}

func (h *heldImages) releaseAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for dir, p := range h.pins {
		p.release()
		delete(h.pins, dir)
	}
}
