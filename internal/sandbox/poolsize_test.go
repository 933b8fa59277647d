package sandbox

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

func TestPoolSizer(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if n := newPoolSizer(2, 64, 0).target(t0); n != 2 {
		t.Fatalf("without a budget: %d, want the floor 2", n)
	}
	s := newPoolSizer(2, 64, 1024)
	if n := s.target(t0); n != 2 {
		t.Fatalf("no demand yet: %d, want 2", n)
	}
	s.refilled(500*time.Millisecond, 120<<20)
	// One create every 10 s needs no more than the floor.
	at := t0
	for range 6 {
		at = at.Add(10 * time.Second)
		s.arrive(at)
	}
	if n := s.target(at); n != 2 {
		t.Fatalf("a create every 10 s: %d, want 2", n)
	}
	// Back to back, 4 a second: the pool grows, within the budget.
	for range 12 {
		at = at.Add(250 * time.Millisecond)
		s.arrive(at)
	}
	grown := s.target(at)
	if grown <= 2 || grown > 1024/120 {
		t.Fatalf("4 creates a second: %d, want more than 2 and at most %d", grown, 1024/120)
	}
	// It holds for a while, then falls back to the floor.
	if n := s.target(at.Add(time.Minute)); n < 2 || n > grown {
		t.Fatalf("a minute later: %d", n)
	}
	if n := s.target(at.Add(time.Hour)); n != 2 {
		t.Fatalf("an hour later: %d, want the floor 2", n)
	}
	// A burst of 100 at once is capped by the budget, and by the ceiling.
	for range 100 {
		s.arrive(at.Add(time.Hour))
	}
	if n := s.target(at.Add(time.Hour)); n != 1024/120 {
		t.Fatalf("after a burst: %d, want the budget's %d", n, 1024/120)
	}
	small := newPoolSizer(2, 3, 1<<20)
	for range 100 {
		small.arrive(t0)
	}
	if n := small.target(t0); n != 3 {
		t.Fatalf("with a ceiling of 3: %d", n)
	}
	// A budget below the floor keeps the floor.
	tight := newPoolSizer(2, 64, 100)
	for range 100 {
		tight.arrive(t0)
	}
	if n := tight.target(t0); n != 2 {
		t.Fatalf("a budget for less than the floor: %d, want 2", n)
	}
}

