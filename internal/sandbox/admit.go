package sandbox

import (
	"context"
	"slices"
	"sync"
)

// Restores share the host's CPUs. admission is the line they wait in:
//
//   - Creates take up to limit slots (Config.MaxRestores), first come
//     first served. On an idle host, letting a burst's restores through a
//     few at a time should let the first finish early and bring the median
//     down (20 at once on 2 cores all finish together, 5.6 s p50); on a
//     host busy with other work it cedes that work the CPU and the median
//     grew 1.5-1.8x when measured (docs/code-and-snapshots.md), so it is
//     off by default.
//   - Pool refills (background) restore only while no create restores or
//     waits, so a pool never slows the creates it exists to serve.
type admission struct {
	mu        sync.Mutex
	limit     int             // slots; <= 0: no limit on creates
	running   int             // restores holding a slot
	fgRunning int             // of which creates
	fg, bg    []chan struct{} // waiting, oldest first: creates, and pool refills
}

func newAdmission(limit int) *admission { return &admission{limit: limit} }

// free reports whether a slot is free. a.mu is held.
func (a *admission) free() bool { return a.limit <= 0 || a.running < a.limit }

// acquire waits for a slot and returns its release (call it once). It
// returns at once when nothing stands ahead of the caller and a slot is
// free; ctx cancels the wait, with ctx's error and no slot held.
func (a *admission) acquire(ctx context.Context, background bool) (func(), error) {
	a.mu.Lock()
	ch := make(chan struct{})
	if background {
		a.bg = append(a.bg, ch)
	} else {
		a.fg = append(a.fg, ch)
	}
	a.grant()
	a.mu.Unlock()
	select {
	case <-ch:
		return a.releaser(background), nil
	case <-ctx.Done():
	}
	a.mu.Lock()
	q := &a.fg
	if background {
		q = &a.bg
	}
	if i := slices.Index(*q, ch); i >= 0 {
		*q = slices.Delete(*q, i, i+1)
		a.grant() // a refill may go now that this create does not wait
		a.mu.Unlock()
		return nil, ctx.Err()
	}
	a.mu.Unlock()
	a.releaser(background)() // granted as the wait ended: pass it on
	return nil, ctx.Err()
}

func (a *admission) releaser(background bool) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.running--
			if !background {
				a.fgRunning--
			}
			a.grant()
		})
	}
}

// grant hands free slots to the oldest waiters: creates, then refills
// once no create restores or waits. a.mu is held.
func (a *admission) grant() {
	for len(a.fg) > 0 && a.free() {
		close(a.fg[0])
		a.fg = a.fg[1:]
		a.running++
		a.fgRunning++
	}
	for len(a.bg) > 0 && len(a.fg) == 0 && a.fgRunning == 0 && a.free() {
		close(a.bg[0])
		a.bg = a.bg[1:]
		a.running++
	}
}

// waiting returns how many creates wait in line.
func (a *admission) waiting() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.fg)
}
