package sandbox

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// TestHostKillNote: a command killed by SIGKILL while the host's count of
// out-of-memory kills went up is told so last on its stderr, once; one the
// agent's watch killed (its own note), one timed out, one killed with the
// count unchanged, or one in a runtime that cannot count, is left as the
// agent said.
func TestHostKillNote(t *testing.T) {
	const agentNote = "\npandastack: out_of_memory: the sandbox's 1024 MiB were nearly used up, and this command was killed\n"
	for _, c := range []struct {
		name     string
		events   string // the agent's answer, NDJSON
		counts   bool   // the runtime counts host kills
		kill     bool   // the count goes up while the command runs
		wantNote bool
	}{
		{"host kill", `{"type":"stdout","data":"eA=="}` + "\n" + `{"type":"exit","exit_code":-1,"signal":"SIGKILL"}`, true, true, true},
		{"watch kill", `{"type":"stderr","data":"` + b64(agentNote) + `"}` + "\n" + `{"type":"exit","exit_code":-1,"signal":"SIGKILL"}`, true, true, false},
		{"timed out", `{"type":"exit","exit_code":-1,"signal":"SIGKILL","timed_out":true}`, true, true, false},
		{"kill -9", `{"type":"exit","exit_code":-1,"signal":"SIGKILL"}`, true, false, false},
		{"exit 1", `{"type":"exit","exit_code":1}`, true, true, false},
		{"no count", `{"type":"exit","exit_code":-1,"signal":"SIGKILL"}`, false, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			var kills atomic.Int64
			kills.Store(2)
			ac := fakeAgent(t, func(mux *http.ServeMux) {
				mux.HandleFunc("POST /v1/exec", func(w http.ResponseWriter, r *http.Request) {
					if c.kill {
						kills.Add(1)
					}
					w.Write([]byte(c.events + "\n"))
				})
			})
			if c.counts {
				ac.hostOOMKills = kills.Load
			}
			var stderr strings.Builder
			var types []string
			exit, err := ac.Exec(context.Background(), agentproto.ExecRequest{Argv: []string{"fill"}}, func(ev agentproto.ExecEvent) error {
				types = append(types, ev.Type)
				if ev.Type == "stderr" {
					stderr.Write(ev.Data)
				}
				return nil
			})
			if err != nil || exit.Type != "exit" {
				t.Fatalf("exec: %+v %v", exit, err)
			}
			host := strings.Count(stderr.String(), "and the host killed this command")
			if c.wantNote && (host != 1 || types[len(types)-2] != "stderr" || !strings.HasPrefix(stderr.String(), "\npandastack: out_of_memory: ")) {
				t.Fatalf("events %v, stderr %q; want the host's note once, just before the exit", types, stderr.String())
			}
			if !c.wantNote && host != 0 {
				t.Fatalf("stderr %q; want no host note", stderr.String())
			}
		})
	}
}

// TestHostKillNoteBackground: a background process's output ends with the
// host's note when the count went up after the process started, on every
// read of it; a process the client did not start (another server's
// session) gets none.
func TestHostKillNoteBackground(t *testing.T) {
	var kills atomic.Int64
	ac := fakeAgent(t, func(mux *http.ServeMux) {
		mux.HandleFunc("POST /v1/processes", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"pid":41}`))
		})
		mux.HandleFunc("GET /v1/processes/{pid}/output", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"type":"exit","exit_code":-1,"signal":"SIGKILL"}` + "\n"))
		})
	})
	ac.hostOOMKills = kills.Load
	if p, err := ac.StartProcess(context.Background(), agentproto.ExecRequest{Argv: []string{"fill"}}); err != nil || p.PID != 41 {
		t.Fatalf("start: %+v %v", p, err)
	}
	kills.Add(1)
	read := func(pid int) string {
		var stderr strings.Builder
		if _, err := ac.ProcessOutput(context.Background(), pid, true, func(ev agentproto.ExecEvent) error {
			if ev.Type == "stderr" {
				stderr.Write(ev.Data)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return stderr.String()
	}
	for i := range 2 {
		if got := read(41); !strings.Contains(got, "the host killed this background process") {
			t.Fatalf("read %d of the output: stderr %q, want the host's note", i, got)
		}
	}
	if got := read(42); got != "" {
		t.Fatalf("a process not started here: stderr %q", got)
	}
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// TestHostKillNoteKernel: a run whose kernel died while the host's count
// went up says the host killed it; one the agent's watch killed, or with
// the count unchanged, keeps the agent's words.
func TestHostKillNoteKernel(t *testing.T) {
	for _, c := range []struct {
		name, value string
		kill        bool
		want        string
	}{
		{"host kill", "the kernel process exited (killed by SIGKILL)", true, "the kernel process exited (killed by SIGKILL); out_of_memory: the sandbox ran out of memory before its memory watch could act, and the host killed the kernel"},
		{"watch kill", "out_of_memory: the kernel used 805 MiB, more than its limit", true, "out_of_memory: the kernel used 805 MiB, more than its limit"},
		{"no host kill", "the kernel process exited (exit status 1)", false, "the kernel process exited (exit status 1)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var kills atomic.Int64
			ac := fakeAgent(t, func(mux *http.ServeMux) {
				mux.HandleFunc("POST /v1/contexts/{id}/run", func(w http.ResponseWriter, r *http.Request) {
					if c.kill {
						kills.Add(1)
					}
					json.NewEncoder(w).Encode(agentproto.CodeEvent{Type: "execution", Execution: &agentproto.Execution{Error: &agentproto.ExecutionError{Name: "KernelDied", Value: c.value}}})
				})
			})
			ac.hostOOMKills = kills.Load
			ex, err := ac.RunCode(context.Background(), "ctx_a", agentproto.RunRequest{Code: "fill()"}, nil)
			if err != nil || ex.Error == nil || ex.Error.Value != c.want {
				t.Fatalf("run: %+v %v; want KernelDied %q", ex.Error, err, c.want)
			}
		})
	}
}
