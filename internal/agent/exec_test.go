//go:build linux

package agent_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agent"
	"github.com/pandastack/pandastack/internal/agentproto"
)

func TestExecEcho(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		res := st.exec(t, agentproto.ExecRequest{Argv: []string{"echo", "hello", "world"}})
		if got := res.stdout.String(); got != "hello world\n" {
			t.Errorf("stdout %q, want %q", got, "hello world\n")
		}
		if res.exit.ExitCode != 0 || res.exit.Signal != "" || res.exit.TimedOut {
			t.Errorf("exit %+v, want a clean exit 0", res.exit)
		}
	})
}

func TestExecFailingCommand(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		res := st.exec(t, agentproto.ExecRequest{Cmd: "echo out; echo oops >&2; exit 3"})
		if res.exit.ExitCode != 3 {
			t.Errorf("exit code %d, want 3", res.exit.ExitCode)
		}
		if got := res.stderr.String(); got != "oops\n" {
			t.Errorf("stderr %q, want %q", got, "oops\n")
		}
		if got := res.stdout.String(); got != "out\n" {
			t.Errorf("stdout %q, want %q", got, "out\n")
		}
	})
}

func TestExecEnvAndCwd(t *testing.T) {
	t.Setenv("PANDASTACK_TEST_SANDBOX_VAR", "from-sandbox")
	t.Setenv("PANDASTACK_TEST_OVERRIDDEN", "from-sandbox")
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		res := st.exec(t, agentproto.ExecRequest{
			Cmd: `echo "$FOO|$HOME|$USER|$LOGNAME|$PANDASTACK_TEST_SANDBOX_VAR|$PANDASTACK_TEST_OVERRIDDEN|$PATH"; pwd`,
			Env: map[string]string{"FOO": "bar baz", "PANDASTACK_TEST_OVERRIDDEN": "from-request", "PATH": "/usr/bin:/bin"},
		})
		want := "bar baz|" + cfg.Home + "|user|user|from-sandbox|from-request|/usr/bin:/bin\n" + cfg.Home + "\n"
		if got := res.stdout.String(); got != want {
			t.Errorf("stdout %q, want %q", got, want)
		}

		sub := filepath.Join(cfg.Home, "sub")
		st.call(t, http.MethodPost, "/v1/files/mkdir", q("path", "sub"), nil, http.StatusOK, nil)
		res = st.exec(t, agentproto.ExecRequest{Argv: []string{"pwd"}, Cwd: "sub"})
		if got := res.stdout.String(); got != sub+"\n" {
			t.Errorf("relative cwd: pwd printed %q, want %q", got, sub+"\n")
		}
		res = st.exec(t, agentproto.ExecRequest{Argv: []string{"pwd"}, Cwd: "/"})
		if got := res.stdout.String(); got != "/\n" {
			t.Errorf("cwd /: pwd printed %q", got)
		}

		msg := st.callError(t, http.MethodPost, "/v1/exec", nil,
			jsonBody(t, agentproto.ExecRequest{Argv: []string{"pwd"}, Cwd: "no/such/dir"}),
			http.StatusBadRequest, "invalid_request")
		if !strings.Contains(msg, "does not exist") {
			t.Errorf("missing cwd: message %q does not say it does not exist", msg)
		}
	})
}

func TestExecUser(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		want := strconv.Itoa(os.Geteuid())
		if os.Geteuid() == 0 {
			want = strconv.Itoa(agentproto.UserUID)
		}
		res := st.exec(t, agentproto.ExecRequest{Cmd: "id -u; id -G"})
		if got := strings.Fields(res.stdout.String()); len(got) == 0 || got[0] != want {
			t.Errorf("id -u printed %q, want %s", res.stdout.String(), want)
		} else if mark, _ := strconv.ParseUint(got[len(got)-1], 10, 32); os.Geteuid() == 0 && (len(got) != 3 || got[1] != strconv.Itoa(agentproto.UserGID) || mark <= 2_000_000_000) {
			// Not root's groups: the user's, and the command's mark.
			t.Errorf("id -G printed %q, want the user's group and a mark above 2000000000", got[1:])
		}
		if os.Geteuid() != 0 {
			return
		}
		res = st.exec(t, agentproto.ExecRequest{Cmd: "id -u; echo $HOME", Root: true})
		if got := res.stdout.String(); got != "0\n/root\n" {
			t.Errorf("root: printed %q, want %q", got, "0\n/root\n")
		}
	})
}

