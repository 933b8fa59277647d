package main

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"github.com/pandastack/pandastack/internal/pagecache"
	"github.com/pandastack/pandastack/internal/paths"
)

// idleCold measures the resume of an idle-suspended sandbox whose paused
// image has left the host's page cache, as it has when the resume comes
// minutes after the suspend: memory pressure drops file pages nobody reads,
// and on the project's VM the kernel's DAMON reclaim pages them out after
// 60 s unread (a 110 MB file there lost a third of its pages in 4 idle
// minutes). The idle section resumes within a second of the suspend, its
// image still cached. Each round, on each side, the sandbox suspends itself
// twice: once it is resumed as it is (image cached), once after the bench
// dropped its image's pages (posix_fadvise DONTNEED on each of its files);
// the two take turns going first, and with -baseline the sides do too.
func (b *bench) idleCold(ctx context.Context) error {
	type side struct {
		name      string
		s         *server
		id        string
		hot, cold []float64
		resident  []float64
		steps     [2]map[string][]float64 // by mode: hot, cold
		order     []string
	}
	sides := []*side{{name: "", s: b.pool}}
	if b.baseline != nil {
		sides = append(sides, &side{name: "baseline (-baseline): ", s: b.baseline})
	}
	servers := make([]*server, len(sides))
	for i, sd := range sides {
		servers[i] = sd.s
	}
	ids, done, err := idleSandboxes(ctx, servers)
	defer done()
	if err != nil {
		return err
	}
	for i, sd := range sides {
		sd.id, sd.steps = ids[i], [2]map[string][]float64{{}, {}}
	}
	const hot, cold = 0, 1
	for r := range b.set.N {
		order := slices.Clone(sides)
		modes := []int{hot, cold}
		if r%2 == 1 {
			slices.Reverse(order)
			slices.Reverse(modes)
		}
		for _, sd := range order {
			s := sd.s
			for _, mode := range modes {
				want := fmt.Sprint(2*r + mode)
				if err := expectText(ctx, s.c, sd.id, "x = "+want+"\nx", want); err != nil {
					return err
				}
				if err := waitSuspended(ctx, s.c, sd.id); err != nil {
					return err
				}
				if err := waitStopped(ctx, s, sd.id); err != nil {
					return err
				}
				// Its resume prepared and its image held before the drop,
				// whichever came first of the old sandbox's end and the
				// new container (waitStopped): a drop before the hold
				// measured a hold that reads the image back.
				if err := waitPrepared(ctx, s, sd.id); err != nil {
					return err
				}
				if mode == cold {
					left, err := dropCache(filepath.Join(s.dataDir, "paused", sd.id))
					if err != nil {
						return err
					}
					sd.resident = append(sd.resident, 100*left)
				}
				if err := b.gate.wait(ctx); err != nil {
					return err
				}
				from := len(s.log.String())
				t0 := time.Now()
				if err := expectText(ctx, s.c, sd.id, "x", want); err != nil {
					return fmt.Errorf("%safter an idle suspend: %w", sd.name, err)
				}
				took := ms(time.Since(t0))
				if mode == cold {
					sd.cold = append(sd.cold, took)
				} else {
					sd.hot = append(sd.hot, took)
				}
				// The first resume logged after the request began is its own.
				steps, order := firstResumeSteps(s.log.String()[from:], sd.id)
				for _, k := range order {
					if !slices.Contains(sd.order, k) {
						sd.order = append(sd.order, k)
					}
					sd.steps[mode][k] = append(sd.steps[mode][k], steps[k])
				}
			}
		}
	}
	for _, sd := range sides {
		b.add(summarize("idle-cold", sd.name+"resume of an idle-suspended sandbox → first result, image in the page cache", "ms", sd.hot,
			"as the idle section: the run_code that resumes it until its result"))
		st := summarize("idle-cold", sd.name+"resume of an idle-suspended sandbox → first result, image dropped from the page cache", "ms", sd.cold,
			"the same sandbox, alternating: its paused image's pages dropped (posix_fadvise DONTNEED) before the run_code, as a resume minutes after the suspend finds it")
		if sd.name == "" {
			st = st.withTarget(targetIdleResumeP50, targetIdleResumeP95, "issue 13")
		}
		b.add(st)
		b.add(summarize("idle-cold", sd.name+"share of the image still in the page cache after the drop", "%", sd.resident,
			"mincore over the paused image's files, right after the drop"))
		for mode, what := range []string{"image cached", "image dropped"} {
			for _, k := range sd.order {
				b.add(summarize("idle-cold", sd.name+"resume step, "+what+": "+k, "ms", sd.steps[mode][k],
					"from the server's log line \"sandbox resumed\" of the timed resume"))
			}
		}
	}
	b.gate.report(b, "idle-cold")
	return nil
}

