package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"time"

	"github.com/pandastack/pandastack/client"
)

// streamExec measures exec output streamed to the caller: `yes | head -c
// N` through the API as NDJSON (JSON lines, the output a JSON string) and
// as binary frames (application/vnd.pandastack.stream), against the same
// command through `runsc exec` with its stdout read by this process, and on
// the host without any sandbox. Rounds alternate the order of the four.
// With -baseline, the two API forms on the other revision's server join
// the rotation: a before/after comparison side by side.
func (b *bench) streamExec(ctx context.Context) error {
	sb, err := b.pool.create(ctx, "base")
	if err != nil {
		return err
	}
	defer b.pool.kill(sb.ID)
	size := int64(b.set.StreamMB) << 20
	cmd := fmt.Sprintf("yes | head -c %d", size)
	req := client.ExecRequest{Cmd: cmd, TimeoutSeconds: 900}
	rate := func(n int64, d time.Duration) float64 { return float64(n) / 1e6 / d.Seconds() }

	binaryOn := func(s *server, id string) func() (float64, error) {
		return func() (float64, error) {
			var n countingWriter
			t0 := time.Now()
			res, err := s.c.ExecPipe(ctx, id, req, &n, nil)
			if err == nil && (res.ExitCode != 0 || int64(n) != size) {
				err = fmt.Errorf("binary stream: exit %d, %d bytes of %d", res.ExitCode, n, size)
			}
			return rate(int64(n), time.Since(t0)), err
		}
	}
	ndjsonOn := func(s *server, id string) func() (float64, error) {
		return func() (float64, error) {
			t0 := time.Now()
			n, err := execNDJSON(ctx, s, id, req)
			if err == nil && n != size {
				err = fmt.Errorf("ndjson stream: %d bytes of %d", n, size)
			}
			return rate(n, time.Since(t0)), err
		}
	}
	binary, ndjson := binaryOn(b.pool, sb.ID), ndjsonOn(b.pool, sb.ID)
	pipe := func(name string, args ...string) func() (float64, error) {
		return func() (float64, error) {
			var n countingWriter
			t0 := time.Now()
			x := exec.CommandContext(ctx, name, args...)
			x.Stdout = &n
			err := x.Run()
			if err == nil && int64(n) != size {
				err = fmt.Errorf("%s: %d bytes of %d", name, n, size)
			}
			return rate(int64(n), time.Since(t0)), err
		}
	}
	runsc := pipe(b.pool.runsc, "--root="+b.pool.runscRoot, "exec", "--user=1000:1000", sb.ID, "/bin/sh", "-c", cmd)
	host := pipe("/bin/sh", "-c", cmd)

	ways := []func() (float64, error){ndjson, binary, runsc, host}
	if b.baseline != nil {
		old, err := b.baseline.create(ctx, "base")
		if err != nil {
			return err
		}
		defer b.baseline.kill(old.ID)
		ways = append(ways, ndjsonOn(b.baseline, old.ID), binaryOn(b.baseline, old.ID))
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
	mb := fmt.Sprintf("%d MiB of `yes`", b.set.StreamMB)
	b.add(summarizeRate("stream", "exec output via API, NDJSON", "MB/s", got[0], mb+"; JSON lines, the client decodes each"))
	b.add(summarizeRate("stream", "exec output via API, binary frames", "MB/s", got[1], mb+"; Accept: application/vnd.pandastack.stream, Go client ExecPipe").
		withTarget(100, 0, "issue 13"))
	b.add(summarizeRate("stream", "exec output via runsc exec", "MB/s", got[2], mb+"; baseline: runsc exec's stdout read by the bench"))
	b.add(summarizeRate("stream", "exec output on the host", "MB/s", got[3], mb+"; baseline: the same command without a sandbox"))
	if b.baseline != nil {
		b.add(summarizeRate("stream", "baseline (-baseline): exec output via API, NDJSON", "MB/s", got[4], mb+"; the other revision's server, in the same rotation"))
		b.add(summarizeRate("stream", "baseline (-baseline): exec output via API, binary frames", "MB/s", got[5], mb+"; the other revision's server, in the same rotation"))
	}
	return nil
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
