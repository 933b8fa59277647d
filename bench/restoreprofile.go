package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/runtime/gvisor"
	"github.com/pandastack/pandastack/internal/sandbox"
)

// RestoreStep is one step of a restore: for ours, its duration; for the
// runsc log's marks, when it happened, in ms from our start of `runsc
// restore` (what a create runs for a template's warm image).
type RestoreStep struct {
	Step   string    `json:"step"`
	Source string    `json:"source"` // "ours" (timed by the bench) or "runsc debug log"
	Median float64   `json:"median_ms"`
	P95    float64   `json:"p95_ms"`
	N      int       `json:"n"`
	Values []float64 `json:"samples_ms"`
}

// runscMarks are the runsc debug log lines that mark a restore's steps, in
// the order they happen (gVisor's own timelines, "Timer for Restore" and
// "Timer for runsc boot"); the first line of each pattern counts, in the
// log of the process named by file ("restore" is the command, "boot" the
// sandbox, "gofer" the gofer). "." takes the file's last line.
var runscMarks = []struct{ step, file, re string }{
	{"restore command started", "restore", `Args: `},
	{"gofer process started", "gofer", `Args: `},
	{"sandbox (sentry) process started", "boot", `Timer for runsc boot: Starting`},
	{"sentry loader created", "boot", `reached midpoint loader created`},
	{"restore RPC received", "boot", `Timeline Restore reached midpoint cm.Restore RPC`},
	{"state file opened", "boot", `reached midpoint created statefile reader`},
	{"memory pages: async load started", "boot", `async page loading started`},
	// A runsc with precompiled filters (scripts/runsc-precompiled) renders
	// one and installs it right after; one without builds it first.
	{"seccomp filters built and installed", "boot", `reached midpoint (seccomp program installed|precompiled seccomp program rendered)`},
	{"kernel state load starts", "boot", `Timeline Restore reached midpoint loading kernel`},
	// The kernel load's own timeline (kernel.LoadFrom): the state file
	// decoded, the network stack restored, then the VFS (every file the
	// image's processes hold, reopened through the gofer or directly).
	{"kernel load: kernel objects decoded", "boot", `reached midpoint Kernel loaded`},
	{"kernel load: network stack restored", "boot", `reached midpoint Network stack restored`},
	{"kernel load: VFS restored", "boot", `reached midpoint VFS restored`},
	{"memory pages: async load done", "boot", `Async page loading completed`},
	{"kernel state loaded (VFS restored)", "boot", `Timeline Restore reached midpoint kernel loaded`},
	{"sandbox kernel started", "boot", `reached midpoint kernel started`},
	{"restore command exits", "restore", `.`},
}

