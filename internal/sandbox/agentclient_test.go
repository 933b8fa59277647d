package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
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
	return fakeAgentWithContexts(t, nil, handler)
}

// fakeAgentWithContexts is fakeAgent whose hello lists contexts.
func fakeAgentWithContexts(t *testing.T, contexts []string, handler func(mux *http.ServeMux)) *AgentClient {
	t.Helper()
	return fakeAgentWithHello(t, agentproto.Hello{Contexts: contexts}, handler)
}

// fakeAgentWithHello is fakeAgent whose hello says what h says (its
// protocol version and epoch are filled in).
func fakeAgentWithHello(t *testing.T, h agentproto.Hello, handler func(mux *http.ServeMux)) *AgentClient {
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
			h := h
			h.ProtocolVersion, h.Epoch = agentproto.ProtocolVersion, epoch
			json.NewEncoder(w).Encode(h)
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

// TestHelloContextsAreKnown: the contexts a hello lists are known to the
// session (no create before a run in them); others are not.
func TestHelloContextsAreKnown(t *testing.T) {
	c := fakeAgentWithContexts(t, []string{"ctx_default_python", "ctx_x"}, func(*http.ServeMux) {})
	for id, want := range map[string]bool{"ctx_default_python": true, "ctx_x": true, "ctx_default_bash": false} {
		if got := c.HasContext(id); got != want {
			t.Errorf("HasContext(%s) = %v, want %v", id, got, want)
		}
	}
	if c := fakeAgent(t, func(*http.ServeMux) {}); len(c.KnownContexts()) != 0 {
		t.Errorf("an older agent's hello (no contexts): known %v", c.KnownContexts())
	}
}

// TestRunCreatesContext: a run that carries its context's create (an
// agent whose hello names FeatureRunCreates) makes HasContext know the
// context once the agent started it; one the agent refused does not.
func TestRunCreatesContext(t *testing.T) {
	var mu sync.Mutex
	var created []string
	c := fakeAgent(t, func(mux *http.ServeMux) {
		mux.HandleFunc("POST /v1/contexts/{id}/run", func(w http.ResponseWriter, r *http.Request) {
			var req agentproto.RunRequest
			json.NewDecoder(r.Body).Decode(&req)
			if r.PathValue("id") == "ctx_bad" {
				w.WriteHeader(http.StatusBadRequest)
				var eb agentproto.ErrorBody
				eb.Error.Code, eb.Error.Message = pandastack.EInvalid, "no kernel for that"
				json.NewEncoder(w).Encode(eb)
				return
			}
			if req.Create != nil {
				mu.Lock()
				created = append(created, req.Create.ID)
				mu.Unlock()
			}
			json.NewEncoder(w).Encode(agentproto.CodeEvent{Type: "execution", Execution: &agentproto.Execution{}})
		})
	})
	ctx := context.Background()
	for _, id := range []string{"ctx_default_python", "ctx_bad"} {
		c.RunCode(ctx, id, agentproto.RunRequest{Code: "1", Create: &agentproto.ContextRequest{ID: id, Language: "python"}}, nil)
	}
	if !c.HasContext("ctx_default_python") || c.HasContext("ctx_bad") {
		t.Fatalf("known after runs with create: %v, want ctx_default_python alone", c.KnownContexts())
	}
	if _, err := c.RunCode(ctx, "ctx_x", agentproto.RunRequest{Code: "1"}, nil); err != nil || c.HasContext("ctx_x") {
		t.Fatalf("a run without create: %v, known %v", err, c.KnownContexts())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(created) != 1 || created[0] != "ctx_default_python" {
		t.Fatalf("the agent was asked to create %q", created)
	}
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
	if !pandastack.IsCode(err, pandastack.EStopped) || !strings.Contains(err.Error(), "was killed") || !strings.Contains(err.Error(), "running code") {
		t.Fatalf("run cut off by a kill: %v", err)
	}
	if err := c.Explain(pandastack.Errorf(pandastack.EUnavailable, "sandbox sbx_test stopped answering during exec")); !strings.Contains(err.Error(), "was killed") || !strings.Contains(err.Error(), "exec") {
		t.Fatalf("Explain: %v", err)
	}
}

// TestCutByKillOnExit: a request cut off because a server run with
// --kill-on-exit stops says so; it said the sandbox was killed by a DELETE
// nobody sent.
func TestCutByKillOnExit(t *testing.T) {
	c := fakeAgent(t, func(mux *http.ServeMux) {})
	c.markStopped(reasonKillOnExit)
	err := c.Explain(pandastack.Errorf(pandastack.EUnavailable, "sandbox sbx_test stopped answering during exec"))
	if !pandastack.IsCode(err, pandastack.EStopped) || !strings.Contains(err.Error(), "--kill-on-exit") || strings.Contains(err.Error(), "DELETE") || !strings.Contains(err.Error(), "exec") {
		t.Fatalf("cut off by --kill-on-exit: %v", err)
	}
}

// TestProcessOutputCutByKill: following a background process's output
// when the sandbox is killed fails saying so (it was an internal error),
// and the output so far without follow still ends cleanly.
func TestProcessOutputCutByKill(t *testing.T) {
	started := make(chan struct{})
	c := fakeAgent(t, func(mux *http.ServeMux) {
		mux.HandleFunc("GET /v1/processes/{pid}/output", func(w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(`{"type":"stdout","data":"Z28="}` + "\n"))
			if r.URL.Query().Get("follow") == "" {
				return
			}
			w.(http.Flusher).Flush()
			close(started)
			<-r.Context().Done()
		})
	})
	var got int
	count := func(agentproto.ExecEvent) error { got++; return nil }
	if ev, err := c.ProcessOutput(context.Background(), 7, false, count); err != nil || ev != nil || got != 1 {
		t.Fatalf("output so far: %v %v, %d events", ev, err, got)
	}
	go func() {
		<-started
		c.markStopped(pandastack.StopKilled)
		c.Close()
	}()
	_, err := c.ProcessOutput(context.Background(), 7, true, count)
	if !pandastack.IsCode(err, pandastack.EStopped) || !strings.Contains(err.Error(), "was killed") || !strings.Contains(err.Error(), "the output of process 7") {
		t.Fatalf("output followed, cut off by a kill: %v", err)
	}
	if err := c.Explain(err); !strings.Contains(err.Error(), "during the output of process 7") {
		t.Fatalf("Explain: %v", err)
	}
}

// TestHasContext: a context made or found by CreateContext is known until
// DeleteContext, or until a run finds it gone; a failed create teaches
// nothing.
func TestHasContext(t *testing.T) {
	exists := map[string]bool{"ctx_there": true}
	var mu sync.Mutex
	c := fakeAgent(t, func(mux *http.ServeMux) {
		mux.HandleFunc("POST /v1/contexts", func(w http.ResponseWriter, r *http.Request) {
			var req agentproto.ContextRequest
			json.NewDecoder(r.Body).Decode(&req)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case req.Language != "python":
				w.WriteHeader(http.StatusBadRequest)
				agentError(w, pandastack.EInvalid, "unknown language")
			case exists[req.ID]:
				w.WriteHeader(http.StatusConflict)
				agentError(w, pandastack.EConflict, "exists")
			default:
				exists[req.ID] = true
				json.NewEncoder(w).Encode(agentproto.Context{ID: req.ID, Language: req.Language})
			}
		})
		mux.HandleFunc("DELETE /v1/contexts/{id}", func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			delete(exists, r.PathValue("id"))
			mu.Unlock()
			w.WriteHeader(http.StatusNoContent)
		})
		mux.HandleFunc("POST /v1/contexts/{id}/run", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNotFound)
			agentError(w, pandastack.ENotFound, "no code context")
		})
	})
	ctx := context.Background()
	if c.HasContext("ctx_new") || c.HasContext("ctx_there") {
		t.Fatal("a new session knows contexts it never asked about")
	}
	if _, err := c.CreateContext(ctx, agentproto.ContextRequest{ID: "ctx_new", Language: "python"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateContext(ctx, agentproto.ContextRequest{ID: "ctx_there", Language: "python"}); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("create of an existing context: %v, want conflict", err)
	}
	if _, err := c.CreateContext(ctx, agentproto.ContextRequest{ID: "ctx_cobol", Language: "cobol"}); !pandastack.IsCode(err, pandastack.EInvalid) {
		t.Fatalf("create in an unknown language: %v, want invalid", err)
	}
	if !c.HasContext("ctx_new") || !c.HasContext("ctx_there") || c.HasContext("ctx_cobol") {
		t.Fatalf("known: new %v, there %v, cobol %v; want true, true, false", c.HasContext("ctx_new"), c.HasContext("ctx_there"), c.HasContext("ctx_cobol"))
	}
	if err := c.DeleteContext(ctx, "ctx_new"); err != nil {
		t.Fatal(err)
	}
	if c.HasContext("ctx_new") {
		t.Fatal("a deleted context is still known")
	}
	if _, err := c.RunCode(ctx, "ctx_there", agentproto.RunRequest{Code: "1+1"}, nil); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Fatalf("run in a context the agent lost: %v, want not_found", err)
	}
	if c.HasContext("ctx_there") {
		t.Fatal("a context a run found gone is still known")
	}
}

