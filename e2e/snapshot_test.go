package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
)

// rawJSON sends an authenticated request and decodes a 2xx answer into out.
func rawJSON(t *testing.T, s *server, method, path, body string, out any) (int, string) {
	t.Helper()
	status, raw := rawCall(t, s, method, path, body)
	raw = bytes.TrimSpace(raw)
	if status < 300 && out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, raw)
		}
	}
	return status, string(raw)
}

type snapshot struct {
	ID        string `json:"id"`
	SandboxID string `json:"sandbox_id"`
	Template  string `json:"template"`
	SizeBytes int64  `json:"size_bytes"`
}

func takeSnapshot(t *testing.T, s *server, id string) snapshot {
	t.Helper()
	var snap snapshot
	if st, body := rawJSON(t, s, "POST", "/v1/sandboxes/"+id+"/snapshots", `{"metadata":{"k":"v"}}`, &snap); st != 201 {
		t.Fatalf("snapshot: %d %s", st, body)
	}
	if !strings.HasPrefix(snap.ID, "snap_") || snap.SandboxID != id || snap.SizeBytes < 1<<20 {
		t.Fatalf("snapshot = %+v", snap)
	}
	return snap
}

func TestSnapshotRestoreFork(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 600})
	if _, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "import json, fractions\nsecret = 41\nimport os; os.makedirs('work', exist_ok=True); os.chdir('work')"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "/home/user/notes.txt", strings.NewReader("kept")); err != nil {
		t.Fatal(err)
	}
	snap := takeSnapshot(t, s, sb.ID)

	// The parent keeps running after the snapshot.
	if ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "secret + 1"}); err != nil || ex.Text != "42" {
		t.Fatalf("parent after snapshot: %+v %v", ex, err)
	}

	t.Run("restore brings back variables, modules, cwd and files", func(t *testing.T) {
		var got client.Sandbox
		if st, body := rawJSON(t, s, "POST", "/v1/sandboxes", fmt.Sprintf(`{"snapshot_id":%q,"ttl_seconds":300}`, snap.ID), &got); st != 201 {
			t.Fatalf("create from snapshot: %d %s", st, body)
		}
		defer c.KillSandbox(ctx, got.ID)
		ex, err := c.RunCode(ctx, got.ID, client.RunRequest{Code: "print(secret, fractions.Fraction(1, 2), os.getcwd())"})
		if err != nil || ex.Error != nil || ex.Stdout != "41 1/2 /home/user/work\n" {
			t.Fatalf("restored run: %+v %v", ex, err)
		}
		rc, err := c.ReadFile(ctx, got.ID, "/home/user/notes.txt")
		if err != nil {
			t.Fatal(err)
		}
		rc.Close()
		res, _ := c.Exec(ctx, got.ID, client.ExecRequest{Cmd: "echo $PANDASTACK_SANDBOX_ID"})
		if strings.TrimSpace(res.Stdout) != got.ID {
			t.Fatalf("restored sandbox thinks it is %q", res.Stdout)
		}
		// The context it holds from the snapshot's sandbox says so too.
		if ex, err := c.RunCode(ctx, got.ID, client.RunRequest{Code: "os.environ['PANDASTACK_SANDBOX_ID']"}); err != nil || ex.Text != "'"+got.ID+"'" {
			t.Fatalf("the restored context thinks it runs in %+v, %v; want %s", ex, err, got.ID)
		}
	})

	t.Run("fork gives independent children", func(t *testing.T) {
		var out struct {
			Sandboxes []client.Sandbox `json:"sandboxes"`
		}
		if st, body := rawJSON(t, s, "POST", "/v1/sandboxes/"+sb.ID+"/fork", `{"count":4}`, &out); st != 201 || len(out.Sandboxes) != 4 {
			t.Fatalf("fork: %d %s", st, body)
		}
		for _, k := range out.Sandboxes {
			defer c.KillSandbox(ctx, k.ID)
		}
		for i, k := range out.Sandboxes {
			if _, err := c.RunCode(ctx, k.ID, client.RunRequest{Code: fmt.Sprintf("secret = %d", 100+i)}); err != nil {
				t.Fatal(err)
			}
		}
		for i, k := range out.Sandboxes {
			ex, err := c.RunCode(ctx, k.ID, client.RunRequest{Code: "secret"})
			if err != nil || ex.Text != fmt.Sprint(100+i) {
				t.Fatalf("child %d: %+v %v", i, ex, err)
			}
			// Its context, the parent's until the fork, names the child.
			ex, err = c.RunCode(ctx, k.ID, client.RunRequest{Code: "os.environ['PANDASTACK_SANDBOX_ID']"})
			if err != nil || ex.Text != "'"+k.ID+"'" {
				t.Fatalf("child %d's context thinks it runs in %+v, %v; want %s", i, ex, err, k.ID)
			}
		}
		// Restarted, the kernel starts in the child, not in the parent its
		// context was made in.
		k := out.Sandboxes[0]
		if _, err := c.RestartContext(ctx, k.ID, "ctx_default_python"); err != nil {
			t.Fatal(err)
		}
		if ex, err := c.RunCode(ctx, k.ID, client.RunRequest{Code: "import os; os.environ['PANDASTACK_SANDBOX_ID']"}); err != nil || ex.Text != "'"+k.ID+"'" {
			t.Fatalf("a child's restarted context thinks it runs in %+v, %v; want %s", ex, err, k.ID)
		}
		if ex, _ := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "secret"}); ex.Text != "41" {
			t.Fatalf("parent changed by its children: %+v", ex)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		cases := []struct{ method, path, body, code string }{
			{"POST", "/v1/sandboxes", `{"snapshot_id":"snap_nope"}`, "not_found"},
			{"POST", "/v1/sandboxes/" + sb.ID + "/fork", `{"count":0}`, "invalid_request"},
			{"POST", "/v1/sandboxes/" + sb.ID + "/fork", `{"count":17}`, "invalid_request"},
			{"GET", "/v1/snapshots/snap_nope", ``, "not_found"},
		}
		for _, tc := range cases {
			status, code, msg := api(t, s, s.key, tc.method, tc.path, tc.body)
			if code != tc.code || status < 400 {
				t.Errorf("%s %s %s → %d %s %s, want %s", tc.method, tc.path, tc.body, status, code, msg, tc.code)
			}
		}
		other := client.New(s.url, s.newKey("snap-other"))
		theirs, err := other.CreateSandbox(ctx, client.CreateSandboxRequest{})
		if err != nil {
			t.Fatal(err)
		}
		defer other.KillSandbox(ctx, theirs.ID)
		req, _ := http.NewRequest("GET", s.url+"/v1/snapshots/"+snap.ID, nil)
		req.Header.Set("Authorization", "Bearer "+other.APIKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 404 {
			t.Fatalf("another project sees the snapshot: %v %v", resp.StatusCode, err)
		}
		resp.Body.Close()
	})

	t.Run("corrupt snapshot", func(t *testing.T) {
		snap2 := takeSnapshot(t, s, sb.ID)
		dir := filepath.Join(s.dataDir, "snapshots", snap2.ID, "image")
		var victim string
		filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() && (victim == "" || fi.Size() > 1<<20) {
				victim = p
			}
			return nil
		})
		f, err := os.OpenFile(victim, os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt([]byte("garbage!"), 4096)
		f.Close()
		before := s.runscList()
		status, code, msg := api(t, s, s.key, "POST", "/v1/sandboxes", fmt.Sprintf(`{"snapshot_id":%q}`, snap2.ID))
		if code != "snapshot_corrupt" || status != 422 || !strings.Contains(msg, "checksum") {
			t.Fatalf("restore of an altered snapshot: %d %s %s", status, code, msg)
		}
		os.Truncate(victim, 100)
		_, code, msg = api(t, s, s.key, "POST", "/v1/sandboxes", fmt.Sprintf(`{"snapshot_id":%q}`, snap2.ID))
		if code != "snapshot_corrupt" || !strings.Contains(msg, "truncated") {
			t.Fatalf("restore of a truncated snapshot: %s %s", code, msg)
		}
		if left := s.containersSince(before); len(left) > 0 {
			t.Fatalf("a corrupt restore left containers: %v", left)
		}
		// Deleting removes the files.
		if st, _ := rawJSON(t, s, "DELETE", "/v1/snapshots/"+snap2.ID, "", nil); st != 204 {
			t.Fatalf("delete snapshot: %d", st)
		}
		if _, err := os.Stat(filepath.Join(s.dataDir, "snapshots", snap2.ID)); !os.IsNotExist(err) {
			t.Fatalf("snapshot files left after delete: %v", err)
		}
	})

	t.Run("listed with disk use", func(t *testing.T) {
		var out struct {
			Snapshots []snapshot `json:"snapshots"`
			Total     int64      `json:"total_size_bytes"`
		}
		rawJSON(t, s, "GET", "/v1/snapshots?metadata.k=v", "", &out)
		if len(out.Snapshots) == 0 || out.Total < snap.SizeBytes {
			t.Fatalf("list = %+v", out)
		}
	})
}

