package sandbox

import (
	"math"
	"sync"
	"time"
)

// poolSizer decides how many sandboxes a pool keeps ready: its floor
// (Config.PoolSize), plus what the recent arrival rate of creates needs
// while a refill is under way (rate × refill time, Little's law), within
// what the memory budget holds. It grows at once when creates come faster
// and shrinks over minutes after they stop: a burst or a run of creates
// back to back tends to come again, and a ready sandbox costs only its
// memory while a missing one costs a create a full restore.
type poolSizer struct {
	mu        sync.Mutex
	floor     int     // never fewer (Config.PoolSize)
	budgetMiB float64 // memory for this pool's ready sandboxes; 0: the floor is the size
	ceiling   int     // never more, whatever the budget (the ready channel's capacity)

	rate, peak float64   // creates per second: decaying estimate, and its decaying peak
	at, peakAt time.Time // when each was last brought up to date
	refill     float64   // seconds a refill takes (moving average); 0: none measured yet
	pssMiB     float64   // memory of one ready sandbox (moving average); 0: none measured yet
}

const (
	// rateTau is the time constant of the rate estimate: a run of creates
	// shows within a few of them.
	rateTau = 3 * time.Second
	// peakHalfLife is how fast the pool shrinks back once creates slow.
	peakHalfLife = 5 * time.Minute
	// defaultRefill and defaultPSSMiB stand in until measured (a restore
	// of the code-interpreter image, its PSS, on a 2-core machine).
	defaultRefill = 0.6
	defaultPSSMiB = 128
	// headroom covers the spread of arrivals around their rate.
	headroom = 1.5
)

func newPoolSizer(floor, ceiling int, budgetMiB float64) *poolSizer {
	return &poolSizer{floor: floor, ceiling: max(ceiling, floor), budgetMiB: budgetMiB}
}

// decay brings both estimates up to t. s.mu is held.
func (s *poolSizer) decay(t time.Time) {
	if !s.at.IsZero() && t.After(s.at) {
		s.rate *= math.Exp(-t.Sub(s.at).Seconds() / rateTau.Seconds())
	}
	s.at = t
	if !s.peakAt.IsZero() && t.After(s.peakAt) {
		s.peak *= math.Exp2(-t.Sub(s.peakAt).Seconds() / peakHalfLife.Seconds())
	}
	s.peakAt = t
	s.peak = max(s.peak, s.rate)
}

// arrive counts a create that the pool could have served, hit or miss.
func (s *poolSizer) arrive(t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.decay(t)
	s.rate += 1 / rateTau.Seconds()
	s.peak = max(s.peak, s.rate)
}

// refilled records one refill: how long it took, and the memory of the
// sandbox it made (0 when unknown).
func (s *poolSizer) refilled(d time.Duration, pssBytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	avg := func(old, v float64) float64 {
		if old == 0 {
			return v
		}
		return 0.7*old + 0.3*v
	}
	s.refill = avg(s.refill, d.Seconds())
	if pssBytes > 0 {
		s.pssMiB = avg(s.pssMiB, float64(pssBytes)/(1<<20))
	}
}

// refillTime is how long a refill takes, as measured (0: not yet).
func (s *poolSizer) refillTime() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return time.Duration(s.refill * float64(time.Second))
}

// sandboxMiB is the memory of one ready sandbox, as measured (or
// defaultPSSMiB until then).
func (s *poolSizer) sandboxMiB() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pssMiB == 0 {
		return defaultPSSMiB
	}
	return int(s.pssMiB)
}

// target returns how many ready sandboxes the pool should hold at t.
func (s *poolSizer) target(t time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.budgetMiB <= 0 {
		return s.floor
	}
	s.decay(t)
	refill, pss := s.refill, s.pssMiB
	if refill == 0 {
		refill = defaultRefill
	}
	if pss == 0 {
		pss = defaultPSSMiB
	}
	n := s.floor + int(math.Round(s.peak*refill*headroom))
	n = min(n, int(s.budgetMiB/pss), s.ceiling)
	return max(n, s.floor)
}
