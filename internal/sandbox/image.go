package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/pandastack/pandastack"
)

// An image directory holds what a checkpoint wrote (image/) and a manifest
// with the facts a restore needs and a checksum of every file. It is built
// in a temp directory beside its final place and renamed into place once
// complete and synced, so a crash never leaves a half image that looks whole.

const manifestVersion = 1

type fileSum struct {
	Size   int64  `json:"size"`
	CRC32C uint32 `json:"crc32c"`
}

type manifest struct {
	Version   int                `json:"version"`
	SandboxID string             `json:"sandbox_id"`
	Template  string             `json:"template"`
	RootFS    string             `json:"rootfs"`
	CPU       int                `json:"cpu"`
	MemoryMB  int                `json:"memory_mb"`
	CreatedAt time.Time          `json:"created_at"`
	Files     map[string]fileSum `json:"files"` // relative to image/
	// Network is the sandbox's egress policy at checkpoint time; a sandbox
	// restored from the image gets it unless the create names another.
	Network *pandastack.NetworkPolicy `json:"network,omitempty"`
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksumDir sums every regular file under dir (CRC-32C: integrity, not
// security; it runs at memory speed so restores stay fast).
func checksumDir(dir string) (map[string]fileSum, int64, error) {
	sums := map[string]fileSum{}
	var total int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		h := crc32.New(castagnoli)
		n, err := io.Copy(h, f)
		if err != nil {
			return err
		}
		sums[rel] = fileSum{Size: n, CRC32C: h.Sum32()}
		total += n
		return nil
	})
	return sums, total, err
}

// sealImage writes the manifest into tmp (which holds image/), syncs
// everything and renames tmp to final. It returns the image's size.
func sealImage(tmp, final string, man manifest) (int64, error) {
	sums, size, err := checksumDir(filepath.Join(tmp, "image"))
	if err != nil {
		return 0, err
	}
	man.Version, man.Files = manifestVersion, sums
	b, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "manifest.json"), b, 0o600); err != nil {
		return 0, err
	}
	if err := syncTree(tmp); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return 0, err
	}
	return size, syncDir(filepath.Dir(final))
}

func syncTree(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return syncDir(p)
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	})
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// verifyImage reads the manifest of an image directory and checks every
// file against it. Any mismatch is an ESnapshotCorrupt naming the file.
func verifyImage(dir, what string) (manifest, error) {
	var man manifest
	b, err := os.ReadFile(filepath.Join(dir, "manifest.json"))
	if err != nil {
		return man, pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: its manifest is missing or unreadable; delete it and take a new one", what)
	}
	if err := json.Unmarshal(b, &man); err != nil || man.Version != manifestVersion || len(man.Files) == 0 {
		return man, pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: its manifest is damaged; delete it and take a new one", what)
	}
	sums, _, err := checksumDir(filepath.Join(dir, "image"))
	if err != nil {
		// The message names no host path; the log has the details.
		return man, fmt.Errorf("%w (%v)", pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: its files are missing or unreadable; delete it and take a new one", what), err)
	}
	for name, want := range man.Files {
		got, ok := sums[name]
		switch {
		case !ok:
			return man, pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: file %s is missing", what, name)
		case got.Size != want.Size:
			return man, pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: file %s has %d bytes, expected %d (truncated?)", what, name, got.Size, want.Size)
		case got.CRC32C != want.CRC32C:
			return man, pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: file %s fails its checksum (altered on disk)", what, name)
		}
	}
	if _, err := os.Stat(man.RootFS); err != nil {
		return man, pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: the root filesystem of template %s it was taken on is gone (rebuilt?)", what, man.Template)
	}
	return man, nil
}

// storageError turns a full disk into a short, clear error whose message
// ends with outcome (what became of the operation); the details (host
// paths, runsc's own trace) stay in the wrapped error, for the log.
func storageError(err error, outcome string) error {
	if errors.Is(err, syscall.ENOSPC) || strings.Contains(err.Error(), "no space left on device") {
		return fmt.Errorf("%w (%v)", pandastack.Errorf(pandastack.EStorage, "the server's disk is full; %s", outcome), err)
	}
	return err
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
			if strings.HasPrefix(e.Name(), ".tmp-") || strings.HasPrefix(e.Name(), ".fork-") {
				remove(filepath.Join(m.cfg.SnapshotDir, e.Name()))
			}
		}
	}
	if m.cfg.PausedDir == "" {
		return
	}
	ents, _ := os.ReadDir(m.cfg.PausedDir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".tmp-") {
			sb, err := m.store.GetSandbox(ctx, "", e.Name())
			if err == nil && sb.State == pandastack.StatePaused {
				continue
			}
			if err != nil && !pandastack.IsCode(err, pandastack.ENotFound) {
				continue // the store failed: keep it rather than guess
			}
		}
		remove(filepath.Join(m.cfg.PausedDir, e.Name()))
	}
}
