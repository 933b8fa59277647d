package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"sync"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/imagestore"
)

// saveSnapshot checkpoints a quiesced sandbox into a sealed image in
// SnapshotDir, lets the sandbox go on, and hands the image to the image
// store: the sandbox does not wait for an upload. It returns the image's
// size, and whether the image store was given it (so may hold some of it
// after an error).
func (m *Manager) saveSnapshot(ctx context.Context, sb pandastack.Sandbox, snapID string) (int64, bool, error) {
	// A crash leaves at most a .tmp-* directory, swept at start.
	staged := filepath.Join(m.cfg.SnapshotDir, ".tmp-"+snapID+"-sealed")
	_, err := m.checkpoint(ctx, sb, staged, true)
	m.sbx.settle(sb.ID)
	if err != nil {
		return 0, false, m.checkpointError(ctx, sb.ID, "its snapshot", err)
	}
	// The snapshot is taken: a client that hangs up does not undo it.
	size, err := m.cfg.Images.Put(context.WithoutCancel(ctx), snapID, staged)
	return size, true, err
}

// savePausedSnapshot hands the image store a snapshot of paused sandbox
// id (claimed by the caller): a copy of its paused image, sealed with its
// manifest and checksums when it paused, whose files are hard links to
// the paused image's. Neither is written again, and each outlives the
// other: the resume removes the paused image, a snapshot's delete its own.
// linked is called once the links are made, before the upload: the
// caller's claim on the sandbox can go then.
func (m *Manager) savePausedSnapshot(ctx context.Context, id, snapID string, linked func()) (int64, bool, error) {
	staged := filepath.Join(m.cfg.SnapshotDir, ".tmp-"+snapID+"-sealed")
	err := imagestore.LinkTree(m.pausedPath(id), staged)
	if err == nil {
		// The links' directory entries (the files' bytes were synced when
		// the sandbox paused, so their fsyncs find nothing to write).
		err = imagestore.SyncTree(staged)
	}
	if err != nil {
		os.RemoveAll(staged)
		return 0, false, storageError(err, "no snapshot was taken")
	}
	// The links outlive the paused image (a resume or a kill removes it):
	// the sandbox is free from here on.
	linked()
	size, err := m.cfg.Images.Put(context.WithoutCancel(ctx), snapID, staged)
	return size, true, err
}

// openSnapshot makes the image of snapshot id available on local disk,
// checked against its manifest, and returns the manifest. Close the image
// once the restore has opened its files.
func (m *Manager) openSnapshot(ctx context.Context, id string) (manifest, pandastack.OpenImage, error) {
	what := "snapshot " + id
	release, ok := m.snapUse.take(id)
	if !ok {
		return manifest{}, nil, pandastack.Errorf(pandastack.ENotFound, "%s is being deleted", what)
	}
	img, err := m.cfg.Images.Open(ctx, id)
	if err != nil {
		release()
	}
	if pandastack.IsCode(err, pandastack.ENotFound) {
		// The record exists (the caller found it): its files do not.
		if !m.cfg.Node.PlaceRestores && m.otherNodes() {
			// Likely on another node's disk: not to be deleted for it.
			return manifest{}, nil, pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: its files are not in this node's snapshot store; they are likely on another node's disk: nodes that share a database each need the same s3:// snapshot store (--snapshot-store), or snapshots taken on one are missing on the others", what)
		}
		return manifest{}, nil, pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: its files are gone from the snapshot store; delete it and take a new one", what)
	}
	if err != nil {
		return manifest{}, nil, err
	}
	man, err := imagestore.ReadManifest(img.Dir(), what)
	if err == nil {
		man.RootFS = m.localRootFS(ctx, man)
		err = checkRootFS(man, what)
	}
	if err != nil {
		img.Close()
		release()
		return manifest{}, nil, err
	}
	return man, usedImage{OpenImage: img, release: release}, nil
}

// localRootFS is where this node keeps the root filesystem a snapshot was
// taken on: man.RootFS, the path on the node that took it, when it is
// there; else the same build (the directory named for the template and its
// spec's hash) in this node's own templates directory, so that nodes with
// caches in other places restore each other's snapshots (they were
// refused as corrupt). man.RootFS when neither is there.
func (m *Manager) localRootFS(ctx context.Context, man manifest) string {
	if _, err := os.Stat(man.RootFS); err == nil || man.RootFS == "" {
		return man.RootFS
	}
	tpl, err := m.templates.Resolve(ctx, man.Template)
	if err != nil || tpl.RootFS == "" {
		return man.RootFS
	}
	p := filepath.Join(filepath.Dir(filepath.Dir(tpl.RootFS)), filepath.Base(filepath.Dir(man.RootFS)), filepath.Base(man.RootFS))
	if _, err := os.Stat(p); err != nil {
		return man.RootFS
	}
	return p
}

// snapshotUse counts the restores in flight from each snapshot, so that
// deleting one under a restore is refused rather than failing the restore
// (runsc opens the pages file while it restores); and it marks the ones
// being deleted, so that a restore then is refused as not found rather
// than finding half the files gone (snapshot_corrupt).
type snapshotUse struct {
	mu       sync.Mutex
	n        map[string]int
	deleting map[string]chan struct{} // closed when the delete ends
}

// take counts a use of snapshot id; call the returned release once. It
// reports false, counting nothing, while id is being deleted.
func (u *snapshotUse) take(id string) (release func(), ok bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.deleting[id] != nil {
		return func() {}, false
	}
	if u.n == nil {
		u.n = make(map[string]int)
	}
	u.n[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			u.mu.Lock()
			defer u.mu.Unlock()
			if u.n[id]--; u.n[id] == 0 {
				delete(u.n, id)
			}
		})
	}, true
}

func (u *snapshotUse) inUse(id string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.n[id] > 0
}

// deleteStarts marks id as being deleted, unless a restore uses it, or
// another delete runs (false; deleting is then closed when that one
// ends); call the returned done once the delete has ended.
func (u *snapshotUse) deleteStarts(id string) (done func(), deleting <-chan struct{}, ok bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if ch := u.deleting[id]; ch != nil {
		return nil, ch, false
	}
	if u.n[id] > 0 {
		return nil, nil, false
	}
	if u.deleting == nil {
		u.deleting = make(map[string]chan struct{})
	}
	ch := make(chan struct{})
	u.deleting[id] = ch
	return func() {
		u.mu.Lock()
		defer u.mu.Unlock()
		delete(u.deleting, id)
		close(ch)
	}, nil, true
}

// usedImage releases its snapshot's use when closed.
type usedImage struct {
	pandastack.OpenImage
	release func()
}

func (i usedImage) Close() error {
	defer i.release()
	return i.OpenImage.Close()
}
