package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/pandastack/pandastack"
)

// Memory pressure. A host asked to run more sandboxes than its memory holds
// must not get as far as the kernel's OOM killer, which ends whichever
// process it finds largest: a user's sandbox with its work, or the server.
// The server keeps Config.MemoryReserveMB of the host's memory available
// (MemAvailable in /proc/meminfo), less what boots under way were promised
// (book: a restore's pages load after it returns):
//
//   - Below it, the reaper (every ReapInterval) first stops the pools'
//     ready sandboxes and the prepared resumes, then suspends quiet running
//     sandboxes, the longest unused first, until their memory covers the
//     shortfall: pause reason PauseMemory, resumed by their next request
//     like an idle suspend (but with no prepared resume). Quiet: nothing in
//     flight or held, no request, and under idleCPUShare of a CPU, over
//     the last pressureQuiet at least (the reaper reads each sandbox's CPU
//     every pressureSample). A sandbox whose idle timeout is 0 asked never
//     to be suspended and is never chosen.
//   - A create, restore, fork or resume must find room for the memory it
//     will take (its image's size): if it does not, it does the same
//     first, and is refused with EMemory when that was not enough.
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
	// pressureSample is how often the reaper reads a quiet sandbox's CPU.
	pressureSample = 5 * time.Second
	// keptSamples covers pressureQuiet and a sample more.
	keptSamples = 4
	// poolHeadroomMiB is the memory, over the reserve, that pools need
	// to keep sandboxes ready: a few of them.
	poolHeadroomMiB = 512
	// bootSettle is how long a boot's memory stays booked after it
	// returned: a lazy restore loads its pages in the second after.
	bootSettle = 3 * time.Second
)

// imageMiB is the memory a sandbox restored from the image directory dir
// will take: the size of its memory's file, at least defaultPSSMiB (a
// cold boot's, or an unreadable image's).
func imageMiB(dir string) int {
	if dir == "" {
		return defaultPSSMiB // a cold boot
	}
	fi, err := os.Stat(filepath.Join(dir, "pages.img"))
	if err != nil {
		return defaultPSSMiB
	}
	return max(defaultPSSMiB, int(fi.Size()>>20))
}

// memoryOf is the memory sandbox sb takes, running (its cgroup's) or
// paused (its image's; a prepared resume's container holds next to
// nothing yet), in MiB; at least defaultPSSMiB.
func (m *Manager) memoryOf(ctx context.Context, sb pandastack.Sandbox) int {
	if m.cfg.MemoryReserveMB <= 0 {
		return 0 // not needed
	}
	if sb.State == pandastack.StateRunning {
		return max(defaultPSSMiB, m.memoryMiB(ctx, sb.ID))
	}
	return imageMiB(filepath.Join(m.pausedPath(sb.ID), "image"))
}

// cpuSample is a sandbox's CPU time (ns) at a moment.
type cpuSample struct {
	at  time.Time
	cpu int64
}

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

// checkReserve refuses a reserve of all the host's memory or more (no
// sandbox could ever start), and warns at the start when the reserve
// leaves the host little for sandboxes: over half its memory, or more
// than it has available now.
func (m *Manager) checkReserve(total int) error {
	if m.cfg.MemoryReserveMB <= 0 {
		return nil
	}
	if m.cfg.MemoryReserveMB >= total {
		return pandastack.Errorf(pandastack.EInvalid, "--memory-reserve-mb %d is all of the host's memory (%d MiB) or more: no sandbox could start; give less, or 0 for no reserve", m.cfg.MemoryReserveMB, total)
	}
	avail := m.memAvailable()
	switch {
	case avail < m.cfg.MemoryReserveMB:
		m.log.Warn("the host has less memory available than the reserve this server keeps: creates and resumes are refused (insufficient_memory) until it has more (serve --memory-reserve-mb)", "available_mib", avail, "reserve_mib", m.cfg.MemoryReserveMB)
	case m.cfg.MemoryReserveMB > total/2:
		m.log.Warn("the memory reserve is over half the host's memory: few sandboxes will run (serve --memory-reserve-mb)", "total_mib", total, "reserve_mib", m.cfg.MemoryReserveMB)
	}
	return nil
}

