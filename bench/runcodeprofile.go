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
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/runtime/gvisor"
	"github.com/pandastack/pandastack/internal/sandbox"
)

// RuncodeProfile counts the system calls of one run_code("1+1") inside the
// sandbox, by thread and by call (section runcode-profile).
type RuncodeProfile struct {
	Server string `json:"server"` // "this" or "baseline"
	Runs   int    `json:"runs"`   // cells counted
	// PerRun is the calls one cell made, all threads of the sandbox.
	PerRun float64 `json:"syscalls_per_run"`
	// Threads are the calls per cell of each thread: the agent's, and
	// each kernel thread by its Python name (libzmq's by their own).
	Threads []SyscallCount `json:"threads"`
	// Calls are the calls per cell by thread and system call, most first.
	Calls []SyscallCount `json:"calls"`
}

// SyscallCount is how many calls one cell made, and how long they took in
// all under --strace (blocking calls count their wait).
type SyscallCount struct {
	Thread   string  `json:"thread"`
	Syscall  string  `json:"syscall,omitempty"`
	PerRun   float64 `json:"per_run"`
	USPerRun float64 `json:"us_per_run"`
}

// runcodeProfileRuns is how many cells the profile counts.
const runcodeProfileRuns = 20

// runcodeProfile restores a fresh code-interpreter sandbox of s with
// runsc's --strace on, drives its agent directly (as the server does: the
// default context, from the warm spare), runs warm-up cells, then counts
// the system calls of runcodeProfileRuns cells of "1+1" in the sandbox's
// debug log. Under --strace every call is slower; the counts, not the
// times, are the point.
func (b *bench) runcodeProfile(ctx context.Context, s *server, name string) error {
	src, done, err := profileSource(ctx, s, "runcode-profile")
	if err != nil {
		return err
	}
	defer done()
	snapDir, man, agentBin := src.snapDir, src.man, src.agent
	tmp, cleanup, err := profileTemp("pandastack-bench-runcode-", "-"+name)
	if err != nil {
		return err
	}
	defer cleanup()
	logDir := filepath.Join(tmp, "logs")
	rt, err := gvisor.New(gvisor.Config{Runsc: s.runsc, StateDir: filepath.Join(tmp, "state"), AgentPath: agentBin, DebugLogDir: logDir, Strace: true,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return err
	}
	defer rt.Close()
	id := pandastack.NewID("sbx")
	spec := pandastack.RuntimeSpec{ID: id, RootFS: man.RootFS, CPU: man.CPU, MemoryMB: man.MemoryMB, PIDs: 1024, Lazy: true,
		Env: []string{"PANDASTACK_SANDBOX_ID=" + id}}
	rwc, err := rt.Restore(ctx, spec, filepath.Join(snapDir, "image"))
	if err != nil {
		return fmt.Errorf("runcode profile: restore: %w", err)
	}
	defer rt.Stop(context.Background(), id)
	c, err := sandbox.DialAgent(ctx, id, rwc, true)
	if err != nil {
		return fmt.Errorf("runcode profile: %w", err)
	}
	defer c.Close()

	// The default context, as the server makes it: it takes the warm spare.
	// No replacement spare: its start would be counted with the cells.
	cid := sandbox.DefaultContextID("python")
	if _, err := c.CreateContext(ctx, agentproto.ContextRequest{ID: cid, Language: "python"}); err != nil {
		return fmt.Errorf("runcode profile: %w", err)
	}
	if _, err := c.PrepareSpares(ctx, agentproto.SparesRequest{Language: "python", Count: 0}); err != nil {
		return fmt.Errorf("runcode profile: no spares: %w", err)
	}
	// The server's request: its default timeout and output cap.
	req := agentproto.RunRequest{Code: "1+1", TimeoutMS: 300_000, OutputCap: 1 << 20}
	run := func(code string) (agentproto.Execution, error) {
		r := req
		r.Code = code
		ex, err := c.RunCode(ctx, cid, r, nil)
		if err == nil && ex.Error != nil {
			err = fmt.Errorf("%s: %s", ex.Error.Name, ex.Error.Value)
		}
		return ex, err
	}
	for range 3 {
		if _, err := run("1+1"); err != nil {
			return fmt.Errorf("runcode profile: warm-up: %w", err)
		}
	}
	ex, err := run("import json as _j, os as _o, threading as _t\n" +
		"print(_j.dumps({'pid': _o.getpid(), 'threads': {str(t.native_id): t.name for t in _t.enumerate()}}))\n" +
		"del _j, _o, _t")
	if err != nil {
		return fmt.Errorf("runcode profile: threads: %w", err)
	}
	var kernel struct {
		PID     int               `json:"pid"`
		Threads map[string]string `json:"threads"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(ex.Stdout)), &kernel); err != nil {
		return fmt.Errorf("runcode profile: threads: %q: %w", ex.Stdout, err)
	}
	boot, err := filepath.Glob(filepath.Join(logDir, "*boot*"))
	if err != nil || len(boot) != 1 {
		return fmt.Errorf("runcode profile: want one boot log in %s, found %v", logDir, boot)
	}
	size := func() (int64, error) {
		fi, err := os.Stat(boot[0])
		if err != nil {
			return 0, err
		}
		return fi.Size(), nil
	}
	time.Sleep(200 * time.Millisecond) // let the calls around the last cell settle
	from, err := size()
	if err != nil {
		return err
	}
	for range runcodeProfileRuns {
		if ex, err := run("1+1"); err != nil || ex.Text != "2" {
			return fmt.Errorf("runcode profile: 1+1 gave %q, %v", ex.Text, err)
		}
	}
	to, err := size()
	if err != nil {
		return err
	}
	p, err := countSyscalls(boot[0], from, to, kernel.PID, kernel.Threads, runcodeProfileRuns)
	if err != nil {
		return err
	}
	p.Server = name
	b.rep.RuncodeProfile = append(b.rep.RuncodeProfile, p)
	fmt.Fprintf(os.Stderr, "  %s: %.0f system calls per run_code(\"1+1\") in the sandbox\n", name, p.PerRun)
	for _, t := range p.Threads {
		fmt.Fprintf(os.Stderr, "    %-28s %6.1f\n", t.Thread, t.PerRun)
	}
	for i, cl := range p.Calls {
		if i == 25 {
			break
		}
		fmt.Fprintf(os.Stderr, "    %-28s %-18s %6.1f  %8.0f µs under strace\n", cl.Thread, cl.Syscall, cl.PerRun, cl.USPerRun)
	}
	return nil
}

// straceExit matches the exit line of a system call that runsc --strace
// logs: "[ pid: tid] name X call(args) = ret (0x..) (elapsed)"; a task
// outside the root pid namespace shows "pid(nspid):tid(nstid)".
var straceExit = regexp.MustCompile(`\[\s*(\d+)(?:\(\s*\d+\))?:\s*(\d+)(?:\(\s*\d+\))?\] (\S+) X (\w+)\(.*\) = .*\(([0-9.]+[a-zµ]+)\)$`)

// countSyscalls reads the strace lines in [from, to) of a runsc boot log.
// Threads of the kernel process kpid are named by threads (tid → Python
// thread name); other tasks by their own name.
func countSyscalls(path string, from, to int64, kpid int, threads map[string]string, runs int) (RuncodeProfile, error) {
	f, err := os.Open(path)
	if err != nil {
		return RuncodeProfile{}, err
	}
	defer f.Close()
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return RuncodeProfile{}, err
	}
	type key struct{ thread, call string }
	calls := map[key]*SyscallCount{}
	byThread := map[string]*SyscallCount{}
	total := 0
	sc := bufio.NewScanner(io.LimitReader(f, to-from))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		m := straceExit.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		pid, tid, comm, call := m[1], m[2], m[3], m[4]
		thread := comm
		if pid == strconv.Itoa(kpid) {
			if n, ok := threads[tid]; ok {
				thread = "kernel: " + n
			} else {
				thread = "kernel: " + comm + " (not Python's)"
			}
		}
		var us float64
		if d, err := time.ParseDuration(m[5]); err == nil {
			us = float64(d.Microseconds())
		}
		k := key{thread, call}
		if calls[k] == nil {
			calls[k] = &SyscallCount{Thread: thread, Syscall: call}
		}
		if byThread[thread] == nil {
			byThread[thread] = &SyscallCount{Thread: thread}
		}
		for _, c := range []*SyscallCount{calls[k], byThread[thread]} {
			c.PerRun++
			c.USPerRun += us
		}
		total++
	}
	if err := sc.Err(); err != nil {
		return RuncodeProfile{}, err
	}
	if total == 0 {
		return RuncodeProfile{}, fmt.Errorf("runcode profile: no strace lines in %s", path)
	}
	p := RuncodeProfile{Runs: runs, PerRun: float64(total) / float64(runs)}
	per := func(c *SyscallCount) SyscallCount {
		return SyscallCount{Thread: c.Thread, Syscall: c.Syscall, PerRun: c.PerRun / float64(runs), USPerRun: c.USPerRun / float64(runs)}
	}
	for _, c := range byThread {
		p.Threads = append(p.Threads, per(c))
	}
	for _, c := range calls {
		p.Calls = append(p.Calls, per(c))
	}
	most := func(l []SyscallCount) func(i, j int) bool {
		return func(i, j int) bool {
			if l[i].PerRun != l[j].PerRun {
				return l[i].PerRun > l[j].PerRun
			}
			return l[i].Thread+l[i].Syscall < l[j].Thread+l[j].Syscall
		}
	}
	sort.Slice(p.Threads, most(p.Threads))
	sort.Slice(p.Calls, most(p.Calls))
	return p, nil
}

// runcodeProfiles profiles this revision's sandbox and, with -baseline, the
// other revision's.
func (b *bench) runcodeProfiles(ctx context.Context) error {
	if err := b.runcodeProfile(ctx, b.noPool, "this"); err != nil {
		return err
	}
	if b.baselineNoPool != nil {
		return b.runcodeProfile(ctx, b.baselineNoPool, "baseline")
	}
	return nil
}
