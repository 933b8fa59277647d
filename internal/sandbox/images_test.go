package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/imagestore"
	"github.com/pandastack/pandastack/internal/testutil"
)

// images is an ImageStore on a local directory apart from SnapshotDir (as
// a remote store is), recording calls and failing on demand.
type images struct {
	*imagestore.Local
	mu              sync.Mutex
	puts, opens     []string
	putErr, openErr error
	deleteErr       error
	putHook         func() // if set, runs as Put begins
}

func (s *images) Delete(ctx context.Context, id string) error {
	s.mu.Lock()
	err := s.deleteErr
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.Local.Delete(ctx, id)
}

func (s *images) Put(ctx context.Context, id, dir string) (int64, error) {
	s.mu.Lock()
	s.puts = append(s.puts, id)
	err, hook := s.putErr, s.putHook
	s.mu.Unlock()
	if hook != nil {
		hook()
	}
	if err != nil {
		os.RemoveAll(dir) // as the contract says
		return 0, err
	}
	return s.Local.Put(ctx, id, dir)
}

func (s *images) Open(ctx context.Context, id string) (pandastack.OpenImage, error) {
	s.mu.Lock()
	s.opens = append(s.opens, id)
	err := s.openErr
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return s.Local.Open(ctx, id)
}

func newImagesHarness(t *testing.T) (*harness, *images) {
	h := newHarness(t)
	img := &images{Local: imagestore.NewLocal(filepath.Join(h.dir, "store"))}
	h.images = img
	h.m.Close()
	h.m = h.newManager()
	return h, img
}

// A snapshot is sealed in SnapshotDir, handed to the image store, and
// restored from what the store opens.
func TestSnapshotGoesToImageStore(t *testing.T) {
	h, img := newImagesHarness(t)
	ctx := context.Background()
	sb := h.create()
	h.exec(sb.ID, "set x=7")
	snap, err := h.m.Snapshot(ctx, project, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(img.puts) != 1 || img.puts[0] != snap.ID {
		t.Fatalf("puts = %v, want [%s]", img.puts, snap.ID)
	}
	if _, err := imagestore.Verify(filepath.Join(h.dir, "store", snap.ID), "stored"); err != nil {
		t.Fatalf("the store does not hold a sealed image: %v", err)
	}
	if snap.SizeBytes <= 0 {
		t.Errorf("snapshot size %d", snap.SizeBytes)
	}
	testutil.RequireEmptyDir(t, h.m.cfg.SnapshotDir)

	got, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := h.exec(got.ID, "get x"); err != nil || out != "7" {
		t.Fatalf("restored: get x = %q, %v", out, err)
	}
	if len(img.opens) != 1 {
		t.Errorf("opens = %v, want one", img.opens)
	}
	if err := h.m.DeleteSnapshot(ctx, project, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(h.dir, "store", snap.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("image still in the store after DeleteSnapshot: %v", err)
	}
}

// A delete whose files cannot be removed (the server dies half-way, the
// store stops answering) still deletes the snapshot: its record goes
// first, so it is never listed over half its files, and what is left of
// the files is named for the next start, which removes it.
func TestDeleteSnapshotRecordFirst(t *testing.T) {
	h, img := newImagesHarness(t)
	ctx := context.Background()
	sb := h.create()
	snap, err := h.m.Snapshot(ctx, project, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	img.mu.Lock()
	img.deleteErr = errors.New("the store stopped answering")
	img.mu.Unlock()
	if err := h.m.DeleteSnapshot(ctx, project, snap.ID); err != nil {
		t.Fatalf("delete with the store down: %v, want the snapshot deleted", err)
	}
	if _, err := h.m.GetSnapshot(ctx, project, snap.ID); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Errorf("the snapshot is still listed: %v", err)
	}
	stored := filepath.Join(h.dir, "store", snap.ID)
	if _, err := os.Stat(stored); err != nil {
		t.Fatalf("the fake store lost the files it failed to delete: %v", err)
	}
	img.mu.Lock()
	img.deleteErr = nil
	img.mu.Unlock()
	h.m.Close()
	h.m = h.newManager()
	if _, err := os.Stat(stored); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the next start left the deleted snapshot's files: %v", err)
	}
	testutil.RequireEmptyDir(t, h.m.cfg.SnapshotDir)
}

// A store that fails the upload: no snapshot record, nothing staged left,
// and the sandbox goes on working.
func TestSnapshotStoreFailsPut(t *testing.T) {
	h, img := newImagesHarness(t)
	ctx := context.Background()
	sb := h.create()
	img.putErr = errors.New("object storage unreachable")
	if _, err := h.m.Snapshot(ctx, project, sb.ID, nil); err == nil || !errors.Is(err, img.putErr) {
		t.Fatalf("Snapshot = %v, want the store's error", err)
	}
	if list, _ := h.m.ListSnapshots(ctx, project, nil); len(list) != 0 {
		t.Errorf("a failed snapshot left records %v", list)
	}
	testutil.RequireEmptyDir(t, h.m.cfg.SnapshotDir)
	if _, err := h.exec(sb.ID, "set y=1"); err != nil {
		t.Errorf("the sandbox after a failed snapshot: %v", err)
	}
}

// A snapshot whose files the store lost is snapshot_corrupt (the record
// exists); a store that fails otherwise passes its error on. Neither
// leaves a sandbox behind.
func TestSnapshotStoreFailsOpen(t *testing.T) {
	h, img := newImagesHarness(t)
	ctx := context.Background()
	sb := h.create()
	snap, err := h.m.Snapshot(ctx, project, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := h.rt.ids()
	img.openErr = pandastack.Errorf(pandastack.ENotFound, "no such object")
	_, err = h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
	wantCode(t, err, pandastack.ESnapshotCorrupt)
	img.openErr = errors.New("connection refused")
	if _, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID}); !errors.Is(err, img.openErr) {
		t.Fatalf("Create = %v, want the store's error", err)
	}
	if after := h.rt.ids(); len(after) != len(before) {
		t.Errorf("failed restores left sandboxes: %v → %v", before, after)
	}
	if list, _ := h.m.List(ctx, project, pandastack.SandboxFilter{}); len(list) != 1 {
		t.Errorf("records after failed restores: %v", list)
	}
}

