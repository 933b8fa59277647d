package history

import (
	"slices"
	"sync"
	"time"
)

// Origin says where a sandbox came from.
type Origin struct {
	SandboxID string    `json:"sandbox_id"`
	Kind      string    `json:"kind"` // "snapshot": restored from a snapshot; "fork": forked from a sandbox
	From      string    `json:"from"` // the snapshot's or the parent sandbox's id
	At        time.Time `json:"at"`
}

// Lineage remembers the origins of sandboxes made from snapshots and forks,
// per project, the newest maxEntries of them. Safe for concurrent use.
type Lineage struct {
	mu         sync.Mutex
	maxEntries int
	byProject  map[string][]Origin
}

// NewLineage returns an empty lineage keeping at most maxEntries origins per
// project (10000 when maxEntries <= 0).
func NewLineage(maxEntries int) *Lineage {
	if maxEntries <= 0 {
		maxEntries = 10000
	}
	return &Lineage{maxEntries: maxEntries, byProject: map[string][]Origin{}}
}

// Add records o in the project.
func (l *Lineage) Add(projectID string, o Origin) {
	l.mu.Lock()
	defer l.mu.Unlock()
	list := append(l.byProject[projectID], o)
	if n := len(list) - l.maxEntries; n > 0 {
		list = slices.Delete(list, 0, n)
	}
	l.byProject[projectID] = list
}

// List returns the project's origins, oldest first.
func (l *Lineage) List(projectID string) []Origin {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := slices.Clone(l.byProject[projectID])
	if out == nil {
		out = []Origin{}
	}
	return out
}
