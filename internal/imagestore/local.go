package imagestore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
)

// Local is the default ImageStore: images in a directory of this server,
// <root>/<id>/ (manifest.json + image/). Put is a rename; Open checks every
// file against the manifest, each time.
type Local struct {
	root string
}

var _ pandastack.ImageStore = (*Local)(nil)

// NewLocal returns the store on root; the first Put makes root if needed.
func NewLocal(root string) *Local { return &Local{root: root} }

// SweepCopies removes the copies into root that a Put across filesystems
// left when its process died (.tmp-copy-*), once nothing in one has been
// written for olderThan: several servers may share the directory, and
// another's copy may be under way. It returns how many it removed.
func SweepCopies(root string, olderThan time.Duration) int {
	ents, _ := os.ReadDir(root)
	n := 0
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ".tmp-copy-") {
			continue
		}
		dir := filepath.Join(root, e.Name())
		newest := time.Time{}
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil {
				if fi, err := d.Info(); err == nil && fi.ModTime().After(newest) {
					newest = fi.ModTime()
				}
			}
			return nil
		})
		if time.Since(newest) >= olderThan && os.RemoveAll(dir) == nil {
			n++
		}
	}
	return n
}

// Root is the store's directory; a staging directory beside it makes Put a
// rename.
func (l *Local) Root() string { return l.root }

func (l *Local) Put(ctx context.Context, id, dir string) (int64, error) {
	if err := ValidID(id); err != nil {
		os.RemoveAll(dir)
		return 0, err
	}
	// The manifest only: every Open checks the files, and a snapshot
	// should not pay for a second pass over every byte right after Seal.
	man, err := ReadManifest(dir, "image "+id)
	if err != nil {
		os.RemoveAll(dir)
		return 0, err
	}
	if err := os.MkdirAll(l.root, 0o700); err != nil {
		os.RemoveAll(dir)
		return 0, StorageError(err)
	}
	final := filepath.Join(l.root, id)
	if _, err := os.Lstat(final); err == nil {
		os.RemoveAll(dir)
		return 0, pandastack.Errorf(pandastack.EConflict, "image %s already exists", id)
	}
	if err := moveDir(dir, final); err != nil {
		return 0, StorageError(err)
	}
	return man.Size(), syncDir(l.root)
}

func (l *Local) Open(ctx context.Context, id string) (pandastack.OpenImage, error) {
	if err := ValidID(id); err != nil {
		return nil, pandastack.Errorf(pandastack.ENotFound, "no image %q", id)
	}
	dir := filepath.Join(l.root, id)
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, pandastack.Errorf(pandastack.ENotFound, "no image %s", id)
	}
	if _, err := Verify(dir, "snapshot "+id); err != nil {
		return nil, err
	}
	return openDir{dir: dir}, nil
}

func (l *Local) Delete(ctx context.Context, id string) error {
	if ValidID(id) != nil {
		return nil
	}
	return os.RemoveAll(filepath.Join(l.root, id))
}

type openDir struct {
	dir     string
	release func()
}

func (o openDir) Dir() string { return o.dir }

func (o openDir) Close() error {
	if o.release != nil {
		o.release()
	}
	return nil
}

// Cache keeps local copies of remote images in a directory, <root>/<id>/,
// up to a total size: past it, the least recently opened images that no
// caller holds open are evicted. Every Open checks the copy again.
type Cache struct {
	root string
	max  int64 // bytes; 0 means no limit

	mu       sync.Mutex
	leases   map[string]int           // open images by id
	fetching map[string]chan struct{} // ids being filled, closed when done
}

// NewCache returns the cache on root, removing temp directories a crash
// left there.
func NewCache(root string, maxBytes int64) (*Cache, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, StorageError(err)
	}
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			os.RemoveAll(filepath.Join(root, e.Name()))
		}
	}
	return &Cache{root: root, max: maxBytes, leases: map[string]int{}, fetching: map[string]chan struct{}{}}, nil
}

// Root is the cache's directory; stage images beside their place there.
func (c *Cache) Root() string { return c.root }

// TempDir makes a new temp directory in the cache for filling image id;
// Admit it or remove it.
func (c *Cache) TempDir(id string) (string, error) {
	dir, err := os.MkdirTemp(c.root, ".tmp-"+id+"-")
	return dir, StorageError(err)
}

