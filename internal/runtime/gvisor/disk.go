package gvisor

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pandastack/pandastack"
)

// A sandbox's disk is runsc's file-backed overlay: the writable layer over
// the template's root filesystem lives in a sparse file (created, then
// unlinked, in the sandbox's directory on the host), limited to the disk's
// size, so a full disk is ENOSPC inside the sandbox and its pages are page
// cache the host can write back rather than sandbox memory that an
// upload could exhaust. Its content is saved with every checkpoint, as the
// in-memory overlay's was. Measured with this runsc: a restore must use the
// medium (memory or file) the image was taken with, and keeps the image's
// size whatever the flag says; so each image records its medium.

// DefaultDiskMB is a sandbox's disk size when neither its spec nor the
// driver's configuration gives one.
const DefaultDiskMB = 2048

const (
	diskFile      = "disk-mb"            // in the sandbox's dir: its disk size, 0 for memory
	imageDiskFile = "pandastack-disk-mb" // in an image dir: the same, for restores
)

// diskFor decides a sandbox's disk: for a boot, the spec's or the default
// size; for a restore, whatever the image was taken with (0: in memory,
// as images made before sandboxes had disks).
func (r *Runtime) diskFor(spec pandastack.RuntimeSpec, imageDir string) (int, error) {
	if imageDir != "" {
		b, err := os.ReadFile(filepath.Join(imageDir, imageDiskFile))
		if errors.Is(err, fs.ErrNotExist) {
			return 0, nil
		}
		if err != nil {
			return 0, fmt.Errorf("restore %s: %w", spec.ID, err)
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || n < 0 {
			return 0, pandastack.Errorf(pandastack.ESnapshotCorrupt, "the image's disk record is damaged")
		}
		return n, nil // runsc keeps the image's size; the flag only selects the medium
	}
	switch {
	case spec.DiskMB > 0:
		return spec.DiskMB, nil
	case spec.DiskMB < 0:
		return 0, pandastack.Errorf(pandastack.EInvalid, "disk size %d MiB is negative", spec.DiskMB)
	case r.cfg.DiskMB < 0:
		return 0, nil
	case r.cfg.DiskMB > 0:
		return r.cfg.DiskMB, nil
	}
	return DefaultDiskMB, nil
}

// flagSafe reports whether runsc's --overlay2 syntax can carry dir.
func flagSafe(dir string) bool { return !strings.ContainsAny(dir, ",:=") }

// overlayFlag is runsc's --overlay2 value for a sandbox whose directory is
// dir: its disk there, or memory.
func overlayFlag(dir string, diskMB int) string {
	if diskMB <= 0 {
		return "root:memory"
	}
	return fmt.Sprintf("root:dir=%s,size=%dm", dir, diskMB)
}

// sandboxDisk reads the disk size recorded in a sandbox's directory (0: in
// memory, also for sandboxes started before disks).
func sandboxDisk(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, diskFile))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return max(n, 0)
}

// markImageDisk records a checkpoint's disk size in its image directory,
// for a restore to use the same medium.
func markImageDisk(imageDir string, diskMB int) error {
	return os.WriteFile(filepath.Join(imageDir, imageDiskFile), []byte(strconv.Itoa(diskMB)), 0o644)
}
