package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/imagestore"
)

// fakeWarm seals a warm image on rootfs in warmDir, last touched at.
func fakeWarm(t *testing.T, warmDir, name, rootfs string, at time.Time) string {
	t.Helper()
	tmp := filepath.Join(warmDir, ".tmp-"+name)
	os.MkdirAll(filepath.Join(tmp, imagestore.FilesDir), 0o700)
	os.WriteFile(filepath.Join(tmp, imagestore.FilesDir, "pages"), []byte("x"), 0o600)
	final := filepath.Join(warmDir, name)
	if _, err := imagestore.Seal(tmp, final, imagestore.Manifest{Template: "base", RootFS: rootfs, CreatedAt: at}); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(final, at, at)
	return final
}

func TestCollectRootFSRefs(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	first := h.tpls.tpl.RootFS
	snapped := h.create()
	snap, err := h.m.Snapshot(ctx, project, snapped.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.m.Kill(ctx, project, snapped.ID); err != nil {
		t.Fatal(err)
	}
	// The template is rebuilt: new sandboxes run on a second rootfs.
	second := filepath.Join(h.dir, "rootfs2")
	os.MkdirAll(second, 0o700)
	h.tpls.tpl.RootFS = second
	paused := h.create()
	if _, err := h.m.Pause(ctx, project, paused.ID); err != nil {
		t.Fatal(err)
	}
	third := filepath.Join(h.dir, "rootfs3")
	os.MkdirAll(third, 0o700)
	h.tpls.tpl.RootFS = third
	running := h.create()

	warm := h.m.cfg.WarmDir
	old := time.Now().Add(-48 * time.Hour)
	staleWarm := fakeWarm(t, warm, "base-old-x", "/gone/rootfs-old", old)
	recentWarm := fakeWarm(t, warm, "base-recent-x", "/some/rootfs-recent", time.Now())
	currentWarm := fakeWarm(t, warm, "base-current-x", third, old)
	oldAgentWarm := fakeWarm(t, warm, "base-current-oldagent", third, old)

	src := RefSources{
		Store: h.store, Images: imagestore.NewLocal(h.m.cfg.SnapshotDir), PausedDir: h.m.cfg.PausedDir, WarmDir: warm,
		Current:     func(rootfs string) bool { return rootfs == third },
		CurrentWarm: func(name string) bool { return name == "base-current-x" },
		WarmMinAge:  time.Hour,
	}
	refs, removed, err := CollectRootFSRefs(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{first: "snapshot " + snap.ID, second: paused.ID, third: running.ID, "/some/rootfs-recent": "warm image base-recent-x"}
	for rootfs, by := range want {
		got, ok := refs.Keeps("base", rootfs, time.Now())
		if !ok || !strings.Contains(got, by) {
			t.Errorf("rootfs %s: kept=%v by %q, want by %q", rootfs, ok, got, by)
		}
	}
	if by, ok := refs.Keeps("base", "/gone/rootfs-old", time.Now()); ok {
		t.Errorf("the stale warm image's rootfs is kept by %q", by)
	}
	var dirs []string
	for _, r := range removed {
		dirs = append(dirs, r.Dir)
		if r.Bytes <= 0 {
			t.Errorf("removed warm image %s counted %d bytes", r.Dir, r.Bytes)
		}
	}
	if strings.Join(dirs, " ") != oldAgentWarm+" "+staleWarm {
		t.Errorf("removed warm images %v, want %s and %s", dirs, oldAgentWarm, staleWarm)
	}
	for _, d := range []string{recentWarm, currentWarm} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("warm image %s was removed", d)
		}
	}
	for _, d := range []string{staleWarm, oldAgentWarm} {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("the stale warm image %s is still there", d)
		}
	}

	// A snapshot store whose manifests are not local files (S3): every
	// build of the snapshot's template made before it is kept.
	src.Images = struct{ pandastack.ImageStore }{src.Images}
	refs, _, err = CollectRootFSRefs(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := refs.Keeps("base", "/elsewhere/rootfs", snap.CreatedAt.Add(-time.Second)); !ok {
		t.Error("a build older than a snapshot whose rootfs is unknown is not kept")
	}
	if by, ok := refs.Keeps("base", "/elsewhere/rootfs", time.Now().Add(time.Hour)); ok {
		t.Errorf("a build newer than every snapshot is kept by %q", by)
	}
	if by, ok := refs.Keeps("other", "/elsewhere/rootfs", snap.CreatedAt.Add(-time.Second)); ok {
		t.Errorf("a build of another template is kept by %q", by)
	}
}

// A cache directory spelled another way than the server's (a symlink to a
// bigger disk, the default path under sudo) names the same builds: a
// sandbox recorded on the build through one spelling keeps it when gc
// lists the builds through the other.
func TestRootFSRefsSeeThroughSymlinks(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	real := filepath.Join(h.dir, "big-disk", "cache")
	rootfs := filepath.Join(real, "templates", "base-0123456789abcdef", "rootfs")
	if err := os.MkdirAll(rootfs, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(h.dir, "cache-link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	h.tpls.tpl.RootFS = filepath.Join(link, "templates", "base-0123456789abcdef", "rootfs")
	sb := h.create()
	refs, _, err := CollectRootFSRefs(ctx, RefSources{Store: h.store})
	if err != nil {
		t.Fatal(err)
	}
	if by, ok := refs.Keeps("base", rootfs+"/", time.Now().Add(time.Hour)); !ok || !strings.Contains(by, sb.ID) {
		t.Errorf("the build under its real path: kept=%v by %q, want by %s", ok, by, sb.ID)
	}
	if by, ok := refs.Keeps("base", h.tpls.tpl.RootFS, time.Now().Add(time.Hour)); !ok || !strings.Contains(by, sb.ID) {
		t.Errorf("the build under the server's spelling: kept=%v by %q, want by %s", ok, by, sb.ID)
	}
}
