package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"os"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// maxWatches bounds the directory watches open at once in one sandbox:
// each holds a kernel inotify instance (gVisor's, in the sentry).
const maxWatches = 64

// maxWatchedDirs bounds the directories one recursive watch follows.
const maxWatchedDirs = 8192

// watchFiles streams the changes in a directory (?path=, and with
// ?recursive=true in every directory beneath it, those made later too) as
// FileEvent lines until the caller hangs up, the directory goes, or the
// sandbox stops. The first line says the watch is live.
func (s *Server) watchFiles(w http.ResponseWriter, r *http.Request) error {
	t, err := s.target(r, "recursive")
	if err != nil {
		return err
	}
	recursive, err := agentproto.ParseBool("recursive", r.URL.Query().Get("recursive"), false)
	if err != nil {
		return err
	}
	if err := guard(t.path, true, false); err != nil {
		return err
	}
	pl, err := t.place(t.path, false, true, false)
	if err != nil {
		return err
	}
	defer pl.close()
	if s.watches.Add(1) > maxWatches {
		s.watches.Add(-1)
		return pandastack.Errorf(pandastack.EConflict, "%d directory watches are open in this sandbox, the most it keeps: stop one first", maxWatches)
	}
	defer s.watches.Add(-1)
	var wt *watcher
	err = t.run(func() error {
		// The directory's real path: a link to it is followed, and the
		// events name where the files are.
		real, err := pl.real()
		if err != nil {
			return fsError(err, t.path, false)
		}
		t.path = real
		fi, err := os.Stat(t.path)
		if err != nil {
			return fsError(err, t.path, false)
		}
		if !fi.IsDir() {
			return pandastack.Errorf(pandastack.EInvalid, "%s is a file, not a directory: watch the directory it is in", t.path)
		}
		wt, err = newWatcher(t, recursive, &s.uploads)
		return err
	})
	if err != nil {
		return err
	}
	defer wt.close()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	rc := http.NewResponseController(w)
	enc.Encode(agentproto.FileEvent{Type: pandastack.FileEventWatching, Path: t.path, IsDir: true})
	if rc.Flush() != nil {
		return nil
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	err = wt.run(ctx, func(evs []agentproto.FileEvent) error {
		for _, ev := range evs {
			if err := enc.Encode(ev); err != nil {
				return err
			}
		}
		return rc.Flush()
	})
	if err != nil && r.Context().Err() == nil {
		enc.Encode(agentproto.FileEvent{Type: pandastack.FileEventError, Error: &pandastack.StreamError{Code: pandastack.ErrorCode(err), Message: pandastack.ErrorMessage(err)}})
		rc.Flush()
	}
	return nil
}
