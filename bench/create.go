package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
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

// createSide is a server of the create and burst sections: this
// revision's, or with -baseline the other revision's, labelled so.
type createSide struct {
	s     *server
	label string // appended to the series' names
}

// createSides returns the servers with a pool (pooled) or without, this
// revision's first.
func (b *bench) createSides(pooled bool) []createSide {
	sides := []createSide{{s: b.noPool}}
	if pooled {
		sides[0].s = b.pool
	}
	if b.baseline != nil {
		bs := b.baselineNoPool
		if pooled {
			bs = b.baseline
		}
		sides = append(sides, createSide{s: bs, label: " (baseline)"})
	}
	return sides
}

// sequentialCreates alternates a create on the pooled server with one on
// the server without a pool (with -baseline, on the other revision's two
// as well), killing each sandbox after its first result; then it makes as
// many creates back to back on each pooled server alone, in two blocks per
// server taking turns, where the pool has only the time of a create and a
// kill to refill. Which creates were served from the pool is counted
// exactly (poolHit).
func (b *bench) sequentialCreates(ctx context.Context) error {
	pools, lazies := b.createSides(true), b.createSides(false)
	pooled := make([][]float64, len(pools))
	lazy := make([][]float64, len(lazies))
	alt := make([]poolSplit, len(pools))
	for i := range b.set.N {
		type turn struct {
			side int
			pool bool
		}
		var turns []turn
		for k := range pools {
			turns = append(turns, turn{k, true}, turn{k, false})
		}
		if i%2 == 1 {
			slices.Reverse(turns)
		}
		for _, tn := range turns {
			s := lazies[tn.side].s
			if tn.pool {
				s = pools[tn.side].s
			}
			if err := b.gate.wait(ctx); err != nil {
				return err
			}
			d, hit, err := s.createRunKill(ctx)
			if err != nil {
				return err
			}
			if tn.pool {
				pooled[tn.side] = append(pooled[tn.side], d)
				alt[tn.side].add(d, hit)
			} else {
				lazy[tn.side] = append(lazy[tn.side], d)
			}
		}
	}
	for k, sd := range pools {
		b.add(summarize("create", fmt.Sprintf("create code-interpreter → first run_code, pool %d%s", b.set.PoolSize, sd.label), "ms", pooled[k],
			fmt.Sprintf("%d sequential creates alternating with the no-pool server; %d served from the pool", len(pooled[k]), len(alt[k].hit))).
			withTarget(targetCreateP50, targetCreateP95, "issue 4"))
	}
	for k, sd := range lazies {
		b.add(summarize("create", "create code-interpreter → first run_code, no pool"+sd.label, "ms", lazy[k],
			"--pool-size 0: each create is a lazy restore (runsc restore --background) of the warm snapshot").
			withTarget(targetCreateP50, targetCreateP95, "issue 4"))
	}
	for k, sd := range pools {
		alt[k].report(b, "sequential, alternating with the no-pool server"+sd.label)
	}
	b.gate.report(b, "create")
	for _, sd := range lazies {
		// The servers' own timing of each create's boot (its log line
		// "sandbox booted"): where a no-pool create's time goes.
		steps, order := logSteps(sd.s.log.String(), `msg="sandbox booted"`, "")
		for _, k := range order {
			b.add(summarize("create", "no-pool create step (server's timing)"+sd.label+": "+k, "ms", steps[k],
				"from the server's log line \"sandbox booted\" (this revision's servers only; the warm-up's boot included)"))
		}
	}

	if err := b.earlyRuns(ctx, lazies); err != nil {
		return err
	}

	b2b := make([][]float64, len(pools))
	split := make([]poolSplit, len(pools))
	for block := range 2 {
		for k, sd := range pools {
			sd.s.settle(ctx, 30*time.Second)
			n := b.set.N / 2
			if block == 0 {
				n = b.set.N - n
			}
			for range n {
				d, hit, err := sd.s.createRunKill(ctx)
				if err != nil {
					return err
				}
				b2b[k] = append(b2b[k], d)
				split[k].add(d, hit)
			}
		}
	}
	for k, sd := range pools {
		b.add(summarize("create", fmt.Sprintf("same, pool %d, back to back on that server alone%s", b.set.PoolSize, sd.label), "ms", b2b[k],
			fmt.Sprintf("%d creates, each right after the kill of the one before, in 2 blocks; %d served from the pool", len(b2b[k]), len(split[k].hit))).
			withTarget(targetCreateP50, targetCreateP95, "issue 4"))
		split[k].report(b, "sequential, back to back"+sd.label)
	}
	return nil
}

