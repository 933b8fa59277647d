package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
)

// Idle suspend. A running sandbox is idle when, for its whole idle timeout,
//
//   - nothing was in flight in it (exec, run, upload, terminal; Acquire)
//     and nothing held it (proxied connections, output streams; Hold),
//   - no request used it (Agent, Acquire and Hold all count as use), and
//   - its processes used less than idleCPUShare of one CPU on average, so a
//     training loop or a server running in the background keeps it awake.
//
// The reaper then pauses it to disk with PauseIdle (phase suspending). The
// next request of any kind that needs the sandbox resumes it, and requests
// arriving meanwhile wait for that resume. Its TTL keeps counting while it
// is suspended; expiry deletes its image like any paused sandbox's.

// idleCPUShare is the CPU use (of one CPU) under which a sandbox counts as
// idle: an idle gVisor sandbox with a kernel waiting uses far less.
const idleCPUShare = 0.05

// idleState is an entry's account of its idleness; table.mu guards it.
type idleState struct {
	timeout  time.Duration // 0: never suspend
	lastUse  time.Time     // the last start or end of a use
	cpuAt    time.Time     // when cpuStart was read; zero: not yet in this quiet spell
	cpuStart int64         // the runtime's CPU time then, in ns
	// A suspend that failed (a full disk) is not tried again before
	// retryAt: each try writes the sandbox's memory out and throws it away.
	retryAt  time.Time
	failures int
	// CPU readings taken every pressureSample while nothing used it, the
	// newest last (pressure.go); a use drops them.
	samples []cpuSample
}

// Back-off of failed idle suspends: the first retry after a minute, each
// next one after twice as long, at most half an hour.
const (
	suspendRetryFirst = time.Minute
	suspendRetryMax   = 30 * time.Minute
)

// suspendFailed puts the next idle suspend of id off.
func (t *table) suspendFailed(id string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[id]
	if e == nil {
		return 0
	}
	s := &e.idle
	wait := suspendRetryFirst << min(s.failures, 5)
	wait = min(wait, suspendRetryMax)
	s.failures++
	s.retryAt = t.now().Add(wait)
	s.cpuAt = time.Time{}
	return wait
}

func (s *idleState) used(now time.Time) {
	s.lastUse = now
	s.cpuAt = time.Time{}
	s.samples = s.samples[:0]
}

// idleCheck is a sandbox the reaper must measure: to open its quiet spell
// (first) or to decide at its end.
type idleCheck struct {
	id    string
	first bool
}

// quietSoFar says whether e may be suspended as it stands: running, with
// an idle timeout, nothing in flight or held. t.mu is held.
func (e *entry) quietSoFar() bool {
	return e.phase == phaseRunning && e.idle.timeout > 0 && e.inflight == 0 && e.holds == 0
}

// idleDue lists the quiet sandboxes that need a CPU reading now.
func (t *table) idleDue() []idleCheck {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	var out []idleCheck
	for id, e := range t.entries {
		s := &e.idle
		if !e.quietSoFar() || now.Before(s.retryAt) {
			continue
		}
		switch {
		case s.cpuAt.IsZero():
			out = append(out, idleCheck{id: id, first: true})
		case now.Sub(s.cpuAt) >= s.timeout && now.Sub(s.lastUse) >= s.timeout:
			out = append(out, idleCheck{id: id})
		}
	}
	return out
}

// idleMeasured records a CPU reading (ns; -1 unknown) taken for c and says
// whether the sandbox is idle and should be suspended. A busy CPU starts a
// new quiet spell from this reading.
func (t *table) idleMeasured(c idleCheck, cpu int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[c.id]
	if e == nil || e.phase != phaseRunning || e.inflight > 0 || e.holds > 0 {
		return false
	}
	s := &e.idle
	now := t.now()
	if c.first != s.cpuAt.IsZero() {
		return false // used meanwhile
	}
	if c.first {
		s.cpuAt, s.cpuStart = now, cpu
		return false
	}
	if cpu >= 0 && s.cpuStart >= 0 {
		if share := float64(cpu-s.cpuStart) / float64(now.Sub(s.cpuAt)); share >= idleCPUShare {
			s.cpuAt, s.cpuStart = now, cpu
			return false
		}
	}
	return now.Sub(s.lastUse) >= s.timeout
}

