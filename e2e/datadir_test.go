package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/paths"
)

// A second serve on a data directory in use refuses to start, naming the
// directory and the holder's pid, and the first one's sandboxes live on.
func TestDataDirIsLocked(t *testing.T) {
	s := startServer(t, "")
	defer func() { s.stop(); os.RemoveAll(s.dataDir) }()
	sb, err := s.client().CreateSandbox(t.Context(), client.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(s.bin, "pandastack"), "serve")
	cmd.Env = append(os.Environ(),
		"PANDASTACK_LISTEN=127.0.0.1:"+strconv.Itoa(freePort(t)),
		"PANDASTACK_DATA_DIR="+s.dataDir,
		"PANDASTACK_CACHE_DIR="+paths.CacheDir(),
	)
	done := make(chan struct{})
	var out []byte
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		<-done
		t.Fatalf("a second serve on the same data dir kept running:\n%s", out)
	}
	msg := string(out)
	if err == nil || !strings.Contains(msg, s.dataDir) || !strings.Contains(msg, fmt.Sprintf("pid %d", s.cmd.Process.Pid)) {
		t.Fatalf("second serve: %v\n%s", err, msg)
	}
	res, err := s.client().Exec(t.Context(), sb.ID, client.ExecRequest{Cmd: "echo alive"})
	if err != nil || res.Stdout != "alive\n" {
		t.Fatalf("the first server's sandbox after the second start: %+v %v", res, err)
	}
	s.client().KillSandbox(t.Context(), sb.ID)
}

// A server killed mid-snapshot or mid-fork leaves partial images; the next
// start sweeps them, and unowned paused images, and keeps whole snapshots.
func TestRestartSweepsPartialImages(t *testing.T) {
	s := startServer(t, "")
	defer func() { s.stop(); os.RemoveAll(s.dataDir) }()
	// Its sandboxes go with serve's own stop at the end (kill on exit).
	sb, err := s.client().CreateSandbox(t.Context(), client.CreateSandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	snap := takeSnapshot(t, s, sb.ID)
	s.cmd.Process.Kill() // as kill -9 would
	s.cmd.Wait()
	s.cmd = nil
	leftovers := []string{
		filepath.Join(s.dataDir, "snapshots", ".tmp-snap_x-t_y"),
		filepath.Join(s.dataDir, "snapshots", ".fork-f_z"),
		filepath.Join(s.dataDir, "paused", ".tmp-sbx_a-t_b"),
		filepath.Join(s.dataDir, "paused", "sbx_nobodyhasthis"),
	}
	for _, d := range leftovers {
		os.MkdirAll(filepath.Join(d, "image"), 0o700)
		os.WriteFile(filepath.Join(d, "image", "pages-1.img"), make([]byte, 1<<20), 0o600)
	}
	s.start()
	for _, d := range leftovers {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s survived the restart: %v", d, err)
		}
	}
	if _, err := s.client().CreateSandboxFromSnapshot(t.Context(), client.RestoreRequest{SnapshotID: snap.ID}); err != nil {
		t.Fatalf("the whole snapshot after the restart: %v", err)
	}
}
