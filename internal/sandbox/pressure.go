package sandbox

import (
	"context"
	"slices"
	"time"

	"github.com/pandastack/pandastack"
)

// Memory pressure. A host asked to run more sandboxes than its memory holds
// must not get as far as the kernel's OOM killer, which ends whichever
// process it finds largest: a user's sandbox with its work, or the server.
// The server keeps Config.MemoryReserveMB of the host's memory available
// (MemAvailable in /proc/meminfo):
//
//   - Below it, the reaper (every ReapInterval) first stops the pools'
//     ready sandboxes, then suspends quiet running sandboxes, the longest
//     unused first, until their memory covers the shortfall: pause reason
//     PauseMemory, resumed by their next request like an idle suspend.
//     Quiet is what idle means (idle.go) over a shorter spell: nothing in
//     flight or held, no request for pressureQuiet, and their CPU under
//     idleCPUShare since their quiet spell began. A sandbox whose idle
//     timeout is 0 asked never to be suspended and is never chosen.
//   - A create, restore, fork or resume that finds the host below it does
//     the same first, and is refused with EMemory when that was not enough.
//   - Pools keep nothing ready, and refill nothing, unless poolHeadroomMiB
//     more than the reserve is available: a ready sandbox must not push
//     the host into the reserve that running ones then pay for.

const (
	// pressureQuiet is how long a sandbox must have had no request to be
	// suspended for the host's memory: one a client used a moment ago is
	// likely used again at once.
	pressureQuiet = 10 * time.Second
	// poolHeadroomMiB is the memory, over the reserve, that pools need
	// to keep sandboxes ready: a few of them.
	poolHeadroomMiB = 512
)

// memoryShort returns the host's available memory in MiB and whether it
// is under the reserve plus extraMiB. Without a reserve it is never short.
func (m *Manager) memoryShort(extraMiB int) (availMiB int, short bool) {
	if m.cfg.MemoryReserveMB <= 0 {
		return 0, false
	}
	availMiB = m.memAvailable()
	return availMiB, availMiB < m.cfg.MemoryReserveMB+extraMiB
}

// availableMiB reads MemAvailable (hostMemoryMB: a large figure when it
// cannot, so that nothing is refused for want of a reading).
func availableMiB() int {
	_, free := hostMemoryMB()
	return free
}

// roomFor makes sure the host has its reserve available before a boot
// adds a running sandbox (what names it, for the error): if it has not,
// it frees memory first (relieveMemory) and refuses with EMemory when
// that was not enough.
func (m *Manager) roomFor(ctx context.Context, what string) error {
	if _, short := m.memoryShort(0); !short {
		return nil
	}
	avail, err := m.relieveMemory(ctx, true)
	if err != nil {
		return err
	}
	if avail >= m.cfg.MemoryReserveMB {
		return nil
	}
	return pandastack.Errorf(pandastack.EMemory,
		"the host has %d MiB of memory available, under the %d MiB this server keeps free (serve --memory-reserve-mb), and no quiet sandbox is left to suspend: %s must wait; retry later, or pause or kill sandboxes",
		avail, m.cfg.MemoryReserveMB, what)
}

// relievePressure is the reaper's look at the host's memory: when it is
// short and no relief is under way, one runs in the background.
func (m *Manager) relievePressure() {
	if _, short := m.memoryShort(0); !short {
		return
	}
	m.wg.Add(1) // the reaper's own count keeps Close waiting, so this cannot race its Wait
	go func() {
		defer m.wg.Done()
		m.relieveMemory(context.Background(), false)
	}()
}

// relieveMemory frees memory while the host is under its reserve: the
// pools' ready sandboxes first, then quiet sandboxes suspended (see the
// top of this file). One relief runs at a time; wait says whether to wait
// for one under way (a request) or to leave it be (the reaper). It
// returns the memory available after, in MiB.
func (m *Manager) relieveMemory(ctx context.Context, wait bool) (int, error) {
	if wait {
		select {
		case m.relieving <- struct{}{}:
		case <-ctx.Done():
			return 0, pandastack.Errorf(pandastack.ETimeout, "gave up waiting for memory to be freed: %v", ctx.Err())
		}
	} else {
		select {
		case m.relieving <- struct{}{}:
		default:
			return 0, nil
		}
	}
	defer func() { <-m.relieving }()
	avail, short := m.memoryShort(0)
	if !short {
		return avail, nil
	}
	// What only speeds creates and resumes up goes first: the pools'
	// sandboxes, and the prepared resumes with their images held in
	// memory (prepare.go).
	pooled, prepared := m.drainPools(), m.dropPrepared(0)
	if pooled+prepared > 0 {
		m.log.Info("the host is short of memory: pool sandboxes and prepared resumes stopped", "pool", pooled, "prepared_resumes", prepared, "available_mib", avail, "reserve_mib", m.cfg.MemoryReserveMB)
		if avail, short = m.memoryShort(0); !short {
			return avail, nil
		}
	}
	need := int64(m.cfg.MemoryReserveMB-avail) << 20
	var pick []string
	cands, now := m.sbx.quietest()
	for _, c := range cands {
		if need <= 0 {
			break
		}
		st, err := m.rt.Stats(ctx, c.id)
		if err != nil {
			continue // gone meanwhile
		}
		if st.CPUNanos >= 0 && c.cpuStart >= 0 {
			if share := float64(st.CPUNanos-c.cpuStart) / float64(now.Sub(c.cpuAt)); share >= idleCPUShare {
				continue // working in the background: not quiet
			}
		}
		pick = append(pick, c.id)
		if st.MemoryBytes > 0 {
			need -= st.MemoryBytes
		} else {
			need -= defaultPSSMiB << 20
		}
	}
	if len(pick) == 0 {
		return avail, nil
	}
	m.log.Warn("the host is short of memory: suspending the quietest sandboxes", "available_mib", avail, "reserve_mib", m.cfg.MemoryReserveMB, "sandboxes", len(pick))
	m.suspend(pick, pandastack.PauseMemory)
	avail, _ = m.memoryShort(0)
	return avail, nil
}

// quietCandidate is a running sandbox that may be suspended for the host's
// memory, with the CPU reading its quiet spell began with.
type quietCandidate struct {
	id       string
	lastUse  time.Time
	cpuAt    time.Time
	cpuStart int64
}

// quietest lists the running sandboxes quiet enough to be suspended for
// the host's memory (see the top of this file), the longest unused first,
// and when it looked. Their CPU since the spell began is the caller's to
// check.
func (t *table) quietest() (_ []quietCandidate, now time.Time) {
	t.mu.Lock()
	now = t.now()
	var out []quietCandidate
	for id, e := range t.entries {
		s := &e.idle
		if e.phase != phaseRunning || s.timeout <= 0 || e.inflight > 0 || e.holds > 0 || now.Before(s.retryAt) ||
			s.cpuAt.IsZero() || now.Sub(s.lastUse) < pressureQuiet || !now.After(s.cpuAt) {
			continue
		}
		out = append(out, quietCandidate{id: id, lastUse: s.lastUse, cpuAt: s.cpuAt, cpuStart: s.cpuStart})
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b quietCandidate) int { return a.lastUse.Compare(b.lastUse) })
	return out, now
}
