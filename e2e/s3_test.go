package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/testutil"
)

// Two serves share a PostgreSQL database and an S3 bucket (a real
// versitygw on loopback): a snapshot taken on A restores on B, which has
// never seen it (it downloads the image into its own cache, checked), and
// the restored sandbox forks on B. An image altered in the bucket is
// refused on B with snapshot_corrupt and leaves nothing behind; a delete on
// B removes the objects. Creates stay on the serve asked (placement local):
// this test is about the image store; TestNodes covers placement.
func TestSnapshotStoreS3(t *testing.T) {
	testutil.Runsc(t)
	ctx := context.Background()
	db := testutil.StartPostgres(t).NewDatabase(t)
	s3 := testutil.StartS3(t)
	bucket := s3.NewBucket(t)
	env := append([]string{
		"PANDASTACK_STORE=" + db, "PANDASTACK_SNAPSHOT_STORE=s3://" + bucket + "/pandastack",
		"PANDASTACK_WARM=0", "PANDASTACK_POOL_SIZE=0", "PANDASTACK_PLACEMENT=local",
	}, s3.Env()...)

	a := startServer(t, "", env...)
	var onA, onB []string // sandboxes to kill through each serve
	dataB, err := os.MkdirTemp("", "pandastack-e2e-")
	if err != nil {
		t.Fatal(err)
	}
	// B finds A's key in the shared database and makes none of its own.
	if err := os.WriteFile(filepath.Join(dataB, "api-key"), []byte(a.key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b := startServer(t, dataB, env...)
	defer func() {
		for _, id := range onA {
			a.client().KillSandbox(ctx, id)
		}
		for _, id := range onB {
			b.client().KillSandbox(ctx, id)
		}
		a.stop()
		b.stop()
		for _, s := range []*server{a, b} {
			if pids := processesMentioning(s.dataDir); len(pids) > 0 {
				t.Errorf("processes of %s left after it stopped: %v", s.dataDir, pids)
			}
			os.RemoveAll(s.dataDir)
		}
	}()
	if !strings.Contains(b.out.String(), "snapshot_store=\"s3://"+bucket+"/pandastack") {
		t.Errorf("B's log does not name the snapshot store:\n%s", tail(b.out.String(), 20))
	}

	ca, cb := a.client(), b.client()
	sb, err := ca.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 600})
	if err != nil {
		t.Fatalf("create on A: %v\n%s", err, tail(a.out.String(), 30))
	}
	onA = append(onA, sb.ID)
	if ex, err := ca.RunCode(ctx, sb.ID, client.RunRequest{Code: "secret = 41\nimport fractions"}); err != nil || ex.Error != nil {
		t.Fatalf("run on A: %+v %v", ex, err)
	}
	if _, err := ca.WriteFile(ctx, sb.ID, "/home/user/notes.txt", strings.NewReader("written on A")); err != nil {
		t.Fatal(err)
	}
	snap := takeSnapshot(t, a, sb.ID)

	// The image is in the bucket, manifest last: one object per file.
	objects := filepath.Join(s3.Root, bucket, "pandastack", snap.ID)
	if _, err := os.Stat(filepath.Join(objects, "manifest.json")); err != nil {
		t.Fatalf("no manifest object in the bucket: %v", err)
	}
	var stored int64
	filepath.Walk(filepath.Join(objects, "image"), func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			stored += fi.Size()
		}
		return nil
	})
	if stored != snap.SizeBytes {
		t.Errorf("the bucket holds %d bytes of the image, the snapshot says %d", stored, snap.SizeBytes)
	}
	// Nothing is left in A's local snapshot dir: the image went to the
	// bucket and into A's cache.
	testutil.RequireEmptyDir(t, filepath.Join(a.dataDir, "snapshots"))
	if _, err := os.Stat(filepath.Join(a.dataDir, "snapshot-cache", snap.ID, "manifest.json")); err != nil {
		t.Errorf("A's cache has no copy of the image it uploaded: %v", err)
	}

	t.Logf("snapshot %s: %d bytes in the bucket", snap.ID, stored)
	// B restores it: a download into its own cache.
	if _, err := os.Stat(filepath.Join(b.dataDir, "snapshot-cache", snap.ID)); err == nil {
		t.Fatal("B has the image cached before it ever restored it")
	}
	got, err := cb.CreateSandboxFromSnapshot(ctx, client.RestoreRequest{SnapshotID: snap.ID, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("restore on B: %v\n%s", err, tail(b.out.String(), 30))
	}
	onB = append(onB, got.ID)
	if _, err := os.Stat(filepath.Join(b.dataDir, "snapshot-cache", snap.ID, "manifest.json")); err != nil {
		t.Errorf("B's cache has no copy of the image after the restore: %v", err)
	}
	ex, err := cb.RunCode(ctx, got.ID, client.RunRequest{Code: "print(secret + 1, fractions.Fraction(1, 3))"})
	if err != nil || ex.Error != nil || ex.Stdout != "42 1/3\n" {
		t.Fatalf("run on B in the restored sandbox: %+v %v", ex, err)
	}
	res, err := cb.Exec(ctx, got.ID, client.ExecRequest{Cmd: "cat /home/user/notes.txt"})
	if err != nil || res.Stdout != "written on A" {
		t.Fatalf("file in the restored sandbox: %+v %v", res, err)
	}
	if list := b.runscList(); !contains(list, got.ID) {
		t.Errorf("the restored sandbox does not run on B (B's runsc has %v)", list)
	}

	// The restored sandbox forks on B.
	kids, err := cb.Fork(ctx, got.ID, client.ForkRequest{Count: 1, TTLSeconds: 600})
	if err != nil || len(kids) != 1 {
		t.Fatalf("fork on B: %v %v", kids, err)
	}
	onB = append(onB, kids[0].ID)
	if ex, err := cb.RunCode(ctx, kids[0].ID, client.RunRequest{Code: "secret"}); err != nil || ex.Text != "41" {
		t.Fatalf("run in the fork on B: %+v %v", ex, err)
	}

	// A second restore on B runs from its cache, checked again: a copy
	// damaged there is dropped and the bucket's good copy fetched again.
	// (Replaced, not written in place: the running restores still read
	// their pages from the old file.)
	cached := largestFile(t, filepath.Join(b.dataDir, "snapshot-cache", snap.ID, "image"))
	replaceAltered(t, cached)
	again, err := cb.CreateSandboxFromSnapshot(ctx, client.RestoreRequest{SnapshotID: snap.ID, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("restore on B with an altered cache copy (the bucket's is good): %v", err)
	}
	onB = append(onB, again.ID)
	if ex, err := cb.RunCode(ctx, again.ID, client.RunRequest{Code: "secret"}); err != nil || ex.Text != "41" {
		t.Fatalf("run after re-fetch: %+v %v", ex, err)
	}

	// An image altered in the bucket is refused on a server without a copy.
	snap2 := takeSnapshot(t, a, sb.ID)
	alter(t, largestFile(t, filepath.Join(s3.Root, bucket, "pandastack", snap2.ID, "image")))
	before := b.runscList()
	status, code, msg := api(t, b, b.key, "POST", "/v1/sandboxes", fmt.Sprintf(`{"snapshot_id":%q}`, snap2.ID))
	if status != 422 || code != "snapshot_corrupt" || !strings.Contains(msg, "checksum") {
		t.Fatalf("restore on B of an image altered in the bucket: %d %s %s", status, code, msg)
	}
	if left := b.containersSince(before); len(left) > 0 {
		t.Errorf("a refused restore left containers on B: %v", left)
	}
	testutil.RequireEmptyDir(t, filepath.Join(b.dataDir, "snapshots"))
	ents, _ := os.ReadDir(filepath.Join(b.dataDir, "snapshot-cache"))
	for _, e := range ents {
		if e.Name() != snap.ID {
			t.Errorf("B's cache holds %s after a refused download", e.Name())
		}
	}

	// Deleting through B removes the objects and B's copy; A no longer
	// finds the snapshot.
	if err := cb.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(objects, "manifest.json")); err == nil {
		t.Errorf("the manifest object is still in the bucket after the delete")
	}
	if _, err := os.Stat(filepath.Join(b.dataDir, "snapshot-cache", snap.ID)); err == nil {
		t.Errorf("B's cached copy is still there after the delete")
	}
	if _, err := ca.CreateSandboxFromSnapshot(ctx, client.RestoreRequest{SnapshotID: snap.ID}); !client.IsCode(err, "not_found") {
		t.Errorf("restore on A of a snapshot deleted on B: %v, want not_found", err)
	}
	if err := ca.DeleteSnapshot(ctx, snap2.ID); err != nil {
		t.Errorf("delete the second snapshot: %v", err)
	}
	if left, _ := os.ReadDir(filepath.Join(s3.Root, bucket, "pandastack")); len(left) != 0 {
		var names []string
		for _, e := range left {
			names = append(names, e.Name())
		}
		t.Errorf("objects left in the bucket after both deletes: %v", names)
	}

	// With the object storage gone a snapshot fails (retry, it says),
	// leaves no record and no files but its pending mark (the bucket did
	// not answer the clean-up either: the next start tries it), and the
	// sandbox runs on.
	if err := s3.Stop(); err != nil {
		t.Fatal(err)
	}
	status, code, msg = api(t, a, a.key, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", "")
	if status != 503 || code != "sandbox_unavailable" || !strings.Contains(msg, "retry") {
		t.Errorf("snapshot with the object storage down: %d %s %s", status, code, msg)
	}
	if list, _, err := ca.ListSnapshots(ctx, nil); err != nil || len(list) != 0 {
		t.Errorf("snapshots after a failed upload: %v %v", list, err)
	}
	left, _ := os.ReadDir(filepath.Join(a.dataDir, "snapshots"))
	for _, e := range left {
		if !strings.HasPrefix(e.Name(), ".pending-snap_") || e.IsDir() {
			t.Errorf("left in the snapshot dir after a failed upload: %s", e.Name())
		}
	}
	if ex, err := ca.RunCode(ctx, sb.ID, client.RunRequest{Code: "secret"}); err != nil || ex.Text != "41" {
		t.Errorf("the sandbox after a failed snapshot: %+v %v", ex, err)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// largestFile returns the biggest file under dir.
func largestFile(t *testing.T, dir string) string {
	t.Helper()
	var victim string
	var size int64 = -1
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && fi.Size() > size {
			victim, size = p, fi.Size()
		}
		return nil
	})
	if victim == "" {
		t.Fatalf("no file under %s", dir)
	}
	return victim
}

// alter overwrites 8 bytes in the middle of a file.
func alter(t *testing.T, p string) {
	t.Helper()
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	if _, err := f.WriteAt([]byte("garbage!"), fi.Size()/2); err != nil {
		t.Fatal(err)
	}
}

// replaceAltered replaces a file by a copy with 8 bytes changed.
func replaceAltered(t *testing.T, p string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	copy(b[len(b)/2:], "garbage!")
	if err := os.WriteFile(p+".new", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(p+".new", p); err != nil {
		t.Fatal(err)
	}
}
