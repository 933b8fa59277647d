package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/client"
)

// streamExec measures exec output streamed to the caller: N MiB of `yes`
// output through the API as NDJSON (JSON lines, the output a JSON string)
// and as binary frames (application/vnd.pandastack.stream), against the
// same command through `runsc exec` with its stdout read by this process,
// and on the host without any sandbox. Rounds alternate the order of the
// four. With -baseline, the two API forms on the other revision's server
// join the rotation: a before/after comparison side by side.
//
// The command is dd reading a file of `yes` output in 1 MiB blocks, not
// `yes | head -c N` itself: in gVisor every system call is costly, and
// yes and head move 8 KiB per call, so that pipeline alone ran at about
// 40 MB/s in the sandbox, below the target, whatever carried its output.
func (b *bench) streamExec(ctx context.Context) error {
	sb, err := b.pool.create(ctx, "base")
	if err != nil {
		return err
	}
	defer b.pool.kill(sb.ID)
	size := int64(b.set.StreamMB) << 20
	if err := writeStreamSource(ctx, b.pool, sb.ID); err != nil {
		return err
	}
	cmd := streamCmd(streamSource, size)
	req := client.ExecRequest{Cmd: cmd, TimeoutSeconds: 900}
	rate := func(n int64, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }

	// CPU seconds per GiB of each API series: on a machine others load,
	// the rate follows the CPU share we get, the CPU spent per byte does not.
	cpu := map[string][]float64{}
	timed := func(f func() (int64, error)) func() (float64, error) {
		return func() (float64, error) {
			t0 := time.Now()
			n, err := f()
			return rate(n, time.Since(t0)), err
		}
	}
	metered := func(name string, s *server, id string, f func() (int64, error)) func() (float64, error) {
		return func() (float64, error) {
			c0 := cpuUsed(s, id)
			t0 := time.Now()
			n, err := f()
			d := time.Since(t0)
			if c := cpuUsed(s, id) - c0; c > 0 && n > 0 {
				cpu[name] = append(cpu[name], c.Seconds()/(float64(n)/(1<<30)))
			}
			return rate(n, d), err
		}
	}
	binaryOn := func(name string, s *server, id string) func() (float64, error) {
		return metered(name, s, id, func() (int64, error) {
			var n countingWriter
			res, err := s.c.ExecPipe(ctx, id, req, &n, nil)
			if err == nil && (res.ExitCode != 0 || int64(n) != size) {
				err = fmt.Errorf("binary stream: exit %d, %d bytes of %d", res.ExitCode, n, size)
			}
			return int64(n), err
		})
	}
	ndjsonOn := func(name string, s *server, id string) func() (float64, error) {
		return metered(name, s, id, func() (int64, error) {
			n, err := execNDJSON(ctx, s, id, req)
			if err == nil && n != size {
				err = fmt.Errorf("ndjson stream: %d bytes of %d", n, size)
			}
			return n, err
		})
	}
	binary, ndjson := binaryOn("binary", b.pool, sb.ID), ndjsonOn("ndjson", b.pool, sb.ID)
	pipe := func(name string, args ...string) func() (int64, error) {
		return func() (int64, error) {
			var n countingWriter
			x := exec.CommandContext(ctx, name, args...)
			x.Stdout = &n
			err := x.Run()
			if err == nil && int64(n) != size {
				err = fmt.Errorf("%s: %d bytes of %d", name, n, size)
			}
			return int64(n), err
		}
	}
	// runsc exec's CPU: the sandbox's cgroup (the command in gVisor, with
	// no agent in the way) and the idle server; the runsc exec process
	// itself is not counted.
	runsc := metered("runsc", b.pool, sb.ID, pipe(b.pool.runsc, "--root="+b.pool.runscRoot, "exec", "--user=1000:1000", sb.ID, "/bin/sh", "-c", cmd))
	hostSource, err := hostStreamSource()
	if err != nil {
		return err
	}
	defer os.Remove(hostSource)
	host := timed(pipe("/bin/sh", "-c", streamCmd(hostSource, size)))
	// The command alone in the sandbox, its output thrown away there: what
	// gVisor costs the command itself, a floor for any way to stream it.
	inside := metered("inside", b.pool, sb.ID, func() (int64, error) {
		res, err := b.pool.c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: cmd + " > /dev/null", TimeoutSeconds: 900})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("in the sandbox: exit %d: %s", res.ExitCode, res.Stderr)
		}
		return size, err
	})

	ways := []func() (float64, error){ndjson, binary, runsc, host, inside}
	if b.baseline != nil {
		old, err := b.baseline.create(ctx, "base")
		if err != nil {
			return err
		}
		defer b.baseline.kill(old.ID)
		if err := writeStreamSource(ctx, b.baseline, old.ID); err != nil {
			return err
		}
		ways = append(ways, ndjsonOn("baseline ndjson", b.baseline, old.ID), binaryOn("baseline binary", b.baseline, old.ID))
	}
	got := make([][]float64, len(ways))
	for i := range b.set.Rounds {
		for j := range ways {
			k := (i + j) % len(ways)
			r, err := ways[k]()
			if err != nil {
				return err
			}
			got[k] = append(got[k], r)
		}
	}
	mb := fmt.Sprintf("%d MiB of `yes` output (dd of a %d MiB file, 1 MiB blocks)", b.set.StreamMB, streamSourceMiB)
	b.add(summarizeRate("stream", "exec output via API, NDJSON", "MB/s", got[0], mb+"; JSON lines, the client decodes each"))
	b.add(summarizeRate("stream", "exec output via API, binary frames", "MB/s", got[1], mb+"; Accept: application/vnd.pandastack.stream, Go client ExecPipe").
		withTarget(100, 0, "issue 13"))
	b.add(summarizeRate("stream", "exec output via runsc exec", "MB/s", got[2], mb+"; baseline: runsc exec's stdout read by the bench"))
	b.add(summarizeRate("stream", "exec output on the host", "MB/s", got[3], mb+"; baseline: the same command without a sandbox"))
	b.add(summarizeRate("stream", "exec output thrown away in the sandbox", "MB/s", got[4], mb+"; floor: the same command with its stdout to /dev/null inside the sandbox, not streamed (exec through the API, one JSON answer)"))
	if b.baseline != nil {
		b.add(summarizeRate("stream", "baseline (-baseline): exec output via API, NDJSON", "MB/s", got[5], mb+"; the other revision's server, in the same rotation"))
		b.add(summarizeRate("stream", "baseline (-baseline): exec output via API, binary frames", "MB/s", got[6], mb+"; the other revision's server, in the same rotation"))
	}
	for _, w := range []struct{ key, name string }{
		{"ndjson", "exec output via API, NDJSON"}, {"binary", "exec output via API, binary frames"},
		{"runsc", "exec output via runsc exec"}, {"inside", "exec output thrown away in the sandbox"},
		{"baseline ndjson", "baseline (-baseline): exec output via API, NDJSON"},
		{"baseline binary", "baseline (-baseline): exec output via API, binary frames"},
	} {
		if xs := cpu[w.key]; len(xs) > 0 {
			b.add(summarize("stream", w.name+": CPU per GiB", "s", xs,
				"CPU seconds the server process and the sandbox's cgroup (sentry, gofer, agent, the command) spent per GiB streamed; less is better"))
		}
	}
	return nil
}

