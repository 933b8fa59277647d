package e2e

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
)

// TestHistoryOutlivesRestart: what was run in a sandbox and the tree of
// snapshots and forks are still there after serve stops and starts again on
// the same data dir; a command that was running when serve stopped reads as
// finished, with a failure that says why.
func TestHistoryOutlivesRestart(t *testing.T) {
	s := startServer(t, "")
	defer func() { s.stop(); os.RemoveAll(s.dataDir) }()
	ctx := context.Background()
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo before-restart; exit 4"}); err != nil {
		t.Fatal(err)
	}
	snap := takeSnapshot(t, s, sb.ID)
	restored, err := c.CreateSandboxFromSnapshot(ctx, client.RestoreRequest{SnapshotID: snap.ID, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	kids, err := c.Fork(ctx, sb.ID, client.ForkRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// A command still running when serve stops.
	started := make(chan struct{})
	go func() {
		close(started)
		c.Exec(context.Background(), restored.ID, client.ExecRequest{Cmd: "echo sleeping; sleep 600"})
	}()
	<-started
	waitHistory(t, s, restored.ID, func(h []historyEntry) bool { return len(h) == 1 && strings.Contains(h[0].Stdout, "sleeping") })

	s.stop() // with kill on exit, the sandboxes go too
	s.start()

	h := waitHistory(t, s, sb.ID, func(h []historyEntry) bool { return true })
	if len(h) != 1 || h[0].Command != "echo before-restart; exit 4" || h[0].Stdout != "before-restart\n" || h[0].ExitCode == nil || *h[0].ExitCode != 4 {
		t.Errorf("history of %s after a restart = %+v, want the exec with exit 4", sb.ID, h)
	}
	h = waitHistory(t, s, restored.ID, func(h []historyEntry) bool { return true })
	if len(h) != 1 || h[0].Command != "echo sleeping; sleep 600" || h[0].Running || h[0].Failure == "" {
		t.Errorf("the command cut short by the restart = %+v, want it ended with a failure", h)
	}
	got := lineage(t, s, s.key)
	want := []string{restored.ID + "<snapshot<" + snap.ID, kids[0].ID + "<fork<" + sb.ID}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("lineage after a restart = %v, want %v", got, want)
	}
	for _, id := range []string{sb.ID, restored.ID, kids[0].ID} {
		s.assertGone(t, id)
	}
}

// waitHistory reads the sandbox's history until ok accepts it.
func waitHistory(t *testing.T, s *server, id string, ok func([]historyEntry) bool) []historyEntry {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var h struct{ History []historyEntry }
		if code, body := rawJSON(t, s, "GET", "/v1/sandboxes/"+id+"/history", "", &h); code != 200 {
			t.Fatalf("history of %s: %d %s", id, code, body)
		}
		if ok(h.History) {
			return h.History
		}
		if time.Now().After(deadline) {
			t.Fatalf("history of %s = %+v", id, h.History)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// lineage returns the project's origins as "sandbox<kind<from", oldest first.
func lineage(t *testing.T, s *server, key string) []string {
	t.Helper()
	var lin struct {
		Origins []struct {
			SandboxID string `json:"sandbox_id"`
			Kind      string `json:"kind"`
			From      string `json:"from"`
		} `json:"origins"`
	}
	req, _ := http.NewRequest("GET", s.url+"/v1/lineage", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	decodeJSON(t, resp, &lin)
	got := []string{}
	for _, o := range lin.Origins {
		got = append(got, o.SandboxID+"<"+o.Kind+"<"+o.From)
	}
	return got
}

// A command whose caller hung up reads as cancelled in the history, not as
// an internal error.
func TestHistorySaysCancelled(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{TTLSeconds: 300})
	short, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err := c.Exec(short, sb.ID, client.ExecRequest{Cmd: "echo hanging; sleep 30"})
	cancel()
	if err == nil {
		t.Fatal("a 30 s command answered within its caller's 2 s")
	}
	h := waitHistory(t, s, sb.ID, func(h []historyEntry) bool { return len(h) == 1 && !h[0].Running })
	if !strings.HasPrefix(h[0].Failure, "cancelled: the caller went away") {
		t.Errorf("the history of a command whose caller hung up = %+v, want it cancelled", h[0])
	}
}
