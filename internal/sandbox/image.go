package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/imagestore"
)

// An image directory holds what a checkpoint wrote (image/) and a manifest
// with the facts a restore needs and a checksum of every file, in the
// format of internal/imagestore, which also keeps snapshots (Config.Images).
// Paused sandboxes and warm templates are images in local directories.

type manifest = imagestore.Manifest

// sealImage writes the manifest into tmp (which holds image/), syncs
// everything and renames tmp to final. It returns the image's size.
func sealImage(tmp, final string, man manifest) (int64, error) {
	return imagestore.Seal(tmp, final, man)
}

// verifyImage checks every file of an image directory against its
// manifest, and that the template root filesystem it needs is there. Any
// mismatch is an ESnapshotCorrupt.
func verifyImage(dir, what string) (manifest, error) {
	man, err := imagestore.Verify(dir, what)
	if err != nil {
		return man, err
	}
	return man, checkRootFS(man, what)
}

func checkRootFS(man manifest, what string) error {
	if _, err := os.Stat(man.RootFS); err != nil {
		return pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: the root filesystem of template %s it was taken on is gone (rebuilt?)", what, man.Template)
	}
	return nil
}

// storageError turns a full disk into a short, clear error whose message
// ends with outcome (what became of the operation); the details (host
// paths, runsc's own trace) stay in the wrapped error, for the log.
func storageError(err error, outcome string) error {
	if err == nil || pandastack.IsCode(err, pandastack.EStorage) {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) || strings.Contains(err.Error(), "no space left on device") {
		return fmt.Errorf("%w (%v)", pandastack.Errorf(pandastack.EStorage, "the server's disk is full; %s", outcome), err)
	}
	return err
}

// roomError turns the failure of a restore of image into a clear
// EStorage when the filesystem the sandbox's disk is written to (diskDir's;
// "": image's) has less room left than the image takes: runsc then fails
// for want of space without saying so (exit status 128, no message), since
// a restore writes the sandbox's disk out again. A warm template's image
// is in the cache directory, which may be on another filesystem than the
// data directory the disks go to.
func roomError(err error, image, diskDir, outcome string) error {
	if err == nil || pandastack.IsCode(err, pandastack.EStorage) {
		return err
	}
	if diskDir == "" {
		diskDir = image
	}
	free, ferr := freeBytes(diskDir)
	if ferr != nil {
		return err
	}
	need := dirSize(image)
	if need < 0 || free >= need {
		return storageError(err, outcome)
	}
	return fmt.Errorf("%w (%v)", pandastack.Errorf(pandastack.EStorage, "the server's disk is nearly full (%d MiB free, and the restore writes up to %d MiB); %s", free>>20, need>>20, outcome), err)
}