// memoryShort returns the host's available memory in MiB, less what boots
// under way were promised (bookedMiB), and whether that is under the
// reserve plus extraMiB. Without a reserve it is never short.
func (m *Manager) memoryShort(extraMiB int) (availMiB int, short bool) {
	if m.cfg.MemoryReserveMB <= 0 {
		return 0, false
	}
	availMiB = m.memAvailable() - m.bookedMiB()
	return availMiB, availMiB < m.cfg.MemoryReserveMB+extraMiB
}

// availableMiB reads MemAvailable (hostMemoryMB: a large figure when it
// cannot, so that nothing is refused for want of a reading).
func availableMiB() int {
	_, free := hostMemoryMB()
	return free
}

// booking is the memory (MiB) a boot was promised by roomFor: all of it
// while the boot is under way, then, until bootSettle after it returned,
// what its sandboxes' cgroups do not hold yet (a restore loads its pages
// after it returns; what they hold is in MemAvailable already).
// Manager.bookMu guards its fields.
type booking struct {
	m        *Manager
	mib      int
	ids      []string  // its sandboxes, once known
	returned time.Time // zero: under way
}

// of says the boot is sandbox id's. Nil-safe.
func (b *booking) of(id string) {
	if b == nil {
		return
	}
	b.m.bookMu.Lock()
	b.ids = append(b.ids, id)
	b.m.bookMu.Unlock()
}

// done ends the boot: ok, its booking fades over bootSettle; failed, it
// goes at once. Nil-safe.
func (b *booking) done(ok bool) {
	if b == nil {
		return
	}
	m := b.m
	drop := func() {
		m.bookMu.Lock()
		delete(m.bookings, b)
		m.bookMu.Unlock()
	}
	if !ok || m.bootSettle <= 0 {
		drop()
		return
	}
	m.bookMu.Lock()
	b.returned = m.now()
	m.bookMu.Unlock()
	time.AfterFunc(m.bootSettle, drop)
}

// bookedMiB is the memory the bookings still stand for.
func (m *Manager) bookedMiB() int {
	type view struct {
		mib      int
		ids      []string
		returned bool
	}
	m.bookMu.Lock()
	vs := make([]view, 0, len(m.bookings))
	for b := range m.bookings {
		vs = append(vs, view{b.mib, slices.Clone(b.ids), !b.returned.IsZero()})
	}
	m.bookMu.Unlock()
	total := 0
	for _, v := range vs {
		left := v.mib
		if v.returned {
			for _, id := range v.ids {
				left -= m.memoryMiB(context.Background(), id)
			}
		}
		total += max(0, left)
	}
	return total
}

// memoryMiB is the memory sandbox id's cgroup holds now, in MiB (0 when
// unknown).
func (m *Manager) memoryMiB(ctx context.Context, id string) int {
	var n int64 = -1
	if ru, ok := m.rt.(pandastack.RuntimeUsage); ok {
		n, _ = ru.MemoryBytes(ctx, id)
	} else if st, err := m.rt.Stats(ctx, id); err == nil {
		n = st.MemoryBytes
	}
	return int(max(n, 0) >> 20)
}

// roomFor makes sure the host has its reserve, plus mib for what a boot
// will take, available before the boot adds running sandboxes (what names
// it, for the error): if it has not, it frees memory first
// (relieveMemory) and refuses with EMemory when that was not enough. The
// mib are then booked (booking): boots at once each count the others'.
// The caller tells the booking its sandboxes (of) and ends it (done).
// Callers hold what they boot for (the admission slot, the resume's
// claim), so that requests waiting for the same boot wait for it rather
// than each being refused.
func (m *Manager) roomFor(ctx context.Context, what string, mib int) (*booking, error) {
	if m.cfg.MemoryReserveMB <= 0 {
		return nil, nil
	}
	book := func() *booking {
		b := &booking{m: m, mib: mib}
		m.bookMu.Lock()
		if m.bookings == nil {
			m.bookings = map[*booking]struct{}{}
		}
		m.bookings[b] = struct{}{}
		m.bookMu.Unlock()
		return b
	}
	var last relief
	suspended := 0
	for round := range 3 {
		if _, short := m.memoryShort(mib); !short {
			return book(), nil
		}
		if round > 0 {
			// What the last round stopped may show in MemAvailable a
			// moment late: look again before freeing more for it.
			time.Sleep(reliefSettle)
			if _, short := m.memoryShort(mib); !short {
				return book(), nil
			}
		}
		r, err := m.relieveMemory(ctx, true, mib)
		if err != nil {
			return nil, err
		}
		last, suspended = r, suspended+r.suspended
		if _, short := m.memoryShort(mib); !short {
			return book(), nil // this relief's work, or another's meanwhile
		}
		if r.freed == 0 {
			break // nothing (more) to free
		}
	}
	last.suspended = suspended
	avail, _ := m.memoryShort(mib)
	return nil, pandastack.Errorf(pandastack.EMemory,
		"no room for %s (about %d MiB): the host has %d MiB of memory available for sandboxes, and this server keeps %d MiB free (serve --memory-reserve-mb); %s; retry later, or pause or kill sandboxes",
		what, mib, avail, m.cfg.MemoryReserveMB, last.why())
}

