package network

import (
	"testing"

	"github.com/pandastack/pandastack"
)

func TestEgressLogKeepsNewest(t *testing.T) {
	var l egressLog
	for i := range MaxLogEntries + 5 {
		l.add(pandastack.EgressEntry{Port: i})
	}
	got := l.list()
	if len(got) != MaxLogEntries || got[0].Port != 5 || got[len(got)-1].Port != MaxLogEntries+4 {
		t.Fatalf("ring of %d: first %d, last %d", len(got), got[0].Port, got[len(got)-1].Port)
	}
}