// agentError answers an error as the agent does, after the status.
func agentError(w http.ResponseWriter, code, msg string) {
	var eb agentproto.ErrorBody
	eb.Error.Code, eb.Error.Message = code, msg
	json.NewEncoder(w).Encode(eb)
}

// TestRunCodeTimed: the agent's breakdown comes back with the execution,
// and never with an output event.
func TestRunCodeTimed(t *testing.T) {
	c := fakeAgent(t, func(mux *http.ServeMux) {
		mux.HandleFunc("POST /v1/contexts/{id}/run", func(w http.ResponseWriter, r *http.Request) {
			enc := json.NewEncoder(w)
			enc.Encode(agentproto.CodeEvent{Type: "stdout", Data: "hi", Timing: &agentproto.RunTiming{HandlerUS: 1}})
			enc.Encode(agentproto.CodeEvent{Type: "execution", Execution: &agentproto.Execution{Text: "2"}, Timing: &agentproto.RunTiming{HandlerUS: 1500, KernelUS: 1200, Messages: 4}})
		})
	})
	var events []agentproto.CodeEvent
	ex, timing, err := c.RunCodeTimed(context.Background(), "ctx_1", agentproto.RunRequest{Code: "1+1"}, func(ev agentproto.CodeEvent) error {
		events = append(events, ev)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ex.Text != "2" || timing == nil || timing.HandlerUS != 1500 || timing.KernelUS != 1200 || timing.Messages != 4 {
		t.Fatalf("execution %+v, timing %+v", ex, timing)
	}
	if len(events) != 1 || events[0].Data != "hi" || events[0].Timing != nil {
		t.Fatalf("events %+v: want the stdout event without timing", events)
	}
}

// TestStoppedCodes: a request cut off by the sandbox's end answers
// sandbox_stopped when the sandbox never runs again, and
// sandbox_unavailable (retry) when it does or when its end is not known yet.
func TestStoppedCodes(t *testing.T) {
	for reason, want := range map[string]string{
		pandastack.StopKilled:    pandastack.EStopped,
		pandastack.StopExpired:   pandastack.EStopped,
		pandastack.StopOOM:       pandastack.EStopped,
		pandastack.StopPIDsLimit: pandastack.EStopped,
		pandastack.StopLost:      pandastack.EStopped,
		reasonKillOnExit:         pandastack.EStopped,
		reasonShutdown:           pandastack.EUnavailable,
		reasonPaused:             pandastack.EUnavailable,
	} {
		c := fakeAgent(t, func(mux *http.ServeMux) {})
		c.markStopped(reason)
		if err := c.Explain(pandastack.Errorf(pandastack.EUnavailable, "cut off during exec")); !pandastack.IsCode(err, want) {
			t.Errorf("cut off for %q: %v, want %s", reason, err, want)
		}
	}
	c := fakeAgent(t, func(mux *http.ServeMux) {})
	if err := c.Explain(pandastack.Errorf(pandastack.EUnavailable, "cut off during exec")); !pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Errorf("cut off before the manager knew why: %v, want %s", err, pandastack.EUnavailable)
	}
}

// errReader fails its first read.
type errReader struct{ err error }

func (r errReader) Read([]byte) (int, error) { return 0, r.err }

// A request whose body fails to read is the caller's failure (BodyError,
// unwrapping to the read's error), never "the sandbox is not answering".
func TestBrokenBodyIsTheCallers(t *testing.T) {
	c := fakeAgent(t, func(mux *http.ServeMux) {
		mux.HandleFunc("PUT /v1/files", func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Write([]byte(`{}`))
		})
	})
	tooBig := &http.MaxBytesError{Limit: 10}
	_, err := c.PutFile(context.Background(), "/home/user/x", false, io.MultiReader(strings.NewReader("some"), errReader{tooBig}))
	var be *BodyError
	var mb *http.MaxBytesError
	if !errors.As(err, &be) || !errors.As(err, &mb) || pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Fatalf("a body over its limit: %v, want a BodyError unwrapping to *http.MaxBytesError", err)
	}
	_, err = c.PutFile(context.Background(), "/home/user/x", false, errReader{errors.New("invalid byte in chunk length")})
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "chunk length") {
		t.Fatalf("a malformed body: %v, want a BodyError", err)
	}
	if _, err := c.PutFile(context.Background(), "/home/user/x", false, strings.NewReader("whole")); err != nil {
		t.Fatalf("a whole body: %v", err)
	}
}

