package template

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// Cache layout under BuildOptions.CacheDir:
//
//	templates/<name>-<hash[:16]>/rootfs         a built root filesystem
//	templates/<name>-<hash[:16]>/template.json  written last; its presence means done
//	templates/stages/<suite>-<key>              pristine debootstrap output, shared
//	templates/.<name>.lock                      serialises builds of one name
//	templates/.build-<name>-*                   a build in progress (or a crashed one)
//	debs/                                       debootstrap's .deb cache
const (
	templatesDir = "templates"
	stagesDir    = "stages"
	markerFile   = "template.json"
	rootfsDir    = "rootfs"
)

// BuildOptions configures Build.
type BuildOptions struct {
	CacheDir string // required; usually paths.CacheDir()
	Mirror   string // Debian mirror for specs without one; default: the host's apt sources
	// SecurityMirror is the archive of <suite>-security; default: the
	// host's apt sources (none there: no security updates, with a warning).
	SecurityMirror string
	Progress       io.Writer // step lines and heartbeats; nil discards them
	Force          bool      // rebuild even when a build with this hash exists; the old one is deleted, or kept aside while a running sandbox has it mounted (RemoveStale and GC delete it later); the debootstrap stage is still reused
}

// Built describes a built template; it is also the content of template.json.
type Built struct {
	Name         string    `json:"name"`
	Hash         string    `json:"hash"`
	SizeBytes    int64     `json:"size_bytes"`
	BuildSeconds float64   `json:"build_seconds"`
	BuiltAt      time.Time `json:"built_at"`
	// BuildID is random, one per build: a --force rebuild has the same
	// hash and directory as the build before it but other files. Empty in
	// builds made before it was recorded; see ID.
	BuildID string `json:"build_id,omitempty"`
	Spec    Spec   `json:"spec"`

	Dir    string `json:"-"` // the build's directory in the cache
	RootFS string `json:"-"` // Dir/rootfs: give it to the runtime read-only
}

// ID names this build among the builds of its spec, for what was made of
// its files (a warm image) and must not outlive them: BuildID, or for a
// build made before build ids, its build time.
func (b Built) ID() string {
	if b.BuildID != "" {
		return b.BuildID
	}
	return fmt.Sprintf("t%x", b.BuiltAt.UnixNano())
}

// newBuildID returns a random BuildID.
func newBuildID() string {
	var id [8]byte
	rand.Read(id[:])
	return hex.EncodeToString(id[:])
}

// Dir returns the directory Build uses for spec under cacheDir, whether or
// not it exists yet.
func Dir(cacheDir string, spec Spec) string {
	return filepath.Join(cacheDir, templatesDir, spec.Name+"-"+spec.Hash()[:16])
}

// Lookup returns the finished build of spec (same name and hash) without
// building anything. It costs one small file read.
func Lookup(cacheDir string, spec Spec) (Built, bool) {
	if !nameRE.MatchString(spec.Name) {
		return Built{}, false // and keep a name like ../x out of the path
	}
	b, err := readBuilt(Dir(cacheDir, spec))
	if err != nil || b.Name != spec.Name || b.Hash != spec.Hash() {
		return Built{}, false
	}
	return b, true
}

func readBuilt(dir string) (Built, error) {
	data, err := os.ReadFile(filepath.Join(dir, markerFile))
	if err != nil {
		return Built{}, err
	}
	var b Built
	if err := json.Unmarshal(data, &b); err != nil {
		return Built{}, fmt.Errorf("%s: %w", filepath.Join(dir, markerFile), err)
	}
	b.Dir = dir
	b.RootFS = filepath.Join(dir, rootfsDir)
	if st, err := os.Stat(b.RootFS); err != nil || !st.IsDir() {
		return Built{}, fmt.Errorf("%s: rootfs missing", dir)
	}
	return b, nil
}

// ListBuilt returns every finished build in cacheDir, sorted by name and
// then newest first. Builds in progress and unreadable entries are skipped;
// a missing cache is an empty list.
func ListBuilt(cacheDir string) ([]Built, error) {
	root := filepath.Join(cacheDir, templatesDir)
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list built templates: %w", err)
	}
	var out []Built
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") || e.Name() == stagesDir {
			continue
		}
		if b, err := readBuilt(filepath.Join(root, e.Name())); err == nil {
			out = append(out, b)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].BuiltAt.After(out[j].BuiltAt)
	})
	return out, nil
}

// errInUse: a process (a running sandbox) has the tree mounted.
var errInUse = errors.New("mounted by a running process")

// Remove deletes a build from the cache. It refuses while anything is
// mounted beneath it. The caller must know no sandbox still uses its rootfs,
// and hold the build lock of its name. The build first leaves its place for
// a .old.NAME.N one, as a --force rebuild's old build does: a removal cut
// short (killed, a disk error) leaves no half-deleted build that Lookup
// takes for built, and RemoveStale finishes it.
func Remove(b Built) error {
	if b.Dir == "" || filepath.Base(filepath.Dir(b.Dir)) != templatesDir || !nameRE.MatchString(b.Name) {
		return fmt.Errorf("remove template: %q is not a build directory", b.Dir)
	}
	if err := checkUnused(b.Dir); err != nil {
		return err
	}
	aside := filepath.Join(filepath.Dir(b.Dir), fmt.Sprintf(".old.%s.%d", b.Name, time.Now().UnixNano()))
	if err := os.Rename(b.Dir, aside); err != nil {
		return fmt.Errorf("remove %s: %w", b.Dir, err)
	}
	return removeTree(aside)
}

// removeTree removes dir after making sure nothing is mounted beneath it:
// os.RemoveAll through a bind mount would delete the host's files.
func removeTree(dir string) error {
	if err := checkUnused(dir); err != nil {
		return err
	}
	if err := removeAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// checkUnused fails when something is mounted beneath dir, in this mount
// namespace or any other.
func checkUnused(dir string) error {
	mounted, err := mountsUnder(dir)
	if err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	if len(mounted) > 0 {
		return fmt.Errorf("remove %s: still mounted: %s", dir, strings.Join(mounted, ", "))
	}
	// A sandbox's gofer holds its rootfs in a mount namespace of its own:
	// this process's table does not show it, and deleting the files would
	// pull the root filesystem out from under a running sandbox.
	used, err := inUseBy()
	if err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	if m := used(dir); m != "" {
		return fmt.Errorf("remove %s: %w (%s)", dir, errInUse, m)
	}
	return nil
}

// removeAll is os.RemoveAll; a test cuts it short.
var removeAll = os.RemoveAll

// mirrors resolves the archives a build of spec uses: the spec's own mirror,
// else the operator's, else the host's apt sources.
func (o BuildOptions) mirrors(spec Spec) (Mirrors, error) {
	m := Mirrors{Debian: spec.Mirror, Security: o.SecurityMirror}
	if m.Debian == "" {
		m.Debian = o.Mirror
	}
	if m.Debian != "" && m.Security != "" {
		return m, nil
	}
	host, err := HostMirrors()
	if m.Debian == "" {
		if err != nil {
			return m, err
		}
		m.Debian = host.Debian
	}
	if m.Security == "" {
		m.Security = host.Security
	}
	return m, nil
}
