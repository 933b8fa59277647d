// Package imagestore writes and checks sealed checkpoint images (the format
// pandastack.ImageStore documents) and keeps them in a local directory: Local
// is the default ImageStore, Cache the local copies of a remote one
// (imagestore/s3). internal/sandbox uses the format for paused and warm
// images too; cmd/ picks the ImageStore.
//
// A sealed image is built in a temp directory beside its final place and
// renamed into place once complete and synced, so a crash never leaves a
// half image that looks whole.
package imagestore

import (
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

const (
	// ManifestName is the manifest's file name in an image directory.
	ManifestName = "manifest.json"
	// FilesDir holds what the checkpoint wrote.
	FilesDir = "image"

	manifestVersion = 1
)

// FileSum is one file's size and checksum.
type FileSum struct {
	Size   int64  `json:"size"`
	CRC32C uint32 `json:"crc32c"`
}

// Manifest describes an image: the facts a restore needs and a checksum of
// every file under FilesDir.
type Manifest struct {
	Version   int                `json:"version"`
	SandboxID string             `json:"sandbox_id"`
	Template  string             `json:"template"`
	RootFS    string             `json:"rootfs"`
	CPU       int                `json:"cpu"`
	MemoryMB  int                `json:"memory_mb"`
	CreatedAt time.Time          `json:"created_at"`
	Files     map[string]FileSum `json:"files"` // slash-separated, relative to FilesDir
	// Network is the sandbox's egress policy at checkpoint time; a sandbox
	// restored from the image gets it unless the create names another.
	Network *pandastack.NetworkPolicy `json:"network,omitempty"`
}

// Size is the total size of the image's files.
func (m Manifest) Size() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// NewCRC returns the checksum the manifest keeps (CRC-32C: integrity, not
// security; it runs at memory speed so restores stay fast).
func NewCRC() interface {
	io.Writer
	Sum32() uint32
} {
	return crc32.New(castagnoli)
}

// Checksum sums every regular file under dir.
func Checksum(dir string) (map[string]FileSum, int64, error) {
	sums := map[string]FileSum{}
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
		h := NewCRC()
		n, err := io.Copy(h, f)
		if err != nil {
			return err
		}
		sums[filepath.ToSlash(rel)] = FileSum{Size: n, CRC32C: h.Sum32()}
		total += n
		return nil
	})
	return sums, total, err
}

// Seal writes the manifest into tmp (which holds FilesDir), syncs
// everything and renames tmp to final. It returns the image's size. On an
// error nothing is at final: a sync of final's directory that failed
// after the rename left a whole image there, which the caller, removing
// only tmp, never removed (a paused sandbox's then refused every later
// pause, its rename finding the directory taken).
func Seal(tmp, final string, man Manifest) (int64, error) {
	sums, size, err := Checksum(filepath.Join(tmp, FilesDir))
	if err != nil {
		return 0, err
	}
	man.Version, man.Files = manifestVersion, sums
	b, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(tmp, ManifestName), b, 0o600); err != nil {
		return 0, err
	}
	if err := SyncTree(tmp); err != nil {
		return 0, err
	}
	if err := os.Rename(tmp, final); err != nil {
		return 0, err
	}
	if err := syncDir(filepath.Dir(final)); err != nil {
		os.RemoveAll(final)
		return 0, err
	}
	return size, nil
}