// freeBytes is the room left for an unprivileged writer on dir's
// filesystem (a variable for the tests).
var freeBytes = func(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// What a failed checkpoint leaves: nothing, and the sandbox as it was.
const checkpointOutcome = "nothing was written and the sandbox runs on unchanged"

// sweepImages removes what an earlier run that died left half-written: the
// temp directories of snapshots, forks and pauses, and paused images whose
// sandbox is not paused (gone, stopped, or resumed just before the crash).
// The data directory's lock (serve) guarantees no other process writes here.
func (m *Manager) sweepImages(ctx context.Context) {
	remove := func(dir string) {
		if err := os.RemoveAll(dir); err != nil {
			m.log.Warn("remove a leftover image", "dir", dir, "err", err)
			return
		}
		m.log.Info("removed a leftover image", "dir", dir)
	}
	if m.cfg.SnapshotDir != "" {
		ents, _ := os.ReadDir(m.cfg.SnapshotDir)
		for _, e := range ents {
			if id, ok := strings.CutPrefix(e.Name(), pendingPrefix); ok {
				if m.dropUnrecorded(ctx, id) {
					os.Remove(filepath.Join(m.cfg.SnapshotDir, e.Name()))
				}
				continue
			}
			if strings.HasPrefix(e.Name(), ".tmp-") || strings.HasPrefix(e.Name(), ".fork-") {
				dir := filepath.Join(m.cfg.SnapshotDir, e.Name())
				id, staged := strings.CutSuffix(strings.TrimPrefix(e.Name(), ".tmp-"), "-sealed")
				if staged && !m.dropUnrecorded(ctx, id) {
					// The store did not answer: keep the name (emptied) as
					// the next start's reminder of what is left there.
					ents, _ := os.ReadDir(dir)
					for _, f := range ents {
						os.RemoveAll(filepath.Join(dir, f.Name()))
					}
					continue
				}
				remove(dir)
			}
		}
	}
	m.sweepSnapshotCache(ctx)
	if m.cfg.PausedDir == "" {
		return
	}
	ents, _ := os.ReadDir(m.cfg.PausedDir)
	for _, e := range ents {
		id := e.Name()
		if strings.HasPrefix(id, ".tmp-") {
			remove(filepath.Join(m.cfg.PausedDir, id))
			continue
		}
		sb, err := m.store.GetSandbox(ctx, "", id)
		if err == nil && sb.State == pandastack.StatePaused {
			continue
		}
		if err != nil && !pandastack.IsCode(err, pandastack.ENotFound) {
			continue // the store failed: keep it rather than guess
		}
		remove(filepath.Join(m.cfg.PausedDir, id))
		if err != nil || sb.State == pandastack.StateStopped {
			// Ended while this node was down or lost: the runtime's Stop
			// also drops what the network kept for its resume (the
			// policy's file), which nothing else would remove.
			m.rt.Stop(ctx, id)
		}
	}
}

// pendingPrefix names the file in SnapshotDir that stands for a snapshot
// whose image may be in the image store before its record is written, or
// after its record was deleted.
const pendingPrefix = ".pending-"

// dropUnrecorded removes from the image store what a crash left of
// snapshot id when no record of it was written, or after its record was
// deleted (DeleteSnapshot): the objects of an upload
// cut short (object storage keeps them, and the parts of a multipart
// upload, until someone deletes them), or a whole image uploaded just
// before the crash. Its traces in SnapshotDir are its staged image
// (".tmp-<id>-sealed", see saveSnapshot) and its pending file
// (pendingPrefix). It reports false when the stores did not answer, so
// that the trace is kept for another try.
func (m *Manager) dropUnrecorded(ctx context.Context, id string) bool {
	if m.cfg.Images == nil || imagestore.ValidID(id) != nil {
		return true
	}
	if _, err := m.store.GetSnapshot(ctx, "", id); !pandastack.IsCode(err, pandastack.ENotFound) {
		return err == nil // recorded: nothing to do; the store failed: try again
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := m.cfg.Images.Delete(ctx, id); err != nil {
		m.log.Warn("remove what an interrupted snapshot or snapshot delete left in the snapshot store; the next start tries again", "snapshot", id, "err", err)
		return false
	}
	m.log.Info("removed what an interrupted snapshot or snapshot delete left in the snapshot store", "snapshot", id)
	return true
}

// cachedImages is an ImageStore that keeps local copies of images other
// servers may delete (object storage).
type cachedImages interface {
	SweepCache(keep func(id string) bool, olderThan time.Duration) []string
}

// sweepSnapshotCache drops the local copies of snapshots deleted through
// another server (their record is gone); at start and hourly.
func (m *Manager) sweepSnapshotCache(ctx context.Context) {
	c, ok := m.cfg.Images.(cachedImages)
	if !ok {
		return
	}
	gone := c.SweepCache(func(id string) bool {
		_, err := m.store.GetSnapshot(ctx, "", id)
		return !pandastack.IsCode(err, pandastack.ENotFound)
	}, 10*time.Minute)
	if len(gone) > 0 {
		m.log.Info("dropped cached copies of deleted snapshots", "snapshots", gone)
	}
}