// clockCell measures, inside the sandbox, one clock read of a kernel (ns
// per time.monotonic(), over 2000 reads).
const clockCell = "import time\n_t = time.perf_counter()\nfor _ in range(2000): time.monotonic()\nround((time.perf_counter() - _t) / 2000 * 1e9)"

// earlyRuns measures the cells that come right after a no-pool create's
// first result: five run_code("1+1") one after the other, then a cell that
// times the kernel's clock reads. A restored sandbox is slower at first
// (pages it has not touched yet, gVisor's clocks calibrating: until then
// every clock read is a system call); these say by how much. The sides
// take turns, each create killed after its cells.
func (b *bench) earlyRuns(ctx context.Context, sides []createSide) error {
	runs := make([][]float64, len(sides))
	clock := make([][]float64, len(sides))
	for i := range b.set.N {
		order := make([]int, len(sides))
		for k := range order {
			order[k] = k
		}
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, k := range order {
			s := sides[k].s
			if err := b.gate.wait(ctx); err != nil {
				return err
			}
			sb, _, err := s.createAndRun(ctx)
			if err == nil {
				for range 5 {
					t0 := time.Now()
					if err = expectText(ctx, s.c, sb.ID, "1+1", "2"); err != nil {
						break
					}
					runs[k] = append(runs[k], ms(time.Since(t0)))
				}
			}
			var ex *client.Execution
			if err == nil {
				ex, err = s.c.RunCode(ctx, sb.ID, client.RunRequest{Code: clockCell})
			}
			if sb != nil {
				s.kill(sb.ID)
			}
			if err != nil {
				return err
			}
			ns, perr := strconv.ParseFloat(ex.Text, 64)
			if ex.Error != nil || perr != nil {
				return fmt.Errorf("clock cell: %+v %q", ex.Error, ex.Text)
			}
			clock[k] = append(clock[k], ns)
		}
	}
	for k, sd := range sides {
		b.add(summarize("create", "  run_code(\"1+1\") right after a no-pool create's first result"+sd.label, "ms", runs[k],
			"the 2nd to 6th run_code of the sandbox, one after the other"))
		b.add(summarize("create", "  a kernel's clock read right after those"+sd.label, "ns", clock[k],
			"ns per time.monotonic() in the 7th cell, some 100-200 ms after the create; a system call into gVisor's sentry costs microseconds, its VDSO about 100 ns"))
	}
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
	return ms(d), s.poolHit(before, sb.ID), nil
}

