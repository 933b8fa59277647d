package sandbox

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pandastack/pandastack"
)

// A pool keeps a few sandboxes of a warm template restored ahead of time,
// with their default context already answering, so a create only has to
// claim one (a restore costs 0.3-0.5 s; a claim a few milliseconds). Pool
// sandboxes have their final ids from the start but no record until claimed;
// a server that dies leaves them as orphans, which the next start removes.

type pooled struct {
	id     string
	client *AgentClient
	image  string
}

type pool struct {
	tpl   Template
	ready chan pooled // capacity: poolCeiling
	kick  chan struct{}
	stop  chan struct{} // closed when the pool is retired (retireWarm)
	size  *poolSizer
	mu    sync.Mutex
	ids   map[string]bool // the ready sandboxes, for stats

	filling   atomic.Int32 // refills under way, in line for a slot or restoring
	restoring atomic.Int32 // of which restoring
	waiting   atomic.Int32 // creates waiting for one of those restoring
	started   []time.Time  // when each of those restoring began, oldest first (mu)
}

// restoreBegan and restoreEnded keep p.started.
func (p *pool) restoreBegan(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.started = append(p.started, t)
}

func (p *pool) restoreEnded(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if i := slices.Index(p.started, t); i >= 0 {
		p.started = slices.Delete(p.started, i, i+1)
	}
}

// ownRestoreWorth is what a create that restores its own sandbox costs
// more than one served from the pool: here 98-100 ms p50 to its first
// result against 13 (go run ./bench -quiet -only create: no pool, pool 2).
const ownRestoreWorth = 90 * time.Millisecond

// readySoon says whether the n-th oldest of the pool's restores under way
// (n from 1) should be ready within ownRestoreWorth, by the refill time
// measured so far (unknown: yes). A create waits only for one of those:
// back to back, creates that waited for refills just begun took 160-215
// ms to their sandbox, against 125-135 ms for those that restored their
// own beside them.
func (p *pool) readySoon(n int, now time.Time) bool {
	took := p.size.refillTime()
	if took == 0 {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n > len(p.started) {
		return false
	}
	return now.Sub(p.started[n-1])+ownRestoreWorth >= took
}

// poolCeiling bounds a pool whatever its memory budget.
const poolCeiling = 64

// maxRefills bounds a pool's refills under way: one per CPU, so that a
// pool falling short by many after a burst does not restore them all at
// once beside the burst's first cells.
var maxRefills = runtime.NumCPU()

// poolTick is how often a pool looks at its target without a claim (it
// shrinks as the demand it saw fades).
const poolTick = 5 * time.Second

// PoolStats describes a template's pool for GET /v1/templates.
type PoolStats struct {
	Ready    int   `json:"ready"`
	Size     int   `json:"size"`      // the number it keeps ready now (adaptive with Config.PoolMemoryMB)
	PSSBytes int64 `json:"pss_bytes"` // host memory the ready sandboxes hold
}

// EnablePool keeps size sandboxes of tpl (which must have a WarmImage)
// restored and waiting, more while creates come faster if
// Config.PoolMemoryMB gives a budget (poolSizer). Call after Start.
func (m *Manager) EnablePool(tpl Template, size int) {
	if size <= 0 || tpl.WarmImage == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped() {
		return // after Close nothing may fill a pool: its sandboxes would leak
	}
	if m.pools == nil {
		m.pools = map[string]*pool{}
	}
	if _, ok := m.pools[tpl.Name]; ok || !m.isWarmNowLocked(tpl) {
		return // a pool of it already, or its template has a newer image
	}
	// The budget is shared by the pools alike; warm templates are few.
	budget := float64(m.cfg.PoolMemoryMB) / float64(len(m.pools)+1)
	for _, pl := range m.pools {
		pl.size.mu.Lock()
		pl.size.budgetMiB = budget
		pl.size.mu.Unlock()
	}
	p := &pool{tpl: tpl, ready: make(chan pooled, max(poolCeiling, size)), kick: make(chan struct{}, 1), stop: make(chan struct{}), ids: map[string]bool{},
		size: newPoolSizer(size, poolCeiling, budget)}
	m.pools[tpl.Name] = p
	m.wg.Add(1)
	go m.fill(p)
}

// fill keeps the pool at its target until the manager closes: it starts
// restores (at most maxRefills at once, each in a background slot of the
// admission line, so never ahead of a waiting create) while ready and
// under way fall short, and stops surplus sandboxes once the target
// shrinks. It acts on every claim, every finished refill and every
// poolTick.
func (m *Manager) fill(p *pool) {
	defer m.wg.Done()
	ctx, cancel := m.untilClose()
	defer cancel()
	go func() {
		select {
		case <-p.stop: // retired: it ends, and what it holds is stopped
			cancel()
		case <-ctx.Done():
		}
	}()
	defer m.drain(p) // after its refills: what they restored goes too
	var refills sync.WaitGroup
	defer refills.Wait() // before the pool is drained
	failed := make(chan struct{}, 1)
	t := time.NewTicker(poolTick)
	defer t.Stop()
	for {
		target := m.poolTarget(p)
		for int(p.filling.Load())+len(p.ready) < target && int(p.filling.Load()) < maxRefills {
			p.filling.Add(1)
			refills.Add(1)
			go func() {
				defer refills.Done()
				ok := m.refill(ctx, p)
				p.filling.Add(-1) // before the kick, which looks at it
				if !ok {
					select {
					case failed <- struct{}{}:
					default:
					}
					return
				}
				select {
				case p.kick <- struct{}{}:
				default:
				}
			}()
		}
		if surplus := len(p.ready) + int(p.filling.Load()) - target; surplus > 0 {
			m.shrink(p, min(surplus, len(p.ready)))
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-t.C:
			m.pruneDead(p)
		case <-failed:
			m.log.Warn("pool restore failed; retrying in 5 s", "template", p.tpl.Name)
			select {
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Second):
			}
		}
	}
}

