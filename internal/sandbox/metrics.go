package sandbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/metrics"
)

// managerMetrics are the manager's series (docs/deploy.md, "Monitoring").
type managerMetrics struct {
	ops     *metrics.Counter   // operation, outcome: "ok" or the error's code
	seconds *metrics.Histogram // operation: how long the successful ones took
	creates *metrics.Counter   // source: how a create got its sandbox
	stops   *metrics.Counter   // reason: a Stop* reason
}

// Operations counted, as the operation label says them.
const (
	opCreate  = "create"  // POST /v1/sandboxes from a template
	opRestore = "restore" // POST /v1/sandboxes with a snapshot_id
	opFork    = "fork"
	opSnap    = "snapshot"
	opPause   = "pause"
	opResume  = "resume"         // asked for
	opWake    = "wake"           // a request to a suspended sandbox (or one with auto_resume)
	opSuspend = "suspend"        // paused for idleness
	opMemory  = "suspend_memory" // paused for the host's memory (pressure.go)
	opKill    = "kill"
)

// Sources of a create's sandbox, as the source label says them.
const (
	sourcePool     = "pool"     // handed out ready from the pool
	sourcePrepared = "prepared" // restored into a container prepared ahead
	sourceRestore  = "restore"  // restored from an image (the template's warm one, or a snapshot)
	sourceBoot     = "boot"     // booted cold
)

// storeScrapeTimeout bounds the store's count of sandboxes at a scrape.
const storeScrapeTimeout = 2 * time.Second

// sandboxCountEvery is how often a scrape counts the sandboxes in the store:
// scrapes sooner after one give its count (the metrics listener takes no
// key, so whoever reaches it must not drive the store). A variable for
// tests.
var sandboxCountEvery = 250 * time.Millisecond

// useMetrics registers the manager's series in r.
func (m *Manager) useMetrics(r *metrics.Registry) {
	m.metrics = managerMetrics{
		ops: r.NewCounter("pandastack_sandbox_operations_total",
			"Sandbox operations this node ran for users (its own warm-ups aside), by operation and outcome (ok, or the error code the caller got).", "operation", "outcome"),
		seconds: r.NewHistogram("pandastack_sandbox_operation_duration_seconds",
			"How long the successful sandbox operations took on this node, from the request to the answer.", metrics.DurationBuckets, "operation"),
		creates: r.NewCounter("pandastack_sandbox_creates_total",
			"Sandboxes this node created (from templates and snapshots, forks' children excluded), by how: pool, prepared, restore or boot.", "source"),
		stops: r.NewCounter("pandastack_sandbox_stops_total",
			"Users' sandboxes this node stopped, by reason (the stop_reason users see).", "reason"),
	}
	var counted struct {
		sync.Mutex
		at time.Time
		n  map[pandastack.SandboxState]int
	}
	r.NewGauge("pandastack_sandboxes", "Sandboxes of this node by state (the store's records: pool sandboxes count once handed out; the server's own warm-up sandboxes never).", []string{"state"}, func(emit func(float64, ...string)) {
		counted.Lock()
		defer counted.Unlock()
		if time.Since(counted.at) >= sandboxCountEvery { // scrapes in a burst cost one count
			ctx, cancel := context.WithTimeout(context.Background(), storeScrapeTimeout)
			defer cancel()
			recs, err := m.store.ListSandboxes(ctx, pandastack.SandboxFilter{Node: m.cfg.Node.ID, States: []pandastack.SandboxState{pandastack.StateStarting, pandastack.StateRunning, pandastack.StatePaused}})
			if err != nil {
				m.log.Warn("metrics: counting sandboxes", "err", err)
				return
			}
			counted.at, counted.n = time.Now(), map[pandastack.SandboxState]int{}
			for _, sb := range recs {
				if sb.ProjectID != warmProject {
					counted.n[sb.State]++
				}
			}
		}
		for _, st := range []pandastack.SandboxState{pandastack.StateStarting, pandastack.StateRunning, pandastack.StatePaused} {
			emit(float64(counted.n[st]), string(st))
		}
	})
	r.NewGauge("pandastack_pool_ready", "Sandboxes restored and waiting in each template's pool.", []string{"template"}, func(emit func(float64, ...string)) {
		for name, st := range m.poolCounts() {
			emit(float64(st.Ready), name)
		}
	})
	r.NewGauge("pandastack_pool_size", "How many sandboxes each template's pool keeps ready now (it follows demand with --pool-memory-mb).", []string{"template"}, func(emit func(float64, ...string)) {
		for name, st := range m.poolCounts() {
			emit(float64(st.Size), name)
		}
	})
	r.NewGauge("pandastack_creates_waiting", "Creates waiting in line for a free restore slot (--max-restores).", nil, func(emit func(float64, ...string)) {
		emit(float64(m.admit.waiting()))
	})
}

// observe counts an operation that started at start and ended with *err.
// For a defer: defer m.observe(opCreate, time.Now(), &err).
func (m *Manager) observe(op string, start time.Time, err *error) {
	if m.metrics.ops == nil {
		return
	}
	if *err != nil {
		m.metrics.ops.Inc(op, pandastack.ErrorCode(m.classify(*err)))
		return
	}
	m.metrics.ops.Inc(op, "ok")
	m.metrics.seconds.Observe(time.Since(start).Seconds(), op)
}

// classify gives a failure without a code the one the store finds for it
// (pandastack.StoreErrors), as the API does before it answers: the
// outcome is the code the caller got.
func (m *Manager) classify(err error) error {
	var e *pandastack.Error
	if errors.As(err, &e) {
		return err
	}
	if se, ok := m.store.(pandastack.StoreErrors); ok {
		return se.ClassifyError(err)
	}
	return err
}

// countCreate counts a create's sandbox by how it came to be.
func (m *Manager) countCreate(p plan) {
	if m.metrics.creates == nil {
		return
	}
	switch {
	case p.pooled:
		m.metrics.creates.Inc(sourcePool)
	case p.prepared:
		m.metrics.creates.Inc(sourcePrepared)
	case p.image != "":
		m.metrics.creates.Inc(sourceRestore)
	default:
		m.metrics.creates.Inc(sourceBoot)
	}
}

// recordStop records a sandbox stopped for reason in the store, and counts it.
func (m *Manager) recordStop(ctx context.Context, id, reason string) error {
	if m.metrics.stops != nil {
		m.metrics.stops.Inc(reason)
	}
	return m.store.SetSandboxState(ctx, id, pandastack.StateStopped, reason, m.now())
}