// reliefSettle is how long roomFor waits for what a relief stopped to show
// in MemAvailable before it frees more.
const reliefSettle = 200 * time.Millisecond

// reliefPause is how long the reaper leaves the host's memory alone after
// a relief that found nothing to free.
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

// relief is what relieveMemory did and found.
type relief struct {
	avail     int // MiB available for sandboxes after it
	freed     int // pool sandboxes and prepared resumes stopped, sandboxes suspended
	suspended int // of which suspended
	running   int // running sandboxes it looked at (their idle timeout not 0, no work in flight)
	futile    bool
}

// why says, for the error of a boot refused after r, why no more memory
// could be freed.
func (r relief) why() string {
	switch {
	case r.suspended > 0:
		return fmt.Sprintf("suspending %d quiet %s did not free enough", r.suspended, plural(r.suspended, "sandbox", "sandboxes"))
	case r.running == 0:
		return "none of this server's sandboxes could be suspended (none runs without work in flight, or they may not be: idle_timeout_seconds 0), so the memory is in use by those or elsewhere on the host"
	default:
		return fmt.Sprintf("none of its %d running %s without work in flight has been quiet (no request, under 5%% of a CPU) for %s", r.running, plural(r.running, "sandbox", "sandboxes"), pressureQuiet)
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
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
	if !short {
		return relief{avail: avail}, nil
	}
	if m.reliefGen.Load() != gen && m.reliefFutile.Load() != 0 {
		return m.lastRelief, nil
	}
	r := m.relieve(ctx, avail, extraMiB)
	if r.futile {
		m.reliefFutile.Store(m.now().UnixNano())
	} else {
		m.reliefFutile.Store(0)
	}
	m.lastRelief = r
	m.reliefGen.Add(1)
	return r, nil
}

// relieve is relieveMemory's work, with avail MiB available for sandboxes,
// short of the reserve plus extraMiB; the caller holds m.relieving.
func (m *Manager) relieve(ctx context.Context, avail, extraMiB int) relief {
	// What only speeds creates and resumes up goes first: the pools'
	// sandboxes, and the prepared resumes with their images held in
	// memory (prepare.go).
	need := int64(m.cfg.MemoryReserveMB+extraMiB-avail) << 20
	pooled, poolMiB := m.drainPools()
	prepared := m.dropPreparedResumes()
	r := relief{freed: pooled + prepared}
	if r.freed > 0 {
		m.log.Info("the host is short of memory: pool sandboxes and prepared resumes stopped", "pool", pooled, "prepared_resumes", prepared, "available_mib", avail, "reserve_mib", m.cfg.MemoryReserveMB)
		var short bool
		if r.avail, short = m.memoryShort(extraMiB); !short {
			return r
		}
		// What they held may show in MemAvailable a moment late.
		need = min(need-int64(poolMiB)<<20, int64(m.cfg.MemoryReserveMB+extraMiB-r.avail)<<20)
	}
	var pick []string
	cands, now := m.sbx.quietest()
	r.running = len(cands)
	for _, c := range cands {
		if c.base.at.IsZero() {
			continue // not quiet for pressureQuiet yet
		}
		cpu, err := m.cpuNanos(ctx, c.id)
		if err != nil {
			continue // gone meanwhile
		}
		if cpu >= 0 && c.base.cpu >= 0 {
			// (A count that went back says nothing: not quiet.)
			if share := float64(cpu-c.base.cpu) / float64(now.Sub(c.base.at)); share >= idleCPUShare || cpu < c.base.cpu {
				continue // working in the background: not quiet
			}
		}
		if need <= 0 {
			break
		}
		pick = append(pick, c.id)
		mem := m.memoryMiB(ctx, c.id)
		if mem == 0 {
			mem = defaultPSSMiB // unknown
		}
		need -= int64(mem) << 20
	}
	if len(pick) == 0 {
		r.avail, _ = m.memoryShort(extraMiB)
		r.futile = r.freed == 0
		return r
	}
	m.log.Warn("the host is short of memory: suspending the quietest sandboxes", "available_mib", avail, "reserve_mib", m.cfg.MemoryReserveMB, "sandboxes", len(pick))
	m.suspend(pick, pandastack.PauseMemory)
	r.suspended = len(pick)
	r.freed += len(pick)
	r.avail, _ = m.memoryShort(extraMiB)
	return r
}

// cpuNanos reads sandbox id's CPU time: alone if the runtime can
// (RuntimeUsage), else from Stats.
func (m *Manager) cpuNanos(ctx context.Context, id string) (int64, error) {
	if rc, ok := m.rt.(pandastack.RuntimeUsage); ok {
		return rc.CPUNanos(ctx, id)
	}
	st, err := m.rt.Stats(ctx, id)
	if err != nil {
		return -1, err
	}
	return st.CPUNanos, nil
}

// sampleCPU is the reaper's reading of the CPU of the sandboxes that are
// quiet so far, each every pressureSample, for the relief to judge them
// by (quietest). Nothing without a reserve.
func (m *Manager) sampleCPU() {
	if m.cfg.MemoryReserveMB <= 0 {
		return
	}
	for _, id := range m.sbx.sampleDue() {
		cpu, err := m.cpuNanos(context.Background(), id)
		if err != nil {
			continue
		}
		m.sbx.addSample(id, cpu)
	}
}

// sampleDue lists the running sandboxes, quiet so far, whose last CPU
// reading is pressureSample old.
func (t *table) sampleDue() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	var out []string
	for id, e := range t.entries {
		s := &e.idle
		if !e.quietSoFar() {
			continue
		}
		if n := len(s.samples); n == 0 || now.Sub(s.samples[n-1].at) >= pressureSample {
			out = append(out, id)
		}
	}
	return out
}