// restoreProfile restores a snapshot of a fresh code-interpreter sandbox
// (what a create restores: the warm image's processes, one warmed-up
// kernel) n times through the gVisor driver with runsc's debug logs on,
// timing each step: runsc restore until it returns (sentry and gofer start,
// kernel state load; memory loads in the background), the agent's hello on
// a new session, and the kernel's first answer (Jupyter reconnect, its
// pages); runsc's own timestamps split the first step.
func (b *bench) restoreProfile(ctx context.Context) error {
	s := b.noPool
	src, done, err := profileSource(ctx, s, "profile")
	if err != nil {
		return err
	}
	defer done()
	snapDir, man, agent := src.snapDir, src.man, src.agent
	tmp, cleanup, err := profileTemp("pandastack-bench-profile-", "")
	if err != nil {
		return err
	}
	defer cleanup()

	steps := map[string][]float64{}
	var order []string
	add := func(step string, ms float64) {
		if _, ok := steps[step]; !ok {
			order = append(order, step)
		}
		steps[step] = append(steps[step], ms)
	}
	var imageBytes int64
	filepath.Walk(filepath.Join(snapDir, "image"), func(_ string, fi os.FileInfo, err error) error {
		if err == nil && !fi.IsDir() {
			imageBytes += fi.Size()
		}
		return nil
	})
	for i := range b.set.N {
		for _, renamed := range []bool{false, true} {
			dir := filepath.Join(tmp, fmt.Sprintf("prepared-%d-%t", i, renamed))
			if err := b.preparedRestore(ctx, dir, s.runsc, agent, man.RootFS, man.CPU, man.MemoryMB, filepath.Join(snapDir, "image"), renamed, add); err != nil {
				return err
			}
		}
		logDir := filepath.Join(tmp, fmt.Sprintf("logs-%d", i))
		rt, err := gvisor.New(gvisor.Config{Runsc: s.runsc, StateDir: filepath.Join(tmp, "state"), AgentPath: agent, DebugLogDir: logDir,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			return err
		}
		id := pandastack.NewID("sbx")
		spec := pandastack.RuntimeSpec{ID: id, RootFS: man.RootFS, CPU: man.CPU, MemoryMB: man.MemoryMB, PIDs: 1024, Lazy: true,
			Env: []string{"PANDASTACK_SANDBOX_ID=" + id}}
		t0 := time.Now()
		rwc, err := rt.Restore(ctx, spec, filepath.Join(snapDir, "image"))
		t1 := time.Now()
		var c *sandbox.AgentClient
		var t2, t3 time.Time
		if err == nil {
			c, err = sandbox.DialAgent(ctx, id, rwc, true)
			t2 = time.Now()
		}
		if err == nil {
			err = c.TouchSpares(ctx) // the kernel's first answer
			t3 = time.Now()
		}
		var spares []agentproto.Spares
		if err == nil {
			spares, err = c.ListSpares(ctx)
		}
		if c != nil {
			c.Close()
		}
		rt.Stop(context.Background(), id)
		rt.Close()
		if err != nil {
			return fmt.Errorf("restore profile: %w", err)
		}
		if len(spares) != 1 || spares[0].Ready != 1 {
			return fmt.Errorf("restore profile: the restored agent has spares %+v, want one ready python kernel", spares)
		}
		add("runsc restore returns (--background --detach)", ms(t1.Sub(t0)))
		add("agent hello on a new session", ms(t2.Sub(t1)))
		add("warm kernel answers a silent cell (Jupyter reconnect, its pages)", ms(t3.Sub(t2)))
		add("total: restore → kernel answers", ms(t3.Sub(t0)))
		if err := addRunscMarks(add, "runsc log, at: ", logDir, t0); err != nil {
			return err
		}
	}
	for _, st := range order {
		xs := steps[st]
		sum := summarize("restore", st, "ms", xs, "")
		src := "ours"
		if strings.Contains(st, "runsc log") {
			src = "runsc debug log"
		}
		b.rep.RestoreProfile = append(b.rep.RestoreProfile, RestoreStep{Step: st, Source: src, Median: sum.Median, P95: sum.P95, N: sum.N, Values: sum.Samples})
		fmt.Fprintf(os.Stderr, "  %-70s median %8.1f ms  p95 %8.1f  (n=%d)\n", st, sum.Median, sum.P95, sum.N)
	}
	b.rep.RestoreImageBytes = imageBytes
	fmt.Fprintf(os.Stderr, "  image restored: %.0f MB\n", float64(imageBytes)/1e6)
	if pss := b.rep.RestorePreparedPSS; len(pss) > 0 {
		fmt.Fprintf(os.Stderr, "  a container prepared ahead holds %.1f MiB PSS (first of %d)\n", float64(pss[0])/(1<<20), len(pss))
	}
	return nil
}

// preparedRestore is one round of the restore profile's second variant:
// the container made ahead with gvisor.Runtime.Prepare (runsc create: gofer
// and sentry started, waiting), then timed from the restore into it until
// the kernel answers. renamed: the third variant, as a resume that takes
// the container prepared for its template's creates does: prepared under
// another id, then renamed (gvisor.Runtime.Rename) to the restored one.
func (b *bench) preparedRestore(ctx context.Context, dir, runsc, agent, rootfs string, cpu, mem int, image string, renamed bool, add func(string, float64)) error {
	logDir := filepath.Join(dir, "logs")
	rt, err := gvisor.New(gvisor.Config{Runsc: runsc, StateDir: filepath.Join(dir, "state"), AgentPath: agent, DebugLogDir: logDir,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	defer rt.Close()
	id := pandastack.NewID("sbx")
	defer rt.Stop(context.Background(), id)
	spec := pandastack.RuntimeSpec{ID: id, RootFS: rootfs, CPU: cpu, MemoryMB: mem, PIDs: 1024, Lazy: true,
		Env: []string{"PANDASTACK_SANDBOX_ID=" + id}}
	label := "prepared ahead: "
	pspec := spec
	if renamed {
		label = "prepared under another id, renamed: "
		pspec.ID = pandastack.NewID("sbx")
		pspec.Env = []string{"PANDASTACK_SANDBOX_ID=" + pspec.ID}
		defer rt.Stop(context.Background(), pspec.ID)
	}
	tp := time.Now()
	if err := rt.Prepare(ctx, pspec, image); err != nil {
		return fmt.Errorf("restore profile: %w", err)
	}
	prep := ms(time.Since(tp))
	if renamed {
		if err := rt.Rename(ctx, pspec.ID, id); err != nil {
			return fmt.Errorf("restore profile: %w", err)
		}
	}
	var pssBytes int64
	if st, err := rt.Stats(ctx, id); err == nil {
		pssBytes = st.PSSBytes
	}
	time.Sleep(100 * time.Millisecond) // as a container made ahead would have: the create's work done
	t0 := time.Now()
	rwc, err := rt.Restore(ctx, spec, image)
	t1 := time.Now()
	var c *sandbox.AgentClient
	var t2, t3 time.Time
	if err == nil {
		c, err = sandbox.DialAgent(ctx, id, rwc, true)
		t2 = time.Now()
	}
	if err == nil {
		err = c.TouchSpares(ctx)
		t3 = time.Now()
	}
	if c != nil {
		c.Close()
	}
	if err != nil {
		return fmt.Errorf("restore profile (prepared): %w", err)
	}
	add(label+"runsc create (not on the restore's path)", prep)
	if !renamed {
		b.rep.RestorePreparedPSS = append(b.rep.RestorePreparedPSS, pssBytes)
	}
	add(label+"runsc restore returns", ms(t1.Sub(t0)))
	add(label+"agent hello", ms(t2.Sub(t1)))
	add(label+"warm kernel answers a silent cell", ms(t3.Sub(t2)))
	add(label+"total: restore → kernel answers", ms(t3.Sub(t0)))
	return addRunscMarks(add, label+"runsc log, at: ", logDir, t0)
}

// addRunscMarks adds, under prefix, when each step of runsc's timeline in
// the debug logs of logDir happened after t0.
func addRunscMarks(add func(string, float64), prefix, logDir string, t0 time.Time) error {
	marks, err := runscTimes(logDir, t0)
	if err != nil {
		return err
	}
	for _, m := range runscMarks {
		if v, ok := marks[m.step]; ok {
			add(prefix+m.step, v)
		}
	}
	return nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// profiled is what a profile restores: the snapshot of a fresh
// code-interpreter sandbox (its directory and manifest) and the host path
// of the agent binary that sandbox runs.
type profiled struct {
	snapDir string
	man     struct {
		RootFS   string `json:"rootfs"`
		CPU      int    `json:"cpu"`
		MemoryMB int    `json:"memory_mb"`
	}
	agent string
}

// profileSource creates a code-interpreter sandbox on s and snapshots it
// for a profile; done deletes the snapshot and kills the sandbox.
func profileSource(ctx context.Context, s *server, label string) (_ profiled, done func(), err error) {
	var p profiled
	sb, err := s.create(ctx, ciTemplate)
	if err != nil {
		return p, nil, err
	}
	snap, err := s.c.CreateSnapshot(ctx, sb.ID, map[string]string{"bench": label})
	if err != nil {
		s.kill(sb.ID)
		return p, nil, err
	}
	done = func() {
		s.c.DeleteSnapshot(context.Background(), snap.ID)
		s.kill(sb.ID)
	}
	p.snapDir = filepath.Join(s.dataDir, "snapshots", snap.ID)
	if err := readJSON(filepath.Join(p.snapDir, "manifest.json"), &p.man); err != nil {
		done()
		return p, nil, err
	}
	if p.agent, err = agentSource(filepath.Join(s.dataDir, "runtime", "sandboxes", sb.ID, "config.json")); err != nil {
		done()
		return p, nil, err
	}
	return p, done, nil
}

// profileTemp makes a profile's temp directory; cleanup removes it, or
// with BENCH_PROFILE_LOGS set moves it there (plus suffix), to read the
// logs afterwards.
func profileTemp(prefix, suffix string) (dir string, cleanup func(), err error) {
	dir, err = os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, err
	}
	if keep := os.Getenv("BENCH_PROFILE_LOGS"); keep != "" {
		return dir, func() { os.Rename(dir, keep+suffix) }, nil
	}
	return dir, func() { os.RemoveAll(dir) }, nil
}

// agentSource finds the host path of the agent binary a sandbox mounts.
func agentSource(configJSON string) (string, error) {
	var spec struct {
		Mounts []struct {
			Destination string `json:"destination"`
			Source      string `json:"source"`
		} `json:"mounts"`
	}
	if err := readJSON(configJSON, &spec); err != nil {
		return "", err
	}
	for _, m := range spec.Mounts {
		if m.Destination == agentproto.AgentPath {
			return m.Source, nil
		}
	}
	return "", fmt.Errorf("no agent mount in %s", configJSON)
}

// glogTime matches the timestamp of a runsc (glog-style) log line, e.g.
// "I1130 23:46:13.472123 ...".
var glogTime = regexp.MustCompile(`^[IWEDF](\d{2})(\d{2}) (\d{2}:\d{2}:\d{2}\.\d{6})`)

// runscTimes reads the debug logs of one restore and returns, for each
// mark found, its time in ms after t0.
func runscTimes(dir string, t0 time.Time) (map[string]float64, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no runsc debug logs in %s", dir)
	}
	sort.Strings(files)
	res := make([]*regexp.Regexp, len(runscMarks))
	for i, mk := range runscMarks {
		res[i] = regexp.MustCompile(mk.re)
	}
	out := map[string]float64{}
	for _, f := range files {
		base := filepath.Base(f)
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		var last time.Time
		for sc.Scan() {
			line := sc.Text()
			m := glogTime.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			ts, err := time.ParseInLocation("2006 0102 15:04:05.000000", fmt.Sprintf("%d %s%s %s", t0.UTC().Year(), m[1], m[2], m[3]), time.UTC)
			if err != nil {
				continue
			}
			last = ts
			for i, mk := range runscMarks {
				if _, done := out[mk.step]; done || !strings.Contains(base, "."+mk.file) || mk.re == "." {
					continue
				}
				if res[i].MatchString(line) {
					out[mk.step] = ms(ts.Sub(t0))
				}
			}
		}
		fh.Close()
		for _, mk := range runscMarks {
			if mk.re == "." && strings.Contains(base, "."+mk.file) && !last.IsZero() {
				out[mk.step] = ms(last.Sub(t0))
			}
		}
	}
	return out, nil
}
