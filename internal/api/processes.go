package api

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/history"
	"github.com/pandastack/pandastack/internal/sandbox"
)

// execBackground starts req in the background (exec with background:
// true) and answers with its Process at once. Without timeout_seconds it
// runs until it ends, is killed, or the sandbox goes.
func (s *Server) execBackground(w http.ResponseWriter, r *http.Request, project string, req execRequest) {
	var timeoutMS int64
	if req.TimeoutSeconds != nil {
		timeout, err := s.timeout(req.TimeoutSeconds, 0)
		if err != nil {
			writeError(w, err)
			return
		}
		timeoutMS = timeout.Milliseconds()
	}
	agent, done, err := s.mgr.Acquire(r.Context(), project, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer done()
	cmd := req.Cmd
	if cmd == "" {
		cmd = strings.Join(req.Argv, " ")
	}
	rec := s.history.Begin(project, r.PathValue("id"), history.Entry{Kind: history.KindExec, Command: cmd, Background: true})
	p, err := agent.StartProcess(r.Context(), agentproto.ExecRequest{Argv: req.Argv, Cmd: req.Cmd, Env: req.Env, Cwd: req.Cwd, TimeoutMS: timeoutMS, Stdin: []byte(req.Stdin)})
	rec.End(func(e *history.Entry) {
		if err != nil {
			e.Failure = failure(r.Context(), err)
			return
		}
		e.PID = p.PID
	})
	if err != nil {
		s.logFailure(r, err)
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// processAgent resolves the sandbox's agent and the {pid} of the path.
func (s *Server) processAgent(w http.ResponseWriter, r *http.Request, project string) (*sandbox.AgentClient, int, bool) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		writeError(w, pandastack.Errorf(pandastack.EInvalid, "process id %q is not a positive number", r.PathValue("pid")))
		return nil, 0, false
	}
	agent, err := s.mgr.Agent(r.Context(), project, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return nil, 0, false
	}
	return agent, pid, true
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request, project string) {
	agent, err := s.mgr.Agent(r.Context(), project, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	list, err := agent.ListProcesses(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"processes": list})
}

// processOutput streams a background process's output as NDJSON, the same
// events as a streamed exec: from the first kept byte, with ?follow=true
// until the process ends.
func (s *Server) processOutput(w http.ResponseWriter, r *http.Request, project string) {
	pid, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || pid <= 0 {
		writeError(w, pandastack.Errorf(pandastack.EInvalid, "process id %q is not a positive number", r.PathValue("pid")))
		return
	}
	// Checked before the hold, which wakes a suspended sandbox.
	var follow bool
	switch v := r.URL.Query().Get("follow"); v {
	case "", "false", "0":
	case "true", "1":
		follow = true
	default:
		writeError(w, pandastack.Errorf(pandastack.EInvalid, "follow must be true or false, not %.40q", v))
		return
	}
	// Someone following the output is using the sandbox: it is not idle
	// (nor suspended under the stream) until the stream ends.
	agent, done, err := s.mgr.Hold(r.Context(), project, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer done()
	nd := newNDJSON(w)
	_, err = agent.ProcessOutput(r.Context(), pid, follow, func(ev agentproto.ExecEvent) error {
		return nd.sendExec(ev)
	})
	if err != nil && (r.Context().Err() == nil || revokedErr(r.Context(), nil) != nil) {
		s.logFailure(r, err)
		err = agent.Explain(err) // after logFailure reconciled: say how it ended
		if !nd.started {
			writeError(w, err)
			return
		}
		eb := errorJSON(revokedErr(r.Context(), err))
		nd.flushCarry()
		nd.send(streamEvent{Type: "error", Error: &eb.Error})
		return
	}
	// Output so far of a process still running ends where it ends: a
	// character it has not finished writing goes as it is.
	if nd.flushCarry(); nd.started {
		nd.rc.Flush()
	}
	if !nd.started { // no output yet: an empty stream
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
	}
}

type stdinRequest struct {
	Data string `json:"data"`
	EOF  bool   `json:"eof"`
}

func (s *Server) processStdin(w http.ResponseWriter, r *http.Request, project string) {
	var req stdinRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	agent, pid, ok := s.processAgent(w, r, project)
	if !ok {
		return
	}
	if err := agent.ProcessStdin(r.Context(), pid, agentproto.StdinRequest{Data: []byte(req.Data), EOF: req.EOF}); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) killProcess(w http.ResponseWriter, r *http.Request, project string) {
	agent, pid, ok := s.processAgent(w, r, project)
	if !ok {
		return
	}
	if err := agent.KillProcess(r.Context(), pid); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// killAllProcesses kills every process of the sandbox user but the code
// contexts' kernels: the way out of a fork bomb that keeps the kernels'
// state.
func (s *Server) killAllProcesses(w http.ResponseWriter, r *http.Request, project string) {
	// Work in flight: a snapshot, fork or pause meanwhile answers
	// conflict rather than catch every process of the user stopped.
	agent, done, err := s.mgr.Acquire(r.Context(), project, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer done()
	k, err := agent.KillAll(r.Context())
	if err != nil {
		s.logFailure(r, err)
		writeError(w, agent.Explain(err))
		return
	}
	writeJSON(w, http.StatusOK, k)
}
