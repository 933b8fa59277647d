package sandbox

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Each sandbox restored from a warm image hands its spare kernel out on its
// first context, and its agent then starts a replacement: a kernel's start
// and the template's imports, 3-4 s of CPU. In a burst of creates, or the
// children of a fork, every sandbox did that about 2 s after its first
// cell, beside the restores and first cells of the sandboxes still coming:
// measured, a burst of 20 with agents that waited 60 s before a refill
// gave each create its first result in 5.1-7.3 s p50 where ours took
// 7.0-25.5 s (bench/results/2026-12-02-vm-burst-*refill60*.json). So the
// manager paces the refills: a create's or a resume's hello holds the
// agent's refills (hold_spares=1), and the pacer ends those holds one
// sandbox at a time, oldest first, once the host is quiet (quietForRefills),
// refillSpacing apart. A hold older than refillMaxHold ends anyway, so a
// host that never quiets down still gets its spares.
const (
	refillMaxHold = time.Minute
	// Quiet: no create under way or ended within refillCalm (a burst's
	// sandboxes run their first cells after their creates return), and a
	// CPU idle over refillLook (a refill takes one).
	refillCalm     = 3 * time.Second
	refillHostIdle = 1.0
)

// Variables for the tests.
var (
	refillSpacing = 3 * time.Second
	refillLook    = 500 * time.Millisecond
)

// refillHolds are the sandboxes whose spare refills wait for the pacer.
type refillHolds struct {
	mu    sync.Mutex
	held  []refillHold // oldest first
	kick  chan struct{}
	start sync.Once
}

type refillHold struct {
	id    string
	c     *AgentClient
	since time.Time
}

// pacesRefills reports whether hellos hold the spares' refills for the
// pacer.
func (m *Manager) pacesRefills() bool { return !m.cfg.UnpacedRefills }

// holdRefills hands the pacer the hold of a sandbox just started with c,
// if c's hello took one.
func (m *Manager) holdRefills(id string, c *AgentClient) {
	if c.heldSpares {
		m.paceHold(id, c, m.now())
	}
}

// paceHold hands the pacer a hold of the spares of sandbox id, taken
// through c at since (a hello's, or a fork's of its parent, whose hold
// is older than its children's), for it to end in its turn: the holds
// are kept oldest first.
func (m *Manager) paceHold(id string, c *AgentClient, since time.Time) {
	r := &m.refills
	r.mu.Lock()
	i := len(r.held)
	for i > 0 && r.held[i-1].since.After(since) {
		i--
	}
	r.held = slices.Insert(r.held, i, refillHold{id: id, c: c, since: since})
	if r.kick == nil {
		r.kick = make(chan struct{}, 1)
	}
	select {
	case r.kick <- struct{}{}:
	default:
	}
	r.mu.Unlock()
	r.start.Do(func() {
		m.goBackground(func() {
			ctx, cancel := m.untilClose()
			defer cancel()
			m.paceRefills(ctx)
		})
	})
}

// paceRefills ends the holds, one per turn: it waits for a hold, for the
// host to be quiet (or the oldest hold to reach refillMaxHold), ends the
// oldest hold of a sandbox still running on its session, then waits
// refillSpacing: the agent begins the refill 2 s after the hold ends.
func (m *Manager) paceRefills(ctx context.Context) {
	r := &m.refills
	for {
		r.mu.Lock()
		n, kick := len(r.held), r.kick
		var oldest time.Time
		if n > 0 {
			oldest = r.held[0].since
		}
		r.mu.Unlock()
		if n == 0 {
			select {
			case <-ctx.Done():
				return
			case <-kick:
				continue
			}
		}
		if m.quietForRefills(ctx, oldest) != nil {
			return
		}
		if h, ok := m.nextRefill(); ok {
			uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := h.c.UnholdSpares(uctx)
			if err != nil && ctx.Err() == nil {
				m.log.Debug("ending the hold of a sandbox's spare refills", "sandbox", h.id, "err", err)
			} else if err == nil {
				m.log.Debug("spare refills may start", "sandbox", h.id, "held_ms", m.now().Sub(h.since).Milliseconds())
			}
			cancel()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(refillSpacing):
		}
	}
}

// quietForRefills waits until the host is quiet for a refill (see
// refillCalm), or a hold taken at oldest reaches refillMaxHold, or ctx
// ends (its error).
func (m *Manager) quietForRefills(ctx context.Context, oldest time.Time) error {
	for {
		if m.now().Sub(oldest) >= refillMaxHold {
			return nil
		}
		calm := m.now().Sub(time.Unix(0, m.lastCreate.Load())) >= refillCalm
		if m.creates.Load() == 0 && calm {
			idle, err := m.idleCPUs(ctx, refillLook)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// (Unmeasurable: do not hold the refills back on it.)
			if (err != nil || idle >= refillHostIdle) && m.creates.Load() == 0 {
				return nil
			}
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(refillLook):
		}
	}
}

// nextRefill takes the oldest hold whose sandbox runs on the session that
// took it. Holds whose session closed (the sandbox stopped or suspended; a
// resume's hello ends the hold anyway) are dropped; one of a sandbox in
// another phase for now (a snapshot's checkpoint) waits for a later turn.
func (m *Manager) nextRefill() (refillHold, bool) {
	r := &m.refills
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := 0; i < len(r.held); {
		h := r.held[i]
		switch {
		case h.c.sess.IsClosed():
			r.held = append(r.held[:i], r.held[i+1:]...)
		case m.sbx.client(h.id) == h.c:
			r.held = append(r.held[:i], r.held[i+1:]...)
			return h, true
		default:
			i++
		}
	}
	return refillHold{}, false
}
