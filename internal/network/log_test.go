package network

import (
	"net/netip"
	"strings"
	"testing"
	"time"

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

// A flood of DNS answers does not push connections out of the log, nor
// the other way round: each kind keeps its newest MaxLogEntries.
func TestEgressLogKindsApart(t *testing.T) {
	var l egressLog
	t0 := time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC)
	l.add(pandastack.EgressEntry{Kind: "tcp", Port: 8080, Allowed: true, Time: t0})
	for i := range 2 * MaxLogEntries {
		l.add(pandastack.EgressEntry{Kind: "dns", Time: t0.Add(time.Duration(i+1) * time.Millisecond)})
	}
	for i := range 2 * MaxLogEntries {
		l.add(pandastack.EgressEntry{Kind: "tcp", Port: 22, Allowed: false, Time: t0.Add(time.Duration(i+1) * time.Millisecond)})
	}
	got := l.list()
	if len(got) != 2*MaxLogEntries+1 || got[0].Kind != "tcp" || got[0].Port != 8080 {
		t.Fatalf("after floods of names and refused connects: %d entries, first %+v", len(got), got[0])
	}
}

// A connection is logged when it ends, with the time it began: the list
// is by time all the same.
func TestEgressLogOldestFirst(t *testing.T) {
	var l egressLog
	t0 := time.Date(2026, 12, 3, 7, 0, 0, 0, time.UTC)
	l.add(pandastack.EgressEntry{Kind: "dns", Time: t0.Add(2 * time.Second)})
	l.add(pandastack.EgressEntry{Kind: "tcp", Time: t0}) // began first, ended last
	l.add(pandastack.EgressEntry{Kind: "udp", Time: t0.Add(3 * time.Second)})
	var kinds []string
	for _, e := range l.list() {
		kinds = append(kinds, e.Kind)
	}
	if strings.Join(kinds, " ") != "tcp dns udp" {
		t.Fatalf("order %v", kinds)
	}
}

func TestResolverMemoryBounded(t *testing.T) {
	var s sandboxNet
	for i := range 3 * maxNames {
		s.remember(netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), "n.test")
	}
	n := 0
	s.names.Range(func(any, any) bool { n++; return true })
	if n == 0 || n > maxNames {
		t.Errorf("%d names remembered after %d answers, want 1..%d", n, 3*maxNames, maxNames)
	}
	k := 3*maxNames - 1
	last := netip.AddrFrom4([4]byte{198, 18, byte(k >> 8), byte(k)})
	if s.nameOf(last) != "n.test" {
		t.Error("the newest answer is forgotten")
	}
}