// addSample records a CPU reading of id taken now, unless a use came
// meanwhile.
func (t *table) addSample(id string, cpu int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.entries[id]
	if e == nil || !e.quietSoFar() {
		return
	}
	s := &e.idle
	if len(s.samples) >= keptSamples {
		s.samples = append(s.samples[:0], s.samples[1:]...)
	}
	s.samples = append(s.samples, cpuSample{at: t.now(), cpu: cpu})
}

// quietCandidate is a running sandbox that may be suspended for the
// host's memory, with the CPU reading to judge it by: the newest at
// least pressureQuiet old (zero: none yet).
type quietCandidate struct {
	id      string
	lastUse time.Time
	base    cpuSample
}

// quietest lists the running sandboxes that may be suspended for the
// host's memory (see the top of this file), the longest unused first,
// and when it looked. Their CPU since base is the caller's to check.
func (t *table) quietest() (_ []quietCandidate, now time.Time) {
	t.mu.Lock()
	now = t.now()
	var out []quietCandidate
	for id, e := range t.entries {
		s := &e.idle
		if !e.quietSoFar() || now.Before(s.retryAt) {
			continue
		}
		c := quietCandidate{id: id, lastUse: s.lastUse}
		for i := len(s.samples) - 1; i >= 0; i-- {
			if now.Sub(s.samples[i].at) >= pressureQuiet {
				c.base = s.samples[i] // a use drops them: none since
				break
			}
		}
		out = append(out, c)
	}
	t.mu.Unlock()
	slices.SortFunc(out, func(a, b quietCandidate) int { return a.lastUse.Compare(b.lastUse) })
	return out, now
}