// firstResumeSteps is the *_ms fields of the first "sandbox resumed" line
// about sandbox id in log, in their order.
func firstResumeSteps(log, id string) (map[string]float64, []string) {
	steps, order := resumeSteps(log, id)
	first := map[string]float64{}
	for _, k := range order {
		first[k] = steps[k][0]
	}
	return first, order
}

// preparesResumes says whether the bench's servers prepare the resumes of
// the sandboxes suspended last: they inherit the bench's environment, and
// serve's default is 4.
func preparesResumes() bool {
	v, ok := os.LookupEnv("PANDASTACK_PREPARED_RESUMES")
	n, err := strconv.Atoi(v)
	return !ok || v == "" || err != nil || n > 0
}

// waitPrepared waits until the server has prepared the resume of the
// suspended sandbox id (its container created, waiting for the image;
// the server holds the image before it creates the container), when
// the servers prepare resumes at all.
func waitPrepared(ctx context.Context, s *server, id string) error {
	if !preparesResumes() {
		return nil
	}
	ok, err := pollUntil(ctx, 30*time.Second, func() bool { return containerStatus(s, id) == "created" })
	if err == nil && !ok {
		err = fmt.Errorf("the resume of %s was not prepared 30 s after its suspend (PANDASTACK_PREPARED_RESUMES=0 runs the section without prepared resumes)", id)
	}
	return err
}

// dropCache drops the page cache of every file under dir (a paused image
// is synced before the server records it, so its pages are clean and go)
// and returns the share of dir's bytes still cached afterwards.
func dropCache(dir string) (float64, error) {
	var total, cached int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pagecache.Drop(f); err != nil {
			return err
		}
		n, size, err := pagecache.Resident(f)
		total += size
		cached += n
		return err
	})
	if err != nil || total == 0 {
		return 0, err
	}
	return float64(cached) / float64(total), nil
}

// coldCreates measures the creates that restore a template's warm image
// (no pool) once the host has dropped that image from its page cache, as
// the first create after a quiet spell of minutes meets it: on the servers
// without a pool (with -baseline, the other revision's too), creates with
// the warm images as they are alternate with creates right after the bench
// dropped every warm image under the cache, and the server's runsc binary,
// from the page cache (what a server holds stays: that is the point).
func (b *bench) coldCreates(ctx context.Context) error {
	sides := b.createSides(false)
	hot := make([][]float64, len(sides))
	cold := make([][]float64, len(sides))
	resident := make([][]float64, len(sides))
	runscLeft := make([][]float64, len(sides))
	warm := filepath.Join(paths.CacheDir(), "warm")
	for r := range b.set.N {
		type turn struct {
			side int
			cold bool
		}
		var turns []turn
		for k := range sides {
			turns = append(turns, turn{k, false}, turn{k, true})
		}
		if r%2 == 1 {
			slices.Reverse(turns)
		}
		for _, tn := range turns {
			if err := b.gate.wait(ctx); err != nil {
				return err
			}
			if tn.cold {
				left, err := dropCache(warm)
				if err != nil {
					return err
				}
				resident[tn.side] = append(resident[tn.side], 100*left)
				// So is the server's runsc binary, which a quiet spell
				// pages out as well.
				left, err = dropCache(sides[tn.side].s.runsc)
				if err != nil {
					return err
				}
				runscLeft[tn.side] = append(runscLeft[tn.side], 100*left)
			}
			d, _, err := sides[tn.side].s.createRunKill(ctx)
			if err != nil {
				return err
			}
			if tn.cold {
				cold[tn.side] = append(cold[tn.side], d)
			} else {
				hot[tn.side] = append(hot[tn.side], d)
			}
		}
	}
	for k, sd := range sides {
		b.add(summarize("create-cold", "create code-interpreter → first run_code, no pool, warm image in the page cache"+sd.label, "ms", hot[k],
			"--pool-size 0, alternating with the creates below"))
		b.add(summarize("create-cold", "create code-interpreter → first run_code, no pool, warm images dropped from the page cache"+sd.label, "ms", cold[k],
			"the bench dropped every warm image under the cache and the server's runsc binary from the page cache (posix_fadvise DONTNEED) right before the create"))
		b.add(summarize("create-cold", "share of the warm images still in the page cache after the drop"+sd.label, "%", resident[k],
			"mincore over every warm image under the cache (both revisions' when side by side), right after the drop"))
		b.add(summarize("create-cold", "share of the server's runsc binary still in the page cache after the drop"+sd.label, "%", runscLeft[k],
			"mincore over the runsc the server runs, right after the drop; give -baseline-runsc a copy of it, or the two sides share its pages"))
	}
	b.gate.report(b, "create-cold")
	return nil
}
