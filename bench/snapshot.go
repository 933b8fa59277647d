package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/client"
)

// forks forks a warm code-interpreter sandbox into 1, 4 and 8 children,
// rotating the order each round. A child's time runs from the fork request
// until that child answers run_code; each child must see the parent's
// variable, set anew before every fork. With -baseline the other
// revision's server forks a parent of its own in every round too, the two
// taking turns first. With -quiet each fork waits, once the token is set,
// for a quiet host: the last fork's children are torn down (their network
// namespaces and cgroups, tens of ms of the host's work, much of it in
// kernel workers) and the container prepared for the next create is
// remade after every fork, and without the gate that work lands in
// whichever fork comes next, on either side.
func (b *bench) forks(ctx context.Context) error {
	sides := []*forkSide{newForkSide(b.pool, "")}
	if b.baseline != nil {
		sides = append(sides, newForkSide(b.baseline, " (baseline)"))
	}
	for _, sd := range sides {
		sd.beforeFork = b.gate.wait
	}
	done, err := startParents(ctx, sides)
	defer done()
	if err != nil {
		return err
	}
	for r := range b.set.Rounds {
		for _, sd := range turnOrder(sides, r) {
			for k := range forkCounts {
				if err := sd.fork(ctx, forkCounts[(r+k)%len(forkCounts)]); err != nil {
					return err
				}
			}
		}
	}
	for _, sd := range sides {
		sd.report(b)
	}
	b.gate.report(b, "fork")
	if err := b.freshForks(ctx); err != nil {
		return err
	}
	return b.readyForks(ctx)
}

// startParents gives each side a warm parent that has answered its first
// run_code; done kills those made, also after an error.
func startParents(ctx context.Context, sides []*forkSide) (done func(), err error) {
	var made []func()
	done = func() {
		for _, kill := range made {
			kill()
		}
	}
	for _, sd := range sides {
		parent, _, err := sd.s.createAndRun(ctx)
		if parent != nil {
			s := sd.s
			made = append(made, func() { s.kill(parent.ID) })
		}
		if err != nil {
			return done, err
		}
		sd.parent = parent
	}
	return done, nil
}

// freshForks forks a parent just after its first run_code, while its agent
// replaces the spare kernel that cell's context took (a kernel's start and
// the template's imports, begun 2 s after the hand-out): what a user who
// forks right after setting a sandbox up meets. Each round makes a new
// parent on each side (the sides take turns going first), waits
// freshForkDelay after its first result, and forks it into freshForkCount.
func (b *bench) freshForks(ctx context.Context) error {
	sides := []*forkSide{newForkSide(b.pool, " (fresh parent)")}
	if b.baseline != nil {
		sides = append(sides, newForkSide(b.baseline, " (fresh parent, baseline)"))
	}
	for _, sd := range sides {
		sd.counts = []int{freshForkCount}
	}
	for r := range min(b.set.Rounds, 5) {
		for _, sd := range turnOrder(sides, r) {
			parent, _, err := sd.s.createAndRun(ctx)
			if err != nil {
				if parent != nil {
					sd.s.kill(parent.ID)
				}
				return err
			}
			sd.parent = parent
			select {
			case <-ctx.Done():
			case <-time.After(freshForkDelay):
			}
			err = sd.fork(ctx, freshForkCount)
			sd.s.kill(parent.ID)
			if err != nil {
				return err
			}
		}
	}
	for _, sd := range sides {
		sd.report(b)
	}
	return nil
}

const (
	freshForkCount = 4
	freshForkDelay = 2500 * time.Millisecond
)

// readyForks forks, into one child, a parent that has been left alone long
// enough to start its spare kernel again and finish its warm-up: what a
// user who forks a sandbox they set up a while ago meets. In the other
// fork series the parent's refill need not come between rounds (since
// session 34 the server paces it), so their images may hold none. Each
// side keeps one parent; before every
// round the bench waits until both parents hold two kernels and use no CPU
// (the spare's start done), then forks each, the sides taking turns first.
func (b *bench) readyForks(ctx context.Context) error {
	sides := []*forkSide{newForkSide(b.pool, " (parent's spare ready)")}
	if b.baseline != nil {
		sides = append(sides, newForkSide(b.baseline, " (parent's spare ready, baseline)"))
	}
	for _, sd := range sides {
		sd.counts = []int{1}
	}
	done, err := startParents(ctx, sides)
	defer done()
	if err != nil {
		return err
	}
	ready := make([]int, len(sides))
	for r := range b.set.Rounds {
		for i, sd := range sides {
			ok, err := waitForSpare(ctx, sd.s, sd.parent.ID)
			if err != nil {
				return err
			}
			if ok {
				ready[i]++
			}
		}
		for _, sd := range turnOrder(sides, r) {
			if err := sd.fork(ctx, 1); err != nil {
				return err
			}
		}
	}
	for i, sd := range sides {
		sd.note = fmt.Sprintf("; the parent's spare kernel was ready (two kernels, no CPU) before %d of %d forks", ready[i], b.set.Rounds)
		sd.report(b)
	}
	return nil
}

