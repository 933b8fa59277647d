package sandbox

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// fakeAgent serves handler as an agent would, over the framed channel of
// a pair of pipes, and returns a client of it.
func fakeAgent(t *testing.T, handler func(mux *http.ServeMux)) *AgentClient {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	go agentproto.Serve(inR, outW, func(epoch uint32, conn io.ReadWriteCloser) {
		sess, err := yamux.Server(conn, agentproto.MuxConfig())
		if err != nil {
			return
		}
		mux := http.NewServeMux()
		mux.HandleFunc("GET /v1/hello", func(w http.ResponseWriter, r *http.Request) {
			json.NewEncoder(w).Encode(agentproto.Hello{ProtocolVersion: agentproto.ProtocolVersion, Epoch: epoch})
		})
		handler(mux)
		http.Serve(sess, mux)
	})
	rwc := struct {
		io.Reader
		io.Writer
		io.Closer
	}{outR, inW, closerFunc(func() error { inW.Close(); outR.Close(); return nil })}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := dialAgent(ctx, "sbx_test", rwc, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); inR.Close(); outW.Close() })
	return c
}

type closerFunc func() error

func (f closerFunc) Close() error { return f() }

// TestExecTooLongLine: a line the client cannot hold is reported as such,
// not as a sandbox that died.
func TestExecTooLongLine(t *testing.T) {
	c := fakeAgent(t, func(mux *http.ServeMux) {
		mux.HandleFunc("POST /v1/exec", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"type":"stdout","data":"` + strings.Repeat("A", 17<<20) + "\"}\n"))
		})
	})
	_, err := c.Exec(context.Background(), agentproto.ExecRequest{Cmd: "true"}, nil)
	if !pandastack.IsCode(err, pandastack.ETooLarge) || strings.Contains(err.Error(), "died") {
		t.Fatalf("exec with a 17 MiB line: %v, want too_large, not died", err)
	}
}

// TestRunCutByKill: a run in flight when the manager kills the sandbox
// fails saying it was killed.
func TestRunCutByKill(t *testing.T) {
	started := make(chan struct{})
	c := fakeAgent(t, func(mux *http.ServeMux) {
		mux.HandleFunc("POST /v1/contexts/{id}/run", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"type":"stdout","data":"go"}` + "\n"))
			w.(http.Flusher).Flush()
			close(started)
			<-r.Context().Done()
		})
	})
	go func() {
		<-started
		c.markStopped(pandastack.StopKilled)
		c.Close()
	}()
	_, err := c.RunCode(context.Background(), "ctx_1", agentproto.RunRequest{Code: "sleep"}, nil)
	if !pandastack.IsCode(err, pandastack.EUnavailable) || !strings.Contains(err.Error(), "was killed") || !strings.Contains(err.Error(), "running code") {
		t.Fatalf("run cut off by a kill: %v", err)
	}
	if err := c.Explain(pandastack.Errorf(pandastack.EUnavailable, "sandbox sbx_test stopped answering during exec")); !strings.Contains(err.Error(), "was killed") || !strings.Contains(err.Error(), "exec") {
		t.Fatalf("Explain: %v", err)
	}
}