// A sandbox holding many files (a clone of a large repository, an npm
// install) lives through its snapshot, fork and pause: gVisor encodes its
// kernel state, a few KB a file, in memory charged to the sandbox, and at
// 100,000 files that took the sandbox past its host limit (a 512 MiB
// sandbox was stopped out_of_memory, an idle suspend included).
func TestCheckpointsOfManyFiles(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "base", TTLSeconds: 600})
	if sb.MemoryMB != 512 {
		t.Fatalf("base sandbox of %d MiB, want 512 (the figures above)", sb.MemoryMB)
	}
	mk := `mkdir m && cd m && python3 -c 'for i in range(100000): open(f"f{i}", "w").close()'`
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: mk, TimeoutSeconds: 300}); err != nil || res.ExitCode != 0 {
		t.Fatalf("making the files: %+v %v", res, err)
	}
	count := func(id, when string) {
		t.Helper()
		res, err := c.Exec(ctx, id, client.ExecRequest{Cmd: "ls m | wc -l"})
		if err != nil || strings.TrimSpace(res.Stdout) != "100000" {
			t.Fatalf("%s: %+v %v", when, res, err)
		}
	}
	snap, err := c.CreateSnapshot(ctx, sb.ID, nil)
	if err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	t.Cleanup(func() { c.DeleteSnapshot(context.Background(), snap.ID) })
	count(sb.ID, "after the snapshot")
	kids, err := c.Fork(ctx, sb.ID, client.ForkRequest{Count: 1})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	t.Cleanup(func() { c.KillSandbox(context.Background(), kids[0].ID) })
	count(kids[0].ID, "in the fork's child")
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatalf("pause: %v", err)
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	count(sb.ID, "after pause and resume")
}

