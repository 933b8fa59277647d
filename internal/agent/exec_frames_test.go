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
	"path/filepath"
	"strconv"
	"testing"

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
		b, _ := json.Marshal(agentproto.ExecRequest{Argv: []string{"bash", "-c", script, "bash", blob}, Root: true})
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, st.base+"/v1/exec", bytes.NewReader(b))
		req.Header.Set("Accept", streamframe.MediaType)
		resp, err := st.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != streamframe.MediaType {
			t.Fatalf("status %d, Content-Type %q", resp.StatusCode, ct)
		}
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
