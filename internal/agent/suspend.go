package agent

import (
	"net/http"

	"github.com/pandastack/pandastack/internal/agent/jupyter"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// Before an idle suspend the host asks the agent to make the sandbox small
// (POST /v1/contexts/spares/release): a paused image holds all the memory
// the sandbox's processes use, and the largest part nobody is using is the
// spare kernels (each a whole warmed-up Python with numpy, pandas and
// matplotlib imported: about half of a code-interpreter sandbox's image).
// They are shut down, and the refiller starts them again once the host
// says hello after the resume (or POST .../refill when the suspend did not
// happen). Measured and left out: a garbage collection and malloc_trim in
// the idle kernels gave back under 1 MB of a kernel's 145 MB, and a
// compressed image cost the resume seconds.

// releaseSpares answers POST /v1/contexts/spares/release.
func (s *Server) releaseSpares(w http.ResponseWriter, r *http.Request) error {
	var out agentproto.Released
	for _, k := range s.cfg.Contexts.spares.release() {
		k.Close()
		out.Spares++
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// refillSpares answers POST /v1/contexts/spares/refill: the suspend the
// spares were released for did not happen.
func (s *Server) refillSpares(w http.ResponseWriter, r *http.Request) error {
	s.cfg.Contexts.spares.unrelease()
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// release stops keeping spares until unrelease and returns the ready ones
// for the caller to shut down.
func (sp *spareSet) release() []*jupyter.Kernel {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.kick == nil {
		return nil // no spares were ever asked for
	}
	sp.released = true
	var ks []*jupyter.Kernel
	for lang, l := range sp.ready {
		ks = append(ks, l...)
		sp.ready[lang] = nil
	}
	for _, k := range ks {
		delete(sp.ids, k)
	}
	return ks
}

// unrelease keeps the spares again after a release, or holds (hold.go)
// that were never ended (a hello: a fork's child, or a resume), and wakes
// the refiller to start those missing.
func (sp *spareSet) unrelease() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.released && sp.held == 0 {
		return
	}
	sp.released, sp.held = false, 0
	sp.wake()
}