// setIdleTimeout changes a running sandbox's idle timeout.
func (t *table) setIdleTimeout(id string, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e := t.entries[id]; e != nil {
		e.idle.timeout = d
		e.idle.used(t.now())
		if e.phase == phaseCreating || e.phase == phaseResuming {
			e.idleSet = true // for run, which would set the boot's own
		}
	}
}

// maxConcurrentSuspends bounds the pauses the reaper runs at once: each
// writes a sandbox's memory to disk.
const maxConcurrentSuspends = 2

// suspendIdle measures the quiet sandboxes and pauses the idle ones, in
// the background so that expiry checks go on meanwhile; while one batch of
// pauses runs, later passes measure nothing.
func (m *Manager) suspendIdle() {
	if !m.suspending.CompareAndSwap(false, true) {
		return
	}
	ids := m.idleNow()
	if len(ids) == 0 {
		m.suspending.Store(false)
		return
	}
	m.wg.Add(1) // the reaper's own count keeps Close waiting, so this cannot race its Wait
	go func() {
		defer m.wg.Done()
		defer m.suspending.Store(false)
		m.suspend(ids, pandastack.PauseIdle)
	}()
}

// idleNow takes the CPU readings due and returns the sandboxes found idle.
func (m *Manager) idleNow() []string {
	var idle []string
	for _, c := range m.sbx.idleDue() {
		cpu := int64(-1)
		if n, err := m.cpuNanos(context.Background(), c.id); err == nil {
			cpu = n // the cgroup alone where the runtime can (pressure.go)
		}
		if m.sbx.idleMeasured(c, cpu) {
			idle = append(idle, c.id)
		}
	}
	return idle
}

// suspend pauses the given sandboxes for reason (PauseIdle, PauseMemory),
// a few at a time.
func (m *Manager) suspend(ids []string, reason string) {
	forEachBounded(ids, maxConcurrentSuspends, func(id string) {
		sb, err := m.store.GetSandbox(context.Background(), "", id)
		if err != nil {
			return
		}
		start := time.Now()
		_, err = m.pause(context.Background(), sb, reason)
		if pandastack.IsCode(err, pandastack.EConflict) || errors.Is(err, errClosing) {
			// Taken meanwhile: by a request, a kill, or the other kind of
			// suspend. No failure of the suspend, nothing to retry later.
			m.log.Debug(reason+" suspend not done: the sandbox is busy", "sandbox", id, "err", err)
			return
		}
		op := opSuspend
		if reason == pandastack.PauseMemory {
			op = opMemory
		}
		m.observe(op, start, &err)
		if pandastack.IsCode(err, pandastack.EStopped) {
			m.log.Warn(reason+" suspend failed: the sandbox died", "sandbox", id, "err", err)
			return
		}
		if err != nil {
			wait := m.sbx.suspendFailed(id)
			m.log.Warn(reason+" suspend failed; the sandbox keeps running", "sandbox", id, "err", err, "next_try_in", wait)
			return
		}
		m.log.Info("sandbox suspended", "sandbox", id, "reason", reason)
	})
}

// releaseTimeout bounds the agent's preparation for a suspend (and its
// undoing): kernels to shut down.
const releaseTimeout = 15 * time.Second

