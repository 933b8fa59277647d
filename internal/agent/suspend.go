package agent

import (
	"context"
	"errors"
	"net/http"
	"runtime/debug"
	"time"

	"github.com/pandastack/pandastack/internal/agent/jupyter"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// Before an idle suspend the host asks the agent to make the sandbox small
// (POST /v1/contexts/spares/release): a paused image holds all the memory
// the sandbox's processes use, and the largest part that nobody is using
// is the spare kernels (a whole warmed-up Python with numpy, pandas and
// matplotlib each). They are shut down, and the refiller starts them again
// once the host says hello after the resume (or POST .../refill when the
// suspend did not happen). The idle Python kernels of the contexts run a
// silent garbage collection and give their free heap back (malloc_trim),
// so freed pages are not written either; a busy kernel is left alone. The
// agent returns its own free heap too.

// pythonTrim collects the garbage and returns the C heap's free pages to
// the system; it leaves no name behind.
const pythonTrim = `def _pandastack_trim():
    import gc, ctypes
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except Exception:
        pass
_pandastack_trim()
del _pandastack_trim`

// trimTimeout bounds the trim of one kernel: a kernel slow to answer is
// not worth holding the suspend for.
const trimTimeout = 5 * time.Second

// releaseSpares answers POST /v1/contexts/spares/release.
func (s *Server) releaseSpares(w http.ResponseWriter, r *http.Request) error {
	cs := s.cfg.Contexts
	var out agentproto.Released
	for _, k := range cs.spares.release() {
		k.Close()
		out.Spares++
	}
	var ks []*jupyter.Kernel
	cs.mu.Lock()
	for _, cc := range cs.ctxs {
		if cc.kernel != nil && cc.info.Language == "python" && !cc.kernel.Busy() {
			ks = append(ks, cc.kernel)
		}
	}
	cs.mu.Unlock()
	for _, k := range ks {
		ctx, cancel := context.WithTimeout(r.Context(), trimTimeout)
		err := k.RunSilent(ctx, pythonTrim)
		cancel()
		switch {
		case err == nil:
			out.Trimmed++
		case errors.Is(err, jupyter.ErrBusy), errors.Is(err, jupyter.ErrClosed):
		default:
			s.log.Warn("trimming a kernel's heap failed", "err", err)
		}
	}
	debug.FreeOSMemory()
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
	return ks
}

// unrelease keeps the spares again and wakes the refiller to start them.
func (sp *spareSet) unrelease() {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.released {
		return
	}
	sp.released = false
	sp.wake()
}
