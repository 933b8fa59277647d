package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/testutil"
)

// sandboxCgroup is the memory cgroup directory of sandbox id on this host
// (cgroup v1's memory hierarchy, or v2's) and the name of its limit file.
// The runtime's directory of a sandbox that took over a container prepared
// under another id is a symlink to that container's.
func sandboxCgroup(t *testing.T, s *server, id string) (dir, limit string) {
	t.Helper()
	real, err := filepath.EvalSymlinks(filepath.Join(s.dataDir, "runtime", "sandboxes", id))
	if err != nil {
		t.Fatal(err)
	}
	cid := filepath.Base(real)
	for _, c := range []struct{ dir, limit string }{
		{filepath.Join("/sys/fs/cgroup/memory/pandastack", cid), "memory.limit_in_bytes"},
		{filepath.Join("/sys/fs/cgroup/pandastack", cid), "memory.max"},
	} {
		if _, err := os.Stat(filepath.Join(c.dir, c.limit)); err == nil {
			return c.dir, c.limit
		}
	}
	t.Fatalf("no memory cgroup of sandbox %s (container %s)", id, cid)
	return "", ""
}

// hostKills is the count of the host's out-of-memory kills in sandbox
// id's memory cgroup (the oom_kill line of cgroup v1's memory.oom_control
// or v2's memory.events).
func hostKills(t *testing.T, s *server, id string) int64 {
	t.Helper()
	dir, _ := sandboxCgroup(t, s, id)
	for _, f := range []string{"memory.oom_control", "memory.events"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, " "); ok && k == "oom_kill" {
				if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
					return n
				}
			}
		}
	}
	t.Fatalf("no oom_kill count in %s", dir)
	return 0
}

// TestHostOutOfMemory: a command that reaches the host's memory limit
// before the agent's memory watch acts is killed by the host's OOM killer,
// not the sandbox, and its stderr says so. The test forces that outcome
// by lowering the sandbox's host limit under the level at which the watch
// acts; on a busy host a fast enough allocation reaches the limit first
// by itself (a CI run of TestKernelLimits saw the filler killed with no
// word).
func TestHostOutOfMemory(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 600})
	dir, limitFile := sandboxCgroup(t, s, sb.ID)
	testutil.WaitStubRaised(t, dir)
	usage := func() int64 {
		t.Helper()
		for _, f := range []string{"memory.usage_in_bytes", "memory.current"} {
			if b, err := os.ReadFile(filepath.Join(dir, f)); err == nil {
				n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				return n
			}
		}
		t.Fatalf("no memory usage in %s", dir)
		return 0
	}
	// 300 MiB over what the sandbox holds now: far under the level where
	// the watch acts (three quarters of the sandbox's 1024 MiB and more).
	limit := usage() + 300<<20
	if err := os.WriteFile(filepath.Join(dir, limitFile), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		t.Fatal(err)
	}
	const filler = "a = []\nwhile True:\n    a.append(b'x' * 50_000_000)"
	told := func(t *testing.T, what, stderr string, code float64, signal string) {
		t.Helper()
		if code != -1 || signal != "SIGKILL" || !strings.Contains(stderr, "pandastack: out_of_memory: ") || !strings.Contains(stderr, "the host's out-of-memory killer killed this "+what) {
			t.Fatalf("%s past the host's limit: exit %v, signal %q, stderr %q; want killed, the host's note on stderr", what, code, signal, stderr)
		}
		if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"echo", "alive"}}); err != nil || res.Stdout != "alive\n" {
			t.Fatalf("after the host killed a %s: %+v %v", what, res, err)
		}
		if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != "running" {
			t.Fatalf("sandbox after the host killed a %s: %+v %v", what, got, err)
		}
		// What the killed command held goes back to the host a moment
		// after; the next fill starts from there.
		for deadline := time.Now().Add(30 * time.Second); usage() > limit-150<<20 && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
		}
	}
	t.Run("command", func(t *testing.T) {
		res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"python3", "-c", filler}, TimeoutSeconds: 120})
		if err != nil {
			t.Fatalf("exec: %v", err)
		}
		told(t, "command", res.Stderr, float64(res.ExitCode), res.Signal)
	})
	t.Run("background process", func(t *testing.T) {
		stderr, code, signal := runInBackground(t, s, sb.ID, "python3", "-c", filler)
		told(t, "background process", stderr, code, signal)
	})
}

// runInBackground starts argv as a background process of sandbox id,
// follows its output to its end, and returns its stderr, exit code and
// signal.
func runInBackground(t *testing.T, s *server, id string, argv ...string) (stderr string, code float64, signal string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"argv": argv, "background": true})
	status, out := rawCall(t, s, "POST", "/v1/sandboxes/"+id+"/exec", string(body))
	var p struct {
		PID int `json:"pid"`
	}
	if status != 200 || json.Unmarshal(out, &p) != nil || p.PID <= 0 {
		t.Fatalf("background exec: %d %s", status, out)
	}
	status, out = rawCall(t, s, "GET", fmt.Sprintf("/v1/sandboxes/%s/processes/%d/output?follow=true", id, p.PID), "")
	if status != 200 {
		t.Fatalf("output: %d %s", status, out)
	}
	var errs strings.Builder
	var exit map[string]any
	for _, ev := range ndjsonEvents(t, out) {
		switch ev["type"] {
		case "stderr":
			errs.WriteString(ev["data"].(string))
		case "exit":
			exit = ev
		}
	}
	if exit == nil {
		t.Fatalf("no exit event: %s", out)
	}
	code, _ = exit["exit_code"].(float64)
	signal, _ = exit["signal"].(string)
	return errs.String(), code, signal
}