func TestExecStdin(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		res := st.exec(t, agentproto.ExecRequest{Argv: []string{"cat"}, Stdin: []byte("line one\nline two\n")})
		if got := res.stdout.String(); got != "line one\nline two\n" {
			t.Errorf("cat printed %q", got)
		}
		// Without stdin a reader sees EOF at once rather than hanging.
		res = st.exec(t, agentproto.ExecRequest{Argv: []string{"wc", "-c"}, TimeoutMS: 5000})
		if got := strings.TrimSpace(res.stdout.String()); got != "0" || res.exit.TimedOut {
			t.Errorf("wc -c without stdin printed %q (exit %+v), want 0", got, res.exit)
		}
	})
}

func TestExecBadRequests(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		msg := st.callError(t, http.MethodPost, "/v1/exec", nil,
			jsonBody(t, agentproto.ExecRequest{Argv: []string{"no-such-command-pandastack"}}),
			http.StatusBadRequest, "command_not_found")
		if !strings.Contains(msg, `command not found: "no-such-command-pandastack"`) {
			t.Errorf("message %q does not name the command", msg)
		}
		st.callError(t, http.MethodPost, "/v1/exec", nil,
			jsonBody(t, agentproto.ExecRequest{Argv: []string{"./missing.sh"}}),
			http.StatusBadRequest, "command_not_found")
		st.callError(t, http.MethodPost, "/v1/exec", nil, strings.NewReader(`{"argv": [`),
			http.StatusBadRequest, "invalid_request")
		st.callError(t, http.MethodPost, "/v1/exec", nil, jsonBody(t, agentproto.ExecRequest{}),
			http.StatusBadRequest, "invalid_request")
		st.callError(t, http.MethodPost, "/v1/exec", nil,
			jsonBody(t, agentproto.ExecRequest{Argv: []string{"true"}, Cmd: "true"}),
			http.StatusBadRequest, "invalid_request")
		st.callError(t, http.MethodPost, "/v1/exec", nil,
			jsonBody(t, agentproto.ExecRequest{Argv: []string{"true"}, TimeoutMS: -1}),
			http.StatusBadRequest, "invalid_request")
		// Arguments the kernel would refuse: one over 128 KiB, and many
		// that are each allowed but too large in all.
		long := strings.Repeat("a", 128<<10)
		for name, req := range map[string]agentproto.ExecRequest{
			"argv[1]":          {Argv: []string{"echo", long}},
			"cmd":              {Cmd: "#" + long},
			"env variable":     {Argv: []string{"true"}, Env: map[string]string{"BIG": long}},
			"too large in all": {Argv: append([]string{"true"}, slices.Repeat([]string{long[:100<<10]}, 80)...)},
		} {
			msg := st.callError(t, http.MethodPost, "/v1/exec", nil, jsonBody(t, req), http.StatusBadRequest, "invalid_request")
			if !strings.Contains(msg, name) || !strings.Contains(msg, "stdin or in a file") {
				t.Errorf("%s: message %q does not say what is too large and what to do", name, msg)
			}
		}
		if res := st.exec(t, agentproto.ExecRequest{Argv: []string{"echo", long[:32<<10]}}); res.exit.ExitCode != 0 || res.stdout.Len() != 32<<10+1 {
			t.Errorf("a 32 KiB argument: exit %d, %d bytes out", res.exit.ExitCode, res.stdout.Len())
		}
		// A command that the shell cannot find is the shell's business.
		res := st.exec(t, agentproto.ExecRequest{Cmd: "no-such-command-pandastack"})
		if res.exit.ExitCode != 127 {
			t.Errorf("shell: exit %d, want 127", res.exit.ExitCode)
		}
	})
}

