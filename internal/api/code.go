package api

import (
	"net/http"

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
	if defaultContext {
		if cid = req.ContextID; cid == "" {
			if req.Language == "" {
				req.Language = "python"
			}
			if cid, err = s.defaultContext(r, agent, req.Language); err != nil {
				writeError(w, err)
				return
			}
		}
	}
	areq := agentproto.RunRequest{Code: *req.Code, TimeoutMS: timeout.Milliseconds(), Env: req.Env, OutputCap: s.cfg.RunOutputCap}
	if req.ContextID != "" {
		areq.Language = req.Language // the agent refuses a context of another language
	}
	if wantsStream(r) {
		nd := newNDJSON(w)
		ex, err := s.recordedRun(r.Context(), project, r.PathValue("id"), cid, req.Language, agent, areq, func(ev agentproto.CodeEvent) error { return nd.send(ev) })
		if err != nil {
			s.logFailure(r, err)
			err = agent.Explain(err) // after logFailure reconciled: say how it ended
			if !nd.started {
				writeError(w, err)
				return
			}
			eb := errorJSON(err)
			nd.send(streamEvent{Type: "error", Error: &eb.Error})
			return
		}
		nd.send(agentproto.CodeEvent{Type: "execution", Execution: normalize(&ex)})
		return
	}
	ex, err := s.recordedRun(r.Context(), project, r.PathValue("id"), cid, req.Language, agent, areq, nil)
	if err != nil {
		s.logFailure(r, err)
		err = agent.Explain(err) // after logFailure reconciled: say how it ended
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, normalize(&ex))
}

// normalize makes results an empty list rather than null.
func normalize(ex *agentproto.Execution) *agentproto.Execution {
	if ex.Results == nil {
		ex.Results = []agentproto.Result{}
	}
	return ex
}

// defaultContext returns the id of the sandbox's default context of a
// language, creating it on first use. Its id is fixed per language, so
// concurrent first uses race safely: one creates it, the other sees conflict.
func (s *Server) defaultContext(r *http.Request, agent *sandbox.AgentClient, language string) (string, error) {
	id := "ctx_default_" + language
	_, err := agent.CreateContext(r.Context(), agentproto.ContextRequest{ID: id, Language: language})
	if err != nil && !pandastack.IsCode(err, pandastack.EConflict) {
		return "", err
	}
	return id, nil
}
