package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// The quiet gate (-quiet). Servers measured side by side leave work in the
// background of each other's turns: a pool refill after a create, a
// container prepared for the next create, the page load of a restore, the
// image written by an idle suspend. Which turn that work lands in depends on
// the order the bench takes the servers in, and on 2 cores it moved whole
// series by hundreds of ms (docs/code-and-snapshots.md, prepared creates).
// With -quiet, the create and idle sections wait before each timed turn
// until the host's CPUs have been quiet for a window, so every turn starts
// from the same state; the back-to-back series keep no gate (there the
// leftover work is what they measure).

const (
	quietWindow  = 300 * time.Millisecond
	quietBusy    = 0.2 // of all the host's CPUs over quietWindow
	quietLimit   = 15 * time.Second
	quietSection = "  the quiet gate: wait before a timed turn"
)

// cpuTimes is the first line of /proc/stat: busy and all jiffies.
type cpuTimes struct{ busy, total uint64 }

// parseCPUTimes reads the aggregate "cpu" line of /proc/stat; idle and
// iowait count as not busy.
func parseCPUTimes(stat string) (cpuTimes, error) {
	line, _, _ := strings.Cut(stat, "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return cpuTimes{}, fmt.Errorf("/proc/stat: no aggregate cpu line: %q", line)
	}
	var t cpuTimes
	for i, s := range f[1:] {
		if i >= 8 { // guest and guest_nice are already in user and nice
			break
		}
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return cpuTimes{}, fmt.Errorf("/proc/stat: %q: %w", line, err)
		}
		t.total += v
		if i != 3 && i != 4 { // idle, iowait
			t.busy += v
		}
	}
	return t, nil
}

// busyShare is the share of CPU time spent busy between a and b (0 to 1).
func busyShare(a, b cpuTimes) float64 {
	if b.total <= a.total {
		return 0
	}
	return float64(b.busy-a.busy) / float64(b.total-a.total)
}

func readCPUTimes() (cpuTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	return parseCPUTimes(string(b))
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
	prev, err := readCPUTimes()
	if err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(quietWindow):
		}
		cur, err := readCPUTimes()
		if err != nil {
			return err
		}
		if busyShare(prev, cur) <= quietBusy {
			break
		}
		if time.Since(t0) >= quietLimit {
			g.timeouts++
			break
		}
		prev = cur
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
