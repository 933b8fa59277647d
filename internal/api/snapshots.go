package api

import (
	"net/http"
	"strings"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/sandbox"
)

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request, project string) {
	var req struct {
		Metadata map[string]string `json:"metadata"`
	}
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	snap, err := s.mgr.Snapshot(r.Context(), project, r.PathValue("id"), req.Metadata)
	if err != nil {
		s.logFailure(r, err)
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, snap)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request, project string) {
	md := map[string]string{}
	for k, vs := range r.URL.Query() { // one value each: checkQuery refused repeats
		if !strings.HasPrefix(k, "metadata.") {
			writeError(w, pandastack.Errorf(pandastack.EInvalid, "unknown query parameter %q; filter with metadata.<key>=<value>", k))
			return
		}
		md[strings.TrimPrefix(k, "metadata.")] = vs[0]
	}
	if err := checkMetadataFilters(md); err != nil {
		writeError(w, err)
		return
	}
	list, err := s.mgr.ListSnapshots(r.Context(), project, md)
	if err != nil {
		writeError(w, err)
		return
	}
	if list == nil {
		list = []pandastack.Snapshot{}
	}
	var total int64
	for _, sn := range list {
		total += sn.SizeBytes
	}
	writeJSON(w, http.StatusOK, map[string]any{"snapshots": list, "total_size_bytes": total})
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request, project string) {
	snap, err := s.mgr.GetSnapshot(r.Context(), project, r.PathValue("sid"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, snap)
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request, project string) {
	if err := s.mgr.DeleteSnapshot(r.Context(), project, r.PathValue("sid")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request, project string) {
	var req struct {
		Count      *int                      `json:"count"`
		TTLSeconds *int64                    `json:"ttl_seconds"`
		Metadata   map[string]string         `json:"metadata"`
		Network    *pandastack.NetworkPolicy `json:"network"`
	}
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	kids, err := s.mgr.ForkWith(r.Context(), project, r.PathValue("id"), sandbox.ForkOptions{Count: count, TTLSeconds: req.TTLSeconds, Metadata: req.Metadata, Network: req.Network})
	if err != nil {
		s.logFailure(r, err)
		writeError(w, err)
		return
	}
	if s.orphaned(r, project, kids...) {
		return
	}
	s.noteOrigins(project, "fork", r.PathValue("id"), kids...)
	writeJSON(w, http.StatusCreated, map[string]any{"sandboxes": kids})
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request, project string) {
	sb, err := s.mgr.Pause(r.Context(), project, r.PathValue("id"))
	if err != nil {
		s.logFailure(r, err)
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.mgr.WithNetwork(sb))
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request, project string) {
	sb, err := s.mgr.Resume(r.Context(), project, r.PathValue("id"))
	if err != nil {
		s.logFailure(r, err)
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, s.mgr.WithNetwork(sb))
}
