package main

import (
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

func TestPrintNodes(t *testing.T) {
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	var b strings.Builder
	printNodes(&b, []pandastack.Node{
		{ID: "node-a", URL: "http://10.0.0.5:8080", State: pandastack.NodeUp, HeartbeatAt: now.Add(-1500 * time.Millisecond), CPUs: 2, MemoryMB: 20000, FreeMemoryMB: 15000, Pool: map[string]int{"code-interpreter": 2, "base": 1}},
		{ID: "node-\x1b[2J", State: pandastack.NodeLost, HeartbeatAt: now.Add(-time.Hour)},
	}, now)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "ID ") {
		t.Fatalf("table:\n%s", b.String())
	}
	for _, want := range []string{"node-a", "up", "http://10.0.0.5:8080", "2s ago", "20000 MB", "15000 MB", "base=1,code-interpreter=2"} {
		if !strings.Contains(lines[1], want) {
			t.Errorf("row %q lacks %q", lines[1], want)
		}
	}
	if strings.Contains(lines[2], "\x1b") || !strings.Contains(lines[2], "lost") || !strings.Contains(lines[2], "1h0m0s ago") {
		t.Errorf("lost row %q", lines[2])
	}
}