// suspendedForks (the paused section) forks, into one child, a parent
// suspended for idleness (idle_timeout_seconds 1): what an agent meets
// that forks a sandbox it left alone for a while. Each side keeps one
// parent; every round sets a fresh token in it (which resumes it), waits
// until it is suspended again and its container stopped, then forks it,
// the sides taking turns first, and notes whether the parent is still
// suspended. Then, once it is suspended again, it snapshots it.
func (b *bench) suspendedForks(ctx context.Context) error {
	sides := []*forkSide{newForkSide(b.pool, " (parent suspended)")}
	if b.baseline != nil {
		sides = append(sides, newForkSide(b.baseline, " (parent suspended, baseline)"))
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
	stayed := make([]int, len(sides))
	for i, sd := range sides {
		sd.counts = []int{1}
		sd.parent = &client.Sandbox{ID: ids[i]}
		sd.beforeFork = func(ctx context.Context) error {
			if err := waitSuspended(ctx, sd.s.c, sd.parent.ID); err != nil {
				return err
			}
			if err := waitStopped(ctx, sd.s, sd.parent.ID); err != nil {
				return err
			}
			return b.gate.wait(ctx)
		}
		sd.afterFork = func(ctx context.Context) {
			if got, err := sd.s.c.GetSandbox(ctx, sd.parent.ID); err == nil && got.State == "paused" {
				stayed[i]++
			}
		}
	}
	// After each fork, once the parent is suspended again: a snapshot of
	// it, timed until its answer, then deleted.
	snaps := map[*forkSide][]float64{}
	snapStayed := map[*forkSide]int{}
	for r := range b.set.Rounds {
		for _, sd := range turnOrder(sides, r) {
			if err := sd.fork(ctx, 1); err != nil {
				return err
			}
			if err := sd.beforeFork(ctx); err != nil {
				return err
			}
			t0 := time.Now()
			snap, err := sd.s.c.CreateSnapshot(ctx, sd.parent.ID, nil)
			if err != nil {
				return fmt.Errorf("snapshot of a suspended sandbox: %w", err)
			}
			snaps[sd] = append(snaps[sd], ms(time.Since(t0)))
			if got, err := sd.s.c.GetSandbox(ctx, sd.parent.ID); err == nil && got.State == "paused" {
				snapStayed[sd]++
			}
			if err := sd.s.c.DeleteSnapshot(ctx, snap.ID); err != nil {
				return err
			}
		}
	}
	for i, sd := range sides {
		sd.note = fmt.Sprintf("; the parent was suspended for idleness before each fork, and still paused after %d of %d", stayed[i], len(sd.call[1]))
		sd.report(b)
		suffix := ""
		if sd.s == b.baseline {
			suffix = " (baseline)"
		}
		b.add(summarize("fork", "snapshot of a suspended sandbox → its answer"+suffix, "ms", snaps[sd],
			fmt.Sprintf("the parent of this series, suspended again after its fork; the sandbox still paused after %d of %d", snapStayed[sd], len(snaps[sd]))))
	}
	// Its own waits, which the next section's report took in until
	// session 52.
	b.gate.report(b, "paused")
	return nil
}

// waitForSpare waits until sandbox id runs two Python kernels (its
// default context's and a spare) and its cgroup used under
// spareQuietCPU of CPU over a second (the spare's start and warm-up
// done), or spareWait passes; it reports whether it saw that.
func waitForSpare(ctx context.Context, s *server, id string) (bool, error) {
	for end := time.Now().Add(spareWait); time.Now().Before(end); {
		res, err := s.c.Exec(ctx, id, client.ExecRequest{Cmd: "ps -eo args | grep -c '^/usr/bin/python3 -Xfrozen_modules'", TimeoutSeconds: 30})
		if err != nil {
			return false, fmt.Errorf("counting the parent's kernels: %w", err)
		}
		cpu0 := sandboxCPU(id)
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(time.Second):
		}
		cpu1 := sandboxCPU(id)
		if strings.TrimSpace(res.Stdout) == "2" && cpu0 >= 0 && cpu1-cpu0 < spareQuietCPU {
			return true, nil
		}
	}
	return false, nil
}

