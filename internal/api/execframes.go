package api

import (
	"encoding/json"
	"net/http"
	"strings"

	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/sandbox"
	"github.com/pandastack/pandastack/internal/streamframe"
)

// wantsFrames reports whether the client asked for the binary exec stream
// (streamframe); it wins over NDJSON when both are accepted.
func wantsFrames(r *http.Request) bool {
	return strings.Contains(r.Header.Get("Accept"), streamframe.MediaType)
}

// frameExit is the JSON payload of an exit frame.
type frameExit struct {
	ExitCode   int    `json:"exit_code"`
	Signal     string `json:"signal,omitempty"`
	TimedOut   bool   `json:"timed_out"`
	DurationMS int64  `json:"duration_ms"`
}

// execFrames streams an exec as binary frames: stdout and stderr bytes as
// they come, then one exit frame, or one error frame if the exec failed
// after the answer began.
func (s *Server) execFrames(w http.ResponseWriter, r *http.Request, project string, agent *sandbox.AgentClient, req agentproto.ExecRequest) {
	rc := http.NewResponseController(w)
	fw := streamframe.NewWriter(w)
	started := false
	send := func(t byte, p []byte) error {
		if !started {
			w.Header().Set("Content-Type", streamframe.MediaType)
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		if err := fw.WriteFrame(t, p); err != nil {
			return err
		}
		return rc.Flush()
	}
	_, err := s.recordedExec(r.Context(), project, r.PathValue("id"), agent, req, func(ev agentproto.ExecEvent) error {
		if ev.Type != "exit" {
			return send(streamframe.TypeOf(ev.Type), ev.Data)
		}
		b, err := json.Marshal(frameExit{ExitCode: ev.ExitCode, Signal: ev.Signal, TimedOut: ev.TimedOut, DurationMS: ev.DurationMS})
		if err != nil {
			return err
		}
		return send(streamframe.Exit, b)
	})
	if err != nil {
		s.logFailure(r, err)
		err = agent.Explain(err) // after logFailure reconciled: say how it ended
		if !started {
			writeError(w, err)
			return
		}
		b, _ := json.Marshal(errorJSON(revokedErr(r.Context(), err)))
		send(streamframe.Error, b)
	}
}