func TestPauseResume(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 600})
	if _, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "import numpy as np\nbig = np.ones(50_000_000)\nmarker = 'still here'"}); err != nil {
		t.Fatal(err)
	}
	// gVisor keeps the sandbox's memory in a file the host charges to the
	// sandbox's memory cgroup; that is what a pause must free.
	stats := func() int64 {
		b, err := os.ReadFile("/sys/fs/cgroup/memory/pandastack/" + sb.ID + "/memory.usage_in_bytes")
		if err != nil {
			return 0
		}
		var n int64
		fmt.Sscan(strings.TrimSpace(string(b)), &n)
		return n
	}
	before := stats()
	var got client.Sandbox
	if st, body := rawJSON(t, s, "POST", "/v1/sandboxes/"+sb.ID+"/pause", "", &got); st != 200 || got.State != "paused" {
		t.Fatalf("pause: %d %s", st, body)
	}
	after := stats()
	t.Logf("host memory of the sandbox (cgroup): %d MiB running, %d MiB paused", before>>20, after>>20)
	if before < 350<<20 || after != 0 || len(processesMentioning(sb.ID)) > 0 {
		t.Fatalf("pause did not free memory: %d → %d bytes", before, after)
	}
	status, code, msg := api(t, s, s.key, "POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"cmd":"true"}`)
	if status != 409 || code != "conflict" || !strings.Contains(msg, "paused") {
		t.Fatalf("exec on a paused sandbox: %d %s %s", status, code, msg)
	}
	if status, code, _ := api(t, s, s.key, "POST", "/v1/sandboxes/"+sb.ID+"/pause", ""); status != 409 || code != "conflict" {
		t.Fatalf("pause of a paused sandbox: %d %s", status, code)
	}
	if st, body := rawJSON(t, s, "POST", "/v1/sandboxes/"+sb.ID+"/resume", "", &got); st != 200 || got.State != "running" {
		t.Fatalf("resume: %d %s", st, body)
	}
	// Past a few reaper passes: the resumed sandbox must not be taken for dead.
	time.Sleep(2500 * time.Millisecond)
	ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "marker, big.sum()"})
	if err != nil || ex.Text != "('still here', np.float64(50000000.0))" {
		t.Fatalf("after resume: %+v %v", ex, err)
	}

	t.Run("auto resume", func(t *testing.T) {
		var auto client.Sandbox
		if st, body := rawJSON(t, s, "POST", "/v1/sandboxes", `{"auto_resume":true}`, &auto); st != 201 {
			t.Fatalf("create: %d %s", st, body)
		}
		defer c.KillSandbox(ctx, auto.ID)
		c.Exec(ctx, auto.ID, client.ExecRequest{Cmd: "echo hi > f"})
		rawJSON(t, s, "POST", "/v1/sandboxes/"+auto.ID+"/pause", "", nil)
		res, err := c.Exec(ctx, auto.ID, client.ExecRequest{Cmd: "cat f"})
		if err != nil || res.Stdout != "hi\n" {
			t.Fatalf("exec on an auto-resume sandbox: %+v %v", res, err)
		}
	})
}