// An agent of an older build, which lacks a route or a feature, is
// answered as such: a conflict that names what it cannot do, never the
// not_found of its catch-all (an SDK's NotFoundError said the sandbox or
// file was missing) nor a 503 that says to retry.
func TestOlderAgentCannot(t *testing.T) {
	c := fakeAgent(t, func(mux *http.ServeMux) {
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNotFound)
			var b agentproto.ErrorBody
			b.Error.Code, b.Error.Message = pandastack.ENotFound, "the agent has no endpoint "+r.Method+" "+r.URL.Path+"; see internal/agentproto/api.go for its API"
			json.NewEncoder(w).Encode(b)
		})
	})
	ctx := context.Background()
	_, err := c.RenameFile(ctx, "a", "b", false, false)
	if !pandastack.IsCode(err, pandastack.EConflict) || !strings.Contains(pandastack.ErrorMessage(err), "older server build") || !strings.Contains(pandastack.ErrorMessage(err), "a file rename") {
		t.Errorf("rename on an older agent: %v", err)
	}
	if _, err := c.KillAll(ctx); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Errorf("kill-all on an agent without the feature: %v", err)
	}
	if err := c.WatchDir(ctx, "/home/user", false, false, func(agentproto.FileEvent) error { return nil }); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Errorf("watch on an agent without the feature: %v", err)
	}
}

