package network

import (
	"slices"
	"sync"

	"github.com/pandastack/pandastack"
)

// MaxLogEntries bounds each of a sandbox's three egress logs, its DNS
// answers, its connections and its refused attempts; the newest of each
// are kept. Apart, so that code in the sandbox cannot push its
// connections out of the log by asking for names (1100 queries did it in
// 2.7 s when they shared one ring) or by knocking on closed doors.
const MaxLogEntries = 1000

// egressLog holds a sandbox's newest egress entries.
type egressLog struct {
	mu                  sync.Mutex
	dns, conns, refused ring
}

// ring is the newest MaxLogEntries entries of one kind.
type ring struct {
	entries []pandastack.EgressEntry
	next    int // where the next entry goes once the ring is full
}

func (r *ring) add(e pandastack.EgressEntry) {
	if len(r.entries) < MaxLogEntries {
		r.entries = append(r.entries, e)
		return
	}
	r.entries[r.next] = e
	r.next = (r.next + 1) % MaxLogEntries
}

func (l *egressLog) add(e pandastack.EgressEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case e.Kind == "dns":
		l.dns.add(e)
	case e.Allowed:
		l.conns.add(e)
	default:
		l.refused.add(e)
	}
}

// list returns the entries oldest first, by their time: a connection is
// logged when it ends, with the time it began, so the rings hold them in
// the order they ended.
func (l *egressLog) list() []pandastack.EgressEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]pandastack.EgressEntry, 0, len(l.dns.entries)+len(l.conns.entries)+len(l.refused.entries))
	for _, r := range []*ring{&l.dns, &l.conns, &l.refused} {
		out = append(out, r.entries[r.next:]...)
		out = append(out, r.entries[:r.next]...)
	}
	slices.SortStableFunc(out, func(a, b pandastack.EgressEntry) int { return a.Time.Compare(b.Time) })
	return out
}
