package api

import (
	"net/http"

	"github.com/pandastack/pandastack"
)

// putNetwork replaces a sandbox's egress policy: the whole policy, at once.
func (s *Server) putNetwork(w http.ResponseWriter, r *http.Request, project string) {
	var p pandastack.NetworkPolicy
	if err := decodeRequired(r, &p, `{"allow_internet_access": true} (the whole policy: {} allows nothing)`); err != nil {
		writeError(w, err)
		return
	}
	sb, err := s.mgr.SetNetwork(r.Context(), project, r.PathValue("id"), p)
	if err != nil {
		s.logFailure(r, err)
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, sb)
}

func (s *Server) networkLog(w http.ResponseWriter, r *http.Request, project string) {
	log, err := s.mgr.NetworkLog(r.Context(), project, r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"entries": log})
}
