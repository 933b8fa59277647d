//go:build linux

package main

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/testutil"
)

// buildAgent builds the agent as it ships: static, with a version stamped in.
func buildAgent(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "pandastack-agent")
	cmd := exec.Command("go", "build", "-buildvcs=false", "-o", bin, "-ldflags", "-X main.version=v-test", ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

type pipes struct {
	io.Reader
	io.WriteCloser
}

// TestAgentProcess runs the real binary on pipes, as the runtime does: it
// answers hello with its version, runs commands, and exits once stdin closes.
func TestAgentProcess(t *testing.T) {
	bin := buildAgent(t)
	t.Run("child", func(t *testing.T) { runAgent(t, bin, nil) })
	t.Run("pid1", func(t *testing.T) {
		testutil.RequireRoot(t) // for a new PID namespace
		// PID 1 of its own namespace: commands are waited for by the central reaper.
		runAgent(t, bin, &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID})
	})
}

func runAgent(t *testing.T, bin string, sys *syscall.SysProcAttr) {
	cmd := exec.Command(bin)
	cmd.SysProcAttr = sys
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			cmd.Process.Kill()
			t.Logf("agent log:\n%s", stderr.String())
		}
	}()

	sess, err := yamux.Client(agentproto.HostConn(pipes{stdout, stdin}, 3), agentproto.MuxConfig())
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(context.Context, string, string) (net.Conn, error) { return sess.Open() },
	}, Timeout: 20 * time.Second}

	resp, err := hc.Get("http://agent/v1/hello")
	if err != nil {
		t.Fatalf("hello: %v", err)
	}
	var h agentproto.Hello
	err = json.NewDecoder(resp.Body).Decode(&h)
	resp.Body.Close()
	if err != nil || h.AgentVersion != "v-test" || h.Epoch != 3 || h.ProtocolVersion != agentproto.ProtocolVersion {
		t.Fatalf("hello: %+v, %v; want version v-test, epoch 3", h, err)
	}

	// The host has no /home/user, so every command runs in /.
	for _, c := range []struct {
		req  agentproto.ExecRequest
		want agentproto.ExecEvent
		out  string
	}{
		{agentproto.ExecRequest{Cmd: "echo hi; (sleep 0.2 &)", Cwd: "/"}, agentproto.ExecEvent{ExitCode: 0}, "hi\n"},
		{agentproto.ExecRequest{Argv: []string{"sleep", "60"}, TimeoutMS: 500, Cwd: "/"}, agentproto.ExecEvent{ExitCode: -1, Signal: "SIGKILL", TimedOut: true}, ""},
	} {
		body, _ := json.Marshal(c.req)
		resp, err := hc.Post("http://agent/v1/exec", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatalf("exec %+v: %v", c.req, err)
		}
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("exec %+v: status %d: %s", c.req, resp.StatusCode, b)
		}
		dec := json.NewDecoder(resp.Body)
		var out strings.Builder
		var exit agentproto.ExecEvent
		for {
			var ev agentproto.ExecEvent
			if err := dec.Decode(&ev); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("exec %+v: %v", c.req, err)
			}
			if ev.Type == "exit" {
				exit = ev
			} else {
				out.Write(ev.Data)
			}
		}
		resp.Body.Close()
		if out.String() != c.out || exit.ExitCode != c.want.ExitCode || exit.Signal != c.want.Signal || exit.TimedOut != c.want.TimedOut {
			t.Errorf("exec %+v: output %q, exit %+v; want %q, %+v", c.req, out.String(), exit, c.out, c.want)
		}
	}

	sess.Close() // closes stdin: the agent's channel is gone for good
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("agent exited with %v, want a clean exit", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("agent still running 10 s after stdin closed")
	}
}
