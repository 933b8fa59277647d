package sandbox

import (
	"errors"
	"os"
	"strings"
	"syscall"

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

// storageError turns a full disk into a clear error.
func storageError(err error) error {
	if errors.Is(err, syscall.ENOSPC) || strings.Contains(err.Error(), "no space left on device") {
		return pandastack.Errorf(pandastack.EStorage, "the server's disk is full; the partial snapshot was removed (%v)", err)
	}
	return err
}