const (
	spareWait     = 90 * time.Second
	spareQuietCPU = 30 // ms of CPU in a second
)

// turnOrder is the order the sides go in round r: each goes first every
// other round, so that neither always follows the other.
func turnOrder(sides []*forkSide, r int) []*forkSide {
	order := slices.Clone(sides)
	if r%2 == 1 {
		slices.Reverse(order)
	}
	return order
}

// forkCounts are the children of the section's forks.
var forkCounts = []int{1, 4, 8}

// forkSide is one server of the fork section, its parent and its figures
// by count of children.
type forkSide struct {
	s      *server
	label  string // appended to the series' names: "" or " (baseline)"
	counts []int  // the counts of children reported: forkCounts unless set
	note   string // appended to the note of each count's main series
	// beforeFork, when set, runs after the parent's token is set and
	// before the fork is timed; afterFork once every child has answered.
	beforeFork func(context.Context) error
	afterFork  func(context.Context)
	parent     *client.Sandbox
	child      map[int][]float64 // each child: fork request → its answer
	call       map[int][]float64 // the fork request alone
	first      map[int][]float64 // each child's run_code after the fork's answer
	cpu        map[int][]float64 // each child's CPU until its answer
	// parentCPU is the parent's CPU during the fork request: mostly its
	// checkpoint (the sentry writing the image).
	parentCPU map[int][]float64
	steps     map[int]map[string][]float64 // the server's breakdown of each fork
	failed    map[int][]string             // the forks that failed, why
}

func newForkSide(s *server, label string) *forkSide {
	sd := &forkSide{s: s, label: label, child: map[int][]float64{}, call: map[int][]float64{}, first: map[int][]float64{},
		cpu: map[int][]float64{}, parentCPU: map[int][]float64{}, steps: map[int]map[string][]float64{}, failed: map[int][]string{}}
	for _, c := range forkCounts {
		sd.steps[c] = map[string][]float64{}
	}
	return sd
}

// fork sets a fresh token in the parent, forks it into count children,
// times each child until run_code("token") answers the parent's value,
// and kills them.
func (sd *forkSide) fork(ctx context.Context, count int) error {
	s := sd.s
	token := randomToken()
	if err := expectText(ctx, s.c, sd.parent.ID, fmt.Sprintf("token = %q\nlen(token)", token), strconv.Itoa(len(token))); err != nil {
		return err
	}
	if sd.beforeFork != nil {
		if err := sd.beforeFork(ctx); err != nil {
			return err
		}
	}
	logged := len(forkLines(s.log.String(), sd.parent.ID))
	cpu0 := sandboxCPU(sd.parent.ID)
	t0 := time.Now()
	kids, err := s.fork(ctx, sd.parent.ID, count)
	cpu1 := sandboxCPU(sd.parent.ID)
	if err != nil {
		// A fork the server gave up on (a child not started within the
		// server's start timeout on a machine others load heavily) is
		// counted and reported, and the rounds go on.
		if ctx.Err() != nil {
			return err
		}
		sd.failed[count] = append(sd.failed[count], err.Error())
		return nil
	}
	call := ms(time.Since(t0))
	sd.call[count] = append(sd.call[count], call)
	if cpu0 >= 0 && cpu1 >= 0 {
		sd.parentCPU[count] = append(sd.parentCPU[count], cpu1-cpu0)
	}
	lat := make([]float64, len(kids))
	used := make([]float64, len(kids))
	errs := make([]error, len(kids))
	var wg sync.WaitGroup
	for i, kid := range kids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = expectText(ctx, s.c, kid.ID, "token", "'"+token+"'")
			lat[i] = ms(time.Since(t0))
			used[i] = sandboxCPU(kid.ID)
		}()
	}
	wg.Wait()
	if sd.afterFork != nil {
		sd.afterFork(ctx)
	}
	// The answer can arrive before the server's log line does: wait for
	// this fork's own line rather than read the last fork's. Only once the
	// children have answered, so that the bench's own reads of the server's
	// whole log do not count in their time (until 2026-12-02 they did; in
	// a run of the runcode and fork sections that made no measurable
	// difference).
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if lines := forkLines(s.log.String(), sd.parent.ID); len(lines) > logged {
			for k, v := range forkSteps(lines[logged]) {
				sd.steps[count][k] = append(sd.steps[count][k], v)
			}
			break
		}
	}
	ids := make([]string, len(kids))
	for i, k := range kids {
		ids[i] = k.ID
	}
	s.killAll(ids)
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("fork child does not see the parent's state: %w", err)
		}
	}
	if len(kids) != count {
		return fmt.Errorf("fork %d made %d children", count, len(kids))
	}
	sd.child[count] = append(sd.child[count], lat...)
	for _, l := range lat {
		sd.first[count] = append(sd.first[count], l-call)
	}
	for _, u := range used {
		if u >= 0 {
			sd.cpu[count] = append(sd.cpu[count], u)
		}
	}
	return nil
}