// Fill serialises the filling of one id: it returns once no other caller
// fills id, and done must be called when this caller is through.
func (c *Cache) Fill(ctx context.Context, id string) (done func(), err error) {
	for {
		c.mu.Lock()
		ch, busy := c.fetching[id]
		if !busy {
			ch = make(chan struct{})
			c.fetching[id] = ch
			c.mu.Unlock()
			return func() {
				c.mu.Lock()
				delete(c.fetching, id)
				c.mu.Unlock()
				close(ch)
			}, nil
		}
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Open returns the cached image id after checking it, or ok false when it
// is not cached. A copy that fails its check is removed (and ok is false),
// so the caller fetches it again. One that could not be read for a reason
// of the host's (no file descriptor free) is kept, and err says why: a
// fetch would fail alike, or replace a copy another restore holds.
func (c *Cache) Open(id, what string) (_ pandastack.OpenImage, ok bool, err error) {
	dir := filepath.Join(c.root, id)
	// Looked at and leased as one step, under c.mu, as drop looks at the
	// leases and moves a copy away: a copy this finds is not removed under
	// it.
	c.mu.Lock()
	if _, err := os.Stat(dir); err != nil {
		c.mu.Unlock()
		return nil, false, nil
	}
	c.leases[id]++
	c.mu.Unlock()
	release := c.unlease(id)
	if _, err := Verify(dir, what); err != nil {
		release()
		if !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
			return nil, false, err
		}
		c.Remove(id)
		return nil, false, nil
	}
	now := time.Now()
	os.Chtimes(dir, now, now) // recently used: evicted last
	return openDir{dir: dir, release: release}, true, nil
}

// Admit moves the sealed image directory dir into the cache as id, opens
// it for the caller, and evicts others past the size limit. dir is gone
// afterwards either way.
func (c *Cache) Admit(id, dir string) (pandastack.OpenImage, error) {
	final := filepath.Join(c.root, id)
	os.RemoveAll(final) // a stale copy (only a Fill holder admits)
	if err := moveDir(dir, final); err != nil {
		return nil, StorageError(err)
	}
	now := time.Now()
	os.Chtimes(final, now, now) // used now: Sweep and evict go by this
	release := c.lease(id)
	c.evict()
	return openDir{dir: final, release: release}, nil
}

// Sweep removes the cached images, not open, being filled or used in the
// last olderThan, that keep says to drop, and returns their ids.
func (c *Cache) Sweep(keep func(id string) bool, olderThan time.Duration) []string {
	ents, _ := os.ReadDir(c.root)
	var gone []string
	for _, e := range ents {
		id := e.Name()
		if !e.IsDir() || strings.HasPrefix(id, ".") || ValidID(id) != nil {
			continue
		}
		if info, err := e.Info(); err != nil || time.Since(info.ModTime()) < olderThan {
			continue // (an image admitted before its record is written)
		}
		if keep(id) {
			continue
		}
		if c.drop(id) {
			gone = append(gone, id)
		}
	}
	return gone
}

// drop removes the copy of id unless it is open or being filled, and
// reports whether it did. The look at the leases and the copy's move out
// of its place are one step under c.mu, which Open takes to lease it: a
// restore either holds the copy first, and it stays, or finds none and
// fetches it again; removed after a look, a copy could go while a restore
// that had just checked it was about to open its files.
func (c *Cache) drop(id string) bool {
	c.mu.Lock()
	if c.leases[id] > 0 || c.fetching[id] != nil {
		c.mu.Unlock()
		return false
	}
	gone := filepath.Join(c.root, fmt.Sprintf(".tmp-gone-%s-%d", id, time.Now().UnixNano()))
	err := os.Rename(filepath.Join(c.root, id), gone)
	c.mu.Unlock()
	if err != nil {
		return false
	}
	if beforeRemove != nil {
		beforeRemove(id)
	}
	os.RemoveAll(gone) // what a crash leaves here, NewCache sweeps
	return true
}

// beforeRemove, if set (tests), runs once drop has taken a copy away and
// before it removes its files.
var beforeRemove func(id string)

// Remove drops id from the cache. Restores that opened its files keep them.
func (c *Cache) Remove(id string) {
	if ValidID(id) == nil {
		os.RemoveAll(filepath.Join(c.root, id))
	}
}

func (c *Cache) lease(id string) func() {
	c.mu.Lock()
	c.leases[id]++
	c.mu.Unlock()
	return c.unlease(id)
}

// unlease returns the release of a lease of id taken.
func (c *Cache) unlease(id string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			if c.leases[id]--; c.leases[id] <= 0 {
				delete(c.leases, id)
			}
			c.mu.Unlock()
		})
	}
}

// evict removes the least recently used images not open until the cache
// fits its limit.
func (c *Cache) evict() {
	if c.max <= 0 {
		return
	}
	type entry struct {
		id   string
		size int64
		used time.Time
	}
	var all []entry
	var total int64
	ents, _ := os.ReadDir(c.root)
	for _, e := range ents {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		size := DirSize(filepath.Join(c.root, e.Name()))
		all = append(all, entry{e.Name(), size, info.ModTime()})
		total += size
	}
	sort.Slice(all, func(i, j int) bool { return all[i].used.Before(all[j].used) })
	for _, e := range all {
		if total <= c.max {
			return
		}
		if c.drop(e.id) {
			total -= e.size
		}
	}
}

// DirSize adds up the sizes of the files under dir.
func DirSize(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
