package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/client"
)

// TestMetrics: serve --metrics-listen answers GET /metrics without a key
// in Prometheus' text format, and its series follow what the API did: the
// sandbox operations by outcome, the creates, the stops by reason, the
// requests by route and status, the error codes, and the sandboxes running
// and paused at the scrape.
func TestMetrics(t *testing.T) {
	port := freePort(t)
	s := startServer(t, "", "PANDASTACK_METRICS_LISTEN=127.0.0.1:"+strconv.Itoa(port), "PANDASTACK_POOL_SIZE=0")
	t.Cleanup(func() { s.stop(); os.RemoveAll(s.dataDir) }) // after the sandboxes' own clean-up
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	ctx := context.Background()
	c := s.client()

	sb := newSandbox(t, s, client.CreateSandboxRequest{TTLSeconds: 300})
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo hi"}); err != nil || res.Stdout != "hi\n" {
		t.Fatalf("exec: %+v %v", res, err)
	}
	if _, err := c.GetSandbox(ctx, "sbx_doesnotexist"); err == nil {
		t.Fatal("GET of a sandbox that does not exist succeeded")
	}
	snap, err := c.CreateSnapshot(ctx, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	restored, err := c.CreateSandboxFromSnapshot(ctx, client.RestoreRequest{SnapshotID: snap.ID, TTLSeconds: 300})
	if err != nil {
		t.Fatal(err)
	}
	kids, err := c.Fork(ctx, sb.ID, client.ForkRequest{Count: 2, TTLSeconds: 300})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx, restored.ID); err != nil {
		t.Fatal(err)
	}
	m := scrapeMetrics(t, url)
	for series, want := range map[string]float64{
		`pandastack_sandboxes{state="running"}`: 3, // sb and the two children
		`pandastack_sandboxes{state="paused"}`:  1,
	} {
		if got := m[series]; got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	if _, err := c.Resume(ctx, restored.ID); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{sb.ID, restored.ID, kids[0].ID, kids[1].ID} {
		if err := c.KillSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	m = scrapeMetrics(t, url)
	for series, want := range map[string]float64{
		`pandastack_sandbox_operations_total{operation="create",outcome="ok"}`:            1,
		`pandastack_sandbox_operations_total{operation="restore",outcome="ok"}`:           1,
		`pandastack_sandbox_operations_total{operation="snapshot",outcome="ok"}`:          1,
		`pandastack_sandbox_operations_total{operation="fork",outcome="ok"}`:              1,
		`pandastack_sandbox_operations_total{operation="pause",outcome="ok"}`:             1,
		`pandastack_sandbox_operations_total{operation="resume",outcome="ok"}`:            1,
		`pandastack_sandbox_operations_total{operation="kill",outcome="ok"}`:              4,
		`pandastack_sandbox_operation_duration_seconds_count{operation="fork"}`:           1,
		`pandastack_sandbox_stops_total{reason="killed"}`:                                 4,
		`pandastack_sandboxes{state="running"}`:                                           0,
		`pandastack_sandboxes{state="paused"}`:                                            0,
		`pandastack_http_requests_total{route="POST /v1/sandboxes/{id}/exec",code="200"}`: 1,
		`pandastack_http_requests_total{route="GET /v1/sandboxes/{id}",code="404"}`:       1,
		`pandastack_http_requests_total{route="DELETE /v1/sandboxes/{id}",code="204"}`:    4,
		`pandastack_api_errors_total{code="not_found"}`:                                   1,
	} {
		if got := m[series]; got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	var creates float64
	for series, v := range m {
		if strings.HasPrefix(series, "pandastack_sandbox_creates_total{") {
			creates += v
		}
	}
	if creates != 2 {
		t.Errorf("creates by source add up to %v, want 2 (the create and the restore; the fork's children are the fork's)", creates)
	}
	if m["process_open_fds"] <= 0 || m["go_goroutines"] <= 0 {
		t.Errorf("process series missing: fds %v goroutines %v", m["process_open_fds"], m["go_goroutines"])
	}

	// The metrics address serves nothing else, and the API does not serve
	// the metrics.
	for _, u := range []string{url + "/v1/sandboxes", s.url + "/metrics"} {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound && resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s: %d, want 404 (or the API's 401)", u, resp.StatusCode)
		}
	}
}

// sampleLine is one sample of the text format: a name, labels, a value.
var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*",?)*\})? (\S+)$`)

// scrapeMetrics reads GET /metrics, checks every line is a comment or a
// well-formed sample of a family its # TYPE line declared, and returns the
// samples by their series (name and labels as written).
func scrapeMetrics(t *testing.T, url string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4") {
		t.Fatalf("GET /metrics: %d %q\n%s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	typed := map[string]string{}
	out := map[string]float64{}
	for _, l := range strings.Split(strings.TrimSuffix(string(body), "\n"), "\n") {
		if f, ok := strings.CutPrefix(l, "# TYPE "); ok {
			name, typ, _ := strings.Cut(f, " ")
			typed[name] = typ
			continue
		}
		if strings.HasPrefix(l, "# HELP ") {
			continue
		}
		g := sampleLine.FindStringSubmatch(l)
		if g == nil {
			t.Fatalf("not a sample line: %q", l)
		}
		family := g[1]
		if typed[family] == "" {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(family, suffix); ok && typed[base] == "histogram" {
					family = base
				}
			}
		}
		if typed[family] == "" {
			t.Fatalf("sample of an undeclared family: %q", l)
		}
		v, err := strconv.ParseFloat(g[3], 64)
		if err != nil {
			t.Fatalf("value of %q: %v", l, err)
		}
		out[g[1]+g[2]] = v
	}
	return out
}