// treeCmd prints the pids of a shell, a background child in its process
// group and one that escaped it with setsid, then waits.
const treeCmd = `echo $$; sleep 60 & echo $!; setsid sleep 60 & echo $!; wait`

func TestExecTimeoutKillsTree(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("needs setsid (util-linux)")
	}
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		start := time.Now()
		res := st.exec(t, agentproto.ExecRequest{Cmd: treeCmd, TimeoutMS: 1000})
		took := time.Since(start)
		if !res.exit.TimedOut || res.exit.ExitCode != -1 || res.exit.Signal != "SIGKILL" {
			t.Errorf("exit %+v, want timed out and killed by SIGKILL", res.exit)
		}
		if took > 5*time.Second || took < 900*time.Millisecond {
			t.Errorf("exec took %v, want about 1 s", took)
		}
		if d := res.exit.DurationMS; d < 900 || d > 5000 {
			t.Errorf("duration_ms %d, want about 1000", d)
		}
		waitGone(t, parsePids(t, res.stdout.String(), 3))
	})
}

// A daemon that left the tree (setsid and a double fork: re-parented, no
// parent link leads to it) dies with a timed-out command too.
func TestExecTimeoutKillsDetached(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("needs setsid (util-linux)")
	}
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		res := st.exec(t, agentproto.ExecRequest{Cmd: "sh -c 'setsid sleep 61 & echo $!'; sleep 60", TimeoutMS: 1000})
		if !res.exit.TimedOut {
			t.Fatalf("exit %+v, want timed out", res.exit)
		}
		waitGone(t, parsePids(t, res.stdout.String(), 1))
	})
}

// With the central reaper (as PID 1), a timed-out command is answered once
// what it started is reaped: the next command sees none of its zombies
// (ps listed a fork bomb's hundred after its timeout), nor has them count
// against the user's process limit.
func TestExecTimeoutAnswersOnceReaped(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		// The timeout comes once all forty have started (each says so in
		// the file p after its pid on stdout): forty starts may take a
		// while on a loaded host, and only the reaping after it is tested.
		res := st.exec(t, agentproto.ExecRequest{Cmd: `p=$(mktemp); for i in $(seq 40); do sh -c 'echo $$; echo >> "$1"; exec sleep 60' sh "$p" & done; until [ "$(wc -l < "$p")" -ge 40 ]; do sleep 0.01; done; rm "$p"; sleep 60`, TimeoutMS: 4000})
		if !res.exit.TimedOut {
			t.Fatalf("exit %+v, want timed out", res.exit)
		}
		pids := parsePids(t, res.stdout.String(), 40)
		if testReaper == nil || os.Geteuid() != 0 {
			// Their zombies go to another reaper, in its time; or, not
			// root, the agent gives no marks to wait on.
			waitGone(t, pids)
			return
		}
		var left []int
		for _, pid := range pids {
			if !processGone(pid) {
				left = append(left, pid)
			}
		}
		if len(left) > 0 {
			t.Fatalf("processes %v still there (zombies, say) when the timed-out command was answered", left)
		}
	})
}

// A client that keeps the stream open but stops reading does not keep a
// command alive past its timeout: the agent, stuck writing to it, still
// kills the command on time, and says so once the client reads again.
func TestExecTimeoutWhileClientStalls(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		pidFile := filepath.Join(cfg.Home, "pid")
		// More output than the pipe, the queue and the connection hold.
		cmd := "echo $$ > " + pidFile + "; head -c 64000000 /dev/zero; sleep 60"
		resp := st.request(t, t.Context(), http.MethodPost, "/v1/exec", nil, jsonBody(t, agentproto.ExecRequest{Cmd: cmd, TimeoutMS: 1000}))
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		var b []byte
		for deadline := time.Now().Add(5 * time.Second); !strings.HasSuffix(string(b), "\n"); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the command did not start")
			}
			b, _ = os.ReadFile(pidFile)
		}
		pids := parsePids(t, string(b), 1)
		time.Sleep(time.Second) // the timeout passes, nothing read
		waitGone(t, pids)
		dec := json.NewDecoder(resp.Body)
		for {
			var ev agentproto.ExecEvent
			if err := dec.Decode(&ev); err != nil {
				t.Fatalf("stream ended without its exit: %v", err)
			}
			if ev.Type == "exit" {
				if !ev.TimedOut || ev.Signal != "SIGKILL" {
					t.Fatalf("exit %+v, want timed out", ev)
				}
				return
			}
		}
	})
}

