package template

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/testutil"
)

// fakeBuild writes a finished build of name with a made-up hash, built at.
func fakeBuild(t *testing.T, cache, name, hash string, at time.Time) Built {
	t.Helper()
	dir := filepath.Join(cache, templatesDir, name+"-"+hash)
	if err := os.MkdirAll(filepath.Join(dir, rootfsDir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	b := Built{Name: name, Hash: hash + strings.Repeat("0", 48), BuiltAt: at}
	data, _ := json.Marshal(b)
	marker := filepath.Join(dir, markerFile)
	if err := os.WriteFile(marker, data, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(marker, at, at)
	b.Dir, b.RootFS = dir, filepath.Join(dir, rootfsDir)
	return b
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func TestGCRemovesOnlyUnreferencedOldBuilds(t *testing.T) {
	cache := t.TempDir()
	old := time.Now().Add(-48 * time.Hour)
	current := fakeBuild(t, cache, "base", "aaaaaaaaaaaaaaaa", old)
	pinned := fakeBuild(t, cache, "base", "bbbbbbbbbbbbbbbb", old)
	young := fakeBuild(t, cache, "base", "cccccccccccccccc", time.Now().Add(-time.Minute))
	garbage := fakeBuild(t, cache, "code-interpreter", "dddddddddddddddd", old)
	stage := filepath.Join(cache, templatesDir, stagesDir, "bookworm-x")
	inProgress := filepath.Join(cache, templatesDir, ".build-base-123")
	for _, d := range []string{stage, inProgress} {
		os.MkdirAll(d, 0o755)
	}
	keep := func(b Built) (string, bool) {
		switch b.RootFS {
		case current.RootFS:
			return "current build of base", true
		case pinned.RootFS:
			return "snapshot snap_1", true
		}
		return "", false
	}

	res, err := GC(context.Background(), cache, GCOptions{Keep: keep, MinAge: time.Hour, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 4 {
		t.Fatalf("GC looked at %d builds, want 4: %+v", len(res), res)
	}
	for _, r := range res {
		if r.Removed != (r.Build.Dir == garbage.Dir) {
			t.Errorf("dry run: %s removed=%v (%s)", r.Build.Dir, r.Removed, r.Reason)
		}
	}
	if !exists(garbage.Dir) {
		t.Fatal("a dry run removed a build")
	}

	if _, err := GC(context.Background(), cache, GCOptions{Keep: keep, MinAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if exists(garbage.Dir) {
		t.Error("the unreferenced old build is still there")
	}
	for _, d := range []string{current.Dir, pinned.Dir, young.Dir, stage, inProgress} {
		if !exists(d) {
			t.Errorf("%s was removed", d)
		}
	}
	// A build of the same name running holds the name's lock: its
	// builds stay until it is done.
	busy := fakeBuild(t, cache, "code-interpreter", "9999999999999999", old)
	unlock, err := tryLockName(cache, "code-interpreter")
	if err != nil {
		t.Fatal(err)
	}
	res, err = GC(context.Background(), cache, GCOptions{Keep: keep, MinAge: time.Hour})
	unlock()
	if err != nil || !exists(busy.Dir) {
		t.Fatalf("GC removed a build while a build of its name ran: %v %+v", err, res)
	}
	if _, err := GC(context.Background(), cache, GCOptions{Keep: keep, MinAge: time.Hour}); err != nil || exists(busy.Dir) {
		t.Fatalf("the build is still there once the lock is free: %v", err)
	}
	if _, err := GC(context.Background(), cache, GCOptions{}); err == nil {
		t.Error("GC without a Keep function succeeded")
	}
}

// mountElsewhere bind mounts src from a process in a private mount
// namespace of its own, as a sandbox's gofer does: nothing of it shows in
// this process's mount table. The returned func (also a cleanup) ends it.
func mountElsewhere(t *testing.T, src string) func() {
	t.Helper()
	cmd := exec.Command("unshare", "-m", "--propagation", "private", "sh", "-c",
		`mount --bind "$1" "$2" && echo ready && exec sleep 600`, "sh", src, t.TempDir())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	end := func() { once.Do(func() { cmd.Process.Kill(); cmd.Wait() }) }
	t.Cleanup(end)
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("bind mount in a new namespace failed: %q", line)
	}
	return end
}

// A build whose rootfs a process in another mount namespace has bind
// mounted, as runsc's gofer does for a sandbox of any server sharing the
// cache, is kept even when nothing this server knows refers to it.
func TestGCKeepsABuildMountedElsewhere(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("mount namespaces are Linux's")
	}
	testutil.RequireRoot(t)
	cache := t.TempDir()
	old := time.Now().Add(-48 * time.Hour)
	used := fakeBuild(t, cache, "base", "eeeeeeeeeeeeeeee", old)
	free := fakeBuild(t, cache, "base", "ffffffffffffffff", old)
	mountElsewhere(t, used.RootFS)
	if m := hostMountsUnder(t, used.Dir); len(m) != 0 {
		t.Fatalf("the mount leaked into the test's namespace: %v", m)
	}
	res, err := GC(context.Background(), cache, GCOptions{Keep: func(Built) (string, bool) { return "", false }, MinAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if !exists(used.Dir) {
		t.Fatal("GC removed a build another mount namespace has mounted")
	}
	if exists(free.Dir) {
		t.Error("GC kept the build nobody uses")
	}
	for _, r := range res {
		if r.Build.Dir == used.Dir && !strings.Contains(r.Reason, "mounted") {
			t.Errorf("kept for %q, want a reason naming the mount", r.Reason)
		}
	}
}

// A tree another mount namespace has mounted (a sandbox's rootfs, held by
// its gofer) is not removed: not by removeTree, which a --force rebuild
// uses on the build it replaces, nor by RemoveStale's clean-up of such
// leftovers (serve's start, template gc). Once unmounted, it goes.
func TestRemoveTreeKeepsWhatASandboxHasMounted(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("mount namespaces are Linux's")
	}
	testutil.RequireRoot(t)
	cache := t.TempDir()
	b := fakeBuild(t, cache, "base", "eeeeeeeeeeeeeeee", time.Now())
	old := filepath.Join(filepath.Dir(b.Dir), ".old.base.1")
	if err := os.Rename(b.Dir, old); err != nil { // as a --force rebuild does
		t.Fatal(err)
	}
	unmount := mountElsewhere(t, filepath.Join(old, rootfsDir))
	if err := removeTree(old); !errors.Is(err, errInUse) {
		t.Errorf("removeTree of a tree mounted elsewhere: %v, want errInUse", err)
	}
	if left, err := RemoveStale(cache, true); err != nil || len(left) != 0 {
		t.Fatalf("a dry run names a leftover in use: %v %v", left, err)
	}
	if left, err := RemoveStale(cache, false); err != nil || len(left) != 0 {
		t.Fatalf("RemoveStale of a leftover in use: %v %v", left, err)
	}
	if !exists(filepath.Join(old, rootfsDir)) {
		t.Fatal("the mounted tree was deleted")
	}
	unmount()
	if left, err := RemoveStale(cache, false); err != nil || len(left) != 1 || left[0].Dir != old {
		t.Fatalf("RemoveStale once unmounted: %v %v", left, err)
	}
	if exists(old) {
		t.Error("RemoveStale kept the leftover once nothing had it mounted")
	}
}

// A gc cut short while it deletes a build (killed, a disk error) leaves no
// half-deleted build that still counts as built: the build leaves its
// place first, and the next RemoveStale (serve's start, gc) removes the
// rest.
func TestGCCutShortLeavesNoHalfBuild(t *testing.T) {
	cache := t.TempDir()
	old := time.Now().Add(-48 * time.Hour)
	b := fakeBuild(t, cache, "base", "aaaaaaaaaaaaaaaa", old)
	os.WriteFile(filepath.Join(b.RootFS, "etc", "os-release"), []byte("x"), 0o644)
	defer func(orig func(string) error) { removeAll = orig }(removeAll)
	removeAll = func(dir string) error {
		// Gone as far as the root filesystem's files, then killed.
		if err := os.RemoveAll(filepath.Join(dir, rootfsDir, "etc")); err != nil {
			return err
		}
		return errors.New("killed")
	}
	res, err := GC(context.Background(), cache, GCOptions{Keep: func(Built) (string, bool) { return "", false }, MinAge: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].Removed {
		t.Fatalf("GC results %+v, want the build not removed", res)
	}
	if left, _ := ListBuilt(cache); len(left) != 0 {
		t.Fatalf("a half-deleted build counts as built: %+v", left)
	}
	if exists(b.Dir) {
		t.Fatalf("the half-deleted build is still at %s", b.Dir)
	}
	removeAll = os.RemoveAll
	if _, err := RemoveStale(cache, false); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(cache, templatesDir))
	for _, e := range ents {
		if e.IsDir() {
			t.Errorf("left in the cache after RemoveStale: %s", e.Name())
		}
	}
}

// A gc stopped (Ctrl-C) before it looks at a build removes nothing more
// and says why.
func TestGCStopsWhenCancelled(t *testing.T) {
	cache := t.TempDir()
	old := time.Now().Add(-48 * time.Hour)
	a := fakeBuild(t, cache, "base", "aaaaaaaaaaaaaaaa", old)
	b := fakeBuild(t, cache, "base", "bbbbbbbbbbbbbbbb", old)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := GC(ctx, cache, GCOptions{Keep: func(Built) (string, bool) { return "", false }}); !errors.Is(err, context.Canceled) {
		t.Errorf("a cancelled GC returned %v, want it cancelled", err)
	}
	if !exists(a.Dir) || !exists(b.Dir) {
		t.Error("a cancelled GC removed a build")
	}
}

// A build a running server holds (Hold) is kept, whatever Keep says and
// however old; once the server lets go (it stops), gc removes it.
func TestGCKeepsAHeldBuild(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("builds are held with flock(2) on Linux")
	}
	cache := t.TempDir()
	b := fakeBuild(t, cache, "base", "aaaaaaaaaaaaaaaa", time.Now().Add(-48*time.Hour))
	release, err := Hold(b)
	if err != nil {
		t.Fatal(err)
	}
	unused := func(Built) (string, bool) { return "", false }
	for _, dry := range []bool{true, false} {
		res, err := GC(context.Background(), cache, GCOptions{Keep: unused, MinAge: time.Hour, DryRun: dry})
		if err != nil {
			t.Fatal(err)
		}
		if len(res) != 1 || res[0].Removed || !strings.Contains(res[0].Reason, "in use by a running server") {
			t.Fatalf("dry run %v: %+v, want the held build kept", dry, res)
		}
	}
	release()
	if _, err := GC(context.Background(), cache, GCOptions{Keep: unused, MinAge: time.Hour}); err != nil || exists(b.Dir) {
		t.Fatalf("the build let go of is still there: %v", err)
	}
	// A build gone (removed, or replaced by a --force rebuild) cannot be
	// held: the hold would keep nothing.
	if _, err := Hold(b); err == nil {
		t.Error("a removed build was held")
	}
}