// Refills yield to creates (yieldToCreates): they start once no create
// is under way and the host has refillIdleCPUs to spare over a
// refillSample, or once no create has ended for refillQuiet (a host busy
// with other work still gets its pool back, later).
const (
	refillIdleCPUs = 0.5
	refillSample   = 200 * time.Millisecond
	refillQuiet    = 5 * time.Second
)

// yieldToCreates waits until a refill may take the CPU, or ctx ends. The
// admission line alone keeps refills behind creates that restore; but a
// burst's creates go on working after their restores (a lazily restored
// sandbox pulls its pages in on its first cell), and a refill restoring
// beside them, or one that slips in before their restores start, slows
// every one of them: measured, a burst of 20 with a pool was slower than
// without one.
func (m *Manager) yieldToCreates(ctx context.Context) error {
	for {
		if m.creates.Load() == 0 {
			// The count again after the clock: a create that began since
			// the first look is under way, whatever the clock says.
			if m.now().Sub(time.Unix(0, m.lastCreate.Load())) >= refillQuiet && m.creates.Load() == 0 {
				return nil
			}
			idle, err := m.idleCPUs(ctx, refillSample)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// (Unmeasurable: do not hold the pool back on it.)
			if (err != nil || idle >= refillIdleCPUs) && m.creates.Load() == 0 {
				return nil
			}
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(refillSample):
		}
	}
}

// refill restores one sandbox into the pool; false if that failed.
func (m *Manager) refill(ctx context.Context, p *pool) bool {
	asked := m.now()
	if err := m.yieldToCreates(ctx); err != nil {
		return true // shutting down
	}
	if !m.poolRoom(p) {
		return true // not now: the next look at the target keeps the pool as it is
	}
	release, err := m.admit.acquire(ctx, true)
	if err != nil {
		return true // shutting down
	}
	start := m.now()
	p.restoreBegan(start)
	p.restoring.Add(1)
	pd, err := m.restoreForPool(ctx, p.tpl)
	release()
	if err != nil {
		p.restoring.Add(-1)
		p.restoreEnded(start)
		if ctx.Err() != nil {
			return true // shutting down
		}
		m.log.Warn("pool restore", "template", p.tpl.Name, "err", err)
		return false
	}
	took := m.now().Sub(start)
	p.mu.Lock()
	p.ids[pd.id] = true
	p.mu.Unlock()
	p.ready <- pd       // never blocks: ready + filling stay within the target, at most its capacity
	p.restoring.Add(-1) // after the push: a create waiting for it finds it
	p.restoreEnded(start)
	// Measured after the push, which it would delay (smaps of each process).
	var pss int64
	if st, err := m.rt.Stats(context.Background(), pd.id); err == nil {
		pss = st.PSSBytes
	}
	p.size.refilled(took, pss)
	m.log.Debug("pool refilled", "template", p.tpl.Name, "sandbox", pd.id, "line_ms", msSince(asked, start), "restore_ms", msSince(start, start.Add(took)))
	return true
}

