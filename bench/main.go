// Command bench measures PandaStack on this machine. It builds the binaries,
// starts two `pandastack serve` of its own on free loopback ports with temp
// data dirs (one with the default pool of pre-restored sandboxes, one with
// --pool-size 0), measures everything issue 7 lists, alternating the two
// sides of every comparison so a noisy machine affects both alike, and
// writes bench/results/<date>-<host>.json, a PNG chart beside it (drawn by
// bench/chart.py) and a markdown table on stdout. Everything it creates is
// removed at the end, also after a failure or a Ctrl-C.
//
//	go run ./bench [-n 30] [-quick] [-out bench/results]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/pandastack/pandastack/internal/paths"
)

// Settings are the knobs of one run, recorded in the report.
type Settings struct {
	N            int     `json:"n"`              // repetitions of each sequential measurement
	Burst        int     `json:"burst"`          // concurrent creates in the burst
	Rounds       int     `json:"rounds"`         // rounds of fork and snapshot (each is heavy)
	PoolSize     int     `json:"pool_size"`      // of the server with a pool
	DensityMax   int     `json:"density_max"`    // most sandboxes in the density run
	DensityGiB   float64 `json:"density_gib"`    // PSS budget of the density run
	DensitySlowX float64 `json:"density_slow_x"` // a create this many times slower than the first ends it
	// SuspendedMax and SuspendedDiskGiB bound the section "suspended":
	// sandboxes suspended for idleness, and their paused images on disk.
	SuspendedMax     int      `json:"suspended_max"`
	SuspendedDiskGiB float64  `json:"suspended_disk_gib"`
	StreamMB         int      `json:"stream_mb"`       // exec output of the section stream
	Quiet            bool     `json:"quiet,omitempty"` // the create and idle sections' timed turns wait for a quiet host (quiet.go)
	Only             []string `json:"only,omitempty"`  // the sections run, when not all
}

// sectionKeys name the sections for -only, in the order they run.
var sectionKeys = []string{"recipe", "base", "create", "create-cold", "burst", "runcode", "exec", "stream", "files", "fork", "paused", "snapshot", "restore-profile", "runcode-profile", "stream-profile", "pss", "density", "idle", "idle-cold", "suspended", "languages", "network", "nodes"}

// PoolHits counts the creates of one series that a pool sandbox served.
type PoolHits struct {
	Series  string `json:"series"`
	Hits    int    `json:"hits"`
	Creates int    `json:"creates"`
}

// Report is the JSON the benchmark writes.
type Report struct {
	Date     time.Time `json:"date"`
	Host     string    `json:"host"`
	Command  string    `json:"command"`
	Revision string    `json:"revision"` // git commit measured, "+dirty" with local changes
	Settings Settings  `json:"settings"`
	Baseline string    `json:"baseline,omitempty"` // -baseline: the other revision's binaries
	// BaselineRunsc is the baseline server's runsc (-baseline-runsc), when
	// it differs from the other servers'.
	BaselineRunsc string            `json:"baseline_runsc,omitempty"`
	Machine       map[string]string `json:"machine"`
	Results       []Stat            `json:"results"`
	PoolHits      []PoolHits        `json:"pool_hits,omitempty"`
	Density       *Density          `json:"density,omitempty"`
	// Suspended is the density run with idle suspend (section suspended).
	Suspended *SuspendedDensity `json:"suspended,omitempty"`
	// SuspendedBaseline is the same run on the -baseline server.
	SuspendedBaseline *SuspendedDensity `json:"suspended_baseline,omitempty"`
	// RestoreProfile splits a restore into its steps (section restore-profile).
	RestoreProfile    []RestoreStep `json:"restore_profile,omitempty"`
	RestoreImageBytes int64         `json:"restore_image_bytes,omitempty"`
	// RuncodeProfile counts the system calls of run_code("1+1") (section
	// runcode-profile), for this revision and the -baseline one.
	RuncodeProfile []RuncodeProfile `json:"runcode_profile,omitempty"`
	// StreamProfile counts the system calls in the sandbox per MiB of
	// streamed exec output (section stream-profile), both revisions.
	StreamProfile []StreamProfile `json:"stream_profile,omitempty"`
	// RestorePreparedPSS is the PSS of each container the restore profile
	// made ahead (runsc create, waiting for its restore), in bytes.
	RestorePreparedPSS []int64  `json:"restore_prepared_pss_bytes,omitempty"`
	Errors             []string `json:"errors,omitempty"`
	ServerProblems     []string `json:"server_problems,omitempty"` // WARN/ERROR lines the servers logged
	DurationS          float64  `json:"duration_s"`
}