// miniWheel builds a one-module wheel inside the sandbox (there is no
// network, so pip can only install local files) and installs it for the user.
const miniWheel = `import zipfile, subprocess, sys
files = {
    "pandamini/__init__.py": "ANSWER = 42\n",
    "pandamini-1.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: pandamini\nVersion: 1.0\n",
    "pandamini-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: handmade\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
files["pandamini-1.0.dist-info/RECORD"] = "".join(f"{n},,\n" for n in files) + "pandamini-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile("/tmp/pandamini-1.0-py3-none-any.whl", "w") as z:
    for n, c in files.items():
        z.writestr(n, c)
r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "/tmp/pandamini-1.0-py3-none-any.whl"], capture_output=True, text=True)
print(r.returncode, r.stderr[-500:])
import importlib; importlib.invalidate_caches()
import pandamini  # the kernel's sys.path has the user's site-packages: importable at once
`

func TestSnapshotSurvivesServerRestart(t *testing.T) {
	s := startServer(t, "")
	defer func() { s.stop(); os.RemoveAll(s.dataDir) }()
	ctx := context.Background()
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: miniWheel + "\nimport statistics\nkept = [1, 2, 3]", TimeoutSeconds: 120})
	if err != nil || ex.Error != nil || !strings.HasPrefix(ex.Stdout, "0 ") {
		t.Fatalf("installing a wheel: %+v %v", ex, err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "data/file.txt", strings.NewReader("on disk")); err != nil {
		t.Fatal(err)
	}
	snap := takeSnapshot(t, s, sb.ID)
	c.KillSandbox(ctx, sb.ID)

	s.stop()
	s.start()
	c = s.client()
	var got client.Sandbox
	if st, body := rawJSON(t, s, "POST", "/v1/sandboxes", fmt.Sprintf(`{"snapshot_id":%q}`, snap.ID), &got); st != 201 {
		t.Fatalf("create from snapshot after restart: %d %s", st, body)
	}
	defer c.KillSandbox(ctx, got.ID)
	ex, err = c.RunCode(ctx, got.ID, client.RunRequest{Code: "print(kept, statistics.mean(kept), pandamini.ANSWER, open('/home/user/data/file.txt').read())"})
	if err != nil || ex.Error != nil || ex.Stdout != "[1, 2, 3] 2 42 on disk\n" {
		t.Fatalf("after restart: %+v %v", ex, err)
	}
	// The package is installed on disk, not only imported: a new context finds it.
	fresh, err := c.CreateContext(ctx, got.ID, "python", "")
	if err != nil {
		t.Fatal(err)
	}
	ex, err = c.Run(ctx, got.ID, fresh.ID, client.RunRequest{Code: "import pandamini; pandamini.ANSWER"})
	if err != nil || ex.Text != "42" {
		t.Fatalf("a fresh import of the installed package: %+v %v", ex, err)
	}
}

