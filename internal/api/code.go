package api

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/sandbox"
)

type createContextRequest struct {
	Language    string            `json:"language"`
	Cwd         string            `json:"cwd"`
	Env         map[string]string `json:"env"`
	AutoRestart *bool             `json:"auto_restart"`
}

func (s *Server) createContext(w http.ResponseWriter, r *http.Request, project string) {
	var req createContextRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := sandbox.ValidateEnv(req.Env); err != nil {
		writeError(w, err)
		return
	}
	if req.Language == "" {
		req.Language = "python"
	}
	agent, done, err := s.mgr.Acquire(r.Context(), project, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer done()
	cc, err := agent.CreateContext(r.Context(), agentproto.ContextRequest{ID: pandastack.NewID("ctx"), Language: req.Language, Cwd: req.Cwd, Env: req.Env, AutoRestart: req.AutoRestart})
	if err != nil {
		s.logFailure(r, err)
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, cc)
}

func (s *Server) listContexts(w http.ResponseWriter, r *http.Request, project string) {
	agent, done, err := s.mgr.Acquire(r.Context(), project, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer done()
	list, err := agent.ListContexts(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"contexts": list})
}

func (s *Server) deleteContext(w http.ResponseWriter, r *http.Request, project string) {
	agent, err := s.mgr.Agent(r.Context(), project, r.PathValue("id"))
	if err == nil {
		err = agent.DeleteContext(r.Context(), r.PathValue("cid"))
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) interruptContext(w http.ResponseWriter, r *http.Request, project string) {
	agent, err := s.mgr.Agent(r.Context(), project, r.PathValue("id"))
	if err == nil {
		err = agent.InterruptContext(r.Context(), r.PathValue("cid"))
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) restartContext(w http.ResponseWriter, r *http.Request, project string) {
	agent, done, err := s.mgr.Acquire(r.Context(), project, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer done()
	cc, err := agent.RestartContext(r.Context(), r.PathValue("cid"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, cc)
}

type runRequest struct {
	Code           *string           `json:"code"`
	TimeoutSeconds *float64          `json:"timeout_seconds"`
	Env            map[string]string `json:"env"`
	// Only on /run_code:
	Language  string `json:"language"`
	ContextID string `json:"context_id"`
}

func (s *Server) runInContext(w http.ResponseWriter, r *http.Request, project string) {
	s.run(w, r, project, r.PathValue("cid"), false)
}

func (s *Server) runCode(w http.ResponseWriter, r *http.Request, project string) {
	s.run(w, r, project, "", true)
}

// run serves both /contexts/{cid}/run and /run_code, which picks the
// sandbox's default context of the language when no context_id is given.
func (s *Server) run(w http.ResponseWriter, r *http.Request, project, cid string, defaultContext bool) {
	clock := runClock{begun: time.Now()}
	defer clock.log(s.log, r.PathValue("id"), &cid)
	var req runRequest
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.Code == nil {
		writeError(w, pandastack.Errorf(pandastack.EInvalid, "code is required (a string of source code)"))
		return
	}
	if !defaultContext && (req.Language != "" || req.ContextID != "") {
		writeError(w, pandastack.Errorf(pandastack.EInvalid, "language and context_id belong to /run_code; this context's language is fixed"))
		return
	}
	if err := sandbox.ValidateEnv(req.Env); err != nil {
		writeError(w, err)
		return
	}
	timeout, err := s.timeout(req.TimeoutSeconds, s.cfg.DefaultRunTimeout)
	if err != nil {
		writeError(w, err)
		return
	}
	agent, done, err := s.mgr.Acquire(r.Context(), project, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer done()
	clock.acquired = time.Now()
	var create *agentproto.ContextRequest
	if defaultContext {
		if cid = req.ContextID; cid == "" {
			if req.Language == "" {
				req.Language = "python"
			}
			if cid, create, err = s.defaultContext(r, agent, req.Language); err != nil {
				writeError(w, err)
				return
			}
		}
	}
	clock.contextReady = time.Now()
	areq := agentproto.RunRequest{Code: *req.Code, TimeoutMS: timeout.Milliseconds(), Env: req.Env, OutputCap: s.cfg.RunOutputCap, Create: create}
	if req.ContextID != "" {
		areq.Language = req.Language // the agent refuses a context of another language
	}
	if wantsStream(r) {
		nd := newNDJSON(w)
		ex, store, err := s.recordedRun(r.Context(), project, r.PathValue("id"), cid, req.Language, agent, areq, func(ev agentproto.CodeEvent) error { return nd.send(ev) }, &clock)
		defer store()
		if err != nil {
			s.logFailure(r, err)
			err = agent.Explain(err) // after logFailure reconciled: say how it ended
			if !nd.started {
				writeError(w, err)
				return
			}
			eb := errorJSON(revokedErr(r.Context(), err))
			nd.send(streamEvent{Type: "error", Error: &eb.Error})
			return
		}
		nd.send(agentproto.CodeEvent{Type: "execution", Execution: normalize(&ex)})
		clock.answered = time.Now()
		return
	}
	ex, store, err := s.recordedRun(r.Context(), project, r.PathValue("id"), cid, req.Language, agent, areq, nil, &clock)
	defer store()
	if err != nil {
		s.logFailure(r, err)
		err = agent.Explain(err) // after logFailure reconciled: say how it ended
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, normalize(&ex))
	clock.answered = time.Now()
}

// normalize makes results an empty list rather than null.
func normalize(ex *agentproto.Execution) *agentproto.Execution {
	if ex.Results == nil {
		ex.Results = []agentproto.Result{}
	}
	return ex
}

// defaultContext returns the id of the sandbox's default context of a
// language, creating it on first use: an agent that can (its hello names
// agentproto.FeatureRunCreates) in the run's own round trip (create, for
// the run's request), an older one first. Its id is fixed per language,
// so concurrent first uses race safely: one creates it, the other finds
// it made.
func (s *Server) defaultContext(r *http.Request, agent *sandbox.AgentClient, language string) (string, *agentproto.ContextRequest, error) {
	id := sandbox.DefaultContextID(language)
	if agent.HasContext(id) {
		return id, nil, nil // made or found before in this session: no need to ask
	}
	req := agentproto.ContextRequest{ID: id, Language: language}
	if agent.Hello().HasFeature(agentproto.FeatureRunCreates) {
		return id, &req, nil
	}
	_, err := agent.CreateContext(r.Context(), req)
	if err != nil && !pandastack.IsCode(err, pandastack.EConflict) {
		return "", nil, err
	}
	return id, nil, nil
}

// runClock times the steps of one run for the debug log ("code run"): the
// server's share, the agent's round trip, and the agent's own breakdown.
type runClock struct {
	begun, acquired, contextReady time.Time // handler start, sandbox acquired, context known
	agentSent, agentDone          time.Time // the agent's request and its execution event
	recorded, answered            time.Time // history entry ended, answer written
	agent                         *agentproto.RunTiming
}

// log writes the breakdown of a run that reached the agent, in µs.
func (c *runClock) log(log *slog.Logger, sandboxID string, cid *string) {
	if c.agentDone.IsZero() || c.answered.IsZero() || !log.Enabled(context.Background(), slog.LevelDebug) {
		return
	}
	us := func(from, to time.Time) int64 { return to.Sub(from).Microseconds() }
	args := []any{"sandbox", sandboxID, "context", *cid,
		"total_us", us(c.begun, c.answered),
		"decode_acquire_us", us(c.begun, c.acquired),
		"context_us", us(c.acquired, c.contextReady),
		"history_begin_us", us(c.contextReady, c.agentSent),
		"agent_us", us(c.agentSent, c.agentDone),
		"history_end_us", us(c.agentDone, c.recorded),
		"answer_us", us(c.recorded, c.answered),
	}
	if t := c.agent; t != nil {
		args = append(args,
			"agent_transport_us", us(c.agentSent, c.agentDone)-t.HandlerUS,
			"agent_handler_us", t.HandlerUS,
			"agent_queue_us", t.QueueUS,
			"kernel_us", t.KernelUS,
			"kernel_to_us", t.ToKernelUS,
			"kernel_execute_us", t.ExecuteUS,
			"kernel_reply_to_idle_us", t.ReplyToIdleUS,
			"kernel_back_us", t.BackUS,
			"kernel_messages", t.Messages,
		)
	}
	log.Debug("code run", args...)
}