// A watch's stream comes from inside the sandbox, where it may be tampered
// with: an error code an agent may not give is an internal error, not the
// caller's (an "unauthorized" there made an SDK raise an authentication
// error for a good key), and event types the host does not know are
// dropped.
func TestWatchDirDistrustsTheAgent(t *testing.T) {
	c := fakeAgentWithHello(t, agentproto.Hello{Features: []string{agentproto.FeatureWatch}}, func(mux *http.ServeMux) {
		mux.HandleFunc("GET /v1/files/watch", func(w http.ResponseWriter, r *http.Request) {
			enc := json.NewEncoder(w)
			enc.Encode(agentproto.FileEvent{Type: "watching", Path: "/home/user"})
			enc.Encode(agentproto.FileEvent{Type: "bogus", Path: "/x"})
			enc.Encode(agentproto.FileEvent{Type: "create", Path: "/home/user/a", Name: "a"})
			enc.Encode(agentproto.FileEvent{Type: "error", Error: &pandastack.StreamError{Code: pandastack.EUnauthorized, Message: "no"}})
		})
	})
	var got []string
	err := c.WatchDir(context.Background(), "/home/user", false, false, func(ev agentproto.FileEvent) error {
		got = append(got, ev.Type)
		return nil
	})
	if strings.Join(got, ",") != "watching,create" {
		t.Errorf("events %v, want watching and create", got)
	}
	if code := pandastack.ErrorCode(err); err == nil || code == pandastack.EUnauthorized {
		t.Errorf("an agent's unauthorized: %v (code %s), want an internal error", err, code)
	}
}

