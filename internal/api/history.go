package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/history"
	"github.com/pandastack/pandastack/internal/sandbox"
)

// getHistory serves GET /v1/sandboxes/{id}/history: what was run in the
// sandbox through the API, newest first. It is kept in the store: it
// outlives the sandbox and a restart of serve (until the bounds push it out).
func (s *Server) getHistory(w http.ResponseWriter, r *http.Request, project string) {
	id := r.PathValue("id")
	// Where the sandbox is tells an entry recorded running that no one
	// runs any more (its sandbox stopped, or its node lost) from one
	// another node runs (this node answers from the store when that node
	// cannot be reached).
	sb, gerr := s.mgr.Get(r.Context(), project, id)
	if gerr != nil && !pandastack.IsCode(gerr, pandastack.ENotFound) {
		writeError(w, gerr)
		return
	}
	node := s.mgr.NodeID()
	where := history.Where{
		Stopped:   gerr != nil || sb.State == pandastack.StateStopped,
		Elsewhere: node != "" && sb.NodeID != "" && sb.NodeID != node,
	}
	list, ok, err := s.history.ListAt(r.Context(), project, id, where)
	if err != nil {
		writeError(w, err)
		return
	}
	if !ok && gerr != nil {
		writeError(w, gerr)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"history": list})
}

// failure is what a history entry says of err, which ended its request:
// the revocation of the caller's key, or the caller going away, when one
// of those ended it, rather than the error they caused.
func failure(ctx context.Context, err error) string {
	if c := revokedErr(ctx, nil); c != nil {
		return "cancelled: " + pandastack.ErrorMessage(c)
	}
	var coded *pandastack.Error
	if ctx.Err() != nil && !errors.As(err, &coded) {
		return "cancelled: the caller went away before it ended"
	}
	return pandastack.ErrorMessage(err)
}

// recordedExec is agent.Exec, written to the sandbox's history as it runs.
func (s *Server) recordedExec(ctx context.Context, project, id string, agent *sandbox.AgentClient, req agentproto.ExecRequest, onEvent func(agentproto.ExecEvent) error) (agentproto.ExecEvent, error) {
	cmd := req.Cmd
	if cmd == "" {
		cmd = strings.Join(req.Argv, " ")
	}
	rec := s.history.Begin(project, id, history.Entry{Kind: history.KindExec, Command: cmd})
	exit, err := agent.Exec(ctx, req, func(ev agentproto.ExecEvent) error {
		switch ev.Type {
		case "stdout":
			rec.Stdout(ev.Data)
		case "stderr":
			rec.Stderr(ev.Data)
		}
		return onEvent(ev)
	})
	rec.End(func(e *history.Entry) {
		if err != nil {
			e.Failure = failure(ctx, err)
			return
		}
		e.ExitCode, e.TimedOut = &exit.ExitCode, exit.TimedOut
	})
	return exit, err
}

// recordedRun is agent.RunCode, written to the sandbox's history as it runs.
// The entry is finished when it returns, not stored yet: the caller calls
// the returned store once it has answered, so that the store's write is not
// on the answer's path (the history shows the outcome meanwhile). clock
// receives the times of its steps.
func (s *Server) recordedRun(ctx context.Context, project, id, cid, language string, agent *sandbox.AgentClient, req agentproto.RunRequest, onEvent func(agentproto.CodeEvent) error, clock *runClock) (ex agentproto.Execution, store func(), err error) {
	rec := s.history.Begin(project, id, history.Entry{Kind: history.KindCode, Code: req.Code, Language: language, ContextID: cid})
	clock.agentSent = time.Now()
	var timing *agentproto.RunTiming
	ex, timing, err = agent.RunCodeTimed(ctx, cid, req, func(ev agentproto.CodeEvent) error {
		switch ev.Type {
		case "stdout":
			rec.Stdout([]byte(ev.Data))
		case "stderr":
			rec.Stderr([]byte(ev.Data))
		}
		if onEvent == nil {
			return nil
		}
		return onEvent(ev)
	})
	clock.agentDone, clock.agent = time.Now(), timing
	if err == nil && ctx.Err() != nil && ex.Error != nil && ex.Error.Name == "SandboxError" {
		// The agent answers a run its caller cut off (a hang-up, a
		// revoked key) with an error of its own ("context canceled")
		// and none of the output: it failed as exec's does, its output
		// so far kept.
		err = context.Cause(ctx)
	}
	rec.Finish(func(e *history.Entry) {
		if err != nil {
			e.Failure = failure(ctx, err)
			return
		}
		// The whole outcome replaces what streamed in.
		e.Stdout, e.Stderr, e.Text = ex.Stdout, ex.Stderr, ex.Text
		for _, res := range ex.Results {
			e.Results = append(e.Results, resultKinds(res)...)
		}
		if ex.Error != nil {
			e.Error = &history.CodeError{Name: ex.Error.Name, Value: ex.Error.Value, Traceback: ex.Error.Traceback}
		}
	})
	clock.recorded = time.Now()
	return ex, rec.Store, err
}

// resultKinds names the formats a rich output carries.
func resultKinds(r agentproto.Result) []string {
	var out []string
	for _, f := range []struct {
		name string
		has  bool
	}{
		{"png", r.PNG != ""}, {"jpeg", r.JPEG != ""}, {"svg", r.SVG != ""}, {"html", r.HTML != ""},
		{"markdown", r.Markdown != ""}, {"latex", r.LaTeX != ""}, {"json", r.JSON != nil}, {"pdf", r.PDF != ""},
		{"javascript", r.JavaScript != ""}, {"plotly", r.Plotly != nil},
	} {
		if f.has {
			out = append(out, f.name)
		}
	}
	if len(out) == 0 && r.Text != "" {
		out = append(out, "text")
	}
	return out
}