// cleanImages is images that records deletes, and has a cache of the ids
// in cached for SweepCache.
type cleanImages struct {
	*images
	deleted   []string
	cached    []string
	kept      map[string]bool
	deleteErr error
}

func (s *cleanImages) Delete(ctx context.Context, id string) error {
	s.mu.Lock()
	s.deleted = append(s.deleted, id)
	err := s.deleteErr
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.Local.Delete(ctx, id)
}

func (s *cleanImages) SweepCache(keep func(id string) bool, olderThan time.Duration) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kept = map[string]bool{}
	for _, id := range s.cached {
		s.kept[id] = keep(id)
	}
	return nil
}

// A start removes from the image store what a crash left of a snapshot
// whose record was never written (an upload cut short), and asks the
// store's cache to drop the copies of snapshots deleted elsewhere.
func TestStartCleansInterruptedSnapshot(t *testing.T) {
	h, img := newImagesHarness(t)
	ci := &cleanImages{images: img, cached: []string{"snap_rec", "snap_gone"}}
	h.images = ci
	sb := h.create()
	rec := h.snapshot(sb.ID)
	ci.cached[0] = rec.ID
	for _, id := range []string{"snap_cut", rec.ID} {
		if err := os.MkdirAll(filepath.Join(h.m.cfg.SnapshotDir, ".tmp-"+id+"-sealed", "image"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// A crash after a whole upload, before the record: only the pending
	// file says so (the staged image became the cache's).
	for _, id := range []string{"snap_whole", rec.ID} {
		if err := os.WriteFile(filepath.Join(h.m.cfg.SnapshotDir, ".pending-"+id), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	h.m.Close()
	h.m = h.newManager()
	ci.mu.Lock()
	deleted, kept := ci.deleted, ci.kept
	ci.mu.Unlock()
	if slices.Sort(deleted); !slices.Equal(deleted, []string{"snap_cut", "snap_whole"}) {
		t.Errorf("deleted from the image store at start: %v, want [snap_cut snap_whole]", deleted)
	}
	if !kept[rec.ID] || kept["snap_gone"] || len(kept) != 2 {
		t.Errorf("cache sweep kept %v, want only %s", kept, rec.ID)
	}
	if ents, _ := os.ReadDir(h.m.cfg.SnapshotDir); len(ents) != 0 {
		t.Errorf("left in the snapshot dir: %v", ents)
	}
	if _, err := h.m.Create(context.Background(), project, CreateRequest{SnapshotID: rec.ID}); err != nil {
		t.Errorf("restore of the recorded snapshot after the start: %v", err)
	}

	// A store that does not answer: the name stays, emptied, for the
	// next start, which tries again.
	staged := filepath.Join(h.m.cfg.SnapshotDir, ".tmp-snap_cut2-sealed")
	os.MkdirAll(filepath.Join(staged, "image"), 0o700)
	ci.mu.Lock()
	ci.deleteErr = pandastack.Errorf(pandastack.EUnavailable, "the snapshot store does not answer; retry")
	ci.mu.Unlock()
	h.m.Close()
	h.m = h.newManager()
	if ents, err := os.ReadDir(staged); err != nil || len(ents) != 0 {
		t.Fatalf("after a failed delete the staged dir is %v (%v), want kept and empty", ents, err)
	}
	ci.mu.Lock()
	ci.deleteErr, ci.deleted = nil, nil
	ci.mu.Unlock()
	h.m.Close()
	h.m = h.newManager()
	if _, err := os.Stat(staged); !os.IsNotExist(err) || len(ci.deleted) != 1 || ci.deleted[0] != "snap_cut2" {
		t.Errorf("the start after: deleted %v, staged dir %v", ci.deleted, err)
	}
}

// A snapshot whose upload failed, with a bucket that then does not answer
// the clean-up either (it went away mid-upload), leaves its pending file:
// the next start removes what the upload sent. A snapshot refused before
// any upload (a busy sandbox) asks the store nothing.
func TestFailedUploadCleanedLater(t *testing.T) {
	h, img := newImagesHarness(t)
	ci := &cleanImages{images: img}
	h.images = ci
	h.m.Close()
	h.m = h.newManager()
	sb := h.create()
	down := pandastack.Errorf(pandastack.EUnavailable, "the snapshot store does not answer; retry")
	img.mu.Lock()
	img.putErr = down
	img.mu.Unlock()
	ci.mu.Lock()
	ci.deleteErr = down
	ci.mu.Unlock()
	if _, err := h.m.Snapshot(context.Background(), project, sb.ID, nil); !pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Fatalf("snapshot with the store down: %v", err)
	}
	ents, _ := os.ReadDir(h.m.cfg.SnapshotDir)
	if len(ents) != 1 || !strings.HasPrefix(ents[0].Name(), pendingPrefix) {
		t.Fatalf("after the failed upload the snapshot dir holds %v, want its pending file", ents)
	}
	id := strings.TrimPrefix(ents[0].Name(), pendingPrefix)

	img.mu.Lock()
	img.putErr = nil
	img.mu.Unlock()
	ci.mu.Lock()
	ci.deleteErr, ci.deleted = nil, nil
	ci.mu.Unlock()
	h.m.Close()
	h.m = h.newManager()
	ci.mu.Lock()
	deleted := slices.Clone(ci.deleted)
	ci.mu.Unlock()
	if !slices.Equal(deleted, []string{id}) {
		t.Errorf("deleted at the next start: %v, want [%s]", deleted, id)
	}
	testutil.RequireEmptyDir(t, h.m.cfg.SnapshotDir)
}

// A paused sandbox's snapshot is its paused image, linked into the image
// store: no resume, no checkpoint, the sandbox stays paused. The snapshot
// restores with its state; deleting it leaves the paused image whole (the
// sandbox resumes with its state), and a resume's removal of the paused
// image leaves a second snapshot whole.
func TestSnapshotOfAPausedSandbox(t *testing.T) {
	h, img := newImagesHarness(t)
	ctx := context.Background()
	sb := h.pausedWith("x=7")
	h.rt.takeSuspendLog()
	restores := h.rt.restores
	snap, err := h.m.Snapshot(ctx, project, sb.ID, map[string]string{"k": "v"})
	if err != nil {
		t.Fatal(err)
	}
	if log := h.rt.takeSuspendLog(); len(log) != 0 || h.rt.restores != restores {
		t.Fatalf("the snapshot of a paused sandbox reached the runtime: %q, %d restores", log, h.rt.restores-restores)
	}
	if r := h.record(sb.ID); r.State != pandastack.StatePaused {
		t.Fatalf("after its snapshot the sandbox is %s, want paused", r.State)
	}
	if len(img.puts) != 1 || img.puts[0] != snap.ID || snap.SandboxID != sb.ID || snap.Metadata["k"] != "v" || snap.SizeBytes <= 0 {
		t.Fatalf("snapshot %+v, puts %v", snap, img.puts)
	}
	if _, err := imagestore.Verify(filepath.Join(h.dir, "store", snap.ID), "stored"); err != nil {
		t.Fatalf("the store does not hold a sealed image: %v", err)
	}
	testutil.RequireEmptyDir(t, h.m.cfg.SnapshotDir)
	got, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := h.exec(got.ID, "get x"); err != nil || out != "7" {
		t.Fatalf("restored: get x = %q, %v", out, err)
	}
	if err := h.m.DeleteSnapshot(ctx, project, snap.ID); err != nil {
		t.Fatal(err)
	}
	second, err := h.m.Snapshot(ctx, project, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
		t.Fatalf("resume after its snapshot was deleted: %v", err)
	}
	if out, err := h.exec(sb.ID, "get x"); err != nil || out != "7" {
		t.Fatalf("resumed: get x = %q, %v", out, err)
	}
	h.m.Close() // the paused image's removal after the resume runs in the background
	if _, err := imagestore.Verify(filepath.Join(h.dir, "store", second.ID), "stored"); err != nil {
		t.Fatalf("the second snapshot after the resume removed the paused image: %v", err)
	}
}

// A snapshot taken on a node whose cache is elsewhere names its root
// filesystem by that node's path: restored here, the same build (the
// directory of the template's name and hash) in this node's cache is used.
func TestLocalRootFSOfAnotherNodesSnapshot(t *testing.T) {
	dir := t.TempDir()
	here := filepath.Join(dir, "cache", "templates")
	for _, b := range []string{"base-1111", "base-2222"} {
		if err := os.MkdirAll(filepath.Join(here, b, "rootfs"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	m := &Manager{templates: &fakeTemplates{tpl: Template{Name: "base", RootFS: filepath.Join(here, "base-2222", "rootfs")}}}
	ctx := context.Background()
	for _, c := range []struct{ taken, want string }{
		{"/elsewhere/templates/base-1111/rootfs", filepath.Join(here, "base-1111", "rootfs")}, // an older build, still here
		{"/elsewhere/templates/base-2222/rootfs", filepath.Join(here, "base-2222", "rootfs")},
		{"/elsewhere/templates/base-3333/rootfs", "/elsewhere/templates/base-3333/rootfs"}, // not built here: checkRootFS says so
		{filepath.Join(here, "base-1111", "rootfs"), filepath.Join(here, "base-1111", "rootfs")},
	} {
		if got := m.localRootFS(ctx, manifest{Template: "base", RootFS: c.taken}); got != c.want {
			t.Errorf("taken on %s: %s, want %s", c.taken, got, c.want)
		}
	}
	if got := m.localRootFS(ctx, manifest{Template: "other", RootFS: "/elsewhere/templates/other-1/rootfs"}); got != "/elsewhere/templates/other-1/rootfs" {
		t.Errorf("a template this node does not know: %s", got)
	}
}

// slowSweep is images whose cache sweeps after the start's block until
// released.
type slowSweep struct {
	*images
	calls            atomic.Int32
	entered, release chan struct{}
}

func (s *slowSweep) SweepCache(keep func(id string) bool, olderThan time.Duration) []string {
	if s.calls.Add(1) == 2 { // the first is Start's
		close(s.entered)
		<-s.release
	}
	return nil
}

// The reaper goes on while its hourly sweep of the snapshot cache runs
// (up to a minute on a large cache): a sandbox that dies meanwhile is
// found and recorded stopped.
func TestReaperGoesOnDuringTheCacheSweep(t *testing.T) {
	h, img := newImagesHarness(t)
	ss := &slowSweep{images: img, entered: make(chan struct{}), release: make(chan struct{})}
	h.images, h.reap = ss, 20*time.Millisecond
	h.m.Close()
	h.m = h.newManager()
	t.Cleanup(func() { close(ss.release) }) // before the manager's Close, which waits for the sweep
	select {
	case <-ss.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the reaper did not sweep the cache at its first round")
	}
	sb := h.create()
	h.rt.die(sb.ID, "")
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := h.m.Get(context.Background(), project, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.State == pandastack.StateStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a sandbox that died during the sweep is still %s", got.State)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A snapshot of a paused sandbox holds it only while its image is linked:
// a resume does not wait for the image store's upload.
func TestSnapshotOfAPausedSandboxFreesItBeforeTheUpload(t *testing.T) {
	h, img := newImagesHarness(t)
	ctx := context.Background()
	sb := h.create()
	h.exec(sb.ID, "set v=kept")
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	uploading, release := make(chan struct{}), make(chan struct{})
	img.mu.Lock()
	img.putHook = func() {
		close(uploading)
		<-release
	}
	img.mu.Unlock()
	type result struct {
		snap pandastack.Snapshot
		err  error
	}
	snapped := make(chan result, 1)
	go func() {
		snap, err := h.m.Snapshot(ctx, project, sb.ID, nil)
		snapped <- result{snap, err}
	}()
	<-uploading
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := h.m.Resume(rctx, project, sb.ID); err != nil {
		close(release)
		t.Fatalf("a resume during the snapshot's upload: %v", err)
	}
	close(release)
	r := <-snapped
	if r.err != nil {
		t.Fatal(r.err)
	}
	restored, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: r.snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := h.exec(restored.ID, "get v"); err != nil || out != "kept" {
		t.Fatalf("restored from the snapshot: %q %v", out, err)
	}
}
