package sandbox

import (
	"context"
	"maps"
	"os"
	"path/filepath"
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
	ready chan pooled
	kick  chan struct{}
	mu    sync.Mutex
	ids   map[string]bool // the ready sandboxes, for stats

	filling atomic.Bool  // a restore for the pool is under way
	waiting atomic.Int32 // creates waiting for that restore
}

// PoolStats describes a template's pool for GET /v1/templates.
type PoolStats struct {
	Ready    int   `json:"ready"`
	Size     int   `json:"size"`
	PSSBytes int64 `json:"pss_bytes"` // host memory the ready sandboxes hold
}

// EnablePool keeps size sandboxes of tpl (which must have a WarmImage)
// restored and waiting. Call after Start.
func (m *Manager) EnablePool(tpl Template, size int) {
	if size <= 0 || tpl.WarmImage == "" {
		return
	}
	p := &pool{tpl: tpl, ready: make(chan pooled, size), kick: make(chan struct{}, 1), ids: map[string]bool{}}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped() {
		return // after Close nothing may fill a pool: its sandboxes would leak
	}
	if m.pools == nil {
		m.pools = map[string]*pool{}
	}
	if _, ok := m.pools[tpl.Name]; ok {
		return
	}
	m.pools[tpl.Name] = p
	m.wg.Add(1)
	go m.fill(p)
}

// fill restores sandboxes into the pool until it is full, again after every
// claim, until the manager closes.
func (m *Manager) fill(p *pool) {
	defer m.wg.Done()
	for {
		for len(p.ready) < cap(p.ready) {
			select {
			case <-m.stop:
				return
			default:
			}
			p.filling.Store(true)
			pd, err := m.restoreForPool(p.tpl)
			p.filling.Store(false)
			if err != nil {
				m.log.Warn("pool restore failed; retrying in 5 s", "template", p.tpl.Name, "err", err)
				select {
				case <-m.stop:
					return
				case <-time.After(5 * time.Second):
				}
				continue
			}
			p.mu.Lock()
			p.ids[pd.id] = true
			p.mu.Unlock()
			p.ready <- pd
		}
		select {
		case <-m.stop:
			return
		case <-p.kick:
		}
	}
}

func (m *Manager) restoreForPool(tpl Template) (pooled, error) {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.StartTimeout)
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
	client, err := dialAgent(ctx, id, rwc, true)
	if err == nil {
		err = m.setupSandbox(ctx, client)
	}
	if err == nil {
		// A no-op in the warm kernels pulls their pages in, so the user's
		// first cell does not pay for the lazy restore.
		err = client.TouchSpares(ctx)
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
	var pd pooled
	select {
	case pd = <-pl.ready:
	default:
		// Empty, but a restore for the pool is under way: for one create,
		// waiting for it beats a restore of its own competing with it for
		// the CPU. In a burst the others restore their own at once.
		if !pl.filling.Load() {
			return pooled{}, false
		}
		if pl.waiting.Add(1) > 1 {
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
	select {
	case pl.kick <- struct{}{}:
	default:
	}
	if !pd.client.Alive() || !m.rt.Alive(pd.id) {
		pd.client.Close()
		m.rt.Stop(context.Background(), pd.id)
		return pooled{}, false
	}
	return pd, true
}

// drainPools stops the sandboxes waiting in pools; Close calls it.
func (m *Manager) drainPools() {
	m.mu.Lock()
	pools := m.pools
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, pl := range pools {
		for {
			select {
			case pd := <-pl.ready:
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
	}
	wg.Wait()
}

// Pools reports every pool's state, with the host memory it holds.
func (m *Manager) Pools(ctx context.Context) map[string]PoolStats {
	m.mu.Lock()
	pools := maps.Clone(m.pools)
	m.mu.Unlock()
	out := map[string]PoolStats{}
	for name, pl := range pools {
		st := PoolStats{Size: cap(pl.ready)}
		pl.mu.Lock()
		ids := slices.Collect(maps.Keys(pl.ids))
		pl.mu.Unlock()
		for _, id := range ids {
			if rs, err := m.rt.Stats(ctx, id); err == nil {
				st.Ready++
				st.PSSBytes += rs.PSSBytes
			}
		}
		out[name] = st
	}
	return out
}
