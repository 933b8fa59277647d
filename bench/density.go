package main

import (
	"context"
	"fmt"
	"os"
	"time"
)

const mib = 1 << 20

// idleSettle is how long a new sandbox idles before its memory is read:
// a lazy restore keeps loading pages for a moment after it answers.
const idleSettle = 3 * time.Second

// refillSettle is long enough for the agent to replace a handed-out warm
// kernel (2 s quiet, then a kernel start and the warm-up: about 6 s here).
const refillSettle = 20 * time.Second

// idlePSS measures the host memory of idle sandboxes: code-interpreter
// served from the pool (an eager restore) and restored lazily on the server
// without pool, alternating, and a cold-booted base sandbox.
func (b *bench) idlePSS(ctx context.Context) error {
	var pooled, lazy, base []float64
	for range min(b.set.N, 5) {
		for _, s := range []*server{b.pool, b.noPool} {
			b.pool.settle(ctx, 30*time.Second)
			sb, _, err := s.createAndRun(ctx)
			if err != nil {
				if sb != nil {
					s.kill(sb.ID)
				}
				return err
			}
			time.Sleep(idleSettle)
			p := float64(sandboxPSS(s.runscRoot, sb.ID)) / mib
			s.kill(sb.ID)
			if s == b.pool {
				pooled = append(pooled, p)
			} else {
				lazy = append(lazy, p)
			}
		}
		sb, err := b.pool.create(ctx, "base")
		if err != nil {
			return err
		}
		time.Sleep(idleSettle)
		base = append(base, float64(sandboxPSS(b.pool.runscRoot, sb.ID))/mib)
		b.pool.kill(sb.ID)
	}
	b.add(summarize("memory", "idle code-interpreter PSS, from the pool", "MiB", pooled, "after run_code(\"1+1\") and 3 s idle; runsc-sandbox + gofer"))
	b.add(summarize("memory", "idle code-interpreter PSS, lazy restore (no pool)", "MiB", lazy, "after run_code(\"1+1\") and 3 s idle"))
	b.add(summarize("memory", "idle base PSS", "MiB", base, "cold boot, 3 s idle"))
	// The first context took the warm kernel; once the sandbox is quiet
	// the agent starts a replacement, which holds a kernel's memory too.
	var refilled []float64
	for range min(b.set.N, 3) {
		sb, _, err := b.noPool.createAndRun(ctx)
		if err != nil {
			if sb != nil {
				b.noPool.kill(sb.ID)
			}
			return err
		}
		time.Sleep(refillSettle)
		refilled = append(refilled, float64(sandboxPSS(b.noPool.runscRoot, sb.ID))/mib)
		b.noPool.kill(sb.ID)
	}
	b.add(summarize("memory", "idle code-interpreter PSS, after its warm kernel was replaced", "MiB", refilled,
		fmt.Sprintf("no pool; after run_code(\"1+1\") (which takes the warm kernel) and %s idle, by when the replacement kernel is warm", refillSettle)))
	b.pool.settle(ctx, 30*time.Second)
	if t, err := b.pool.template(ctx, ciTemplate); err == nil && t.Pool != nil && t.Pool.Ready > 0 {
		per := float64(t.Pool.PSSBytes) / float64(t.Pool.Ready) / mib
		b.add(summarize("memory", fmt.Sprintf("pool: memory held per ready sandbox (%d ready)", t.Pool.Ready), "MiB", []float64{per},
			fmt.Sprintf("GET /v1/templates pool.pss_bytes = %.0f MiB for %d", float64(t.Pool.PSSBytes)/mib, t.Pool.Ready)))
	}
	return nil
}

// Density is the bounded run: how many idle sandboxes fit.
type Density struct {
	Count       int       `json:"count"`       // sandboxes running when it stopped
	StopReason  string    `json:"stop_reason"` // why it stopped
	LimitGiB    float64   `json:"limit_gib"`
	Max         int       `json:"max"`
	TotalPSSMiB float64   `json:"total_pss_mib"`
	CreateMS    []float64 `json:"create_ms"` // each create → first run_code
	PSSMiB      []float64 `json:"total_pss_mib_after_each"`
	MemAvail    string    `json:"mem_available_at_stop"`
}

// density creates idle code-interpreter sandboxes one by one on the server
// without a pool (so every create takes the same path, and the first is a
// fair yardstick) until their summed PSS passes the budget, a create fails,
// a create takes more than DensitySlowX times the first one's time, or
// DensityMax run; then kills them all.
func (b *bench) density(ctx context.Context) error {
	s := b.noPool
	d := &Density{LimitGiB: b.set.DensityGiB, Max: b.set.DensityMax}
	b.rep.Density = d
	var ids []string
	defer func() { s.killAll(ids) }()
	limit := int64(b.set.DensityGiB * (1 << 30))
	for len(ids) < b.set.DensityMax {
		sb, dur, err := s.createAndRun(ctx)
		if sb != nil {
			ids = append(ids, sb.ID)
		}
		if err != nil {
			d.StopReason = fmt.Sprintf("create %d failed: %v", len(ids)+1, err)
			if sb != nil {
				s.kill(sb.ID)
				ids = ids[:len(ids)-1]
			}
			break
		}
		d.CreateMS = append(d.CreateMS, ms(dur))
		var total int64
		all := sandboxPIDs(s.runscRoot)
		for _, id := range ids {
			total += pss(all[id])
		}
		d.PSSMiB = append(d.PSSMiB, float64(total)/mib)
		d.Count, d.TotalPSSMiB = len(ids), float64(total)/mib
		fmt.Fprintf(os.Stderr, "  %2d sandboxes: create %6.0f ms, %6.0f MiB PSS in all\n", len(ids), ms(dur), float64(total)/mib)
		if total > limit {
			d.StopReason = fmt.Sprintf("summed PSS passed %g GiB", b.set.DensityGiB)
			break
		}
		if first := d.CreateMS[0]; len(d.CreateMS) > 1 && ms(dur) > b.set.DensitySlowX*first {
			d.StopReason = fmt.Sprintf("create %d took %.0f ms, more than %g× the first (%.0f ms)", len(ids), ms(dur), b.set.DensitySlowX, first)
			break
		}
	}
	if d.StopReason == "" {
		d.StopReason = fmt.Sprintf("reached the cap of %d sandboxes", b.set.DensityMax)
	}
	d.MemAvail = memAvailable()
	fmt.Fprintf(os.Stderr, "  stopped at %d: %s\n", d.Count, d.StopReason)
	if len(d.CreateMS) > 0 {
		b.add(summarize("density", "density run: create → first run_code", "ms", d.CreateMS, "creates one after another, all kept running"))
	}
	return nil
}
