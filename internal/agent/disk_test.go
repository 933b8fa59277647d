//go:build linux

package agent

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// GET /v1/disk is statfs of the sandbox's disk: a file written there shows
// in its use, and the hello names the route. The disk is a tmpfs of its own
// (as root, as CI runs), so that nothing else writes to it meanwhile.
func TestDisk(t *testing.T) {
	dir := t.TempDir()
	own := os.Geteuid() == 0
	if own {
		// withAdmin: another test of the package (the hostname's) keeps
		// CAP_SYS_ADMIN out of the effective set, as the agent does.
		if err := withAdmin(func() error { return syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=32m") }); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { withAdmin(func() error { return syscall.Unmount(dir, syscall.MNT_DETACH) }) })
	}
	h := NewServer(Config{Home: dir, Disk: dir}, 1).Handler()
	disk := func() agentproto.Disk {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/disk", nil))
		var d agentproto.Disk
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &d) != nil {
			t.Fatalf("disk: %d %s", rec.Code, rec.Body)
		}
		return d
	}
	before := disk()
	if before.SizeBytes <= 0 || before.UsedBytes < 0 || before.UsedBytes > before.SizeBytes {
		t.Fatalf("disk = %+v", before)
	}
	if own {
		if before.SizeBytes != 32<<20 {
			t.Errorf("a 32 MiB disk is %d bytes", before.SizeBytes)
		}
		if err := os.WriteFile(filepath.Join(dir, "fill"), make([]byte, 8<<20), 0o644); err != nil {
			t.Fatal(err)
		}
		if after := disk(); after.SizeBytes != before.SizeBytes || after.UsedBytes-before.UsedBytes != 8<<20 {
			t.Errorf("after writing 8 MiB: %+v, before %+v", after, before)
		}
	}

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/disk?path=/", nil))
	if rec.Code != http.StatusBadRequest {
		t.Errorf("disk with a query it does not take: %d %s", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/v1/hello", nil))
	var hello agentproto.Hello
	if json.Unmarshal(rec.Body.Bytes(), &hello) != nil || !hello.HasFeature(agentproto.FeatureDisk) {
		t.Errorf("the hello does not name the disk route: %s", rec.Body)
	}
}
