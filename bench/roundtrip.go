package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/client"
)

// runCode compares run_code("1+1") through the API with the same code sent
// by jupyter_client to an ipykernel on the host, alternating which goes
// first. The API side is timed by the Go client (HTTP request to decoded
// answer), the host side by jupyter_client (execute request until the
// kernel is idle again).
func (b *bench) runCode(ctx context.Context, python string) error {
	sb, _, err := b.pool.createAndRun(ctx)
	if sb != nil {
		defer b.pool.kill(sb.ID)
	}
	if err != nil {
		return err
	}
	hk, err := startHostKernel(ctx, python)
	if err != nil {
		return err
	}
	defer hk.close()
	b.rep.Machine["host_kernel"] = hk.versions
	var inside, baseInside []float64 // the Execution's duration_ms: the agent's own view
	apiOn := func(s *server, id string, inside *[]float64) func() (float64, error) {
		return func() (float64, error) {
			t0 := time.Now()
			ex, err := s.c.RunCode(ctx, id, client.RunRequest{Code: "1+1"})
			d := ms(time.Since(t0))
			if err == nil && (ex.Error != nil || ex.Text != "2") {
				err = fmt.Errorf("run_code 1+1 via API on %s: text %q, error %+v", s.name, ex.Text, ex.Error)
			}
			if err == nil {
				*inside = append(*inside, float64(ex.DurationMS))
			}
			return d, err
		}
	}
	api := apiOn(b.pool, sb.ID, &inside)
	// With -baseline, the other revision's server takes its turn in each
	// round too.
	baseAPI := func() (float64, error) { return 0, nil }
	bsbID := ""
	if b.baseline != nil {
		bsb, _, err := b.baseline.createAndRun(ctx)
		if bsb != nil {
			defer b.baseline.kill(bsb.ID)
		}
		if err != nil {
			return err
		}
		baseAPI = apiOn(b.baseline, bsb.ID, &baseInside)
		bsbID = bsb.ID
	}
	host := func() (float64, error) {
		d, text, err := hk.run(ctx, "1+1")
		if err == nil && text != "2" {
			err = fmt.Errorf("host kernel: 1+1 gave %q", text)
		}
		return d, err
	}
	// The first run_code took the warm spare kernel; the sandbox starts a
	// replacement a moment later (seconds of CPU): let it finish, so that
	// the CPU per run below is the runs'.
	waitCPUQuiet(ctx, sb.ID)
	if bsbID != "" {
		waitCPUQuiet(ctx, bsbID)
	}
	for range 3 { // warm both up: first cells import and allocate
		if _, err := api(); err != nil {
			return err
		}
		if _, err := host(); err != nil {
			return err
		}
		if _, err := baseAPI(); err != nil {
			return err
		}
	}
	var viaAPI, viaHost, viaBase []float64
	inside, baseInside = inside[:0], baseInside[:0]
	// The sandboxes' CPU over the rounds (their cgroups): what a run costs
	// inside, which a busy machine stretches far less than the times.
	cpu0, baseCPU0 := sandboxCPU(sb.ID), sandboxCPU(bsbID)
	for i := range b.set.N {
		if b.baseline != nil {
			d, err := baseAPI()
			if err != nil {
				return err
			}
			viaBase = append(viaBase, d)
		}
		first, second := api, host
		if i%2 == 1 {
			first, second = host, api
		}
		d1, err := first()
		if err != nil {
			return err
		}
		d2, err := second()
		if err != nil {
			return err
		}
		if i%2 == 1 {
			d1, d2 = d2, d1
		}
		viaAPI, viaHost = append(viaAPI, d1), append(viaHost, d2)
	}
	cpu1, baseCPU1 := sandboxCPU(sb.ID), sandboxCPU(bsbID)
	a := summarize("roundtrip", "run_code(\"1+1\") via API", "ms", viaAPI, "HTTP → agent → ipykernel in the sandbox → Execution JSON")
	h := summarize("roundtrip", "run_code(\"1+1\") via jupyter_client, host ipykernel", "ms", viaHost, "baseline: no sandbox, no API")
	b.add(a)
	b.add(h)
	b.add(summarize("roundtrip", "  run_code: duration_ms the API reports", "ms", inside, "the agent's time from the kernel request to its answer, whole ms"))
	if cpu0 >= 0 && cpu1 >= 0 {
		b.add(summarize("runcode-breakdown", "sandbox CPU per run_code(\"1+1\") (cgroup, mean over the rounds)", "ms", []float64{(cpu1 - cpu0) / float64(len(viaAPI))}, "the sandbox's cpuacct before and after the rounds, over their count: agent and kernel, idle work included"))
	}
	if b.baseline != nil && baseCPU0 >= 0 && baseCPU1 >= 0 {
		b.add(summarize("runcode-breakdown", "baseline (-baseline): sandbox CPU per run_code(\"1+1\") (cgroup, mean over the rounds)", "ms", []float64{(baseCPU1 - baseCPU0) / float64(len(viaBase))}, ""))
	}
	b.addRunBreakdown(b.pool, sb.ID, len(viaAPI), "")
	if b.baseline != nil {
		b.add(summarize("roundtrip", "baseline (-baseline): run_code(\"1+1\") via API", "ms", viaBase, "the other revision's server, in the same rounds"))
		b.add(summarize("roundtrip", "  baseline (-baseline): duration_ms the API reports", "ms", baseInside, ""))
		b.addRunBreakdown(b.baseline, bsbID, len(viaBase), "baseline (-baseline): ")
	}
	r := summarize("ratio", "run_code ratio API / host kernel (pairwise)", "x", ratios(viaAPI, viaHost), fmt.Sprintf("ratio of medians %.2f", a.Median/h.Median)).
		withTarget(targetRunRatio, 0, "issue 3")
	b.add(r)
	return nil
}