// forkTargets are issue 13's targets by count of children: fork 1, the
// child answers within 200 ms; fork 8, every child within 600 ms.
var forkTargets = map[int]float64{1: targetForkChild, 8: 600}

func (sd *forkSide) report(b *bench) {
	counts := forkCounts
	if sd.counts != nil {
		counts = sd.counts
	}
	for _, c := range counts {
		note := fmt.Sprintf("%d rounds; from the fork request to the child's first result; every child saw the parent's variable%s", len(sd.call[c]), sd.note)
		if n := len(sd.failed[c]); n > 0 {
			note += fmt.Sprintf("; %d more forks failed, left out: %s", n, strings.Join(sd.failed[c], "; "))
			b.rep.Errors = append(b.rep.Errors, fmt.Sprintf("fork %d%s: %d of %d forks failed", c, sd.label, n, n+len(sd.call[c])))
		}
		st := summarize("fork", fmt.Sprintf("fork %d → each child answers run_code%s", c, sd.label), "ms", sd.child[c], note)
		if t, ok := forkTargets[c]; ok {
			st = st.withTarget(t, 0, "issue 13")
		}
		b.add(st)
	}
	for _, c := range counts {
		b.add(summarize("fork", fmt.Sprintf("fork %d: the fork request alone%s", c, sd.label), "ms", sd.call[c], "checkpoint of the parent + restore of every child"))
	}
	for _, c := range counts {
		for _, st := range forkStepNames {
			if xs := sd.steps[c][st.key]; len(xs) > 0 { // an older server may not log every key
				b.add(summarize("fork", fmt.Sprintf("  fork %d: %s%s", c, st.label, sd.label), st.unit, xs, "the server's log (sandbox forked)"))
			}
		}
		b.add(summarize("fork", fmt.Sprintf("  fork %d: a child's first run_code after the answer%s", c, sd.label), "ms", sd.first[c], "run_code(\"token\") from the fork's answer to its result"))
		b.add(summarize("fork", fmt.Sprintf("  fork %d: the parent's CPU during the fork%s", c, sd.label), "ms", sd.parentCPU[c], "the parent's cgroup (cpuacct) across the fork request: its checkpoint, which writes the image; like the children's CPU, less sensitive to a busy machine than the times"))
		b.add(summarize("fork", fmt.Sprintf("  fork %d: a child's CPU until its answer%s", c, sd.label), "ms", sd.cpu[c], "the child's cgroup (cpuacct): restore, hello, setup and the cell; less sensitive to a busy machine than the times"))
	}
}

// forkStepNames are the keys of the server's "sandbox forked" log line.
var forkStepNames = []struct{ key, label, unit string }{
	{"spares_ms", "the wait for the parent's spare kernels", "ms"},
	{"spares_released", "the parent's ready spare kernels shut down for the fork", "kernels"},
	{"checkpoint_ms", "checkpoint of the parent", "ms"},
	{"image_mb", "the fork image's size", "MB"},
	{"children_ms", "every child restored, wall", "ms"},
	{"children_prepared", "children restored into a container prepared for creates", "children"},
	{"child_restore_ms", "a child's record, network and runsc restore", "ms"},
	{"child_agent_ms", "a child's agent hello", "ms"},
	{"child_setup_ms", "a child's setup (resolver, CA)", "ms"},
	{"child_record_ms", "a child recorded running", "ms"},
}

// forkLines returns the "sandbox forked" lines the server logged for
// parent, oldest first.
func forkLines(log, parent string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `msg="sandbox forked"`) && strings.Contains(l, "sandbox="+parent+" ") {
			out = append(out, l)
		}
	}
	return out
}