// With a memory budget the pool grows while creates come back to back,
// serves them, and gives the surplus back once they stop.
func TestAdaptivePool(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	clk := &clock{t: time.Now()}
	h.m.now = clk.now
	h.m.cfg.PoolMemoryMB = 4 // the fake's sandboxes hold 1 MiB each: at most 4
	tpl := h.warmBase()
	h.tpls.tpl = tpl
	// A restore takes half a second of the clock.
	h.rt.restoreErr = func(pandastack.RuntimeSpec) error { clk.advance(500 * time.Millisecond); return nil }
	h.m.EnablePool(tpl, 1)
	waitFor(t, func() bool { return h.m.Pools(ctx)["base"].Ready == 1 })
	for range 8 {
		clk.advance(200 * time.Millisecond)
		sb := h.create()
		if err := h.m.Kill(ctx, project, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	// Each refill moves the clock, which moves the target a little: look
	// again (as every claim and tick does) until the pool has caught up.
	kick := func() {
		select {
		case h.m.pools["base"].kick <- struct{}{}:
		default:
		}
	}
	var st PoolStats
	waitFor(t, func() bool {
		kick()
		st = h.m.Pools(ctx)["base"]
		return st.Ready == st.Size && h.m.pools["base"].filling.Load() == 0
	})
	if st.Size < 2 || st.Size > 4 {
		t.Fatalf("after 8 creates back to back the pool's size is %d, want 2 to 4 (the budget)", st.Size)
	}
	if n := len(h.rt.ids()); n != st.Size {
		t.Fatalf("the runtime holds %d sandboxes, want the %d ready", n, st.Size)
	}
	// Demand gone for an hour: back to one, the rest stopped.
	clk.advance(time.Hour)
	kick()
	waitFor(t, func() bool { return len(h.rt.ids()) == 1 })
	if st := h.m.Pools(ctx)["base"]; st.Size != 1 || st.Ready != 1 {
		t.Fatalf("an hour later: %+v, want size 1, ready 1", st)
	}
}

// A refill waits while creates are under way, and after them while the
// host's CPUs are busy, until refillQuiet has passed since the last one.
func TestRefillYieldsToCreates(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	clk := &clock{t: time.Now()}
	h.m.now = clk.now
	var mu sync.Mutex
	idle, samples := 64.0, 0
	h.m.idleCPUs = func(context.Context, time.Duration) (float64, error) {
		time.Sleep(time.Millisecond) // a sample takes a while, as the real one does
		mu.Lock()
		defer mu.Unlock()
		samples++
		return idle, nil
	}
	setIdle := func(v float64) {
		mu.Lock()
		idle, samples = v, 0
		mu.Unlock()
	}
	sampled := func() int {
		mu.Lock()
		defer mu.Unlock()
		return samples
	}
	restores := func() int {
		h.rt.mu.Lock()
		defer h.rt.mu.Unlock()
		return h.rt.restores
	}
	tpl := h.warmBase()
	h.tpls.tpl = tpl
	h.m.EnablePool(tpl, 1)
	waitFor(t, func() bool { return h.m.Pools(ctx)["base"].Ready == 1 })

	// Busy host: the create's claim starts a refill, which only samples.
	setIdle(0.1)
	before := restores()
	h.create()
	waitFor(t, func() bool { return sampled() >= 3 })
	if n := restores(); n != before {
		t.Fatalf("%d refills restored while the host was busy right after a create", n-before)
	}
	// A create under way holds it back whatever the host's load.
	h.m.creates.Add(1)
	setIdle(64)
	clk.advance(refillQuiet)
	time.Sleep(3 * refillSample) // a few of the refill's looks
	if n := restores(); n != before {
		t.Fatalf("%d refills restored while a create was under way", n-before)
	}
	h.m.creates.Add(-1)
	waitFor(t, func() bool { return h.m.Pools(ctx)["base"].Ready == 1 })

	// Busy host, but no create for refillQuiet: the pool refills anyway.
	setIdle(0)
	before = restores()
	h.create()
	waitFor(t, func() bool { return sampled() >= 2 })
	if n := restores(); n != before {
		t.Fatalf("%d refills restored on a busy host right after a create", n-before)
	}
	clk.advance(refillQuiet)
	waitFor(t, func() bool { return h.m.Pools(ctx)["base"].Ready == 1 })
}

// A create waits for a pool's restore under way only if, by the refill
// time measured so far, it should be ready sooner than the create's own
// restore would be; each waiting create counts on the next oldest one.
func TestPoolWaitsOnlyForARestoreAboutReady(t *testing.T) {
	p := &pool{size: newPoolSizer(1, poolCeiling, 0)}
	now := time.Unix(1000, 0)
	if !p.readySoon(1, now) {
		t.Error("no refill time measured yet: a create should wait, as before")
	}
	p.size.refilled(300*time.Millisecond, 0)
	p.restoreBegan(now.Add(-250 * time.Millisecond)) // about 50 ms to go
	p.restoreBegan(now.Add(-20 * time.Millisecond))  // about 280 ms to go
	if !p.readySoon(1, now) {
		t.Error("the first create should wait for the restore about to be ready")
	}
	if p.readySoon(2, now) {
		t.Error("the second create should restore its own rather than wait for one just begun")
	}
	if p.readySoon(3, now) {
		t.Error("a third create has no restore to wait for")
	}
	p.restoreEnded(now.Add(-250 * time.Millisecond))
	if p.readySoon(1, now) {
		t.Errorf("after the first restore ended, the one just begun counts: %v", p.started)
	}
	if !p.readySoon(1, now.Add(200*time.Millisecond)) {
		t.Error("the restore begun 220 ms ago should be about ready")
	}
}
