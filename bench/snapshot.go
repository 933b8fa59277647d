package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack/client"
)

// forks forks a warm code-interpreter sandbox into 1, 4 and 8 children,
// rotating the order each round. A child's time runs from the fork request
// until that child answers run_code; each child must see the parent's
// variable, set anew before every fork.
func (b *bench) forks(ctx context.Context) error {
	s := b.pool
	parent, _, err := s.createAndRun(ctx)
	if parent != nil {
		defer s.kill(parent.ID)
	}
	if err != nil {
		return err
	}
	counts := []int{1, 4, 8}
	child := map[int][]float64{}
	call := map[int][]float64{}
	cpu := map[int][]float64{}              // each child's CPU until its answer
	steps := map[int]map[string][]float64{} // the server's breakdown of each fork
	for _, c := range counts {
		steps[c] = map[string][]float64{}
	}
	for r := range b.set.Rounds {
		for k := range counts {
			count := counts[(r+k)%len(counts)]
			token := randomToken()
			if err := expectText(ctx, s.c, parent.ID, fmt.Sprintf("token = %q\nlen(token)", token), strconv.Itoa(len(token))); err != nil {
				return err
			}
			t0 := time.Now()
			kids, err := s.fork(ctx, parent.ID, count)
			if err != nil {
				return fmt.Errorf("fork %d: %w", count, err)
			}
			call[count] = append(call[count], ms(time.Since(t0)))
			for k, v := range forkSteps(s.log.String(), parent.ID) {
				steps[count][k] = append(steps[count][k], v)
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
			child[count] = append(child[count], lat...)
			for _, u := range used {
				if u >= 0 {
					cpu[count] = append(cpu[count], u)
				}
			}
		}
	}
	for _, c := range counts {
		b.add(summarize("fork", fmt.Sprintf("fork %d → each child answers run_code", c), "ms", child[c],
			fmt.Sprintf("%d rounds; from the fork request to the child's first result; every child saw the parent's variable", len(call[c]))).
			withTarget(targetForkChild, 0, "issue 4"))
	}
	for _, c := range counts {
		b.add(summarize("fork", fmt.Sprintf("fork %d: the fork request alone", c), "ms", call[c], "checkpoint of the parent + restore of every child"))
	}
	for _, c := range counts {
		for _, st := range forkStepNames {
			b.add(summarize("fork", fmt.Sprintf("  fork %d: %s", c, st.label), "ms", steps[c][st.key], "the server's log (sandbox forked)"))
		}
		b.add(summarize("fork", fmt.Sprintf("  fork %d: a child's CPU until its answer", c), "ms", cpu[c], "the child's cgroup (cpuacct): restore, hello, setup and the cell; less sensitive to a busy machine than the times"))
	}
	return nil
}

// forkStepNames are the keys of the server's "sandbox forked" log line.
var forkStepNames = []struct{ key, label string }{
	{"checkpoint_ms", "checkpoint of the parent"},
	{"children_ms", "every child restored, wall"},
	{"child_restore_ms", "a child's record, network and runsc restore"},
	{"child_agent_ms", "a child's agent hello"},
	{"child_setup_ms", "a child's setup (resolver, CA)"},
	{"child_record_ms", "a child recorded running"},
}

// forkSteps reads the last "sandbox forked" line the server logged for
// parent: its *_ms figures by key.
func forkSteps(log, parent string) map[string]float64 {
	lines := strings.Split(log, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := lines[i]
		if !strings.Contains(l, `msg="sandbox forked"`) || !strings.Contains(l, "sandbox="+parent+" ") {
			continue
		}
		out := map[string]float64{}
		for _, f := range strings.Fields(l) {
			k, v, ok := strings.Cut(f, "=")
			if !ok || !strings.HasSuffix(k, "_ms") {
				continue
			}
			if x, err := strconv.ParseFloat(v, 64); err == nil {
				out[k] = x
			}
		}
		return out
	}
	return nil
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
