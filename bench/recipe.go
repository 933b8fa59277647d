package main

import (
	"context"
	"fmt"
	"time"

	"github.com/pandastack/pandastack/client"
)

// Targets of issue 13 for the recipe's own path.
const (
	targetRecipeP50  = 200
	targetContextP50 = 50
)

// recipeCell is the first cell of the recipe: the data stack and a plot,
// whose PNG must come back.
// hostWarmup readies the host kernel as a template's spare is: the
// warm-up's imports, then a tiny figure rendered and a pandas plot
// formatted for display (the agent's prime).
const hostWarmup = `import io, numpy, pandas, matplotlib.pyplot as plt
import pandas.plotting._matplotlib
_f = plt.figure(figsize=(2, 2)); plt.plot([0, 1], [0, 1], label="x"); plt.title("t"); plt.legend()
_f.savefig(io.BytesIO(), format="png", bbox_inches="tight"); plt.close(_f); del _f
_f = pandas.DataFrame({"x": [0, 1, 2, 3], "y": [0.0, 1.0, 0.5, 1.5]}).plot(x="x", y="y").figure
get_ipython().display_formatter.format(_f); plt.close(_f); del _f`

const recipeCell = `import numpy as np, pandas as pd, matplotlib.pyplot as plt
df = pd.DataFrame({"x": np.arange(20), "y": np.random.rand(20).cumsum()})
df.plot(x="x", y="y")
plt.show()`

// recipeTimes are the steps of one recipe path, and after it the same
// cell again in the same context (run2). cpu is the sandbox's CPU time
// (its cgroup) over the first cell: steadier than the cell's wall time on
// a loaded machine.
type recipeTimes struct{ create, context, run, total, run2, cpu float64 }

// recipe runs the recipe's path on s: create a code-interpreter sandbox,
// create a Python context (cwd "" takes the template's warm spare kernel;
// any other cwd starts a kernel on demand, as every context did before the
// spares), run recipeCell in it until its result with a PNG (the path's
// end), then once more in the same context, then kill it.
func (s *server) recipe(ctx context.Context, cwd string) (recipeTimes, error) {
	var t recipeTimes
	t0 := time.Now()
	sb, err := s.create(ctx, ciTemplate)
	if err != nil {
		return t, fmt.Errorf("create on %s: %w", s.name, err)
	}
	defer s.kill(sb.ID)
	t1 := time.Now()
	cc, err := s.c.CreateContext(ctx, sb.ID, "python", cwd)
	if err != nil {
		return t, fmt.Errorf("create_code_context on %s: %w", s.name, err)
	}
	cpu0 := sandboxCPU(sb.ID)
	t2 := time.Now()
	if err := s.recipeCell(ctx, sb.ID, cc.ID); err != nil {
		return t, err
	}
	t3 := time.Now()
	cpu := sandboxCPU(sb.ID) - cpu0
	// The same cell again: what any run of it costs in this sandbox, apart
	// from what its first run paid once.
	if err := s.recipeCell(ctx, sb.ID, cc.ID); err != nil {
		return t, fmt.Errorf("second run: %w", err)
	}
	t4 := time.Now()
	return recipeTimes{create: ms(t1.Sub(t0)), context: ms(t2.Sub(t1)), run: ms(t3.Sub(t2)), total: ms(t3.Sub(t0)),
		run2: ms(t4.Sub(t3)), cpu: cpu}, nil
}

// recipeCell runs recipeCell in context cid of sandbox id and checks that
// its result has a PNG.
func (s *server) recipeCell(ctx context.Context, id, cid string) error {
	ex, err := s.c.Run(ctx, id, cid, client.RunRequest{Code: recipeCell, TimeoutSeconds: 120})
	if err != nil {
		return fmt.Errorf("run_code on %s: %w", s.name, err)
	}
	if ex.Error != nil {
		return fmt.Errorf("the recipe's cell failed: %s: %s", ex.Error.Name, ex.Error.Value)
	}
	for _, r := range ex.Results {
		if r.PNG != "" {
			return nil
		}
	}
	return fmt.Errorf("the recipe's cell returned no PNG: %+v", ex.Results)
}

