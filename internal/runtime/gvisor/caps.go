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

// The agent's capabilities and the mounts are part of a container's spec,
// and runsc checks a restore's spec against the one the image was taken
// with (--restore-spec-validation, enforced by default): an image taken
// with another set or other mount options does not restore. So every
// container records the revision of the spec it runs with (the files keep
// their first name, caps-revision), each image takes that record along,
// and a restore (or a container prepared for one) uses the image's.

const (
	capsFile      = "caps-revision"            // in the sandbox's dir
	imageCapsFile = "pandastack-caps-revision" // in an image dir
)

// capsRevision is the revision of the spec new sandboxes get. 1: the
// capabilities before the agent held CAP_SYS_ADMIN (images without a
// record); 2: agentCaps; 3: agentCaps, and /dev/shm sized (shmOptions).
const capsRevision = 3

// capsOf is the capability set of a revision.
func capsOf(rev int) []string {
	if rev == 1 {
		return agentCaps[:len(agentCaps)-1] // all but CAP_SYS_ADMIN, the last
	}
	return agentCaps
}

// shmSized says whether a revision's /dev/shm has a size.
func shmSized(rev int) bool { return rev >= 3 }

// capsFor is the revision a sandbox runs with: this one for a boot, the
// image's for a restore.
func (r *Runtime) capsFor(imageDir string) (int, error) {
	if imageDir == "" {
		if r.bootCaps != 0 {
			return r.bootCaps, nil // a test's older server
		}
		return capsRevision, nil
	}
	b, err := os.ReadFile(filepath.Join(imageDir, imageCapsFile))
	if errors.Is(err, fs.ErrNotExist) {
		return 1, nil
	}
	if err != nil {
		return 0, fmt.Errorf("restore: %w", err)
	}
	rev, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || rev < 1 || rev > capsRevision {
		return 0, pandastack.Errorf(pandastack.ESnapshotCorrupt, "the image's spec revision %q is damaged or from a newer server: restore it on a node of that version or later", strings.TrimSpace(string(b)))
	}
	return rev, nil
}

// sandboxCaps reads the revision recorded in a sandbox's directory (1 for
// a sandbox started before the record).
func sandboxCaps(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, capsFile))
	if err != nil {
		return 1
	}
	rev, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || rev < 1 || rev > capsRevision {
		return 1
	}
	return rev
}

// markImageCaps records a checkpoint's capability revision in its image.
func markImageCaps(imageDir string, rev int) error {
	return os.WriteFile(filepath.Join(imageDir, imageCapsFile), []byte(strconv.Itoa(rev)), 0o644)
}
