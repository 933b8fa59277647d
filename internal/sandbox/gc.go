package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/imagestore"
)

// Template garbage collection, the sandbox side: what refers to a
// template's root filesystem. Every restore needs the exact rootfs its
// image was checkpointed on, so a build stays while a sandbox runs on it,
// a paused sandbox or a snapshot was taken on it, or a warm image still
// worth keeping was made from it. internal/template.GC removes the rest;
// cmd/pandastack wires the two (`pandastack template gc`).

// RootFSRefs are the references CollectRootFSRefs found.
type RootFSRefs struct {
	// Paths maps a rootfs path to the first thing found using it.
	Paths map[string]string
	// Unknown maps a template name to the newest time something of it was
	// made whose rootfs could not be read (a snapshot in object storage,
	// whose manifest would need a download; an old record without one):
	// every build of that template made before then is kept.
	Unknown map[string]time.Time
}

// Keeps reports whether the build of template at rootfs, built at builtAt,
// is referenced, and by what. Paths are compared resolved (see
// CanonicalPath): the server and gc may spell the cache directory two ways.
func (r RootFSRefs) Keeps(template, rootfs string, builtAt time.Time) (string, bool) {
	if by, ok := r.Paths[CanonicalPath(rootfs)]; ok {
		return by, true
	}
	if t, ok := r.Unknown[template]; ok && !builtAt.After(t) {
		return fmt.Sprintf("something of template %s made at %s whose root filesystem is not known here", template, t.UTC().Format(time.RFC3339)), true
	}
	return "", false
}

func (r *RootFSRefs) add(rootfs, by string) {
	p := CanonicalPath(rootfs)
	if _, ok := r.Paths[p]; !ok {
		r.Paths[p] = by
	}
}

// CanonicalPath is p with its symlinks resolved, so that a cache directory
// reached through a symlink (the server's PANDASTACK_CACHE_DIR, a default
// path that sudo leaves gc with) names the same builds; a path that does
// not resolve (a build gone) stays as it is spelled, cleaned.
func CanonicalPath(p string) string {
	p = filepath.Clean(p)
	if real, err := filepath.EvalSymlinks(p); err == nil {
		return real
	}
	return p
}

func (r *RootFSRefs) unknown(template string, at time.Time) {
	if t, ok := r.Unknown[template]; !ok || at.After(t) {
		r.Unknown[template] = at
	}
}

// RefSources says where CollectRootFSRefs looks.
type RefSources struct {
	Store     pandastack.Store
	Images    pandastack.ImageStore // snapshots; manifests are read only where they are local files
	PausedDir string
	WarmDir   string
	// Current reports whether rootfs is the current build of a template.
	// A warm image of any other build that is older than WarmMinAge is
	// removed (unless DryRun) and refers to nothing: no create restores it
	// any more, and another server sharing the cache had WarmMinAge to
	// stop using it.
	Current func(rootfs string) bool
	// CurrentWarm, when set, further says whether a warm image (by its
	// directory's name, see WarmImageDir) is the one a server with this
	// agent restores: one of a current build but an older agent is
	// removed like one of an old build.
	CurrentWarm func(name string) bool
	WarmMinAge  time.Duration
	DryRun      bool
}

// WarmRemoval is a warm image CollectRootFSRefs removed (or would).
type WarmRemoval struct {
	Dir   string
	Bytes int64
}

// CollectRootFSRefs finds every reference to a template rootfs in the
// store (sandboxes not stopped, snapshots), the paused and the warm images,
// and removes warm images of superseded builds as RefSources says. It
// returns the warm images it removed (or would remove), with their sizes. A store that
// fails is an error: guessing would delete what is in use. Cost: a list of
// sandboxes and snapshots and a read of one small manifest per image.
func CollectRootFSRefs(ctx context.Context, src RefSources) (RootFSRefs, []WarmRemoval, error) {
	refs := RootFSRefs{Paths: map[string]string{}, Unknown: map[string]time.Time{}}
	sbs, err := src.Store.ListSandboxes(ctx, pandastack.SandboxFilter{})
	if err != nil {
		return refs, nil, fmt.Errorf("list sandboxes: %w", err)
	}
	for _, sb := range sbs {
		if sb.State == pandastack.StateStopped {
			continue
		}
		if sb.RootFS == "" {
			refs.unknown(sb.Template, time.Now())
			continue
		}
		refs.add(sb.RootFS, fmt.Sprintf("sandbox %s (%s)", sb.ID, sb.State))
	}
	snaps, err := src.Store.ListSnapshots(ctx, "", nil)
	if err != nil {
		return refs, nil, fmt.Errorf("list snapshots: %w", err)
	}
	local, _ := src.Images.(interface{ Root() string })
	for _, s := range snaps {
		if local != nil {
			if man, err := imagestore.ReadManifest(filepath.Join(local.Root(), s.ID), "snapshot "+s.ID); err == nil && man.RootFS != "" {
				refs.add(man.RootFS, "snapshot "+s.ID)
				continue
			}
		}
		refs.unknown(s.Template, s.CreatedAt)
	}
	for _, e := range readDirs(src.PausedDir) {
		if man, err := imagestore.ReadManifest(filepath.Join(src.PausedDir, e), "paused image "+e); err == nil {
			refs.add(man.RootFS, "paused image "+e)
		}
	}
	var removed []WarmRemoval
	for _, e := range readDirs(src.WarmDir) {
		dir := filepath.Join(src.WarmDir, e)
		man, err := imagestore.ReadManifest(dir, "warm image "+e)
		fi, statErr := os.Stat(dir)
		old := statErr == nil && time.Since(fi.ModTime()) >= src.WarmMinAge
		current := err == nil && src.Current != nil && src.Current(man.RootFS) && (src.CurrentWarm == nil || src.CurrentWarm(e))
		switch {
		case current:
			refs.add(man.RootFS, "warm image "+e)
		case !old && err == nil:
			refs.add(man.RootFS, "warm image "+e+" (recent)")
		case old:
			size := imagestore.DirSize(dir)
			if !src.DryRun {
				if err := os.RemoveAll(dir); err != nil {
					return refs, removed, fmt.Errorf("remove warm image %s: %w", e, err)
				}
			}
			removed = append(removed, WarmRemoval{Dir: dir, Bytes: size})
		}
	}
	return refs, removed, nil
}

// readDirs lists the finished entries of dir (not the .tmp-* ones).
func readDirs(dir string) []string {
	if dir == "" {
		return nil
	}
	ents, _ := os.ReadDir(dir)
	var out []string
	for _, e := range ents {
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out
}
