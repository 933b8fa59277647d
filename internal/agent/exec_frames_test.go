//go:build linux

package agent_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/streamframe"
)

// TestExecBinaryFrames asks for the binary form: the output arrives as raw
// frames, byte for byte (bytes JSON would have to escape included), and the
// stream ends with one exit frame.
func TestExecBinaryFrames(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		// 3 MiB of every byte value on stdout, a line on stderr, exit 3.
		blob := filepath.Join(t.TempDir(), "blob")
		script := `head -c 3145728 /dev/urandom > "$1"; cat "$1"; echo oops >&2; exit 3`
		resp := framesExec(t, context.Background(), st, agentproto.ExecRequest{Argv: []string{"bash", "-c", script, "bash", blob}, Root: true})
		defer resp.Body.Close()
		fr := streamframe.NewReader(resp.Body)
		out := sha256.New()
		var stderr bytes.Buffer
		var exit agentproto.ExecEvent
		exits := 0
		for {
			typ, p, err := fr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if exits > 0 {
				t.Fatalf("frame %d after the exit frame", typ)
			}
			switch typ {
			case streamframe.Stdout:
				out.Write(p)
			case streamframe.Stderr:
				stderr.Write(p)
			case streamframe.Exit:
				exits++
				if err := json.Unmarshal(p, &exit); err != nil {
					t.Fatalf("exit frame %q: %v", p, err)
				}
			default:
				t.Fatalf("unexpected frame %d: %q", typ, p)
			}
		}
		if exits != 1 || exit.Type != "exit" || exit.ExitCode != 3 {
			t.Fatalf("exit frames %d, exit %+v; want one with exit code 3", exits, exit)
		}
		if stderr.String() != "oops\n" {
			t.Errorf("stderr %q", stderr.String())
		}
		// The same bytes, read back without the stream.
		want := st.exec(t, agentproto.ExecRequest{Argv: []string{"bash", "-c", `sha256sum < "$1" | cut -c1-64`, "bash", blob}, Root: true})
		if got := hex.EncodeToString(out.Sum(nil)) + "\n"; got != want.stdout.String() {
			t.Errorf("stdout sha256 %q, the file's %q", got, want.stdout.String())
		}
	})
}

// framesExec starts req with Accept: frames and returns the answer; the
// caller reads it with streamframe.NewReader and closes its body.
func framesExec(t *testing.T, ctx context.Context, st *stack, req agentproto.ExecRequest) *http.Response {
	t.Helper()
	b, _ := json.Marshal(req)
	hreq, _ := http.NewRequestWithContext(ctx, http.MethodPost, st.base+"/v1/exec", bytes.NewReader(b))
	hreq.Header.Set("Accept", streamframe.MediaType)
	resp, err := st.hc.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != streamframe.MediaType {
		resp.Body.Close()
		t.Fatalf("status %d, Content-Type %q", resp.StatusCode, ct)
	}
	return resp
}

// Output that trickles in reaches the host as it is written, a frame per
// line, long before the exit frame.
func TestExecFramesStreamBeforeExit(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		resp := framesExec(t, context.Background(), st, agentproto.ExecRequest{Cmd: "for i in 1 2 3; do echo $i; sleep 0.3; done"})
		defer resp.Body.Close()
		fr := streamframe.NewReader(resp.Body)
		var lines []string
		var first time.Time
		for {
			typ, p, err := fr.Next()
			if err != nil {
				t.Fatalf("stream ended without an exit frame: %v (lines %q)", err, lines)
			}
			if typ == streamframe.Stdout {
				if first.IsZero() {
					first = time.Now()
				}
				lines = append(lines, string(p))
				continue
			}
			if typ != streamframe.Exit {
				t.Fatalf("unexpected frame %d: %q", typ, p)
			}
			if gap := time.Since(first); gap < 400*time.Millisecond {
				t.Errorf("first output arrived %v before the exit, want about 0.6 s: output is not streamed", gap)
			}
			break
		}
		if len(lines) != 3 || lines[0] != "1\n" || lines[2] != "3\n" {
			t.Errorf("stdout frames %q, want one per line", lines)
		}
		if _, _, err := fr.Next(); err != io.EOF {
			t.Errorf("after the exit frame: %v, want the end of the stream", err)
		}
	})
}

