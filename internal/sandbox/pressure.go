package sandbox

import (
	"context"
	"fmt"
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
//     ready sandboxes and the prepared resumes, then suspends quiet running
//     sandboxes, the longest unused first, until their memory covers the
//     shortfall: pause reason PauseMemory, resumed by their next request
//     like an idle suspend (but with no prepared resume). Quiet is what
//     idle means (idle.go) over a shorter spell: nothing in flight or
//     held, no request, and their CPU under idleCPUShare, for
//     pressureQuiet at least. A sandbox whose idle timeout is 0 asked never
//     to be suspended and is never chosen.
//   - A create, restore, fork or resume that finds the host below it does
//     the same first, and is refused with EMemory when that was not enough.
//   - Pools refill only with poolHeadroomMiB more than the reserve (and the
//     memory of the refills under way) available, keep what they hold
//     within that headroom, and are emptied under the reserve: a ready
//     sandbox must not push the host into the reserve that running ones
//     then pay for.

const (
	// pressureQuiet is how long a sandbox must have been quiet to be
	// suspended for the host's memory: one a client used a moment ago is
	// likely used again at once, and a CPU reading over a shorter while
	// says little.
	pressureQuiet = 10 * time.Second
	// poolHeadroomMiB is the memory, over the reserve, that pools need
	// to keep sandboxes ready: a few of them.
	poolHeadroomMiB = 512
)

// poolTarget is how many sandboxes pool p keeps ready and restoring now:
// its sizer's figure while the host has the reserve and headroom for
// them, what it holds while the host is within the headroom (neither
// growing nor shrinking: no churn at the boundary), none under the
// reserve itself.
func (m *Manager) poolTarget(p *pool) int {
	target := p.size.target(m.now())
	if _, short := m.memoryShort(0); short {
		return 0
	}
	if !m.poolRoom(p) {
		return min(target, len(p.ready)+int(p.filling.Load()))
	}
	return target
}

// poolRoom says whether the host has the reserve, the headroom and the
// memory of the refills of p under way (each at its sizer's measure).
func (m *Manager) poolRoom(p *pool) bool {
	_, short := m.memoryShort(poolHeadroomMiB + int(p.filling.Load())*p.size.sandboxMiB())
	return !short
}

// checkReserve warns at the start when the reserve leaves the host little
// for sandboxes: over half its memory, or more than it has available.
func (m *Manager) checkReserve() {
	if m.cfg.MemoryReserveMB <= 0 {
		return
	}
	total, _ := hostMemoryMB()
	avail := m.memAvailable()
	switch {
	case avail < m.cfg.MemoryReserveMB:
		m.log.Warn("the host has less memory available than the reserve this server keeps: creates and resumes are refused (insufficient_memory) until it has more (serve --memory-reserve-mb)", "available_mib", avail, "reserve_mib", m.cfg.MemoryReserveMB)
	case m.cfg.MemoryReserveMB > total/2:
		m.log.Warn("the memory reserve is over half the host's memory: few sandboxes will run (serve --memory-reserve-mb)", "total_mib", total, "reserve_mib", m.cfg.MemoryReserveMB)
	}
}

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

// roomFor makes sure the host has its reserve, plus extraMiB, available
// before a boot adds running sandboxes (what names it, for the error): if
// it has not, it frees memory first (relieveMemory) and refuses with
// EMemory when that was not enough. Callers hold what they boot for (the
// admission slot, the resume's claim), so that requests waiting for the
// same boot wait for it rather than each being refused.
func (m *Manager) roomFor(ctx context.Context, what string, extraMiB int) error {
	if _, short := m.memoryShort(extraMiB); !short {
		return nil
	}
	r, err := m.relieveMemory(ctx, true, extraMiB)
	if err != nil {
		return err
	}
	if r.avail >= m.cfg.MemoryReserveMB+extraMiB {
		return nil
	}
	how := "and no quiet sandbox was left to suspend"
	if r.suspended > 0 {
		how = fmt.Sprintf("even after %d quiet sandboxes were suspended", r.suspended)
	}
	need := ""
	if extraMiB > 0 {
		need = fmt.Sprintf(" and %d MiB more for it", extraMiB)
	}
	return pandastack.Errorf(pandastack.EMemory,
		"no room for %s: the host has %d MiB of memory available, under the %d MiB this server keeps free (serve --memory-reserve-mb)%s, %s; retry later, or pause or kill sandboxes",
		what, r.avail, m.cfg.MemoryReserveMB, need, how)
}

// reliefPause is how long the reaper leaves the host's memory alone after
// a relief that found nothing to free: each looks at every running
// sandbox's processes.
const reliefPause = 5 * time.Second

// relievePressure is the reaper's look at the host's memory: when it is
// short, no relief is under way and the last one found something to do
// (or reliefPause has passed), one runs in the background.
func (m *Manager) relievePressure() {
	if _, short := m.memoryShort(0); !short {
		return
	}
	if at := m.reliefFutile.Load(); at != 0 && m.now().Sub(time.Unix(0, at)) < reliefPause {
		return
	}
	m.wg.Add(1) // the reaper's own count keeps Close waiting, so this cannot race its Wait
	go func() {
		defer m.wg.Done()
		m.relieveMemory(context.Background(), false, 0)
	}()
}

// relief is what relieveMemory did: the memory available after it (MiB)
// and how many sandboxes it suspended.
type relief struct {
	avail, suspended int
	futile           bool // still short, and nothing was left to free
}

// relieveMemory frees memory while the host is under its reserve plus
// extraMiB: the pools' ready sandboxes and the prepared resumes first, then
// quiet sandboxes suspended (see the top of this file). One relief runs at
// a time; wait says whether to wait for one under way (a request) or to
// leave it be (the reaper). A request that waited behind a relief which
// found nothing to free takes that outcome rather than look again.
func (m *Manager) relieveMemory(ctx context.Context, wait bool, extraMiB int) (relief, error) {
	gen := m.reliefGen.Load()
	if wait {
		select {
		case m.relieving <- struct{}{}:
		case <-ctx.Done():
			return relief{}, pandastack.Errorf(pandastack.ETimeout, "gave up waiting for memory to be freed: %v", ctx.Err())
		}
	} else {
		select {
		case m.relieving <- struct{}{}:
		default:
			return relief{}, nil
		}
	}
	defer func() { <-m.relieving }()
	avail, short := m.memoryShort(extraMiB)
	if !short || m.reliefGen.Load() != gen && m.reliefFutile.Load() != 0 {
		return relief{avail: avail}, nil
	}
	r := m.relieve(ctx, avail, extraMiB)
	if r.futile {
		m.reliefFutile.Store(m.now().UnixNano())
	} else {
		m.reliefFutile.Store(0)
	}
	m.reliefGen.Add(1)
	return r, nil
}

// relieve is relieveMemory's work, with the host avail MiB short of the
// reserve plus extraMiB; the caller holds m.relieving.
func (m *Manager) relieve(ctx context.Context, avail, extraMiB int) relief {
	// What only speeds creates and resumes up goes first: the pools'
	// sandboxes, and the prepared resumes with their images held in
	// memory (prepare.go).
	pooled, prepared := m.drainPools(), m.dropPreparedResumes()
	if pooled+prepared > 0 {
		m.log.Info("the host is short of memory: pool sandboxes and prepared resumes stopped", "pool", pooled, "prepared_resumes", prepared, "available_mib", avail, "reserve_mib", m.cfg.MemoryReserveMB)
		var short bool
		if avail, short = m.memoryShort(extraMiB); !short {
			return relief{avail: avail}
		}
	}
	need := int64(m.cfg.MemoryReserveMB+extraMiB-avail) << 20
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
		return relief{avail: avail, futile: true}
	}
	m.log.Warn("the host is short of memory: suspending the quietest sandboxes", "available_mib", avail, "reserve_mib", m.cfg.MemoryReserveMB, "sandboxes", len(pick))
	m.suspend(pick, pandastack.PauseMemory)
	avail, _ = m.memoryShort(extraMiB)
	return relief{avail: avail, suspended: len(pick)}
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
		// The CPU is judged over pressureQuiet at least: a spell that
		// a busy reading has just begun again says nothing yet. (A use
		// ends the spell, so the last use is longer ago still.)
		if e.phase != phaseRunning || s.timeout <= 0 || e.inflight > 0 || e.holds > 0 || now.Before(s.retryAt) ||
			s.cpuAt.IsZero() || now.Sub(s.cpuAt) < pressureQuiet {
			continue
		}
		out = append(out, quietCandidate{id: id, lastUse: s.lastUse, cpuAt: s.cpuAt, cpuStart: s.cpuStart})
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b quietCandidate) int { return a.lastUse.Compare(b.lastUse) })
	return out, now
}
