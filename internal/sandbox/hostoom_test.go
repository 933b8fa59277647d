package sandbox

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
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
		{"bash's 137", `{"type":"exit","exit_code":137}`, true, true, true},
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
			host := strings.Count(stderr.String(), "the host's out-of-memory killer killed this command")
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
// host's note when the count went up after the process started, and every
// read of it says what the first read that saw the exit decided; a process
// the client did not start (another server's session) or killed through
// the API gets none.
func TestHostKillNoteBackground(t *testing.T) {
	var kills atomic.Int64
	var next atomic.Int64
	next.Store(40)
	ac := fakeAgent(t, func(mux *http.ServeMux) {
		mux.HandleFunc("POST /v1/processes", func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, `{"pid":%d}`, next.Add(1))
		})
		mux.HandleFunc("POST /v1/processes/{pid}/kill", func(w http.ResponseWriter, r *http.Request) {})
		mux.HandleFunc("GET /v1/processes/{pid}/output", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"type":"exit","exit_code":-1,"signal":"SIGKILL"}` + "\n"))
		})
	})
	ac.hostOOMKills = kills.Load
	start := func() int {
		p, err := ac.StartProcess(context.Background(), agentproto.ExecRequest{Argv: []string{"fill"}})
		if err != nil {
			t.Fatalf("start: %+v %v", p, err)
		}
		return p.PID
	}
	read := func(pid int) bool {
		var stderr strings.Builder
		if _, err := ac.ProcessOutput(context.Background(), pid, true, func(ev agentproto.ExecEvent) error {
			if ev.Type == "stderr" {
				stderr.Write(ev.Data)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return strings.Contains(stderr.String(), "killed this background process")
	}
	calm := start()   // read before any kill: no note, then or later
	filler := start() // the host kills while it runs
	killed := start() // killed through the API
	if read(calm) {
		t.Fatal("a process that exited before any host kill got the host's note")
	}
	kills.Add(1)
	if err := ac.KillProcess(context.Background(), killed); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if !read(filler) {
			t.Fatalf("read %d of the filler's output: no host note", i)
		}
		if read(calm) {
			t.Fatalf("read %d of a process decided before the host's kill: a host note", i)
		}
		if read(killed) {
			t.Fatalf("read %d of a process killed through the API: a host note", i)
		}
	}
	if read(99) {
		t.Fatal("a process not started here: a host note")
	}
}

// TestHostKillNoteKernel: a run whose kernel died while the host's count
// went up says the host killed it; one the agent's watch killed, or with
// the count unchanged, keeps the agent's words.
func TestHostKillNoteKernel(t *testing.T) {
	for _, c := range []struct {
		name, value string
		kill        bool
		want        string
	}{
		{"host kill", "the kernel process exited (killed by SIGKILL (out of memory, or killed))", true, "the kernel process exited (killed by SIGKILL (out of memory, or killed)); out_of_memory: the sandbox reached its host memory limit, and the host's out-of-memory killer killed the kernel"},
		{"exit 1", "the kernel process exited (exit status 1)", true, "the kernel process exited (exit status 1)"},
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

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