// execTrue compares exec("true") through the API with `runsc exec` into the
// same sandbox.
func (b *bench) execTrue(ctx context.Context) error {
	sb, err := b.pool.create(ctx, "base")
	if err != nil {
		return err
	}
	defer b.pool.kill(sb.ID)
	api := func() (float64, error) {
		t0 := time.Now()
		res, err := b.pool.c.Exec(ctx, sb.ID, client.ExecRequest{Argv: []string{"true"}})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exec true: exit %d", res.ExitCode)
		}
		return ms(time.Since(t0)), err
	}
	direct := func() (float64, error) {
		t0 := time.Now()
		out, err := exec.CommandContext(ctx, b.pool.runsc, "--root="+b.pool.runscRoot, "exec", sb.ID, "/bin/true").CombinedOutput()
		if err != nil {
			err = fmt.Errorf("runsc exec: %v: %s", err, out)
		}
		return ms(time.Since(t0)), err
	}
	var viaAPI, viaRunsc []float64
	for i := range b.set.N {
		first, second := api, direct
		if i%2 == 1 {
			first, second = direct, api
		}
		d1, err := first()
		if err != nil {
			return err
		}
		d2, err := second()
		if err != nil {
			return err
		}
		if i%2 == 1 {
			d1, d2 = d2, d1
		}
		viaAPI, viaRunsc = append(viaAPI, d1), append(viaRunsc, d2)
	}
	a := summarize("roundtrip", "exec true via API", "ms", viaAPI, "")
	r := summarize("roundtrip", "exec true via runsc exec", "ms", viaRunsc, "baseline: a new runsc process per command")
	b.add(a)
	b.add(r)
	b.add(summarize("ratio", "exec ratio API / runsc exec (pairwise)", "x", ratios(viaAPI, viaRunsc),
		fmt.Sprintf("ratio of medians %.2f; below 1 means the API is faster", a.Median/r.Median)))
	return nil
}

