package pandastack

import (
	"context"
	"time"
)

// NodeState says whether a node is taking part.
type NodeState string

const (
	NodeUp   NodeState = "up"   // it heartbeats
	NodeLost NodeState = "lost" // it missed its heartbeats for the grace period; its sandboxes were stopped as lost
)

// Node is one `serve` process sharing a store with others: its identity,
// where the others reach it, and the capacity it last reported.
type Node struct {
	ID          string    `json:"id"`
	URL         string    `json:"url"` // its advertised base URL, e.g. http://10.0.0.5:8080
	State       NodeState `json:"state"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	CPUs        int       `json:"cpus"`      // CPUs it offers to sandboxes
	MemoryMB    int       `json:"memory_mb"` // memory it offers to sandboxes, in MiB
	// FreeMemoryMB is the host's available memory at the heartbeat, less
	// the reserve the node keeps (serve --memory-reserve-mb): what creates
	// may take there. Placement skips a node with less than a create asks
	// for.
	FreeMemoryMB int `json:"free_memory_mb"`
	// Pool counts the ready pre-restored sandboxes of each template.
	Pool map[string]int `json:"pool,omitempty"`
}

// Placement is what a create needs of a node.
type Placement struct {
	Template string
	CPU      int
	MemoryMB int
	// Since: only nodes that heartbeat at or after it are candidates.
	Since time.Time
	At    time.Time // recorded as the chosen node's last placement
}

// NodeStore keeps the nodes sharing a store. Both stores implement it; on
// SQLite there is only ever the one node of the process that owns the file.
// Errors follow Store's rules.
type NodeStore interface {
	// Heartbeat records n (inserting it the first time) as up at
	// n.HeartbeatAt, with the capacity it reports. It returns the state
	// it replaced: NodeUp, NodeLost, or "" when there was no record (the
	// first heartbeat, or the node was forgotten since). That state is
	// read under the record's lock in the write's transaction, so a
	// LoseNodes or ForgetNode of the node either shows in it or comes
	// after the write: a node never makes itself up over a "lost" it is
	// not told of.
	Heartbeat(ctx context.Context, n Node) (was NodeState, err error)
	// ListNodes returns every node, lost ones included, by id.
	ListNodes(ctx context.Context) ([]Node, error)
	// PlaceSandbox picks the node for a new sandbox among those up since
	// p.Since with at least p.MemoryMB free: one with a ready pool of
	// p.Template first, then the most memory not committed to its
	// starting and running sandboxes, then the most CPUs likewise, then
	// the one placed on longest ago. The choice is made under a row lock
	// (PostgreSQL: FOR UPDATE SKIP LOCKED, then FOR UPDATE when every
	// candidate is locked), so concurrent placements pick different nodes
	// where they can and wait only when they must. EUnavailable when no
	// node fits.
	PlaceSandbox(ctx context.Context, p Placement) (Node, error)
	// LoseNodes marks every node still up whose last heartbeat is before
	// before as lost, and records each of its sandboxes that is starting
	// or running as stopped at at with StopLost, in one transaction; its
	// paused sandboxes stay paused (their image is on the node's disk,
	// back with the node). It returns the ids of the nodes it marked.
	LoseNodes(ctx context.Context, before, at time.Time) ([]string, error)
	// ClaimSandboxesOfNoNode records node as the node of every sandbox
	// of no node (records made before nodes existed), whatever its state,
	// and returns how many. A node calls it as it starts, before its
	// recovery: the first node to start on a store takes them all, and
	// two starting at once do not share them (one waits for the other,
	// then finds none). The rest find none and leave them to it.
	ClaimSandboxesOfNoNode(ctx context.Context, node string) (int, error)
	// ForgetNode removes a lost node (a host retired for good) and records
	// each of its sandboxes still paused, whose images were on its disk,
	// as stopped at at with StopLost, in one transaction; it returns how
	// many. ENotFound for no such node; EConflict for a node that is up.
	ForgetNode(ctx context.Context, id string, at time.Time) (int, error)
}