// A client reading slowly gets a command's whole output, however long
// after the exit it takes to read what the pipe and the queue hold then:
// the bound on the drain is for a process the command left holding the
// pipe, not for the command's own output.
func TestExecSlowReaderGetsAllOutput(t *testing.T) {
	defer agent.SetDrainMax(300 * time.Millisecond)()
	cfg := testConfig(t)
	// Small socket buffers both ways: what the pipe and the queue hold at
	// the exit stays there until the client reads it.
	srv := httptest.NewUnstartedServer(agent.NewServer(cfg, 1).Handler())
	srv.Listener = smallBuffers{srv.Listener}
	srv.Start()
	t.Cleanup(srv.Close)
	st := &stack{base: srv.URL, hc: &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err == nil {
			c.(*net.TCPConn).SetReadBuffer(16 << 10)
		}
		return c, err
	}}}}
	const size = 4 << 20
	n, notes := 0, ""
	res := st.execStream(t, t.Context(), agentproto.ExecRequest{Cmd: "head -c " + strconv.Itoa(size) + " /dev/zero"}, func(ev agentproto.ExecEvent) {
		switch ev.Type {
		case "stdout":
			n += len(ev.Data)
			time.Sleep(time.Duration(len(ev.Data)) * time.Second / (1 << 20)) // 1 MiB/s
		case "stderr":
			notes += string(ev.Data)
		}
	})
	if n != size || res.exit.ExitCode != 0 || notes != "" {
		t.Fatalf("read %d of %d bytes, exit %+v, stderr %q", n, size, res.exit, notes)
	}
}

// smallBuffers gives the connections it accepts a small send buffer.
type smallBuffers struct{ net.Listener }

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		c.(*net.TCPConn).SetWriteBuffer(16 << 10)
	}
	return c, err
}

// A process the command left holding its output, writing on, is cut off
// drainMax after the command's exit, and the stream says so.
func TestExecDrainStopsForAStrayWriter(t *testing.T) {
	defer agent.SetDrainMax(300 * time.Millisecond)()
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		// An endless writer, which dies of SIGPIPE once the pipe is closed.
		res := st.exec(t, agentproto.ExecRequest{Cmd: "yes & sleep 0.2"})
		if res.exit.ExitCode != 0 || !strings.Contains(res.stderr.String(), "output after this point was not read") {
			t.Fatalf("exit %+v, stderr %q", res.exit, res.stderr.String())
		}
	})
}

func TestExecCancelKillsTree(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		t.Skip("needs setsid (util-linux)")
	}
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		resp := st.request(t, ctx, http.MethodPost, "/v1/exec", nil, jsonBody(t, agentproto.ExecRequest{Cmd: treeCmd}))
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		dec := json.NewDecoder(resp.Body)
		var out strings.Builder
		for strings.Count(out.String(), "\n") < 3 {
			var ev agentproto.ExecEvent
			if err := dec.Decode(&ev); err != nil {
				t.Fatalf("stream ended before the pids were printed: %v (stdout %q)", err, out.String())
			}
			if ev.Type == "exit" {
				t.Fatalf("command exited early: %+v", ev)
			}
			if ev.Type == "stdout" {
				out.Write(ev.Data)
			}
		}
		pids := parsePids(t, out.String(), 3)
		for _, pid := range pids {
			if processGone(pid) {
				t.Fatalf("process %d gone before the cancel", pid)
			}
		}
		cancel()
		waitGone(t, pids)
	})
}

