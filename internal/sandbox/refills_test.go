package sandbox

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestRefillsPaced: creates restored from an image hold their spares'
// refills, and the pacer ends the holds oldest first, one per
// refillSpacing, only once the host is quiet (no create for refillCalm, a
// CPU idle), or after refillMaxHold regardless; a stopped sandbox's hold is
// dropped, and a cold boot (the warm-up) takes none.
func TestRefillsPaced(t *testing.T) {
	setFor(t, &refillSpacing, 50*time.Millisecond)
	setFor(t, &refillLook, 5*time.Millisecond)
	h := newHarness(t)
	clk := &clock{t: time.Now()}
	h.m.now = clk.now
	var mu sync.Mutex
	idle := 0.0
	h.m.idleCPUs = func(context.Context, time.Duration) (float64, error) {
		time.Sleep(time.Millisecond)
		mu.Lock()
		defer mu.Unlock()
		return idle, nil
	}
	setIdle := func(v float64) {
		mu.Lock()
		idle = v
		mu.Unlock()
	}
	unholds := func() []string {
		h.rt.mu.Lock()
		defer h.rt.mu.Unlock()
		var out []string
		for _, e := range h.rt.suspendLog {
			if id, ok := strings.CutPrefix(e, "unhold "); ok {
				out = append(out, id)
			}
		}
		return out
	}
	h.tpls.tpl = h.warmBase()
	a, b, c := h.create(), h.create(), h.create()

	// Busy host, and creates just ended: nothing is released.
	clk.advance(refillCalm)
	time.Sleep(20 * refillLook)
	if u := unholds(); len(u) != 0 {
		t.Fatalf("released on a busy host: %v", u)
	}
	// A stopped sandbox's hold goes with it.
	if err := h.m.Kill(context.Background(), project, a.ID); err != nil {
		t.Fatal(err)
	}
	// Quiet: the oldest left first, then the next, refillSpacing apart.
	setIdle(1.5)
	waitFor(t, func() bool { return len(unholds()) == 1 })
	if u := unholds(); u[0] != b.ID {
		t.Fatalf("first release %v, want the oldest running, %s", u, b.ID)
	}
	waitFor(t, func() bool { return len(unholds()) == 2 })
	if u := unholds(); !slices.Equal(u, []string{b.ID, c.ID}) {
		t.Fatalf("releases %v, want %s then %s (not the stopped %s)", u, b.ID, c.ID, a.ID)
	}

	// A busy host past refillMaxHold: released anyway.
	setIdle(0)
	d := h.create()
	time.Sleep(20 * refillLook)
	if u := unholds(); len(u) != 2 {
		t.Fatalf("released on a busy host: %v", u)
	}
	clk.advance(refillMaxHold)
	waitFor(t, func() bool { return len(unholds()) == 3 })
	if u := unholds(); u[2] != d.ID {
		t.Fatalf("releases %v, want %s last", u, d.ID)
	}
}

// TestRefillsUnpaced: with UnpacedRefills no hello holds the refills.
func TestRefillsUnpaced(t *testing.T) {
	h := newHarness(t)
	h.m.cfg.UnpacedRefills = true
	h.tpls.tpl = h.warmBase()
	sb := h.create()
	c := h.m.sbx.client(sb.ID)
	if c == nil || c.heldSpares {
		t.Fatalf("client %v: the hello held the refills", c)
	}
	h.m.refills.mu.Lock()
	n := len(h.m.refills.held)
	h.m.refills.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d holds for the pacer, want none", n)
	}
}
