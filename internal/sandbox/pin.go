package sandbox

import (
	"errors"
	"io/fs"
	"path/filepath"
	"sync"

	"github.com/pandastack/pandastack/internal/pagecache"
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
	files []*pagecache.Held
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
		h, err := pagecache.Hold(filepath.Join(dir, name))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			p.release()
			return nil, err
		}
		p.files = append(p.files, h)
		p.bytes += h.Bytes()
	}
	return p, nil
}

// release unlocks and unmaps the files: their pages stay cached until the
// host needs the memory. Safe on nil and more than once.
func (p *pinnedImage) release() {
	if p == nil {
		return
	}
	for _, h := range p.files {
		h.Release()
	}
	p.files, p.bytes = nil, 0
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

// release lets go of the image in dir, if it is held.
func (h *heldImages) release(dir string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p := h.pins[dir]; p != nil {
		p.release()
	}
	delete(h.pins, dir)
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
