package agent

import (
	"net/http"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// disk answers GET /v1/disk: the size and use of the sandbox's disk, as
// df shows them inside (the host sees only the sparse file behind it).
func (s *Server) disk(w http.ResponseWriter, r *http.Request) error {
	if err := agentproto.CheckQuery(r.URL.Query()); err != nil {
		return err
	}
	d, err := diskUse(s.cfg.Disk)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, d)
	return nil
}
