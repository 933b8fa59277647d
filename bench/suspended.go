package main

import (
	"context"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/client"
)

// Target of issue 13 (density with idle suspend).
const targetSuspendedCount = 500

// SuspendedDensity is the run of the section "suspended": sandboxes that
// suspend themselves pile up, and at each level a few of them are woken by
// a run_code, timed.
type SuspendedDensity struct {
	Levels     []SuspendedLevel `json:"levels"`
	StopReason string           `json:"stop_reason"`
	// What one suspended sandbox costs the host: its paused image on disk
	// (memory: none); the last level's average.
	ImageMiBEach float64 `json:"image_mib_each"`
	// DiskFreeGiB is what the data dir's file system had free at the start;
	// ProjectedMax is how many suspended sandboxes that disk would hold.
	DiskFreeGiB  float64 `json:"disk_free_gib_at_start"`
	ProjectedMax int     `json:"projected_max_by_disk"`
}

// SuspendedLevel is one level of the run.
type SuspendedLevel struct {
	Sandboxes   int       `json:"sandboxes"` // created and alive
	Suspended   int       `json:"suspended"` // of which paused for idleness when measured
	ImageMiB    float64   `json:"paused_images_mib"`
	MemAvail    string    `json:"mem_available"`
	ResumeMS    []float64 `json:"resume_first_result_ms"` // a random suspended one: run_code → its result
	CreateMSP50 float64   `json:"create_first_result_ms_p50"`
	// After each of those first results, create_code_context in the same
	// sandbox, and how many of those contexts had the warm imports.
	ContextMS   []float64 `json:"context_after_resume_ms"`
	ContextWarm int       `json:"context_after_resume_warm"`
	// What the suspended ones still hold on the host when measured: how
	// many have host processes, and how many a network namespace.
	WithProcesses int `json:"suspended_with_host_processes"`
	WithNetns     int `json:"suspended_with_netns"`
}

// hostFootprint counts the sandboxes among ids that have host processes,
// and those with a network namespace of ours (/run/netns/pandastack-*-ID).
func hostFootprint(s *server, ids []string) (procs, netns int) {
	running := sandboxPIDs(s.runscRoot)
	ents, _ := os.ReadDir("/run/netns")
	for _, id := range ids {
		if len(running[id]) > 0 {
			procs++
		}
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), "pandastack-") && strings.HasSuffix(e.Name(), "-"+id) {
				netns++
				break
			}
		}
	}
	return procs, netns
}

// suspendedDensity creates code-interpreter sandboxes with an idle timeout
// of 1 s one after another on the pooled server; they suspend themselves.
// At 1, 10, 25, 50, 100, 200, 500, at -suspended-max and where it stops it waits until
// all are suspended, then wakes a few at random with run_code and checks
// each answers with its own state, timing it. It stops early when the
// paused images would pass -suspended-disk-gib or leave less than 10 GiB
// free on the shared disk. Everything is killed at the end.
// With -baseline the same run follows on the other revision's server.
func (b *bench) suspendedDensity(ctx context.Context) error {
	d := &SuspendedDensity{}
	b.rep.Suspended = d
	if err := b.suspendedOn(ctx, b.pool, d, ""); err != nil || b.baseline == nil {
		return err
	}
	d = &SuspendedDensity{}
	b.rep.SuspendedBaseline = d
	return b.suspendedOn(ctx, b.baseline, d, "baseline (-baseline): ")
}