// A host that goes away in the middle of a framed answer kills the command
// and its children, as with NDJSON.
func TestExecFramesCancelKillsTree(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("needs setsid (util-linux)")
	}
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		resp := framesExec(t, ctx, st, agentproto.ExecRequest{Cmd: treeCmd})
		defer resp.Body.Close()
		fr := streamframe.NewReader(resp.Body)
		var out strings.Builder
		for strings.Count(out.String(), "\n") < 3 {
			typ, p, err := fr.Next()
			if err != nil {
				t.Fatalf("stream ended before the pids were printed: %v (stdout %q)", err, out.String())
			}
			if typ != streamframe.Stdout {
				t.Fatalf("frame %d %q before the pids", typ, p)
			}
			out.Write(p)
		}
		pids := parsePids(t, out.String(), 3)
		cancel()
		waitGone(t, pids)
	})
}

// A response writer that cannot hand its connection over still gets the
// frames, in its body.
func TestExecFramesWithoutHijack(t *testing.T) {
	cfg := testConfig(t)
	h := agent.NewServer(cfg, 1).Handler()
	b, _ := json.Marshal(agentproto.ExecRequest{Cmd: "printf 'a\\0b'; echo err >&2; exit 5"})
	req := httptest.NewRequest(http.MethodPost, "/v1/exec", bytes.NewReader(b))
	req.Header.Set("Accept", streamframe.MediaType)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if ct := rec.Header().Get("Content-Type"); rec.Code != 200 || ct != streamframe.MediaType {
		t.Fatalf("status %d, Content-Type %q", rec.Code, ct)
	}
	fr := streamframe.NewReader(rec.Body)
	var stdout, stderr string
	var exit agentproto.ExecEvent
	for {
		typ, p, err := fr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch typ {
		case streamframe.Stdout:
			stdout += string(p)
		case streamframe.Stderr:
			stderr += string(p)
		case streamframe.Exit:
			if err := json.Unmarshal(p, &exit); err != nil {
				t.Fatal(err)
			}
		}
	}
	if stdout != "a\x00b" || stderr != "err\n" || exit.Type != "exit" || exit.ExitCode != 5 {
		t.Fatalf("stdout %q, stderr %q, exit %+v", stdout, stderr, exit)
	}
}

// The command's stdout and stderr pipes hold 1 MiB, so a command that
// writes in small pieces runs on while the agent writes what it read.
func TestExecOutputPipesAreLarge(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("needs python3")
	}
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		// F_GETPIPE_SZ is 1032.
		res := st.exec(t, agentproto.ExecRequest{Argv: []string{"python3", "-c", "import fcntl; print(fcntl.fcntl(1, 1032), fcntl.fcntl(2, 1032))"}, Root: true})
		if got := res.stdout.String(); got != "1048576 1048576\n" {
			t.Errorf("pipe sizes %q (stderr %q), want 1048576 for both", got, res.stderr.String())
		}
	})
}

// BenchmarkExecFramesChannel streams `yes | head -c 64 MiB` as binary
// frames through the whole channel (epoch framing, yamux, HTTP over two
// pipes), as the host reads it; for profiles of the agent's output path
// outside gVisor (-cpuprofile). MB/s in the report.
func BenchmarkExecFramesChannel(b *testing.B) {
	const size = 64 << 20
	cfg := testConfig(b)
	st, _ := newHostPipes(b, cfg).connect(b, 1)
	body, _ := json.Marshal(agentproto.ExecRequest{Cmd: "yes | head -c " + strconv.Itoa(size)})
	b.SetBytes(size)
	for b.Loop() {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, st.base+"/v1/exec", bytes.NewReader(body))
		req.Header.Set("Accept", streamframe.MediaType)
		resp, err := st.hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		fr := streamframe.NewReader(resp.Body)
		n := 0
		for {
			typ, p, err := fr.Next()
			if err != nil {
				b.Fatal(err)
			}
			if typ == streamframe.Stdout {
				n += len(p)
			}
			if typ == streamframe.Exit {
				break
			}
		}
		resp.Body.Close()
		if n != size {
			b.Fatalf("%d bytes, want %d", n, size)
		}
	}
}