// recipes measures the recipe's path, the headline figure: on the pooled
// server a warm context (a spare kernel) alternates with the old path (a
// kernel started on demand, then the imports in the first cell); then the
// warm path on the server without a pool (each create a lazy restore).
//
// The first cell's floor: the same cell in an ipykernel on the host (no
// sandbox, no network hop, no chart extraction), warmed up as a spare is,
// alternating with the warm path.
func (b *bench) recipes(ctx context.Context, python string) error {
	var warm, cold, lazy, base, baseCold []recipeTimes
	var native []float64
	hk, err := startHostKernel(ctx, python)
	if err != nil {
		return err
	}
	defer hk.close()
	b.rep.Machine["host_kernel"] = hk.versions
	if _, _, err := hk.run(ctx, hostWarmup); err != nil {
		return fmt.Errorf("host kernel warm-up: %w", err)
	}
	for i := range b.set.N {
		ms, _, err := hk.run(ctx, recipeCell)
		if err != nil {
			return fmt.Errorf("the recipe's cell on the host: %w", err)
		}
		native = append(native, ms)
		if b.baseline != nil && i%2 == 0 {
			if err := b.baselineRecipe(ctx, &base, ""); err != nil {
				return err
			}
			if err := b.baselineRecipe(ctx, &baseCold, "/tmp"); err != nil {
				return err
			}
		}
		order := []bool{true, false}
		if i%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, isWarm := range order {
			cwd := ""
			if !isWarm {
				cwd = "/tmp" // a cwd of its own: no spare fits
			}
			t, err := b.pool.recipe(ctx, cwd)
			if err != nil {
				return err
			}
			if isWarm {
				warm = append(warm, t)
			} else {
				cold = append(cold, t)
			}
			b.pool.settle(ctx, 30*time.Second)
		}
		if b.baseline != nil && i%2 == 1 {
			if err := b.baselineRecipe(ctx, &baseCold, "/tmp"); err != nil {
				return err
			}
			if err := b.baselineRecipe(ctx, &base, ""); err != nil {
				return err
			}
		}
	}
	for range b.set.N {
		t, err := b.noPool.recipe(ctx, "")
		if err != nil {
			return err
		}
		lazy = append(lazy, t)
	}
	pick := func(ts []recipeTimes, f func(recipeTimes) float64) []float64 {
		xs := make([]float64, len(ts))
		for i, t := range ts {
			xs[i] = f(t)
		}
		return xs
	}
	total := func(t recipeTimes) float64 { return t.total }
	step := func(t recipeTimes) float64 { return t.context }
	run := func(t recipeTimes) float64 { return t.run }
	create := func(t recipeTimes) float64 { return t.create }
	run2 := func(t recipeTimes) float64 { return t.run2 }
	cpu := func(t recipeTimes) float64 { return t.cpu }
	pool := fmt.Sprintf("pool %d", b.set.PoolSize)
	b.add(summarize("recipe", "recipe: create → create_code_context → plot with PNG, warm context, "+pool, "ms", pick(warm, total),
		"the headline: the recipe's own path; the context is the template's spare kernel (warm-up done), alternating with the old path").
		withTarget(targetRecipeP50, 0, "issue 13"))
	b.add(summarize("recipe", "same, old path: kernel started on demand, "+pool, "ms", pick(cold, total),
		"context with a cwd of its own, so no spare fits: a kernel start, then the imports in the first cell (what every context did before)"))
	b.add(summarize("recipe", "same, warm context, no pool", "ms", pick(lazy, total), "each create is a lazy restore of the warm snapshot"))
	b.add(summarize("recipe", "  create_code_context alone, warm, "+pool, "ms", pick(warm, step), "").withTarget(targetContextP50, 0, "issue 13"))
	b.add(summarize("recipe", "  create_code_context alone, old path, "+pool, "ms", pick(cold, step), ""))
	b.add(summarize("recipe", "  create_code_context alone, warm, no pool", "ms", pick(lazy, step), ""))
	b.add(summarize("recipe", "  first cell (imports + plot) alone, warm, "+pool, "ms", pick(warm, run), ""))
	b.add(summarize("recipe", "  first cell (imports + plot) alone, old path, "+pool, "ms", pick(cold, run), ""))
	b.add(summarize("recipe", "  first cell (imports + plot) alone, warm, no pool", "ms", pick(lazy, run), ""))
	b.add(summarize("recipe", "  the same cell run again in that context, warm, "+pool, "ms", pick(warm, run2),
		"right after the first cell: what any run of it costs in the sandbox; the first cell minus this is what the first run pays once"))
	b.add(summarize("recipe", "  the same cell run again in that context, warm, no pool", "ms", pick(lazy, run2), ""))
	b.add(summarize("recipe", "  sandbox CPU of the first cell, warm, "+pool, "ms", pick(warm, cpu),
		"the sandbox cgroup's CPU time over the first cell (kernel, agent, gVisor): steadier than its wall time under load"))
	b.add(summarize("recipe", "  sandbox CPU of the first cell, warm, no pool", "ms", pick(lazy, cpu), ""))
	b.add(summarize("recipe", "  the same cell natively: ipykernel on the host, warmed up alike", "ms", native,
		"jupyter_client's execute_interactive until idle, alternating with the warm path; no sandbox, no API hop, no chart extraction: the floor the cell's rendering sets on this machine"))
	if b.baseline != nil {
		b.add(summarize("recipe", "baseline (-baseline): recipe, warm context, "+pool, "ms", pick(base, total),
			"the other revision's server, alternating round by round with the warm path above"))
		b.add(summarize("recipe", "  baseline (-baseline): first cell alone, warm, "+pool, "ms", pick(base, run), ""))
		b.add(summarize("recipe", "  baseline (-baseline): the same cell run again, warm, "+pool, "ms", pick(base, run2), ""))
		b.add(summarize("recipe", "  baseline (-baseline): sandbox CPU of the first cell, warm, "+pool, "ms", pick(base, cpu), ""))
		b.add(summarize("recipe", "baseline (-baseline): same, old path: kernel started on demand, "+pool, "ms", pick(baseCold, total),
			"the other revision's server, in the same rounds"))
		b.add(summarize("recipe", "  baseline (-baseline): create_code_context alone, old path, "+pool, "ms", pick(baseCold, step), ""))
		b.add(summarize("recipe", "  baseline (-baseline): first cell (imports + plot) alone, old path, "+pool, "ms", pick(baseCold, run), ""))
	}
	b.add(summarize("recipe", "  create alone, "+pool, "ms", pick(append(warm, cold...), create), "both paths"))
	b.add(summarize("recipe", "  create alone, no pool", "ms", pick(lazy, create), ""))
	return nil
}

// baselineRecipe runs the warm recipe once on the -baseline server.
func (b *bench) baselineRecipe(ctx context.Context, into *[]recipeTimes, cwd string) error {
	t, err := b.baseline.recipe(ctx, cwd)
	if err != nil {
		return err
	}
	*into = append(*into, t)
	b.baseline.settle(ctx, 30*time.Second)
	return nil
}
