package api

import (
	"net/http"
	"slices"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/history"
)

// SandboxStats is GET /v1/sandboxes/{id}/stats: the host-side resource use
// of a running sandbox, measured when asked.
type SandboxStats struct {
	MemoryBytes      int64   `json:"memory_bytes"`       // the host memory charged to it (its cgroup's working set)
	MemoryLimitBytes int64   `json:"memory_limit_bytes"` // its memory_mb
	CPUSeconds       float64 `json:"cpu_seconds"`        // CPU time it used since it started or was resumed (its cgroup's); rate = difference of two samples
	CPULimit         int     `json:"cpu_limit"`          // its cpu
	// DiskBytes and DiskLimitBytes are the used and whole size of its disk
	// (its disk_mb), as df shows them inside; nil when the sandbox cannot
	// say (its agent is of an older build).
	DiskBytes      *int64    `json:"disk_bytes,omitempty"`
	DiskLimitBytes *int64    `json:"disk_limit_bytes,omitempty"`
	SampledAt      time.Time `json:"sampled_at"`
}

func (s *Server) stats(w http.ResponseWriter, r *http.Request, project string) {
	id := r.PathValue("id")
	sb, err := s.mgr.Get(r.Context(), project, id)
	if err != nil {
		writeError(w, err)
		return
	}
	st, err := s.mgr.Stats(r.Context(), project, id)
	if err != nil {
		writeError(w, err)
		return
	}
	out := SandboxStats{
		MemoryBytes: st.MemoryBytes, MemoryLimitBytes: int64(sb.MemoryMB) << 20,
		CPUSeconds: float64(st.CPUNanos) / 1e9, CPULimit: sb.CPU, SampledAt: time.Now().UTC(),
	}
	// Without cgroup figures, the runtime's host processes alone (which
	// miss the ones that run the sandbox's code).
	if st.MemoryBytes < 0 {
		out.MemoryBytes = st.PSSBytes
	}
	if st.CPUNanos < 0 {
		out.CPUSeconds = cpuSeconds(st.PIDs)
	}
	if sb.State == pandastack.StateRunning {
		if d, ok := s.mgr.Disk(r.Context(), project, id); ok {
			out.DiskBytes, out.DiskLimitBytes = &d.UsedBytes, &d.SizeBytes
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// APIKeyCreated answers POST /v1/api-keys: the only time the secret is shown.
type APIKeyCreated struct {
	pandastack.APIKey
	Secret string `json:"secret"`
}

func (s *Server) listKeys(w http.ResponseWriter, r *http.Request, project string) {
	all, err := s.store.ListAPIKeys(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	out := slices.DeleteFunc(all, func(k pandastack.APIKey) bool { return k.ProjectID != project })
	if out == nil {
		out = []pandastack.APIKey{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"api_keys": out})
}

func (s *Server) createKey(w http.ResponseWriter, r *http.Request, project string) {
	var req struct {
		Name  string `json:"name"`
		Scope string `json:"scope"`
	}
	if err := decode(r, &req); err != nil {
		writeError(w, err)
		return
	}
	if err := pandastack.ValidLabel("name", req.Name); err != nil {
		writeError(w, err)
		return
	}
	scope, err := pandastack.ParseScope(req.Scope)
	if err != nil {
		writeError(w, err)
		return
	}
	secret := pandastack.NewAPIKeySecret()
	k := pandastack.APIKey{ID: pandastack.NewID("key"), ProjectID: project, Name: req.Name, Prefix: secret[:10], Hash: HashKey(secret), CreatedAt: time.Now().UTC().Truncate(time.Millisecond), Scope: scope}
	if err := s.store.CreateAPIKey(r.Context(), k); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, APIKeyCreated{APIKey: k, Secret: secret})
}

func (s *Server) revokeKey(w http.ResponseWriter, r *http.Request, project string) {
	kid := r.PathValue("kid")
	all, err := s.store.ListAPIKeys(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	i := slices.IndexFunc(all, func(k pandastack.APIKey) bool { return k.ID == kid && k.ProjectID == project })
	if i < 0 {
		writeError(w, pandastack.Errorf(pandastack.ENotFound, "no API key %.64q", kid)) // a 100 kB id is not echoed whole
		return
	}
	if all[i].RevokedAt == nil {
		if err := s.store.RevokeAPIKey(r.Context(), kid, time.Now().UTC()); err != nil {
			writeError(w, err)
			return
		}
	}
	w.WriteHeader(http.StatusNoContent)
	// After the answer: a key revoking itself cuts this request too.
	s.keyRevoked(kid, all[i].Prefix)
}

// getLineage serves GET /v1/lineage: which sandbox was restored from which
// snapshot or forked from which sandbox (kept in the store). With the
// snapshots' sandbox_id it draws the whole tree.
func (s *Server) getLineage(w http.ResponseWriter, r *http.Request, project string) {
	origins, err := s.history.Origins(r.Context(), project)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"origins": origins})
}

// noteOrigins records where new sandboxes came from.
func (s *Server) noteOrigins(project, kind, from string, kids ...pandastack.Sandbox) {
	for _, k := range kids {
		s.history.AddOrigin(project, history.Origin{SandboxID: k.ID, Kind: kind, From: from, At: k.CreatedAt})
	}
}