// serverCPU is the CPU time the server process s used so far, with that
// of its children it has waited for (runsc commands), in ms; 0 when it
// cannot be read.
func serverCPU(s *server) float64 {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	// After the command name: utime, stime, cutime and cstime are the
	// 12th to 15th fields, in clock ticks (100 a second).
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return 0
	}
	var ticks int64
	for _, v := range f[11:15] {
		n, _ := strconv.ParseInt(v, 10, 64)
		ticks += n
	}
	return float64(ticks) * 10
}

// cpuUsed is the CPU time spent so far by the server s and by sandbox id:
// the server process's user and system time, and the cpuacct (cgroup v1)
// or cpu.stat (v2) usage of the sandbox's cgroup, which holds the sentry,
// the gofer and the processes gVisor runs for the sandbox's threads. Zero
// when it cannot be read.
func cpuUsed(s *server, id string) time.Duration {
	var total time.Duration
	if s.cmd != nil && s.cmd.Process != nil {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
		// Fields after the command name, which ends with ')': utime and
		// stime are the 12th and 13th, in clock ticks (100 a second).
		if i := bytes.LastIndexByte(b, ')'); i > 0 {
			if f := strings.Fields(string(b[i+1:])); len(f) > 12 {
				ut, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				total += time.Duration(ut+st) * 10 * time.Millisecond
			}
		}
	}
	pids := sandboxPIDs(s.runscRoot)[id]
	if len(pids) == 0 {
		return total
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pids[0]))
	for _, l := range strings.Split(string(cg), "\n") {
		f := strings.SplitN(l, ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case slices.Contains(strings.Split(f[1], ","), "cpuacct"):
			b, _ := os.ReadFile("/sys/fs/cgroup/cpuacct" + f[2] + "/cpuacct.usage")
			ns, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
			return total + time.Duration(ns)
		case f[0] == "0" && f[1] == "" && f[2] != "/":
			b, _ := os.ReadFile("/sys/fs/cgroup" + f[2] + "/cpu.stat")
			for _, l := range strings.Split(string(b), "\n") {
				if us, ok := strings.CutPrefix(l, "usage_usec "); ok {
					n, _ := strconv.ParseInt(us, 10, 64)
					return total + time.Duration(n)*time.Microsecond
				}
			}
		}
	}
	return total
}