// pruneDead stops the ready sandboxes of p that died while they waited
// (the host's OOM killer, a crash): nothing else looks at them before a
// create claims one, so the pool counted them ready and did not refill,
// and their container, cgroup and namespace stayed. The living go back.
func (m *Manager) pruneDead(p *pool) {
	var alive, dead []pooled
	for range len(p.ready) {
		var pd pooled
		select {
		case pd = <-p.ready:
		default:
		}
		if pd.id == "" {
			break // claimed meanwhile
		}
		if pd.client.Alive() && m.rt.Alive(pd.id) {
			alive = append(alive, pd)
		} else {
			dead = append(dead, pd)
		}
	}
	for _, pd := range alive {
		p.ready <- pd // never blocks: they were in it, and refills stay within the target
	}
	for _, pd := range dead { // after: creates find the living meanwhile
		m.log.Warn("a pool sandbox died while it waited; replacing it", "template", p.tpl.Name, "sandbox", pd.id)
		p.mu.Lock()
		delete(p.ids, pd.id)
		p.mu.Unlock()
		pd.client.Close()
		m.rt.Stop(context.Background(), pd.id)
	}
}

// shrink stops n ready sandboxes of the pool.
func (m *Manager) shrink(p *pool, n int) {
	for range n {
		select {
		case pd := <-p.ready:
			p.mu.Lock()
			delete(p.ids, pd.id)
			p.mu.Unlock()
			pd.client.Close()
			m.rt.Stop(context.Background(), pd.id)
		default:
			return
		}
	}
}

// restoreForPool restores a ready sandbox of tpl for the pool. ctx is the
// pool's, which Close cancels: a shutdown cuts a refill short (what it
// started is removed) rather than wait for it.
func (m *Manager) restoreForPool(ctx context.Context, tpl Template) (pooled, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.StartTimeout)
	defer cancel()
	if _, err := os.Stat(tpl.WarmImage); err != nil {
		return pooled{}, err
	}
	id := pandastack.NewID("sbx")
	image := filepath.Join(tpl.WarmImage, "image")
	rwc, err := m.rt.Restore(ctx, pandastack.RuntimeSpec{
		ID: id, RootFS: tpl.RootFS, Env: []string{"PANDASTACK_SANDBOX_ID=" + id},
		CPU: tpl.CPU, MemoryMB: tpl.MemoryMB, PIDs: m.cfg.PIDsLimit,
	}, image)
	if err != nil {
		return pooled{}, err
	}
	// Watched (dialAndSetup): a refill whose sandbox dies on its way up
	// ends then, not at the hello's timeout.
	client, err := m.dialAndSetup(ctx, id, rwc, hello{reseed: true}, nil, true)
	if err == nil {
		// A no-op in the warm kernels pulls their pages in, so the user's
		// first cell does not pay for the lazy restore.
		err = client.TouchSpares(ctx)
	}
	if err == nil && !m.rt.Alive(id) {
		// Also the claim's liveness check, done here: the first one of a
		// sandbox asks runsc (a process; 40-130 ms of a claim, measured).
		err = fmt.Errorf("pool sandbox %s died after its restore", id)
	}
	if err != nil {
		if client != nil {
			client.Close()
		}
		m.rt.Stop(context.Background(), id)
		return pooled{}, err
	}
	return pooled{id: id, client: client, image: image}, nil
}