// ParseManifest decodes a manifest and checks its shape; what names the
// image in errors (ESnapshotCorrupt).
func ParseManifest(b []byte, what string) (Manifest, error) {
	var man Manifest
	if err := json.Unmarshal(b, &man); err != nil || man.Version != manifestVersion || len(man.Files) == 0 {
		return man, pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: its manifest is damaged; delete it and take a new one", what)
	}
	for name := range man.Files {
		if !filepath.IsLocal(name) || strings.Contains(name, `\`) {
			return man, pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: its manifest names a file outside the image (%q)", what, name)
		}
	}
	return man, nil
}

// ReadManifest reads and parses the manifest of an image directory
// without checking its files (Verify does).
func ReadManifest(dir, what string) (Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		if f := hostFault(err, what); f != nil {
			return Manifest{}, f
		}
		return Manifest{}, pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: its manifest is missing or unreadable; delete it and take a new one", what)
	}
	return ParseManifest(b, what)
}

// hostFault is the error for a read of an image that failed for a reason
// of the host's rather than the image's (no file descriptor or memory
// left, no permission), or nil: such an image may be whole, and the
// caller is not told to delete it (ESnapshotCorrupt) nor does a cache
// drop its copy. Out of descriptors or memory, a retry may pass.
func hostFault(err error, what string) error {
	switch {
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE), errors.Is(err, syscall.ENOMEM):
		return fmt.Errorf("%w (%v)", pandastack.Errorf(pandastack.EUnavailable, "%s could not be read now: the server is short of file descriptors or memory; retry", what), err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%s could not be read: %w", what, err)
	}
	return nil
}

// Verify reads the manifest of an image directory and checks every file
// against it. Any mismatch is an ESnapshotCorrupt naming the file; what
// names the image in errors.
func Verify(dir, what string) (Manifest, error) {
	man, err := ReadManifest(dir, what)
	if err != nil {
		return man, err
	}
	sums, _, err := Checksum(filepath.Join(dir, FilesDir))
	if err != nil {
		if f := hostFault(err, what); f != nil {
			return man, f
		}
		// The message names no host path; the log has the details.
		return man, fmt.Errorf("%w (%v)", pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: its files are missing or unreadable; delete it and take a new one", what), err)
	}
	for name, want := range man.Files {
		got, ok := sums[name]
		if err := CheckFile(what, name, got, want, ok); err != nil {
			return man, err
		}
	}
	return man, nil
}

// CheckFile compares a file's sum with the manifest's; present says the
// file exists at all.
func CheckFile(what, name string, got, want FileSum, present bool) error {
	switch {
	case !present:
		return pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: file %s is missing", what, name)
	case got.Size != want.Size:
		return pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: file %s has %d bytes, expected %d (truncated?)", what, name, got.Size, want.Size)
	case got.CRC32C != want.CRC32C:
		return pandastack.Errorf(pandastack.ESnapshotCorrupt, "%s: file %s fails its checksum (altered)", what, name)
	}
	return nil
}

// SyncTree fsyncs every file and directory under dir.
func SyncTree(dir string) error {
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

// syncDir is a variable for tests.
var syncDir = func(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// StorageError turns a full disk into a clear EStorage; other errors pass.
func StorageError(err error) error {
	var typed *pandastack.Error
	if err == nil || errors.As(err, &typed) {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) || strings.Contains(err.Error(), "no space left on device") {
		// The message names no host path; the log has the details.
		return fmt.Errorf("%w (%v)", pandastack.Errorf(pandastack.EStorage, "the server's disk is full; the partial image was removed"), err)
	}
	return err
}

// ValidID reports whether id can name an image: a snapshot id, with no
// path separators and not hidden (temp directories start with a dot).
func ValidID(id string) error {
	if id == "" || len(id) > 128 || strings.HasPrefix(id, ".") || strings.ContainsAny(id, `/\`) || !pandastack.StorableText(id) {
		return pandastack.Errorf(pandastack.EInvalid, "%q is not a valid image id", id)
	}
	return nil
}

// moveDir renames src to dst, copying across filesystems when it must;
// src is gone afterwards either way.
func moveDir(src, dst string) error {
	err := os.Rename(src, dst)
	if err == nil || !errors.Is(err, syscall.EXDEV) {
		if err != nil {
			os.RemoveAll(src)
		}
		return err
	}
	defer os.RemoveAll(src)
	tmp := filepath.Join(filepath.Dir(dst), ".tmp-copy-"+filepath.Base(dst)+"-"+pandastack.NewID("c"))
	if err := copyTree(src, tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := SyncTree(tmp); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.RemoveAll(tmp)
		return err
	}
	return nil
}

// LinkTree makes dst a copy of the directory tree src, each file a hard
// link to src's where it can be (the same filesystem), a copy where not.
// For images, whose files are never written once sealed: two directories
// then share the bytes, and removing either leaves the other whole.
func LinkTree(src, dst string) error {
	return eachFile(src, dst, "link", func(from, to string) error {
		if err := os.Link(from, to); err == nil || !(errors.Is(err, syscall.EXDEV) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EMLINK)) {
			return err
		}
		return copyFile(from, to)
	})
}

func copyTree(src, dst string) error { return eachFile(src, dst, "copy", copyFile) }

// eachFile makes dst's directories as src's and calls file for each
// regular file of src and its path under dst; anything else in src is an
// error (what says what was being done).
func eachFile(src, dst, what string, file func(from, to string) error) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		target := filepath.Join(dst, rel)
		if d.IsDir() {
			return os.MkdirAll(target, 0o700)
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%s %s: not a regular file", what, p)
		}
		return file(p, target)
	})
}

// copyFile copies the regular file src to a new file dst.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