// suspendedOn is the run of the section on the server s; name prefixes
// its measurements.
func (b *bench) suspendedOn(ctx context.Context, s *server, d *SuspendedDensity, name string) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.dataDir, &st); err != nil {
		return err
	}
	d.DiskFreeGiB = float64(st.Bavail) * float64(st.Bsize) / (1 << 30)
	var ids []string
	defer func() { s.killAll(ids) }()
	levels := []int{1, 10, 25, 50, 100, 200, 500, 1000}
	var creates []float64
	one := int64(1)
	probes := min(b.set.N, 5)
	for len(ids) < b.set.SuspendedMax {
		t0 := time.Now()
		sb, err := s.c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: ciTemplate, TTLSeconds: sandboxTTL, IdleTimeoutSeconds: &one})
		if err != nil {
			d.StopReason = fmt.Sprintf("create %d failed: %v", len(ids)+1, err)
			break
		}
		s.track(sb.ID)
		ids = append(ids, sb.ID)
		n := len(ids)
		if err := expectText(ctx, s.c, sb.ID, fmt.Sprintf("x = %d\nx", n), fmt.Sprint(n)); err != nil {
			d.StopReason = fmt.Sprintf("sandbox %d did not answer: %v", n, err)
			break
		}
		creates = append(creates, ms(time.Since(t0)))
		// Checked on every create: the average image so far (of the
		// sealed ones: suspends lag behind the creates) times all the
		// sandboxes, the one just made included.
		paused := filepath.Join(s.dataDir, "paused")
		if sealed := sealedImages(paused); sealed > 0 {
			if avg := float64(dirBytes(paused)) / (1 << 30) / float64(sealed); avg*float64(n+1) > b.set.SuspendedDiskGiB {
				d.StopReason = fmt.Sprintf("the paused images would pass %g GiB (-suspended-disk-gib)", b.set.SuspendedDiskGiB)
			}
		}
		if !slices.Contains(levels, n) && n != b.set.SuspendedMax && d.StopReason == "" {
			continue
		}
		for _, id := range ids {
			if err := waitSuspended(ctx, s.c, id); err != nil {
				return err
			}
		}
		lv := SuspendedLevel{Sandboxes: n, Suspended: n, ImageMiB: float64(dirBytes(filepath.Join(s.dataDir, "paused"))) / mib,
			MemAvail: memAvailable(), CreateMSP50: summarize("", "", "", creates, "").Median}
		for _, id := range ids { // the record says paused just before the stop
			if err := waitStopped(ctx, s, id); err != nil {
				return err
			}
		}
		lv.WithProcesses, lv.WithNetns = hostFootprint(s, ids)
		creates = creates[:0]
		for range probes {
			i := rand.IntN(n)
			if err := waitSuspended(ctx, s.c, ids[i]); err != nil {
				return err
			}
			if err := waitStopped(ctx, s, ids[i]); err != nil {
				return err
			}
			t0 := time.Now()
			if err := expectText(ctx, s.c, ids[i], "x", fmt.Sprint(i+1)); err != nil {
				return fmt.Errorf("waking sandbox %d of %d: %w", i+1, n, err)
			}
			lv.ResumeMS = append(lv.ResumeMS, ms(time.Since(t0)))
			// Then a new context, as the recipe makes: the sandbox's spare
			// kernel was shut down for the suspend and is being started
			// again, so this one may get a kernel without the warm-up.
			t0 = time.Now()
			cc, err := s.c.CreateContext(ctx, ids[i], "python", "")
			if err != nil {
				return fmt.Errorf("a context in sandbox %d of %d after its resume: %w", i+1, n, err)
			}
			lv.ContextMS = append(lv.ContextMS, ms(time.Since(t0)))
			ex, err := s.c.RunCode(ctx, ids[i], client.RunRequest{Code: `import sys; all(m in sys.modules for m in ("numpy", "pandas", "matplotlib.pyplot"))`, ContextID: cc.ID})
			if err != nil || ex.Error != nil {
				return fmt.Errorf("a context in sandbox %d of %d after its resume: %v %+v", i+1, n, err, ex)
			}
			if ex.Text == "True" {
				lv.ContextWarm++
			}
			if err := s.c.DeleteContext(ctx, ids[i], cc.ID); err != nil {
				return err
			}
			// Suspended again before the next probe, so that its spare's
			// start does not share the CPU with the next resume.
			if err := waitSuspended(ctx, s.c, ids[i]); err != nil {
				return err
			}
		}
		d.Levels = append(d.Levels, lv)
		d.ImageMiBEach = lv.ImageMiB / float64(n)
		stat := summarize("density", fmt.Sprintf("%sresume → first result with %d sandboxes suspended", name, n), "ms", lv.ResumeMS,
			fmt.Sprintf("a random one of them woken by run_code; paused images %.0f MiB in all, MemAvailable %s", lv.ImageMiB, lv.MemAvail))
		b.add(stat.withTarget(targetIdleResumeP50, targetIdleResumeP95, "issue 13"))
		b.add(summarize("density", fmt.Sprintf("%screate_code_context right after that resume (%d suspended)", name, n), "ms", lv.ContextMS,
			fmt.Sprintf("%d of %d got a warm kernel (numpy, pandas, matplotlib imported)", lv.ContextWarm, len(lv.ContextMS))))
		fmt.Fprintf(os.Stderr, "  %s%d suspended: paused images %.0f MiB (%.0f MiB each), MemAvailable %s; %d with host processes, %d with a network namespace\n",
			name, n, lv.ImageMiB, d.ImageMiBEach, lv.MemAvail, lv.WithProcesses, lv.WithNetns)
		if d.StopReason != "" {
			break
		}
		if err := syscall.Statfs(s.dataDir, &st); err == nil && float64(st.Bavail)*float64(st.Bsize)/(1<<30) < 10 {
			d.StopReason = "less than 10 GiB left free on the shared disk"
			break
		}
	}
	if d.StopReason == "" {
		d.StopReason = fmt.Sprintf("reached the cap of %d sandboxes (-suspended-max)", b.set.SuspendedMax)
	}
	if d.ImageMiBEach > 0 {
		d.ProjectedMax = int(d.DiskFreeGiB * 1024 / d.ImageMiBEach)
	}
	fmt.Fprintf(os.Stderr, "  %sstopped: %s; %.0f GiB free disk would hold %d suspended sandboxes\n", name, d.StopReason, d.DiskFreeGiB, d.ProjectedMax)
	return nil
}

// sealedImages counts the paused images in dir that are complete.
func sealedImages(dir string) int {
	ents, _ := os.ReadDir(dir)
	n := 0
	for _, e := range ents {
		if _, err := os.Stat(filepath.Join(dir, e.Name(), "manifest.json")); err == nil {
			n++
		}
	}
	return n
}

// dirBytes sums the sizes of the files under dir.
func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			if fi, err := e.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
