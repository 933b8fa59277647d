package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/pandastack/pandastack/client"
)

const ciTemplate = "code-interpreter"

// Targets of issue 4 (create and fork) and issue 3 (run_code ratio).
const (
	targetCreateP50 = 150
	targetCreateP95 = 300
	targetForkChild = 200
	targetSnapshot  = 400
	targetRunRatio  = 1.5
)

// createAndRun creates a code-interpreter sandbox and waits for the result
// of run_code("1+1") in it: what a user waits for before a first answer.
func (s *server) createAndRun(ctx context.Context) (*client.Sandbox, time.Duration, error) {
	t0 := time.Now()
	sb, err := s.create(ctx, ciTemplate)
	if err != nil {
		return nil, 0, fmt.Errorf("create on %s: %w", s.name, err)
	}
	if err := expectText(ctx, s.c, sb.ID, "1+1", "2"); err != nil {
		return sb, 0, err
	}
	return sb, time.Since(t0), nil
}

// expectText runs code and checks the main result's text.
func expectText(ctx context.Context, c *client.Client, id, code, want string) error {
	ex, err := c.RunCode(ctx, id, client.RunRequest{Code: code})
	if err != nil {
		return fmt.Errorf("run_code %q in %s: %w", code, id, err)
	}
	if ex.Error != nil {
		return fmt.Errorf("run_code %q in %s: %s: %s", code, id, ex.Error.Name, ex.Error.Value)
	}
	if ex.Text != want {
		return fmt.Errorf("run_code %q in %s: got %q, want %q", code, id, ex.Text, want)
	}
	return nil
}

func (b *bench) baseCreate(ctx context.Context) error {
	var xs []float64
	for range b.set.N {
		t0 := time.Now()
		sb, err := b.pool.create(ctx, "base")
		if err != nil {
			return err
		}
		_, err = b.pool.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}})
		d := time.Since(t0)
		b.pool.kill(sb.ID)
		if err != nil {
			return err
		}
		xs = append(xs, ms(d))
	}
	b.add(summarize("create", "create base → first exec (cold boot)", "ms", xs, "base has no warm snapshot: runsc run + agent hello + exec"))
	return nil
}

// sequentialCreates alternates a create on the pooled server with one on
// the server without a pool, killing each sandbox after its first result;
// then it makes as many creates back to back on the pooled server alone,
// where the pool has only the time of a create and a kill to refill.
// Which creates were served from the pool is counted exactly: a sandbox
// came from the pool when its runsc processes existed before the create
// request was sent (pool sandboxes have their final ids from the start).
func (b *bench) sequentialCreates(ctx context.Context) error {
	var pooled, lazy []float64
	var alt poolSplit
	for i := range b.set.N {
		sides := []*server{b.pool, b.noPool}
		if i%2 == 1 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		for _, s := range sides {
			d, hit, err := s.createRunKill(ctx)
			if err != nil {
				return err
			}
			if s == b.pool {
				pooled = append(pooled, d)
				alt.add(d, hit)
			} else {
				lazy = append(lazy, d)
			}
		}
	}
	b.add(summarize("create", fmt.Sprintf("create code-interpreter → first run_code, pool %d", b.set.PoolSize), "ms", pooled,
		fmt.Sprintf("%d sequential creates alternating with the no-pool server; %d served from the pool", len(pooled), len(alt.hit))).
		withTarget(targetCreateP50, targetCreateP95, "issue 4"))
	b.add(summarize("create", "create code-interpreter → first run_code, no pool", "ms", lazy,
		"--pool-size 0: each create is a lazy restore (runsc restore --background) of the warm snapshot").
		withTarget(targetCreateP50, targetCreateP95, "issue 4"))
	alt.report(b, "sequential, alternating with the no-pool server")

	b.pool.settle(ctx, 30*time.Second)
	var b2b []float64
	var split poolSplit
	for range b.set.N {
		d, hit, err := b.pool.createRunKill(ctx)
		if err != nil {
			return err
		}
		b2b = append(b2b, d)
		split.add(d, hit)
	}
	b.add(summarize("create", fmt.Sprintf("same, pool %d, back to back on that server alone", b.set.PoolSize), "ms", b2b,
		fmt.Sprintf("%d creates, each right after the kill of the one before; %d served from the pool", len(b2b), len(split.hit))).
		withTarget(targetCreateP50, targetCreateP95, "issue 4"))
	split.report(b, "sequential, back to back")
	return nil
}

