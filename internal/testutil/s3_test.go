//go:build unix

package testutil

import (
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The server answers S3 requests (an unsigned one is refused), a bucket
// is a directory of its root, and Stop leaves neither a process nor a file.
func TestS3ServerLeavesNothing(t *testing.T) {
	s := StartS3(t)
	resp, err := http.Get(s.Endpoint + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("an unsigned request got %d, want 403", resp.StatusCode)
	}
	b := s.NewBucket(t)
	if fi, err := os.Stat(filepath.Join(s.Root, b)); err != nil || !fi.IsDir() {
		t.Errorf("bucket %s is not a directory of the root: %v", b, err)
	}
	if s.NewBucket(t) == b {
		t.Errorf("two buckets share the name %s", b)
	}
	root, pid := s.Root, s.cmd.Process.Pid
	start := time.Now()
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	t.Logf("Stop took %s", time.Since(start))
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("versitygw %d still running after Stop", pid)
	}
	if _, err := os.Stat(root); !os.IsNotExist(err) {
		t.Errorf("root %s left after Stop (stat: %v)", root, err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}