// A request cut off by the server's shutdown is named as the caller knows
// it, not by the agent's route, and Explain keeps that name.
func TestCutOffRequestsNamed(t *testing.T) {
	for _, c := range []struct{ method, path, want string }{
		{"PUT", "/v1/files", "a file upload"},
		{"GET", "/v1/files", "a file download"},
		{"GET", "/v1/files/list", "a file operation"},
		{"POST", "/v1/files/rename", "a file rename"},
		{"POST", "/v1/exec", "exec"},
		{"POST", "/v1/contexts/ctx_1/run", "running code"},
		{"POST", "/v1/env", "the request"},
	} {
		what := describe(c.method, c.path)
		if what != c.want {
			t.Errorf("%s %s is described as %q, want %q", c.method, c.path, what, c.want)
		}
		ac := &AgentClient{id: "sbx_test"}
		ac.markStopped(reasonShutdown)
		err := ac.Explain(pandastack.Errorf(pandastack.EUnavailable, "sandbox sbx_test is not answering during %s: EOF", what))
		if !strings.Contains(err.Error(), "cut off "+c.want+" in sandbox") {
			t.Errorf("%s %s cut off by the shutdown: %v", c.method, c.path, err)
		}
	}
}

// A request cancelled while its answer's body is read ends at once, even
// when the agent sends nothing more (a dead sandbox's): yamux's Close only
// half-closes a stream, and the read waited for the session's keepalive.
func TestCancelEndsABodyReadFromASilentAgent(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	c := fakeAgent(t, func(mux *http.ServeMux) {
		mux.HandleFunc("POST /v1/exec", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-release // says nothing more, whatever the client does
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, agentproto.ExecRequest{Cmd: "true"}, nil)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a cancelled exec returned no error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a cancelled exec still waits for the silent agent after 10 s")
	}
}

// endless is an answer that never ends: `[0,0,0,…`.
type endless struct{ at int }

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		switch {
		case e.at == 0:
			p[i] = '['
		case e.at%2 == 1:
			p[i] = '0'
		default:
			p[i] = ','
		}
		e.at++
	}
	return len(p), nil
}

// An agent's answer is read up to maxAgentAnswer: one that goes on (code
// in the sandbox tampering with the agent) fails, rather than filling the
// server's memory.
func TestAgentAnswerCapped(t *testing.T) {
	var v []int
	err := json.NewDecoder(&capped{r: &endless{}, left: 1 << 20}).Decode(&v)
	if !errors.Is(err, errAnswerTooLarge) {
		t.Fatalf("decoding an endless answer: %v, want %v", err, errAnswerTooLarge)
	}
	var ok []int
	if err := json.NewDecoder(&capped{r: strings.NewReader("[1,2,3]"), left: 7}).Decode(&ok); err != nil || len(ok) != 3 {
		t.Fatalf("an answer of exactly the cap: %v, %v", ok, err)
	}
}