// The stream section's source: a file of `yes` output in the sandbox (and
// one on the host), which the command reads over and over.
const (
	streamSource    = "/tmp/pandastack-bench-stream"
	streamSourceMiB = 64
)

// streamCmd writes size bytes of the file at path (its copies one after
// another) to stdout in 1 MiB blocks.
func streamCmd(path string, size int64) string {
	file := int64(streamSourceMiB) << 20
	var parts []string
	if n := size / file; n > 0 {
		parts = append(parts, fmt.Sprintf("for i in $(seq %d); do dd if=%s bs=1M status=none; done", n, path))
	}
	if r := size % file; r > 0 {
		parts = append(parts, fmt.Sprintf("dd if=%s bs=1M count=%d iflag=count_bytes status=none", path, r))
	}
	return strings.Join(parts, "; ")
}

// writeStreamSource writes the stream section's source file in sandbox id.
func writeStreamSource(ctx context.Context, s *server, id string) error {
	res, err := s.c.Exec(ctx, id, client.ExecRequest{Cmd: fmt.Sprintf("yes | head -c %d > %s", int64(streamSourceMiB)<<20, streamSource), TimeoutSeconds: 120})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
	}
	if err != nil {
		return fmt.Errorf("writing the stream source in %s: %w", id, err)
	}
	return nil
}

// hostStreamSource writes the same source file on the host; the caller
// removes it.
func hostStreamSource() (string, error) {
	f, err := os.CreateTemp("", "pandastack-bench-stream-")
	if err != nil {
		return "", err
	}
	_, err = f.Write(bytes.Repeat([]byte("y\n"), streamSourceMiB<<19))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// execNDJSON streams an exec on s as NDJSON and decodes every line, as a
// client must; it returns the output bytes seen.
func execNDJSON(ctx context.Context, s *server, id string, req client.ExecRequest) (int64, error) {
	body, _ := json.Marshal(req)
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, s.url+"/v1/sandboxes/"+id+"/exec", bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	hreq.Header.Set("Authorization", "Bearer "+s.key)
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Accept", "application/x-ndjson")
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1000))
		return 0, fmt.Errorf("ndjson exec: %s: %s", resp.Status, msg)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var n int64
	for sc.Scan() {
		var ev client.ExecEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return n, err
		}
		switch ev.Type {
		case "stdout":
			n += int64(len(ev.Data))
		case "exit":
			if ev.ExitCode != 0 {
				return n, fmt.Errorf("ndjson exec: exit %d", ev.ExitCode)
			}
			return n, nil
		case "error":
			return n, fmt.Errorf("ndjson exec: %s", ev.Error.Message)
		}
	}
	return n, fmt.Errorf("ndjson exec: stream ended without exit: %v", sc.Err())
}

type countingWriter int64

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}
