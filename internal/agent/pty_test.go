//go:build linux

package agent_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// dialPTY opens a terminal on the agent at base (an httptest URL) by hand:
// an HTTP upgrade, then PTY frames.
func dialPTY(t *testing.T, base, query string) (net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "GET /v1/pty?%s HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", query, agentproto.PTYUpgrade)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	return conn, br
}

// readUntil reads output frames until the transcript contains want, and
// returns the transcript and the exit status if an exit frame came.
func readUntil(t *testing.T, conn net.Conn, br *bufio.Reader, want string) (string, *int) {
	t.Helper()
	// A bound on a hang, not a speed test: a login shell on a loaded machine
	// can take many seconds to print its prompt.
	conn.SetReadDeadline(time.Now().Add(2 * time.Minute))
	var out strings.Builder
	for {
		typ, p, err := agentproto.ReadPTYFrame(br)
		if err != nil {
			t.Fatalf("reading the terminal (transcript so far %q): %v", out.String(), err)
		}
		switch typ {
		case agentproto.PTYData:
			out.Write(p)
			if want != "" && strings.Contains(out.String(), want) {
				return out.String(), nil
			}
		case agentproto.PTYExit:
			code, err := agentproto.ParseExit(p)
			if err != nil {
				t.Fatal(err)
			}
			return out.String(), &code
		}
	}
}

func TestPTYShell(t *testing.T) {
	cfg := testConfig(t)
	s := directStack(t, cfg, 1)
	conn, br := dialPTY(t, s.base, "cols=100&rows=30")
	send := func(typ byte, p []byte) {
		if err := agentproto.WritePTYFrame(conn, typ, p); err != nil {
			t.Fatal(err)
		}
	}
	// The shell evaluates what is typed, on a terminal of the asked size, as
	// the sandbox user in its home.
	send(agentproto.PTYData, []byte("echo A$((6*7))B; stty size; tty; pwd\r"))
	out, _ := readUntil(t, conn, br, "A42B")
	out2, _ := readUntil(t, conn, br, cfg.Home)
	out += out2
	for _, want := range []string{"30 100", "/dev/pts/"} {
		if !strings.Contains(out, want) {
			t.Errorf("transcript %q lacks %q", out, want)
		}
	}
	send(agentproto.PTYResize, agentproto.ResizePayload(132, 43))
	send(agentproto.PTYData, []byte("stty size\r"))
	readUntil(t, conn, br, "43 132")
	if os.Geteuid() == 0 {
		send(agentproto.PTYData, []byte("id -u | sed s/^/uid:/\r"))
		readUntil(t, conn, br, "uid:1000")
	}
	// exit ends the stream with the shell's status.
	send(agentproto.PTYData, []byte("exit 3\r"))
	out, code := readUntil(t, conn, br, "")
	if code == nil || *code != 3 {
		t.Fatalf("exit status %v, want 3 (transcript %q)", code, out)
	}
}

func TestPTYHangupKillsShell(t *testing.T) {
	cfg := testConfig(t)
	s := directStack(t, cfg, 1)
	conn, br := dialPTY(t, s.base, "cols=80&rows=24")
	marker := cfg.Home + "/alive"
	agentproto.WritePTYFrame(conn, agentproto.PTYData, []byte("sleep 1000 & while :; do touch "+marker+"; echo tick; sleep 0.05; done\r"))
	readUntil(t, conn, br, "tick\r\n")
	conn.Close()
	// Once the host hung up, nothing keeps touching the marker.
	deadline := time.Now().Add(20 * time.Second)
	for {
		fi, err := os.Stat(marker)
		if err == nil && time.Since(fi.ModTime()) > time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the shell's loop still runs after the host hung up")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func TestPTYBadRequests(t *testing.T) {
	s := directStack(t, testConfig(t), 1)
	for _, q := range []string{"cols=0&rows=24", "cols=80", "cols=x&rows=1", "cols=80&rows=24&cwd=/nonexistent"} {
		conn, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET /v1/pty?%s HTTP/1.1\r\nHost: agent\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", q, agentproto.PTYUpgrade)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", q, resp.StatusCode)
		}
		conn.Close()
	}
	// Without the upgrade it is a clear error, not a hang.
	resp, err := http.Get(s.base + "/v1/pty?cols=80&rows=24")
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("no upgrade: status %d, want 400", resp.StatusCode)
	}
}