// fromPool claims a ready sandbox of the plan's template, if the plan is a
// plain warm restore and one is waiting.
func (m *Manager) fromPool(p plan) (pooled, bool) {
	m.mu.Lock()
	pl := m.pools[p.template]
	m.mu.Unlock()
	if pl == nil || p.image != filepath.Join(pl.tpl.WarmImage, "image") || len(p.env) > 0 {
		return pooled{}, false
	}
	pl.size.arrive(m.now())
	defer func() {
		select {
		case pl.kick <- struct{}{}:
		default:
		}
	}()
	var pd pooled
	select {
	case pd = <-pl.ready:
	default:
		// Empty, but restores for the pool are under way: for a create,
		// waiting for one about to be ready beats a restore of its own
		// competing with it for the CPU. Creates beyond those restores
		// restore their own (refills still in line wait for creates: none
		// waits for them), and so do those that would wait longer than
		// their own restore takes (readySoon).
		if n := pl.waiting.Add(1); n > pl.restoring.Load() || !pl.readySoon(int(n), m.now()) {
			pl.waiting.Add(-1)
			return pooled{}, false
		}
		defer pl.waiting.Add(-1)
		select {
		case pd = <-pl.ready:
		case <-time.After(2 * time.Second):
			return pooled{}, false
		}
	}
	pl.mu.Lock()
	delete(pl.ids, pd.id)
	pl.mu.Unlock()
	if !pd.client.Alive() || !m.rt.Alive(pd.id) {
		pd.client.Close()
		m.rt.Stop(context.Background(), pd.id)
		return pooled{}, false
	}
	return pd, true
}

// drainPools stops the sandboxes waiting in pools and returns how many,
// and the memory they held as their pools measure it (MiB); Close calls
// it, and so does the relief of memory pressure (pressure.go).
func (m *Manager) drainPools() (n, mib int) {
	m.mu.Lock()
	pools := make([]*pool, 0, len(m.pools))
	for _, pl := range m.pools {
		pools = append(pools, pl)
	}
	m.mu.Unlock()
	for _, pl := range pools {
		k, km := m.drain(pl)
		n, mib = n+k, mib+km
	}
	return n, mib
}

// drain stops the sandboxes waiting in pl and returns how many, and the
// memory they held as pl measures it (MiB).
func (m *Manager) drain(pl *pool) (n, mib int) {
	var wg sync.WaitGroup
	for {
		select {
		case pd := <-pl.ready:
			pl.mu.Lock()
			delete(pl.ids, pd.id)
			pl.mu.Unlock()
			n++
			mib += pl.size.sandboxMiB()
			wg.Add(1)
			go func() {
				defer wg.Done()
				pd.client.Close()
				m.rt.Stop(context.Background(), pd.id)
			}()
			continue
		default:
		}
		break
	}
	wg.Wait()
	return n, mib
}

// poolMembers is one pool as it stands: its sandboxes and how many it
// keeps ready now.
type poolMembers struct {
	ids  []string
	size int
}

// poolsNow returns every pool's members, by template.
func (m *Manager) poolsNow() map[string]poolMembers {
	m.mu.Lock()
	pools := maps.Clone(m.pools)
	m.mu.Unlock()
	out := map[string]poolMembers{}
	for name, pl := range pools {
		pl.mu.Lock()
		ids := slices.Collect(maps.Keys(pl.ids))
		pl.mu.Unlock()
		out[name] = poolMembers{ids: ids, size: pl.size.target(m.now())}
	}
	return out
}

// Pools reports every pool's state, with the host memory it holds.
func (m *Manager) Pools(ctx context.Context) map[string]PoolStats {
	out := map[string]PoolStats{}
	for name, p := range m.poolsNow() {
		st := PoolStats{Size: p.size}
		for _, id := range p.ids {
			if rs, err := m.rt.Stats(ctx, id); err == nil {
				st.Ready++
				st.PSSBytes += rs.PSSBytes
			}
		}
		out[name] = st
	}
	return out
}

// poolCounts is Pools without the runtime's look at each sandbox (which
// reads the host's process table): what a scrape may afford.
func (m *Manager) poolCounts() map[string]PoolStats {
	out := map[string]PoolStats{}
	for name, p := range m.poolsNow() {
		out[name] = PoolStats{Ready: len(p.ids), Size: p.size}
	}
	return out
}