// files uploads and downloads 2 MB of random bytes, alternating.
func (b *bench) files(ctx context.Context) error {
	sb, err := b.pool.create(ctx, "base")
	if err != nil {
		return err
	}
	defer b.pool.kill(sb.ID)
	blob := make([]byte, 2<<20)
	rand.Read(blob)
	mb := float64(len(blob)) / 1e6
	var up, down []float64
	for range b.set.N {
		t0 := time.Now()
		if _, err := b.pool.c.WriteFile(ctx, sb.ID, "blob.bin", bytes.NewReader(blob)); err != nil {
			return err
		}
		up = append(up, mb/time.Since(t0).Seconds())
		t0 = time.Now()
		rc, err := b.pool.c.ReadFile(ctx, sb.ID, "blob.bin")
		if err != nil {
			return err
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		down = append(down, mb/time.Since(t0).Seconds())
		if !bytes.Equal(got, blob) {
			return fmt.Errorf("download: got %d bytes that differ from the upload", len(got))
		}
	}
	b.add(summarizeRate("throughput", "upload 2 MiB", "MB/s", up, "PUT /files, whole request; p95 is the slow tail"))
	b.add(summarizeRate("throughput", "download 2 MiB", "MB/s", down, "GET /files, whole body; p95 is the slow tail"))
	return nil
}

// runSteps are the keys of the server's "code run" debug line, in the order
// of a run, with what each measures.
var runSteps = []struct{ key, label string }{
	{"total_us", "server: whole request, handler start → answer written"},
	{"decode_acquire_us", "server: request decoded, sandbox acquired"},
	{"context_us", "server: default context found or created"},
	{"history_begin_us", "server: history entry begun"},
	{"agent_us", "server: agent request → execution event"},
	{"agent_transport_us", "  host ⇄ agent: that minus the agent's handling (HTTP, yamux, FIFOs)"},
	{"agent_handler_us", "  agent: handling, request → execution event"},
	{"agent_queue_us", "    agent: before the execute_request (decode, plumbing cells)"},
	{"kernel_us", "    agent ⇄ kernel: execute_request → reply and idle received"},
	{"kernel_to_us", "      agent → kernel: execute_request sent → kernel busy"},
	{"kernel_execute_us", "      kernel: busy → execute_reply"},
	{"kernel_reply_to_idle_us", "      kernel: execute_reply → idle"},
	{"kernel_back_us", "      kernel → agent: idle sent → reply and idle received"},
	{"history_end_us", "server: history entry ended before the answer (its store write comes after it)"},
	{"answer_us", "server: answer written"},
}

// addRunBreakdown adds the breakdown of the last n runs the server logged
// for sandbox id (its "code run" debug lines), if it logs them.
func (b *bench) addRunBreakdown(s *server, id string, n int, prefix string) {
	got := runBreakdown(s.log.String(), id, n)
	if got == nil {
		return
	}
	for _, st := range runSteps {
		if xs := got[st.key]; len(xs) > 0 {
			b.add(summarize("runcode-breakdown", prefix+st.label, "ms", xs, st.key+" of the server's \"code run\" debug line"))
		}
	}
}

// runBreakdown reads the last n "code run" lines logged for sandbox id:
// each *_us figure by key, in ms; nil if there are fewer than n.
func runBreakdown(log, id string, n int) map[string][]float64 {
	var lines []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `msg="code run"`) && strings.Contains(l, "sandbox="+id+" ") {
			lines = append(lines, l)
		}
	}
	if n == 0 || len(lines) < n {
		return nil
	}
	out := map[string][]float64{}
	for _, l := range lines[len(lines)-n:] {
		for _, f := range strings.Fields(l) {
			k, v, ok := strings.Cut(f, "=")
			if !ok || !strings.HasSuffix(k, "_us") {
				continue
			}
			if x, err := strconv.ParseFloat(v, 64); err == nil {
				out[k] = append(out[k], x/1000)
			}
		}
	}
	return out
}

// waitCPUQuiet waits until sandbox id uses under 3 % of a CPU over a
// second (its cgroup), for at most a minute: after 3 s, since the agent
// starts a replacement spare 2 s after a hand-out.
func waitCPUQuiet(ctx context.Context, id string) {
	deadline := time.Now().Add(time.Minute)
	time.Sleep(3 * time.Second)
	prev := sandboxCPU(id)
	for prev >= 0 && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Second)
		now := sandboxCPU(id)
		if now-prev < 30 {
			return
		}
		prev = now
	}
}