func TestExecStreamsBeforeExit(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		res := st.exec(t, agentproto.ExecRequest{Cmd: "for i in 1 2 3; do echo $i; sleep 0.3; done"})
		if got := res.stdout.String(); got != "1\n2\n3\n" {
			t.Errorf("stdout %q", got)
		}
		if res.chunks < 2 {
			t.Errorf("output came in %d chunk(s), want one per line", res.chunks)
		}
		if gap := res.exitAt.Sub(res.firstOutput); gap < 400*time.Millisecond {
			t.Errorf("first output arrived %v before the exit, want about 0.9 s: output is not streamed", gap)
		}
	})
}

func TestExecLargeOutput(t *testing.T) {
	if testReaper != nil {
		t.Skip("throughput does not depend on the reaper; the main run covers it")
	}
	const size = 50 << 20
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		n := 0
		res := st.execStream(t, context.Background(), agentproto.ExecRequest{Cmd: "head -c " + strconv.Itoa(size) + " /dev/zero"},
			func(ev agentproto.ExecEvent) {
				if ev.Type == "stdout" {
					n += len(ev.Data)
					// Output that floods in is batched, up to 256 KiB an event.
					if len(ev.Data) > 256<<10 {
						t.Errorf("a chunk of %d bytes, want at most 256 KiB", len(ev.Data))
					}
				}
			})
		if n != size || res.exit.ExitCode != 0 {
			t.Errorf("got %d bytes and exit %+v, want %d bytes and exit 0", n, res.exit, size)
		}
	})
}

func TestExecBackgroundChildHoldsPipes(t *testing.T) {
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		start := time.Now()
		res := st.exec(t, agentproto.ExecRequest{Cmd: "echo started; sleep 20 &"})
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("exec took %v: it waited for the background child's pipes", took)
		}
		if res.stdout.String() != "started\n" || res.exit.ExitCode != 0 {
			t.Errorf("stdout %q exit %+v", res.stdout.String(), res.exit)
		}
	})
}

// TestCentralReaper runs the exec tests again the way the agent runs as PID 1:
// a subreaper whose one reaper goroutine waits for every child.
func TestCentralReaper(t *testing.T) {
	if testReaper != nil {
		t.Skip("already in the central-reaper run")
	}
	if testing.Short() {
		t.Skip("runs the exec tests again")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestExec", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), centralReaperEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("exec tests with the central reaper failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "--- PASS: TestExecTimeoutKillsTree") {
		t.Fatalf("the timeout test did not run:\n%s", out)
	}
}

func q(kv ...string) url.Values {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v[kv[i]] = append(v[kv[i]], kv[i+1])
	}
	return v
}

func TestSetEnv(t *testing.T) {
	t.Cleanup(func() { os.Unsetenv("PANDASTACK_TEST_SET") })
	forEachStack(t, func(t *testing.T, cfg agent.Config, st *stack) {
		st.call(t, http.MethodPost, "/v1/env", nil, jsonBody(t, agentproto.EnvRequest{Env: map[string]string{"PANDASTACK_TEST_SET": "/x/ca.crt"}}), http.StatusOK, nil)
		if got := st.exec(t, agentproto.ExecRequest{Cmd: `echo "$PANDASTACK_TEST_SET"`}).stdout.String(); got != "/x/ca.crt\n" {
			t.Errorf("after POST /v1/env a command sees %q", got)
		}
		st.callError(t, http.MethodPost, "/v1/env", nil, jsonBody(t, agentproto.EnvRequest{Env: map[string]string{"1BAD": "x"}}), http.StatusBadRequest, "invalid_request")
		st.call(t, http.MethodPost, "/v1/env", nil, jsonBody(t, agentproto.EnvRequest{Env: map[string]string{"PANDASTACK_TEST_SET": ""}}), http.StatusOK, nil)
		if got := st.exec(t, agentproto.ExecRequest{Cmd: `echo "${PANDASTACK_TEST_SET-unset}"`}).stdout.String(); got != "unset\n" {
			t.Errorf("after removing, a command sees %q", got)
		}
	})
}