// poolHit says whether the pool served the create of id: its runsc
// processes existed before the create was sent (pool sandboxes have their
// final ids from the start), and the server did not log its boot (a
// container prepared for creates, --prepared-creates, exists before too,
// but the create restores into it).
func (s *server) poolHit(before map[string][]int, id string) bool {
	_, ran := before[id]
	return ran && !strings.Contains(s.log.String(), `msg="sandbox booted" sandbox=`+id)
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

// bursts starts b.set.Burst creates at once on each server (with
// -baseline, on the other revision's too, taking turns); each one's
// latency counts from the common start to its first run_code result.
func (b *bench) bursts(ctx context.Context) error {
	var sides []createSide
	pools, lazies := b.createSides(true), b.createSides(false)
	for k := range pools {
		sides = append(sides, pools[k])
	}
	for k := range lazies {
		sides = append(sides, lazies[k])
	}
	for _, sd := range sides {
		s := sd.s
		if s.poolSize == 0 {
			// The CPU one create costs when it has the host to itself
			// (settle waits for nothing without a pool; the container
			// prepared for the next create is made in the background):
			// what a burst must pay per create at the least.
			var one []float64
			for range 5 {
				s.settle(ctx, 30*time.Second)
				srv0 := serverCPU(s)
				sb, _, err := s.createAndRun(ctx)
				cpu := serverCPU(s) - srv0
				sbx := -1.0
				if sb != nil {
					sbx = sandboxCPU(sb.ID)
					s.kill(sb.ID)
				}
				if err != nil {
					return err
				}
				if sb == nil || sbx < 0 {
					return fmt.Errorf("burst: no CPU time in its cgroup for the sandbox of a create")
				}
				one = append(one, cpu+sbx)
			}
			b.add(summarize("burst", "CPU per create one at a time, no pool"+sd.label, "ms", one, fmt.Sprintf("the sandbox's cgroup over its life until its first result (cpuacct: the prepared container's runsc create before the request included) and the server with its runsc commands from the request to the first result, the creates one after another: a burst of n on %d CPUs cannot end sooner than n × this / %d, nor its median create, served in turn, sooner than half that", runtime.NumCPU(), runtime.NumCPU())))
		}
		s.settle(ctx, 30*time.Second)
		// And the host quiet (-quiet): the other side's pool refills
		// after its own burst landed in this one's (a pooled baseline's
		// burst just before: 518 against 259 ms of the host's CPU per
		// create, p95 5.2 s against 2.6).
		if err := b.gate.wait(ctx); err != nil {
			return err
		}
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
		t0, host0, srv0 := time.Now(), readCPUTimes(), serverCPU(s)
		close(start)
		wg.Wait()
		wall := time.Since(t0)
		host1, srv1 := readCPUTimes(), serverCPU(s)
		var sbx float64
		for _, id := range ids {
			if c := sandboxCPU(id); id != "" && c > 0 {
				sbx += c
			}
		}
		var ok []float64
		var failed []string
		hits := 0
		for i := range lat {
			if errs[i] != nil {
				failed = append(failed, errs[i].Error())
				continue
			}
			ok = append(ok, lat[i])
			if s.poolHit(before, ids[i]) {
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
		label := "no pool" + sd.label
		if s.poolSize > 0 {
			label = fmt.Sprintf("pool %d%s", b.set.PoolSize, sd.label)
			b.rep.PoolHits = append(b.rep.PoolHits, PoolHits{Series: "burst" + sd.label, Hits: hits, Creates: b.set.Burst})
		}
		note := fmt.Sprintf("%d creates at once; all done in %.0f ms; %d served from the pool", b.set.Burst, ms(wall), hits)
		if len(failed) > 0 {
			note += fmt.Sprintf("; %d FAILED: %s", len(failed), failed[0])
		}
		b.add(summarize("burst", fmt.Sprintf("burst of %d creates → first run_code, %s", b.set.Burst, label), "ms", ok, note))
		// What the burst cost the CPUs, per create: with c CPUs a burst of
		// n cannot end before n × this / c, whatever the order.
		n := float64(b.set.Burst)
		b.add(summarize("burst", fmt.Sprintf("  CPU per create during the burst, %s", label), "ms", []float64{busyMS(host0, host1) / n}, fmt.Sprintf("every process on the host from the common start to the last first result (/proc/stat), over the %d creates: with the %d CPUs busy throughout, the burst's wall time × CPUs / creates", b.set.Burst, runtime.NumCPU())))
		b.add(summarize("burst", fmt.Sprintf("    the sandboxes' cgroups, %s", label), "ms", []float64{sbx / n}, "cpuacct (sentry, gofer, agent, kernels) over the sandboxes' lives so far: a pool sandbox's restore before the burst, and a prepared container's runsc create, included"))
		b.add(summarize("burst", fmt.Sprintf("    the server and its runsc commands, %s", label), "ms", []float64{(srv1 - srv0) / n}, "the server process's user and system time and its waited-for children's (/proc/<pid>/stat), during the burst"))
		if len(failed) > 0 {
			return fmt.Errorf("%d of %d concurrent creates on %s failed, first: %s", len(failed), b.set.Burst, s.name, failed[0])
		}
	}
	b.gate.report(b, "burst")
	return nil
}