// forkSteps reads the *_ms and *_mb figures and the count of prepared
// children of one "sandbox forked" line, by key.
func forkSteps(line string) map[string]float64 {
	out := map[string]float64{}
	for _, f := range strings.Fields(line) {
		k, v, ok := strings.Cut(f, "=")
		if !ok || !(strings.HasSuffix(k, "_ms") || strings.HasSuffix(k, "_mb") || k == "children_prepared" || k == "spares_released") {
			continue
		}
		if x, err := strconv.ParseFloat(v, 64); err == nil {
			out[k] = x
		}
	}
	return out
}

// sandboxCPU is the CPU time the sandbox's cgroup used so far, in ms
// (cgroup v1 cpuacct, or v2 cpu.stat), or -1.
func sandboxCPU(id string) float64 {
	if b, err := os.ReadFile("/sys/fs/cgroup/cpuacct/pandastack/" + id + "/cpuacct.usage"); err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64); err == nil {
			return float64(n) / 1e6
		}
	}
	if b, err := os.ReadFile("/sys/fs/cgroup/pandastack/" + id + "/cpu.stat"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, " "); ok && k == "usage_usec" {
				if n, err := strconv.ParseInt(v, 10, 64); err == nil {
					return float64(n) / 1e3
				}
			}
		}
	}
	return -1
}

func randomToken() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// snapshots snapshots and restores two warm code-interpreter sandboxes, one
// fresh and one holding a 100 MB DataFrame, alternating. Restore time runs
// from POST /v1/sandboxes {snapshot_id} until run_code answers with what
// the parent held.
func (b *bench) snapshots(ctx context.Context) error {
	s := b.pool
	type subject struct {
		label       string
		sb          *client.Sandbox
		check, want string
		snap, rest  []float64
		sizeMB      []float64
	}
	warm := &subject{label: "warm code-interpreter", check: "x", want: "42"}
	big := &subject{label: "code-interpreter + 100 MB DataFrame", check: "df.shape", want: "(1250000, 10)"}
	for _, sub := range []*subject{warm, big} {
		sb, _, err := s.createAndRun(ctx)
		if sb != nil {
			defer s.kill(sb.ID)
		}
		if err != nil {
			return err
		}
		sub.sb = sb
	}
	if err := expectText(ctx, s.c, warm.sb.ID, "x = 42\nx", "42"); err != nil {
		return err
	}
	if err := expectText(ctx, s.c, big.sb.ID, "import numpy as np, pandas as pd\ndf = pd.DataFrame(np.random.rand(1_250_000, 10))\nint(df.memory_usage().sum()) // 10**6", "100"); err != nil {
		return err
	}
	subs := []*subject{warm, big}
	for r := range b.set.Rounds {
		for k := range subs {
			sub := subs[(r+k)%2]
			t0 := time.Now()
			snap, err := s.c.CreateSnapshot(ctx, sub.sb.ID, map[string]string{"bench": "1"})
			if err != nil {
				return fmt.Errorf("snapshot %s: %w", sub.label, err)
			}
			sub.snap = append(sub.snap, ms(time.Since(t0)))
			sub.sizeMB = append(sub.sizeMB, float64(snap.SizeBytes)/1e6)
			t0 = time.Now()
			rs, err := s.restore(ctx, snap.ID)
			if err == nil {
				err = expectText(ctx, s.c, rs.ID, sub.check, sub.want)
			}
			d := time.Since(t0)
			if rs != nil {
				s.kill(rs.ID)
			}
			if derr := s.c.DeleteSnapshot(context.WithoutCancel(ctx), snap.ID); derr != nil && err == nil {
				err = derr
			}
			if err != nil {
				return fmt.Errorf("restore %s: %w", sub.label, err)
			}
			sub.rest = append(sub.rest, ms(d))
		}
	}
	for _, sub := range subs {
		st := summarize("snapshot", "snapshot "+sub.label, "ms", sub.snap, "POST /snapshots; the parent keeps running")
		if sub == warm {
			st = st.withTarget(targetSnapshot, 0, "issue 4")
		}
		b.add(st)
	}
	for _, sub := range subs {
		b.add(summarize("snapshot", "restore "+sub.label+" → run_code", "ms", sub.rest,
			fmt.Sprintf("POST /v1/sandboxes {snapshot_id} until run_code(%q) gives %s", sub.check, sub.want)))
	}
	for _, sub := range subs {
		b.add(summarize("size", "snapshot image, "+sub.label, "MB", sub.sizeMB, "size_bytes of the snapshot"))
	}
	return nil
}
