package network

import (
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

// list returns the entries oldest first.
func (l *egressLog) list() []pandastack.EgressEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]pandastack.EgressEntry, 0, len(l.entries))
	out = append(out, l.entries[l.next:]...)
	return append(out, l.entries[:l.next]...)
}
