package network

import (
	"slices"
	"sync"

	"github.com/pandastack/pandastack"
)

// MaxLogEntries bounds each sandbox's egress log; the newest are kept.
const MaxLogEntries = 1000

// egressLog is a ring of a sandbox's newest egress entries.
type egressLog struct {
	mu      sync.Mutex
	entries []pandastack.EgressEntry
	next    int // where the next entry goes once the ring is full
}

func (l *egressLog) add(e pandastack.EgressEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.entries) < MaxLogEntries {
		l.entries = append(l.entries, e)
		return
	}
	l.entries[l.next] = e
	l.next = (l.next + 1) % MaxLogEntries
}

// list returns the entries oldest first, by their time: a connection is
// logged when it ends, with the time it began, so the ring holds them in
// the order they ended.
func (l *egressLog) list() []pandastack.EgressEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]pandastack.EgressEntry, 0, len(l.entries))
	out = append(out, l.entries[l.next:]...)
	out = append(out, l.entries[:l.next]...)
	slices.SortStableFunc(out, func(a, b pandastack.EgressEntry) int { return a.Time.Compare(b.Time) })
	return out
}