func TestSnapshotDiskFull(t *testing.T) {
	s, snapDir := serverWithSmallDisk(t, "snapshots")
	ctx := context.Background()
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 300})
	if err != nil {
		t.Fatal(err)
	}
	defer c.KillSandbox(ctx, sb.ID)
	c.RunCode(ctx, sb.ID, client.RunRequest{Code: "v = 'alive'"})
	status, code, msg := api(t, s, s.key, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", "")
	if status != 507 || code != "insufficient_storage" {
		t.Fatalf("snapshot on a full disk: %d %s %s", status, code, msg)
	}
	if ents, _ := os.ReadDir(snapDir); len(ents) != 0 {
		t.Fatalf("partial snapshot left behind: %v", ents)
	}
	ex, err := c.RunCode(ctx, sb.ID, client.RunRequest{Code: "v"})
	if err != nil || ex.Text != "'alive'" {
		t.Fatalf("the parent after a failed snapshot: %+v %v", ex, err)
	}
}

func TestSnapshotDuringWorkIsConflict(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{})
	// An exec that has printed is under way; it runs until the checks are
	// done and the test hangs up.
	started := make(chan struct{})
	done := make(chan error, 1)
	ectx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		var once sync.Once
		_, err := c.ExecStream(ectx, sb.ID, client.ExecRequest{Cmd: "echo started; sleep 120", TimeoutSeconds: 180}, func(ev client.ExecEvent) {
			if ev.Type == "stdout" && strings.Contains(ev.Data, "started") {
				once.Do(func() { close(started) })
			}
		})
		done <- err
	}()
	select {
	case <-started:
	case err := <-done:
		t.Fatalf("exec ended before the checks: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("exec printed nothing in a minute")
	}
	for _, path := range []string{"/snapshots", "/fork", "/pause"} {
		status, code, msg := api(t, s, s.key, "POST", "/v1/sandboxes/"+sb.ID+path, "")
		if status != 409 || code != "conflict" || !strings.Contains(msg, "running") {
			t.Fatalf("%s during an exec: %d %s %s", path, status, code, msg)
		}
	}
	// A caller that goes away ends its exec (the server notices the
	// closed connection soon after, not at once).
	stop()
	<-done
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, body := rawJSON(t, s, "POST", "/v1/sandboxes/"+sb.ID+"/snapshots", "", nil)
		if st == 201 {
			break
		}
		if st != 409 || time.Now().After(deadline) {
			t.Fatalf("snapshot once the exec's caller went away: %d %s", st, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// A snapshot asked for as soon as an exec's answer is in is taken:
	// the caller reads the exit a moment before the server counts the
	// exec done, and the checkpoint waits that moment out.
	for i := 0; i < 10; i++ {
		if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo hi"}); err != nil || res.Stdout != "hi\n" {
			t.Fatalf("exec %d: %+v %v", i, res, err)
		}
		snap, err := c.CreateSnapshot(ctx, sb.ID, nil)
		if err != nil {
			t.Fatalf("snapshot %d right after an exec's answer: %v", i, err)
		}
		if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
			t.Fatal(err)
		}
	}
}