// releaseForSuspend has the agent of a sandbox about to be suspended (for
// idleness or the host's memory) shut its spare kernels down, so that its paused image does not
// hold them (a spare is a whole warmed-up Python: about half of a
// code-interpreter sandbox's image, 198 → 104 MiB). The agent starts them
// again after the resume. It returns the agent to undo it with if the
// suspend fails (refillAfter), or nil if nothing was released. The
// caller holds the sandbox's claim (pause, after its quiesce): only the
// suspend that will checkpoint it shuts its spares down.
func (m *Manager) releaseForSuspend(id string) *AgentClient {
	c := m.sbx.clientIn(id, phaseSuspending)
	if c == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	r, err := c.ReleaseSpares(ctx)
	if err != nil {
		// An agent of an older build has no such call: the suspend goes
		// on with its spares in the image.
		m.log.Warn("releasing the spare kernels before a suspend", "sandbox", id, "err", err)
		return nil
	}
	m.log.Debug("spares released for the suspend", "sandbox", id, "spares", r.Spares)
	return c
}

// refillAfter restarts the spare kernels that releaseForSuspend shut down
// (c, or nil for none) when the suspend failed and the sandbox runs on.
func (m *Manager) refillAfter(id string, c *AgentClient) {
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := c.RefillSpares(ctx); err != nil {
		m.log.Warn("restarting the spare kernels after a failed suspend", "sandbox", id, "err", err)
	}
}

// forEachBounded runs f for every id, at most n at a time, and waits.
func forEachBounded(ids []string, n int, f func(string)) {
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(id)
		}()
	}
	wg.Wait()
}

// Hold is Acquire for long-lived uses of a sandbox (a proxied connection,
// a process's output stream): while held it is never idle, but snapshots,
// forks and pauses still proceed. Call done when the use ends.
func (m *Manager) Hold(ctx context.Context, projectID, id string) (_ *AgentClient, done func(), _ error) {
	return m.use(ctx, projectID, id, m.sbx.hold)
}

// idleTimeout checks a requested idle timeout; nil means the server's default.
func (m *Manager) idleTimeout(seconds *int64) (time.Duration, error) {
	if seconds == nil {
		return m.cfg.IdleTimeout, nil
	}
	if *seconds < 0 || *seconds > int64(m.cfg.MaxTTL/time.Second) {
		return 0, pandastack.Errorf(pandastack.EInvalid, "idle_timeout_seconds must be between 0 (never) and %d, got %d", int64(m.cfg.MaxTTL/time.Second), *seconds)
	}
	return time.Duration(*seconds) * time.Second, nil
}

// SetIdleTimeout changes a sandbox's idle timeout (0: never suspend).
func (m *Manager) SetIdleTimeout(ctx context.Context, projectID, id string, seconds int64) (pandastack.Sandbox, error) {
	d, err := m.idleTimeout(&seconds)
	if err != nil {
		return pandastack.Sandbox{}, err
	}
	sb, err := m.store.GetSandbox(ctx, projectID, id)
	if err != nil {
		return sb, err
	}
	if sb.State == pandastack.StateStopped {
		return m.running(ctx, projectID, id) // the error that says why
	}
	if err := m.store.SetSandboxIdleTimeout(ctx, id, seconds); err != nil {
		return sb, fmt.Errorf("set idle timeout %s: %w", id, err)
	}
	m.sbx.setIdleTimeout(id, d)
	sb.IdleTimeoutSeconds = seconds
	return sb, nil
}

// Update changes a sandbox's TTL (from now) and/or idle timeout; either
// may be nil. Both are checked before either changes.
func (m *Manager) Update(ctx context.Context, projectID, id string, ttlSeconds, idleSeconds *int64) (pandastack.Sandbox, error) {
	if ttlSeconds != nil {
		if _, err := m.ttl(ttlSeconds); err != nil {
			return pandastack.Sandbox{}, err
		}
	}
	if idleSeconds != nil {
		if _, err := m.idleTimeout(idleSeconds); err != nil {
			return pandastack.Sandbox{}, err
		}
	}
	var sb pandastack.Sandbox
	var err error
	if idleSeconds != nil {
		sb, err = m.SetIdleTimeout(ctx, projectID, id, *idleSeconds)
	}
	if err == nil && ttlSeconds != nil {
		sb, err = m.SetTTL(ctx, projectID, id, *ttlSeconds)
	}
	return sb, err
}