func main() {
	n := flag.Int("n", 30, "repetitions of each sequential measurement")
	quick := flag.Bool("quick", false, "a smoke run: 3 repetitions, small burst and density run")
	out := flag.String("out", "bench/results", "directory for the JSON report and the chart")
	burst := flag.Int("burst", 20, "concurrent creates in the burst")
	densityMax := flag.Int("density-max", 40, "most sandboxes in the density run")
	baseline := flag.String("baseline", "", "a directory with pandastack and pandastack-agent of another revision: the idle, idle-cold, suspended, create, create-cold, burst, stream, recipe, runcode and fork sections alternate their rounds with servers of those (side by side)")
	baselineRunsc := flag.String("baseline-runsc", "", "with -baseline: the runsc its servers use (default: the same as the others'), to compare runsc builds with the same pandastack binaries")
	suspendedMax := flag.Int("suspended-max", 100, "most sandboxes in the section suspended (each suspends itself)")
	suspendedDisk := flag.Float64("suspended-disk-gib", 12, "most disk the section suspended lets paused images take")
	quiet := flag.Bool("quiet", false, "the create, create-cold, idle and idle-cold sections wait before each timed turn until the host's CPUs are quiet, so no turn shares them with work left by another server's turn (quiet.go)")
	only := flag.String("only", "", "comma-separated sections to run (default all): "+strings.Join(sectionKeys, ","))
	flag.Parse()
	set := Settings{N: *n, Burst: *burst, Rounds: min(*n, 10), PoolSize: 2, DensityMax: *densityMax, DensityGiB: 8, DensitySlowX: 2,
		SuspendedMax: *suspendedMax, SuspendedDiskGiB: *suspendedDisk, StreamMB: 1024, Quiet: *quiet}
	if *quick {
		set.N, set.Burst, set.Rounds, set.DensityMax, set.SuspendedMax = 3, 4, 2, 4, min(set.SuspendedMax, 10)
		set.StreamMB = 256
	}
	if set.N < 1 || set.Burst < 1 || set.DensityMax < 1 {
		fmt.Fprintln(os.Stderr, "bench: -n, -burst and -density-max must be at least 1")
		os.Exit(2)
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "bench:", errNotRoot)
		os.Exit(1)
	}
	if _, err := os.Stat("bench/hostkernel.py"); err != nil {
		fmt.Fprintln(os.Stderr, "bench: run it from the repository's root (go run ./bench)")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *only != "" {
		set.Only = strings.Split(*only, ",")
		for _, k := range set.Only {
			if !slices.Contains(sectionKeys, k) {
				fmt.Fprintf(os.Stderr, "bench: no section %q; sections: %s\n", k, strings.Join(sectionKeys, ","))
				os.Exit(2)
			}
		}
	}
	if err := run(ctx, set, *out, *baseline, *baselineRunsc); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// startWarmServer starts a server and waits until code-interpreter is warm
// (and its pool full); on error nothing is left running.
func startWarmServer(ctx context.Context, name, binDir, runsc string, poolSize int) (*server, error) {
	s, err := startServer(ctx, name, binDir, runsc, poolSize)
	if err != nil {
		return nil, err
	}
	if err := s.waitWarm(ctx, "code-interpreter", 20*time.Minute); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// bench holds one run: its two servers and what it measured so far.
type bench struct {
	set    Settings
	pool   *server // --pool-size 2 (the default)
	noPool *server // --pool-size 0: every code-interpreter create restores lazily
	// baseline runs another revision's binaries (-baseline), for the
	// sections that compare revisions side by side; nil without.
	baseline *server
	// baselineNoPool is the baseline's --pool-size 0 server (for the
	// create and burst sections); nil without -baseline.
	baselineNoPool *server
	rep            *Report
	gate           quietGate // -quiet
}

func (b *bench) add(s Stat) {
	b.rep.Results = append(b.rep.Results, s)
	tgt := ""
	if s.Target > 0 {
		tgt = fmt.Sprintf("  target %g (%s)", s.Target, map[bool]string{true: "met", false: "MISSED"}[s.met()])
	}
	fmt.Fprintf(os.Stderr, "  %-52s median %9.2f %-4s p95 %9.2f  (n=%d)%s\n", s.Name, s.Median, s.Unit, s.P95, s.N, tgt)
}

func run(ctx context.Context, set Settings, outDir, baselineBin, baselineRunsc string) error {
	began := time.Now()
	host, _ := os.Hostname()
	runsc := paths.FindRunsc(os.Getenv("PANDASTACK_RUNSC"), paths.CacheDir())
	if runsc == "" {
		return fmt.Errorf("runsc not found: run ./scripts/setup.sh first")
	}
	rep := &Report{Results: []Stat{}, Date: began.UTC(), Host: host, Command: strings.TrimSpace("go run ./bench " + strings.Join(os.Args[1:], " ")), Revision: revision(), Settings: set, Machine: machine(runsc)}
	rep.Machine["loadavg_start"] = loadAvg()
	rep.Machine["mem_available_start"] = memAvailable()
	cpuStart := readCPUTimes()

	fmt.Fprintln(os.Stderr, "building pandastack and the agent")
	binDir, err := buildBinaries()
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)
	python, err := kernelPython()
	if err != nil {
		return err
	}

	fmt.Fprintf(os.Stderr, "starting a server with --pool-size %d (builds %s if missing, warms code-interpreter)\n", set.PoolSize, buildOnStart)
	pool, err := startWarmServer(ctx, "pool", binDir, runsc, set.PoolSize)
	if err != nil {
		return err
	}
	defer pool.stop()
	fmt.Fprintln(os.Stderr, "starting a server with --pool-size 0")
	noPool, err := startWarmServer(ctx, "no-pool", binDir, runsc, 0)
	if err != nil {
		return err
	}
	defer noPool.stop()
	b := &bench{set: set, pool: pool, noPool: noPool, rep: rep, gate: quietGate{on: set.Quiet}}
	if baselineBin != "" {
		brunsc := runsc
		if baselineRunsc != "" {
			brunsc, rep.BaselineRunsc = baselineRunsc, baselineRunsc
		}
		fmt.Fprintf(os.Stderr, "starting baseline servers from %s (runsc %s) with --pool-size %d and 0\n", baselineBin, brunsc, set.PoolSize)
		if b.baseline, err = startWarmServer(ctx, "baseline", baselineBin, brunsc, set.PoolSize); err != nil {
			return err
		}
		defer b.baseline.stop()
		if b.baselineNoPool, err = startWarmServer(ctx, "baseline-no-pool", baselineBin, brunsc, 0); err != nil {
			return err
		}
		defer b.baselineNoPool.stop()
		rep.Baseline = baselineBin
	}
	roots := []string{pool.runscRoot, noPool.runscRoot}
	if b.baseline != nil {
		roots = append(roots, b.baseline.runscRoot, b.baselineNoPool.runscRoot)
	}
	rep.Machine["other_gvisor_sandboxes_at_start"] = fmt.Sprint(otherSandboxes(roots...))

	sections := []struct {
		key, title string
		fn         func(context.Context) error
	}{
		{"recipe", "the recipe's path: create → create_code_context → plot with PNG; warm context vs the old path", func(ctx context.Context) error { return b.recipes(ctx, python) }},
		{"base", "cold create of a base sandbox → first exec", b.baseCreate},
		{"create", "create code-interpreter → first run_code(\"1+1\"), sequential, pool vs no pool alternating", b.sequentialCreates},
		{"create-cold", "create code-interpreter → first run_code without a pool, the warm image in the page cache vs dropped from it", b.coldCreates},
		{"burst", "create code-interpreter → first run_code, concurrent burst", b.bursts},
		{"runcode", "run_code(\"1+1\"): API vs jupyter_client to a host ipykernel, alternating", func(ctx context.Context) error { return b.runCode(ctx, python) }},
		{"exec", "exec `true`: API vs runsc exec, alternating", b.execTrue},
		{"stream", "exec output streamed to the caller: NDJSON vs binary frames vs runsc exec vs the host", b.streamExec},
		{"files", "2 MB upload and download", b.files},
		{"fork", "fork: each child answering run_code, 1/4/8 children", b.forks},
		{"paused", "fork and snapshot of a sandbox suspended for idleness", b.suspendedForks},
		{"snapshot", "snapshot and restore: warm code-interpreter, and with a 100 MB DataFrame", b.snapshots},
		{"restore-profile", "restore of the warm image, step by step (runsc debug log and our own timings)", b.restoreProfile},
		{"runcode-profile", "system calls of one run_code(\"1+1\") in the sandbox, by thread and call (runsc --strace)", b.runcodeProfiles},
		{"stream-profile", "system calls in the sandbox per MiB of exec output streamed as binary frames, by task and call (runsc --strace)", b.streamProfiles},
		{"pss", "idle memory per sandbox (PSS of its host processes)", b.idlePSS},
		{"density", "density: idle code-interpreter sandboxes until 8 GiB, a failure or a 2× slower create", b.density},
		{"idle", "idle suspend: resume of an idle-suspended sandbox → first result, vs pause + resume", b.idleResume},
		{"idle-cold", "idle suspend: resume → first result with the paused image in the page cache vs dropped from it", b.idleCold},
		{"suspended", "density with idle suspend: code-interpreter sandboxes that suspend themselves, a random one woken at each level", b.suspendedDensity},
		{"languages", "first and second run_code per language (python, bash, javascript, typescript, r, java)", b.languages},
		{"nodes", "several hosts: create through a forwarding node vs direct; restore from object storage on another node vs local", b.nodes},
		{"network", "networking: create → first run_code with networking on and off; HTTP throughput through NAT and the domain proxy vs the host", b.network},
	}
	for _, s := range sections {
		if ctx.Err() != nil {
			break
		}
		if len(set.Only) > 0 && !slices.Contains(set.Only, s.key) {
			continue
		}
		fmt.Fprintf(os.Stderr, "%s\n", s.title)
		b.pool.settle(ctx, 30*time.Second)
		if err := s.fn(ctx); err != nil {
			msg := fmt.Sprintf("%s: %v", s.title, err)
			rep.Errors = append(rep.Errors, msg)
			fmt.Fprintln(os.Stderr, "  FAILED:", err)
		}
	}
	rep.Machine["loadavg_end"] = loadAvg()
	rep.Machine["mem_available_end"] = memAvailable()
	// A virtual machine's hypervisor can take CPU time from it: how much it
	// took during the run says whether the figures were measured on a
	// whole machine.
	rep.Machine["cpu_steal_percent"] = stealPercent(cpuStart, readCPUTimes())
	rep.ServerProblems = append(pool.log.problems(), noPool.log.problems()...)
	if b.baseline != nil {
		rep.ServerProblems = append(rep.ServerProblems, b.baseline.log.problems()...)
		rep.ServerProblems = append(rep.ServerProblems, b.baselineNoPool.log.problems()...)
	}
	if len(rep.ServerProblems) > 50 {
		rep.ServerProblems = rep.ServerProblems[:50]
	}
	rep.DurationS = time.Since(began).Seconds()
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted; nothing written (cleaning up)")
	}

	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return err
	}
	base := filepath.Join(outDir, fmt.Sprintf("%s-%s", rep.Date.Format("2006-01-02"), host))
	js, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(base+".json", append(js, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Fprintln(os.Stderr, "wrote", base+".json")
	chart := exec.Command(python, "bench/chart.py", base+".json", base+".png")
	chart.Stdout, chart.Stderr = os.Stderr, os.Stderr
	if len(set.Only) > 0 {
		fmt.Fprintln(os.Stderr, "no chart: it shows the whole run, and -only chose some sections")
	} else if err := chart.Run(); err != nil {
		rep.Errors = append(rep.Errors, "chart: "+err.Error())
		fmt.Fprintln(os.Stderr, "bench: drawing the chart failed:", err)
	} else {
		fmt.Fprintln(os.Stderr, "wrote", base+".png")
	}
	printTable(rep)
	if len(rep.Errors) > 0 {
		return fmt.Errorf("%d measurement(s) failed: %s", len(rep.Errors), strings.Join(rep.Errors, "; "))
	}
	return nil
}

// revision names the commit measured.
func revision() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	rev := strings.TrimSpace(string(out))
	if st, err := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		rev += "+dirty"
	}
	return rev
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func printTable(rep *Report) {
	m := rep.Machine
	fmt.Printf("Machine: %s cores (%s), %s RAM, kernel %s, runsc %s; load average %s at start, %s at end; %s%% of the CPU time taken by the hypervisor (steal) during the run; %s other gVisor sandboxes running at start.\n\n",
		m["cores"], m["cpu"], m["memory"], m["kernel"], m["runsc"], m["loadavg_start"], m["loadavg_end"], m["cpu_steal_percent"], m["other_gvisor_sandboxes_at_start"])
	if v := m["host_kernel"]; v != "" {
		fmt.Printf("The host kernel of the baselines runs %s.\n\n", v)
	}
	fmt.Printf("| measurement | median | p95 | n | target |\n| --- | --- | --- | --- | --- |\n")
	for _, s := range rep.Results {
		tgt := ""
		if s.Target > 0 {
			tgt = fmt.Sprintf("p50 %s %g", s.cmp(), s.Target)
			if s.TargetP95 > 0 {
				tgt += fmt.Sprintf(", p95 %s %g", s.cmp(), s.TargetP95)
			}
			tgt += fmt.Sprintf(" (%s): %s", s.TargetSource, map[bool]string{true: "met", false: "**missed**"}[s.met()])
		}
		fmt.Printf("| %s | %s %s | %s %s | %d | %s |\n", s.Name, num(s.Median), s.Unit, num(s.P95), s.Unit, s.N, tgt)
	}
	if len(rep.PoolHits) > 0 {
		fmt.Println()
	}
	for _, p := range rep.PoolHits {
		fmt.Printf("- Served from the pool, %s: %d of %d\n", p.Series, p.Hits, p.Creates)
	}
	if d := rep.Density; d != nil {
		fmt.Printf("- Density (server without pool): %d idle code-interpreter sandboxes, %.0f MiB PSS in all (%.0f MiB each); stopped because %s\n",
			d.Count, d.TotalPSSMiB, d.TotalPSSMiB/float64(max(d.Count, 1)), d.StopReason)
	}
	if d := rep.Suspended; d != nil && len(d.Levels) > 0 {
		last := d.Levels[len(d.Levels)-1]
		fmt.Printf("- Density with idle suspend (pooled server): %d code-interpreter sandboxes alive, %d suspended, %.0f MiB of paused images (%.0f MiB each); stopped because %s; the %.0f GiB free on disk at the start would hold %d (target %d)\n",
			last.Sandboxes, last.Suspended, last.ImageMiB, d.ImageMiBEach, d.StopReason, d.DiskFreeGiB, d.ProjectedMax, targetSuspendedCount)
	}
	for _, e := range rep.Errors {
		fmt.Printf("- FAILED: %s\n", e)
	}
}

// num prints a figure with sensible precision.
func num(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	default:
		return fmt.Sprintf("%.2f", x)
	}
}
