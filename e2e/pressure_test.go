package e2e

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/testutil"
)

// A server keeps its memory reserve: with the host pushed under it (this
// test's own memory, touched page by page), the quiet sandboxes are
// suspended (pause_reason memory) instead of the host running out; a
// create, and a request to a suspended sandbox, are refused with 503
// insufficient_memory while no room can be made; once the memory is back
// the suspended sandbox's next request resumes it with its files.
func TestMemoryPressure(t *testing.T) {
	// The host keeps at least 2 GiB available all along: the reserve sits
	// 3 GiB under what it has now (room for the server and its sandboxes
	// whatever else runs, so only the hog below crosses it), and the hog
	// takes it 300 MiB under the reserve.
	testutil.RequireMemory(t, 3072+2048+300)
	reserve := testutil.MemAvailableMiB(t) - 3072
	s := startServer(t, "", "PANDASTACK_POOL_SIZE=0", "PANDASTACK_PREPARED_CREATES=0", fmt.Sprintf("PANDASTACK_MEMORY_RESERVE_MB=%d", reserve))
	t.Cleanup(s.stop) // after the sandboxes' kills
	ctx := context.Background()
	c := s.client()

	var ids []string
	for i := range 2 {
		sb := newSandbox(t, s, client.CreateSandboxRequest{})
		ids = append(ids, sb.ID)
		if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: fmt.Sprintf("echo kept-%d > /tmp/v", i)}); err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %+v %v", res, err)
		}
	}
	// Quiet for longer than a sandbox must be to be chosen (10 s).
	time.Sleep(12 * time.Second)

	// The hog: 300 MiB past the reserve, more than the two sandboxes hold.
	hogMiB := testutil.MemAvailableMiB(t) - reserve + 300
	hog := make([]byte, hogMiB<<20)
	for i := 0; i < len(hog); i += os.Getpagesize() {
		hog[i] = 1
	}
	freed := false
	free := func() {
		if !freed {
			freed = true
			hog = nil
			debug.FreeOSMemory()
		}
	}
	defer free()
	for _, id := range ids {
		sb := waitState(t, s, id, "suspended for memory", func(sb *client.Sandbox) bool { return sb.State == "paused" })
		if sb.PauseReason != "memory" {
			t.Fatalf("%s paused for %q, want memory\n%s", id, sb.PauseReason, tail(s.out.String(), 20))
		}
	}
	if !strings.Contains(s.out.String(), "the host is short of memory") {
		t.Errorf("the server's log does not say why it suspended them:\n%s", tail(s.out.String(), 20))
	}
	// No room can be made: nothing else is running.
	status, code, msg := api(t, s, s.key, "POST", "/v1/sandboxes", `{}`)
	if status != 503 || code != "insufficient_memory" || !strings.Contains(msg, "memory available") {
		t.Fatalf("create under the reserve: %d %s %s", status, code, msg)
	}
	if _, err := c.Exec(ctx, ids[0], client.ExecRequest{Cmd: "cat /tmp/v"}); !client.IsCode(err, "insufficient_memory") {
		t.Fatalf("a request to a suspended sandbox under the reserve: %v, want insufficient_memory", err)
	}
	if sb, err := c.GetSandbox(ctx, ids[0]); err != nil || sb.State != "paused" || sb.PauseReason != "memory" {
		t.Fatalf("after the refused resume: %+v %v", sb, err)
	}

	free()
	eventually(t, "the host's memory to be back over the reserve", func() bool { return testutil.MemAvailableMiB(t) > reserve+200 })
	for i, id := range ids {
		res, err := c.Exec(ctx, id, client.ExecRequest{Cmd: "cat /tmp/v"})
		if want := fmt.Sprintf("kept-%d\n", i); err != nil || res.Stdout != want {
			t.Fatalf("after the memory came back, %s: %+v %v; want %q", id, res, err, want)
		}
		if sb, err := c.GetSandbox(ctx, id); err != nil || sb.State != "running" || sb.PauseReason != "" {
			t.Fatalf("resumed: %+v %v", sb, err)
		}
	}
	sb := newSandbox(t, s, client.CreateSandboxRequest{})
	c.KillSandbox(ctx, sb.ID)
}
