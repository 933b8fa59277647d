package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/client"
)

// TestRestoreOfAMissingImageHidesHostPaths (issue 11, item 8): a restore
// whose image directory is gone on the server answers with a stable code
// and a message that names no host path, for a snapshot and for a paused
// sandbox alike.
func TestRestoreOfAMissingImageHidesHostPaths(t *testing.T) {
	s := startServer(t, "", "PANDASTACK_POOL_SIZE=0")
	t.Cleanup(func() { s.stop(); os.RemoveAll(s.dataDir) }) // after newSandbox's kill
	c := s.client()
	ctx := context.Background()
	noHostDetails := func(what string, status int, code, msg string) {
		t.Helper()
		if status < 400 || status >= 500 && status != 503 {
			t.Errorf("%s: status %d (%s %s), want a client-facing error", what, status, code, msg)
		}
		for _, p := range []string{s.dataDir, "/var/", "/tmp/", "goroutine"} {
			if strings.Contains(msg, p) {
				t.Errorf("%s: the message shows host details (%q): %q", what, p, msg)
			}
		}
	}

	sb := newSandbox(t, s, client.CreateSandboxRequest{TTLSeconds: 300})
	snap, err := c.CreateSnapshot(ctx, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(s.dataDir, "snapshots", snap.ID)); err != nil {
		t.Fatal(err)
	}
	status, code, msg := api(t, s, s.key, "POST", "/v1/sandboxes", `{"snapshot_id":"`+snap.ID+`"}`)
	noHostDetails("restore of a snapshot whose image is gone", status, code, msg)
	if code != "snapshot_corrupt" && code != "not_found" {
		t.Errorf("restore of a snapshot whose image is gone: %d %s %s", status, code, msg)
	}
	t.Logf("restore: %d %s %s", status, code, msg)

	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(s.dataDir, "paused", sb.ID)); err != nil {
		t.Fatal(err)
	}
	status, code, msg = api(t, s, s.key, "POST", "/v1/sandboxes/"+sb.ID+"/resume", "")
	noHostDetails("resume of a paused sandbox whose image is gone", status, code, msg)
	if code != "snapshot_corrupt" {
		t.Errorf("resume of a paused sandbox whose image is gone: %d %s %s", status, code, msg)
	}
	t.Logf("resume: %d %s %s", status, code, msg)
}
