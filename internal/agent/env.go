package agent

import (
	"encoding/json"
	"net/http"
	"os"
	"regexp"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// setEnv sets variables that every process started from now on sees (the
// host sets its CA bundle variables this way after a start or restore:
// a restored agent keeps the environment it was checkpointed with).
func (s *Server) setEnv(w http.ResponseWriter, r *http.Request) error {
	var req agentproto.EnvRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return pandastack.Errorf(pandastack.EInvalid, "env: %v", err)
	}
	for k := range req.Env {
		if !envNameRE.MatchString(k) {
			return pandastack.Errorf(pandastack.EInvalid, "env: %q is not a variable name", k)
		}
	}
	for k, v := range req.Env {
		if v == "" {
			os.Unsetenv(k)
		} else {
			os.Setenv(k, v)
		}
	}
	writeJSON(w, http.StatusOK, struct{}{})
	return nil
}
