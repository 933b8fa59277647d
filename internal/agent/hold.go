package agent

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agent/jupyter"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// Before a fork's checkpoint the host asks the agent to hold its spares
// (agentproto.Held). The refiller begins a spare's replacement 2 s after a
// context took the spare, and the start (a kernel's start, then the
// template's imports) runs for 3-4 s here, so a fork made right after a
// sandbox's first run_code tends to catch one halfway. In the image, every
// child would finish that start at once, beside the other children's
// restores: the first fork of 8 from a fresh sandbox took 7.8 s to restore
// its children, against 3.6 s from the same parent once its spare was
// ready (bench/results/2026-12-01-vm-session9-vs-ab1f797.json, its server
// log). Waiting for the start instead cost the fork the rest of it: 4.1 s
// p50 for a fork of 4 of a fresh parent, 6.4 s in all against 3.9 s
// (bench/results/2026-12-01-vm-fork-hold-wait-vs-c32c9d5.json). So a hold
// gives the start in flight up (its kernel is killed) and waits only for
// that to end: 23 ms, and the fork's children answered in 1.9 s against
// 3.7 s (…-fork-hold-vs-c32c9d5.json). The parent, once its forks ended
// their holds (holds are counted: two forks may overlap), and each child
// after its hello, starts its missing spares again once quiet, as after
// any hand-out. Held, the refiller starts nothing.
//
// A hold with release=1 also shuts the ready spares down, as a suspend
// does (suspend.go): a ready spare is a whole warmed-up Python, about half
// of the image (225 against 115 MB), and the checkpoint writes it and
// every child loads it, beside the other children. A fork of a parent
// whose spare was ready took 212 ms to checkpoint and 183 ms to restore
// its child, against 128 and 97 ms without one.

// maxHoldWait bounds the wait a hold request may ask for.
const maxHoldWait = time.Minute

// holdSpares answers POST /v1/contexts/spares/hold.
func (s *Server) holdSpares(w http.ResponseWriter, r *http.Request) error {
	var wait time.Duration
	if v := r.URL.Query().Get("wait_ms"); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 0 || time.Duration(ms)*time.Millisecond > maxHoldWait {
			return pandastack.Errorf(pandastack.EInvalid, "wait_ms must be a number of milliseconds from 0 to %d, got %q", maxHoldWait.Milliseconds(), v)
		}
		wait = time.Duration(ms) * time.Millisecond
	}
	release := r.URL.Query().Get("release") == "1"
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	out, shut := s.cfg.Contexts.spares.hold(ctx, release)
	// Killed, not asked to shut down: they ran nothing of the user's, and
	// the checkpoint waits. Their groups first, all of them: the searches
	// of their trees (a stop of the group, a walk of /proc) then run while
	// they die (a fork of a parent with a ready spare waited 19 ms for the
	// two one after the other). Kill returns once the process has exited.
	for _, k := range shut {
		k.KillGroup()
	}
	for _, k := range shut {
		if err := k.Kill(); err != nil {
			s.log.Warn("shutting a spare kernel down for a fork", "err", err)
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// unholdSpares answers DELETE /v1/contexts/spares/hold.
func (s *Server) unholdSpares(w http.ResponseWriter, r *http.Request) error {
	s.cfg.Contexts.spares.unhold()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// unreleaseHeld is unrelease for a hello that asks for a hold of its own
// (hold_spares=1): every hold ends and the host's one begins, which it
// ends (DELETE /v1/contexts/spares/hold) once the host has a CPU to spare.
// A host that starts many sandboxes at once (a burst of creates, a fork)
// keeps their refills, each a kernel's start and imports (3-4 s of CPU),
// from competing with the restores and first cells still under way.
func (sp *spareSet) unreleaseHeld() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.released, sp.held = false, 1
}

// unhold ends one hold; the last one wakes the refiller.
func (sp *spareSet) unhold() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.held == 0 {
		return
	}
	sp.held--
	sp.wake()
}

// hold stops the refiller from starting spares until as many unholds (or
// unrelease), gives up the start in flight, and waits until it has ended
// or ctx ends. With release, it also takes the ready spares out, and
// returns them for the caller to shut down; a spare whose start ends
// during the wait is taken too.
func (sp *spareSet) hold(ctx context.Context, release bool) (agentproto.Held, []*jupyter.Kernel) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	sp.held++
	if sp.abort != nil {
		sp.abort()
	}
	var shut []*jupyter.Kernel
	for {
		var out agentproto.Held
		if release {
			for lang, l := range sp.ready {
				shut = append(shut, l...)
				sp.ready[lang] = nil
			}
			for _, k := range shut {
				delete(sp.ids, k)
			}
			out.Released = len(shut)
		}
		for _, l := range sp.ready {
			out.Ready += len(l)
		}
		for _, n := range sp.starting {
			out.Starting += n
		}
		if out.Starting == 0 || ctx.Err() != nil || sp.added == nil {
			return out, shut
		}
		added := sp.added // closed when a start ends, with a spare or without
		sp.mu.Unlock()
		select {
		case <-added:
		case <-ctx.Done():
		}
		sp.mu.Lock()
	}
}
