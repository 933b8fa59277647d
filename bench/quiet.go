package main

import (
	"context"
	"fmt"
	"time"

	"github.com/pandastack/pandastack/internal/sandbox"
)

// The quiet gate (-quiet). Servers measured side by side leave work in the
// background of each other's turns: a pool refill after a create, a
// container prepared for the next create, the page load of a restore, the
// image written by an idle suspend. Which turn that work lands in depends on
// the order the bench takes the servers in, and on 2 cores it moved whole
// series by hundreds of ms (docs/code-and-snapshots.md, prepared creates).
// With -quiet, the create, burst, idle, paused and (since session 52) fork
// sections wait before each timed turn until the host's CPUs have been quiet
// for a window, so every turn starts from the same state; the back-to-back
// series and the fork of a fresh parent keep no gate (there the leftover
// work is what they measure).

const (
	quietWindow  = 300 * time.Millisecond
	quietBusy    = 0.2 // of all the host's CPUs over quietWindow
	quietLimit   = 15 * time.Second
	quietSection = "  the quiet gate: wait before a timed turn"
)

// quietEnough says whether idle of the host's cpus CPUs sat idle over a
// window leaves at most quietBusy of them busy.
func quietEnough(idle float64, cpus int) bool {
	return cpus > 0 && 1-idle/float64(cpus) <= quietBusy
}

// quietGate waits, when -quiet is on, until the host was at most quietBusy
// busy over a window, or quietLimit passed; each wait is kept for the
// section's report (report).
type quietGate struct {
	on       bool
	waits    []float64
	timeouts int
}

func (g *quietGate) wait(ctx context.Context) error {
	if !g.on {
		return nil
	}
	t0 := time.Now()
	for {
		// The CPUs /proc/stat counts, not runtime.NumCPU: under a smaller
		// cpuset the idle ones of the whole host made every window quiet.
		idle, cpus, err := sandbox.IdleCPUs(ctx, quietWindow)
		if err != nil {
			return err
		}
		if quietEnough(idle, cpus) {
			break
		}
		if time.Since(t0) >= quietLimit {
			g.timeouts++
			break
		}
	}
	g.waits = append(g.waits, ms(time.Since(t0)))
	return nil
}

// report adds the section's waits, and clears them.
func (g *quietGate) report(b *bench, group string) {
	if !g.on || len(g.waits) == 0 {
		return
	}
	b.add(summarize(group, quietSection, "ms", g.waits,
		fmt.Sprintf("-quiet: before each timed turn, until the host's CPUs were at most %.0f%% busy over %d ms (at most %s: %d turns began at that limit instead)",
			quietBusy*100, quietWindow.Milliseconds(), quietLimit, g.timeouts)))
	g.waits, g.timeouts = nil, 0
}
