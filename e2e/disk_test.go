package e2e

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/client"
)

// zeros is an endless reader of zero bytes, cut with io.LimitReader.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// Issue 11 item 11: a sandbox's disk is not its memory. A 400 MB upload
// into a 256 MiB sandbox used to kill it as out_of_memory; with a disk of
// its own it fits, a full disk is an error to the writer (upload and exec,
// /tmp included), and the sandbox lives on.
func TestSandboxHasADiskOfItsOwn(t *testing.T) {
	s := startServer(t, "", "PANDASTACK_DISK_MB=512")
	// Registered first, so it runs after newSandbox's kill.
	t.Cleanup(func() { s.stop(); os.RemoveAll(s.dataDir) })
	ctx := context.Background()
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{MemoryMB: 256})

	fi, err := c.WriteFile(ctx, sb.ID, "big.bin", io.LimitReader(zeros{}, 400<<20))
	if err != nil {
		t.Fatalf("a 400 MB upload into a 256 MiB sandbox with a 512 MiB disk: %v\n%s", err, tail(s.out.String(), 20))
	}
	if fi.Size != 400<<20 {
		t.Fatalf("uploaded %d bytes", fi.Size)
	}
	// The stats show the disk's use and size, as df does inside.
	if used, size := diskStats(t, s, sb.ID); used == nil || size == nil || *size != 512<<20 || *used < 400<<20 || *used >= *size {
		t.Errorf("stats after a 400 MB upload to a 512 MiB disk: used %v of %v", deref(used), deref(size))
	}
	_, err = c.WriteFile(ctx, sb.ID, "more.bin", io.LimitReader(zeros{}, 300<<20))
	if !client.IsCode(err, "payload_too_large") || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("an upload past the full disk: %v, want payload_too_large (no space left)", err)
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "rm -f more.bin; dd if=/dev/zero of=/tmp/fill bs=1M count=300 2>&1; rm -f /tmp/fill; echo alive"})
	if err != nil {
		t.Fatalf("exec after a full disk: %v", err)
	}
	if !strings.Contains(res.Stdout, "No space left on device") || !strings.HasSuffix(res.Stdout, "alive\n") {
		t.Fatalf("filling /tmp: %q, want ENOSPC and a live sandbox", res.Stdout)
	}
	got, err := c.GetSandbox(ctx, sb.ID)
	if err != nil || got.State != "running" {
		t.Fatalf("after the full disk the sandbox is %+v, %v", got, err)
	}

	// A kernel that cannot start for a full disk says so, as an upload
	// does, rather than answering internal.
	ci := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter"})
	before, err := c.CreateContext(ctx, ci.ID, "python", "/tmp")
	if err != nil {
		t.Fatal(err)
	}
	if res, err := c.Exec(ctx, ci.ID, client.ExecRequest{Cmd: "dd if=/dev/zero of=/home/user/fill bs=64K 2>&1; dd if=/dev/zero of=/home/user/fill2 bs=1K 2>&1", TimeoutSeconds: 120}); err != nil || strings.Count(res.Stdout, "No space left") != 2 {
		t.Fatalf("filling the disk: %+v %v", res, err)
	}
	if _, err := c.CreateContext(ctx, ci.ID, "python", "/tmp"); !client.IsCode(err, "payload_too_large") || !strings.Contains(err.Error(), "no space left") {
		t.Errorf("a new kernel on a full disk: %v, want payload_too_large (no space left)", err)
	}
	// A restart too: its kernel would start, then fail its first cell.
	if _, err := c.RestartContext(ctx, ci.ID, before.ID); !client.IsCode(err, "payload_too_large") || !strings.Contains(err.Error(), "no space left") {
		t.Errorf("a restart on a full disk: %v, want payload_too_large (no space left)", err)
	}
	if res, err := c.Exec(ctx, ci.ID, client.ExecRequest{Cmd: "rm /home/user/fill /home/user/fill2"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("freeing the disk: %+v %v", res, err)
	}
	if _, err := c.RestartContext(ctx, ci.ID, before.ID); err != nil {
		t.Fatalf("a restart once the disk has room: %v", err)
	}
	if ex, err := c.Run(ctx, ci.ID, before.ID, client.RunRequest{Code: "1 + 1"}); err != nil || ex.Text != "2" || ex.Error != nil {
		t.Fatalf("a run after the restart: %+v %v", ex, err)
	}

	// A sandbox may ask for its own size, within limits.
	small := newSandbox(t, s, client.CreateSandboxRequest{DiskMB: 128})
	res, err = c.Exec(ctx, small.ID, client.ExecRequest{Cmd: "df -m / | tail -1 | tr -s ' ' | cut -d' ' -f2"})
	if err != nil || strings.TrimSpace(res.Stdout) != "128" {
		t.Fatalf("disk_mb 128: df says %q, %v", res.Stdout, err)
	}
	if used, size := diskStats(t, s, small.ID); used == nil || size == nil || *size != 128<<20 || *used <= 0 || *used > 64<<20 {
		t.Errorf("stats of a fresh 128 MiB disk: used %v of %v", deref(used), deref(size))
	}
	// Paused, it cannot say (and the look does not wake it).
	if _, err := c.Pause(ctx, small.ID); err != nil {
		t.Fatal(err)
	}
	if used, size := diskStats(t, s, small.ID); used != nil || size != nil {
		t.Errorf("stats of a paused sandbox: disk used %v of %v, want neither", deref(used), deref(size))
	}
	if got, err := c.GetSandbox(ctx, small.ID); err != nil || got.State != "paused" {
		t.Errorf("after its stats the paused sandbox is %+v, %v", got, err)
	}
	for _, body := range []string{`{"disk_mb":10}`, `{"disk_mb":99999999}`, `{"disk_mb":"big"}`} {
		if status, code, msg := api(t, s, s.key, "POST", "/v1/sandboxes", body); status != 400 || code != "invalid_request" || !strings.Contains(msg, "disk_mb") {
			t.Errorf("create %s → %d %s %q, want 400 naming disk_mb", body, status, code, msg)
		}
	}
}

// diskStats reads GET /stats's disk figures: nil when absent.
func diskStats(t *testing.T, s *server, id string) (used, size *int64) {
	t.Helper()
	var st struct {
		DiskBytes      *int64 `json:"disk_bytes"`
		DiskLimitBytes *int64 `json:"disk_limit_bytes"`
	}
	if code, body := rawJSON(t, s, "GET", "/v1/sandboxes/"+id+"/stats", "", &st); code != 200 {
		t.Fatalf("stats: %d %s", code, body)
	}
	return st.DiskBytes, st.DiskLimitBytes
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}
