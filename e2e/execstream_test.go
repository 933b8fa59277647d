package e2e

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/client"
)

// TestExecStreamBinary streams a command's output in the binary format
// (Accept: application/vnd.pandastack.stream) through the real server and
// sandbox: every byte arrives, stdout and stderr apart, with the exit code.
func TestExecStreamBinary(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{})

	t.Run("64 MB of random bytes", func(t *testing.T) {
		made, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "head -c 67108864 /dev/urandom > blob && sha256sum blob", TimeoutSeconds: 120})
		if err != nil || made.ExitCode != 0 {
			t.Fatalf("making the blob: %+v %v", made, err)
		}
		want, _, _ := strings.Cut(made.Stdout, " ")
		sum := sha256.New()
		var n countWriter
		var stderr syncBuffer
		res, err := c.ExecPipe(ctx, sb.ID, client.ExecRequest{Cmd: "cat blob; echo done >&2; exit 7", TimeoutSeconds: 300}, multi{sum, &n}, &stderr)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprintf("%x", sum.Sum(nil)); got != want || n != 64<<20 {
			t.Fatalf("streamed %d bytes with sha256 %s, want %d with %s", n, got, 64<<20, want)
		}
		if res.ExitCode != 7 || res.TimedOut || stderr.String() != "done\n" {
			t.Fatalf("exit %+v, stderr %q; want exit 7 and done", res, stderr.String())
		}
	})
	t.Run("timeout ends with the exit frame", func(t *testing.T) {
		var out syncBuffer
		res, err := c.ExecPipe(ctx, sb.ID, client.ExecRequest{Cmd: "echo start; sleep 60", TimeoutSeconds: 5}, &out, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !res.TimedOut || out.String() != "start\n" {
			t.Fatalf("exit %+v, stdout %q; want timed out after start", res, out.String())
		}
	})
	t.Run("a failing writer stops the command", func(t *testing.T) {
		_, err := c.ExecPipe(ctx, sb.ID, client.ExecRequest{Cmd: "yes", TimeoutSeconds: 60}, failAfter{}, nil)
		if err == nil || !strings.Contains(err.Error(), "writing stdout") {
			t.Fatalf("err = %v, want the writer's error", err)
		}
		// The command is gone: the sandbox has no yes left running.
		ps, err := c.Exec(ctx, sb.ID, client.ExecRequest{TimeoutSeconds: 90, Cmd: "for i in $(seq 200); do pgrep -x yes >/dev/null || exit 0; sleep 0.1; done; ps -eo pid,args; exit 1"})
		if err != nil || ps.ExitCode != 0 {
			t.Fatalf("yes still running: %+v %v", ps, err)
		}
	})
	t.Run("unknown sandbox", func(t *testing.T) {
		_, err := c.ExecPipe(ctx, "sbx-doesnotexist", client.ExecRequest{Cmd: "true"}, nil, nil)
		if !client.IsCode(err, "not_found") {
			t.Fatalf("err = %v, want not_found", err)
		}
	})
	t.Run("bad request", func(t *testing.T) {
		_, err := c.ExecPipe(ctx, sb.ID, client.ExecRequest{}, nil, nil)
		if !client.IsCode(err, "invalid_request") {
			t.Fatalf("err = %v, want invalid_request", err)
		}
	})
}

type countWriter int64

func (c *countWriter) Write(p []byte) (int, error) { *c += countWriter(len(p)); return len(p), nil }

type multi []io.Writer

func (m multi) Write(p []byte) (int, error) {
	for _, w := range m {
		w.Write(p)
	}
	return len(p), nil
}

type failAfter struct{}

func (failAfter) Write(p []byte) (int, error) { return 0, errors.New("disk full") }