// createRunKill is one sequential create: create → first result, then kill;
// hit says whether the pool served it.
func (s *server) createRunKill(ctx context.Context) (float64, bool, error) {
	before := sandboxPIDs(s.runscRoot)
	sb, d, err := s.createAndRun(ctx)
	if sb != nil {
		s.kill(sb.ID)
	}
	if err != nil {
		return 0, false, err
	}
	_, hit := before[sb.ID]
	return ms(d), hit, nil
}

// poolSplit sorts one series' creates into pool hits and misses.
type poolSplit struct{ hit, miss []float64 }

func (p *poolSplit) add(d float64, hit bool) {
	if hit {
		p.hit = append(p.hit, d)
	} else {
		p.miss = append(p.miss, d)
	}
}

// report records the count, and the two halves when the series has both.
func (p *poolSplit) report(b *bench, series string) {
	b.rep.PoolHits = append(b.rep.PoolHits, PoolHits{Series: series, Hits: len(p.hit), Creates: len(p.hit) + len(p.miss)})
	fmt.Fprintf(os.Stderr, "  served from the pool (%s): %d of %d\n", series, len(p.hit), len(p.hit)+len(p.miss))
	if len(p.hit) > 0 && len(p.miss) > 0 {
		b.add(summarize("create", "  of which served from the pool", "ms", p.hit, series))
		b.add(summarize("create", "  of which found the pool empty", "ms", p.miss, series+"; restored on demand while the pool refilled"))
	}
}

// bursts starts b.set.Burst creates at once on each server; each one's
// latency counts from the common start to its first run_code result.
func (b *bench) bursts(ctx context.Context) error {
	for _, s := range []*server{b.pool, b.noPool} {
		b.pool.settle(ctx, 30*time.Second)
		before := sandboxPIDs(s.runscRoot)
		lat := make([]float64, b.set.Burst)
		ids := make([]string, b.set.Burst)
		errs := make([]error, b.set.Burst)
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range b.set.Burst {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				sb, d, err := s.createAndRun(ctx)
				if sb != nil {
					ids[i] = sb.ID
				}
				lat[i], errs[i] = ms(d), err
			}()
		}
		t0 := time.Now()
		close(start)
		wg.Wait()
		wall := time.Since(t0)
		var ok []float64
		var failed []string
		hits := 0
		for i := range lat {
			if errs[i] != nil {
				failed = append(failed, errs[i].Error())
				continue
			}
			ok = append(ok, lat[i])
			if _, hit := before[ids[i]]; hit {
				hits++
			}
		}
		var live []string
		for _, id := range ids {
			if id != "" {
				live = append(live, id)
			}
		}
		s.killAll(live)
		label := "no pool"
		if s == b.pool {
			label = fmt.Sprintf("pool %d", b.set.PoolSize)
			b.rep.PoolHits = append(b.rep.PoolHits, PoolHits{Series: "burst", Hits: hits, Creates: b.set.Burst})
		}
		note := fmt.Sprintf("%d creates at once; all done in %.0f ms; %d served from the pool", b.set.Burst, ms(wall), hits)
		if len(failed) > 0 {
			note += fmt.Sprintf("; %d FAILED: %s", len(failed), failed[0])
		}
		b.add(summarize("burst", fmt.Sprintf("burst of %d creates → first run_code, %s", b.set.Burst, label), "ms", ok, note))
		if len(failed) > 0 {
			return fmt.Errorf("%d of %d concurrent creates on %s failed, first: %s", len(failed), b.set.Burst, s.name, failed[0])
		}
	}
	return nil
}