// TestPausedForksAfterServerRestart: a sandbox paused as asked forks and
// is snapshotted straight from its paused image after the server
// restarted too (its image checked first), and stays paused; both were
// refused ("paused; resume it first") once the server that paused it was
// gone.
func TestPausedForksAfterServerRestart(t *testing.T) {
	s := startServer(t, "", "PANDASTACK_KILL_ON_EXIT=0", "PANDASTACK_POOL_SIZE=0") // the paused sandbox outlives the stop
	defer func() { s.stop(); os.RemoveAll(s.dataDir) }()
	ctx := context.Background()
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.WriteFile(ctx, sb.ID, "kept.txt", strings.NewReader("kept")); err != nil {
		t.Fatal(err)
	}
	defer func() { s.client().KillSandbox(ctx, sb.ID) }()
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	s.stop()
	s.start()
	c = s.client()
	kids, err := c.Fork(ctx, sb.ID, client.ForkRequest{Count: 1})
	if err != nil || len(kids) != 1 {
		t.Fatalf("fork of a paused sandbox after a restart: %v %v", kids, err)
	}
	defer c.KillSandbox(ctx, kids[0].ID)
	if res, err := c.Exec(ctx, kids[0].ID, client.ExecRequest{Cmd: "cat kept.txt"}); err != nil || res.Stdout != "kept" {
		t.Fatalf("the child: %+v %v", res, err)
	}
	snap, err := c.CreateSnapshot(ctx, sb.ID, nil)
	if err != nil {
		t.Fatalf("snapshot of a paused sandbox after a restart: %v", err)
	}
	defer c.DeleteSnapshot(ctx, snap.ID)
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != "paused" {
		t.Fatalf("the parent after its fork and snapshot: %+v %v, want still paused", got, err)
	}
}

// TestStopsGetThroughSnapshotLoops: clients that snapshot a sandbox over
// and over keep neither a kill (it answered 409 for 11 s) nor its TTL (it
// ran on past it) from stopping it; each waits for the snapshot under way.
func TestStopsGetThroughSnapshotLoops(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	loop := func(id, tag string) (stop func() int) {
		lctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		var mu sync.Mutex
		taken := 0
		for range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for lctx.Err() == nil {
					snap, err := c.CreateSnapshot(lctx, id, map[string]string{"loop": tag})
					if err == nil {
						mu.Lock()
						taken++
						mu.Unlock()
						c.DeleteSnapshot(ctx, snap.ID)
					} else if !client.IsCode(err, "conflict") && lctx.Err() == nil {
						return // stopped under it
					}
				}
			}()
		}
		return func() int { cancel(); wg.Wait(); return taken }
	}
	cleanup := func(tag string) {
		snaps, _, _ := c.ListSnapshots(ctx, map[string]string{"loop": tag})
		for _, sn := range snaps {
			c.DeleteSnapshot(ctx, sn.ID)
		}
	}

	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "base", TTLSeconds: 300})
	stop := loop(sb.ID, "kill")
	time.Sleep(time.Second)
	err := c.KillSandbox(ctx, sb.ID)
	n := stop()
	cleanup("kill")
	if err != nil {
		t.Fatalf("a kill during a snapshot loop (%d snapshots taken): %v", n, err)
	}
	if _, err := c.GetSandbox(ctx, sb.ID); !client.IsCode(err, "not_found") {
		t.Fatalf("after the kill: %v", err)
	}

	sb = newSandbox(t, s, client.CreateSandboxRequest{Template: "base", TTLSeconds: 3})
	stop = loop(sb.ID, "ttl")
	deadline := time.Now().Add(60 * time.Second)
	for {
		got, err := c.GetSandbox(ctx, sb.ID)
		if err != nil || got.State == "stopped" {
			if err == nil && got.StopReason != "expired" {
				t.Errorf("stop reason %q, want expired", got.StopReason)
			}
			break
		}
		if time.Now().After(deadline) {
			n := stop()
			cleanup("ttl")
			t.Fatalf("still %s a minute after its 3 s TTL, %d snapshots taken", got.State, n)
		}
		time.Sleep(200 * time.Millisecond)
	}
	stop()
	cleanup("ttl")
}
