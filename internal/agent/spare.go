package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agent/jupyter"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// Spare kernels make a new code context as warm as the default one. The
// host asks for them (POST /v1/contexts/spares) while it warms a template,
// after the warm-up, so the template's warm image holds them already started
// and warmed up; every sandbox restored from it hands one out on its first
// context create instead of paying a kernel start (1.4 s in gVisor) and the
// imports of the warm-up (2 s). Each spare is a kernel process of its own,
// handed out once: contexts share nothing. A hand-out wakes the refiller,
// which starts a replacement once the sandbox is quiet (see refillDelay), so
// the replacement's start does not compete with the user's first cells for
// the sandbox's CPU.

// maxSpares bounds the spares of one language: each holds a kernel's memory.
const maxSpares = 4

// maxSpareWait bounds how long a hand-out waits for a spare being started
// (a start takes 3-4 s here) before the context starts a kernel of its own.
var maxSpareWait = 20 * time.Second

// refillDelay is how long the refiller waits after a hand-out, and then for
// as long as any context runs code, before it starts a replacement.
var refillDelay = 2 * time.Second

type spareSet struct {
	mu    sync.Mutex
	want  map[string]int               // spares to keep, by language
	ready map[string][]*jupyter.Kernel // warmed up, not handed out
	start map[string]func(context.Context) (*jupyter.Kernel, error)
	kick  chan struct{} // wakes the refiller; nil until the first request
	log   func(msg string, args ...any)
	// released: the spares were shut down for an idle suspend (see
	// releaseSpares); none is started until the next hello or refill.
	released bool
	// held counts the forks whose checkpoint is coming (hold.go); while
	// any, the ready spares are kept but none is started. abort gives up
	// the start in flight, if any.
	held  int
	abort context.CancelFunc
	// starting counts the spares being started, by language; added is
	// closed (and replaced) whenever one is added, for a hand-out that
	// waits for a start in progress.
	starting map[string]int
	added    chan struct{}
	// ids holds, for each ready spare, the sandbox id its kernel has in
	// PANDASTACK_SANDBOX_ID: the agent's when it started, or the one a
	// hello gave it since (restored). A hand-out sets the variable
	// only when it differs from the agent's, so that the first cell of a
	// context made from a pool's sandbox does not wait for that cell.
	ids map[*jupyter.Kernel]string
}

// takeSpare hands out a ready spare kernel of language, or nil when there
// is none or the context does not fit one (fits false: a cwd or env of its
// own, which a kernel gets when it starts). ctx bounds the hand-out.
func (cs *Contexts) takeSpare(ctx context.Context, language string, fits bool) *jupyter.Kernel {
	sp := &cs.spares
	if !fits {
		return nil
	}
	// The wait for a start in progress is bounded, so that a start slowed
	// down leaves the caller time to start a kernel of its own.
	waitOver := time.After(maxSpareWait)
	for {
		sp.mu.Lock()
		list := sp.ready[language]
		if len(list) == 0 {
			// A spare being started (after a resume, or a refill) is
			// ready sooner than a kernel started now, which would also
			// compete with it for the CPU.
			added := sp.added
			wait := sp.starting[language] > 0 && added != nil
			sp.wake()
			sp.mu.Unlock()
			if !wait {
				return nil
			}
			select {
			case <-added:
				continue
			case <-waitOver:
				return nil
			case <-ctx.Done():
				return nil
			}
		}
		k := list[len(list)-1]
		sp.ready[language] = list[:len(list)-1]
		has, known := sp.ids[k]
		delete(sp.ids, k)
		sp.wake()
		sp.mu.Unlock()
		if k.Exited() {
			// Died while it waited (a fork bomb in the sandbox left its
			// Python no thread, the memory watch, a kill): a context made
			// of it answered its first cell "the kernel has died".
			sp.log("a spare kernel had died while it waited; trying the next")
			go k.Close()
			continue
		}
		// A spare that started before the sandbox got its present id, and
		// missed the hello that gave it (restored), gets the id the
		// agent has now (its random generators were reseeded when the host
		// said hello after the restore, see Contexts.Restored). Queued, not
		// waited for: it runs before the context's first cell.
		id := os.Getenv("PANDASTACK_SANDBOX_ID")
		if known && has == id {
			return k
		}
		err := k.QueueSilent(sandboxIDCode(id))
		if err == nil {
			return k
		}
		sp.log("a spare kernel failed its hand-out; trying the next", "err", err)
		go k.Close()
		if ctx.Err() != nil {
			return nil
		}
	}
}

// pythonPrime runs after a warm-up that imported matplotlib.pyplot: it
// draws and renders a tiny figure, so the fonts, the Agg renderer and
// pandas' plotting module are loaded before the first user's plot rather
// than during it (100-170 ms of the recipe's first cell in gVisor). It
// leaves no figure open and no name behind. jupyter.PythonMemFontsCode
// runs just before it, so the fonts it loads are read from memory, and
// jupyter.PythonFastPNGCode after it, once its figure has set up the
// inline backend's PNG formatter.
const pythonPrime = `def _pandastack_prime():
    import sys
    if "matplotlib.pyplot" not in sys.modules:
        return
    import io
    import matplotlib.pyplot as plt
    fig = plt.figure(figsize=(2, 2))
    plt.plot([0, 1], [0, 1], label="x")
    plt.title("t")
    plt.legend()
    fig.savefig(io.BytesIO(), format="png", bbox_inches="tight")
    plt.close(fig)
    if "pandas" in sys.modules:
        import pandas.plotting._matplotlib
_pandastack_prime()
del _pandastack_prime`

// pythonPrimeDisplay runs after jupyter.PythonFastPNGCode: it takes the
// path of a displayed pandas plot once, as the recipe's first cell does
// (DataFrame.plot, then every MIME type the display formatter makes of the
// figure: the single-draw PNG, the chart JSON, the text), without
// publishing anything. A kernel's first plot cost twice its second in
// gVisor (the memory its first drawing grows into, and the pages of the
// code it runs); drawn here, that is paid before the checkpoint, and again
// by the touch after a pool's restore (spareTouchCode) rather than by the
// user's first cell. Its data are fixed (no random draw), it leaves no
// figure open and no name behind.
const pythonPrimeDisplay = `def _pandastack_prime_display():
    import sys
    if "matplotlib.pyplot" not in sys.modules:
        return
    import matplotlib.pyplot as plt
    from IPython import get_ipython
    ip = get_ipython()
    if ip is None:
        return
    if "pandas" in sys.modules:
        import pandas as pd
        fig = pd.DataFrame({"x": [0, 1, 2, 3], "y": [0.0, 1.0, 0.5, 1.5]}).plot(x="x", y="y").figure
    else:
        fig = plt.figure()
        plt.plot([0, 1, 2, 3], [0.0, 1.0, 0.5, 1.5], label="y")
        plt.legend()
    try:
        ip.display_formatter.format(fig)
    finally:
        plt.close(fig)
_pandastack_prime_display()
del _pandastack_prime_display`

// sparePrimeCode is what a spare runs after its warm-up, in one silent
// cell: the pieces are whole statements, so each starts on a line of its
// own.
func sparePrimeCode() string {
	return strings.Join([]string{jupyter.PythonMemFontsCode, pythonPrime, jupyter.PythonFastPNGCode, pythonPrimeDisplay}, "\n")
}

// spareTouchCode is what a spare runs when the host touches it after a
// restore (touchSpares): the prime's drawings again, so that the pages
// they use are loaded and mapped before the user's first plot needs them.
func spareTouchCode() string {
	return pythonPrime + "\n" + pythonPrimeDisplay
}

// pythonSetEnv is code that sets env in os.environ and leaves no name
// behind in the user's namespace.
func pythonSetEnv(env map[string]string) string {
	b, _ := json.Marshal(env)
	lit, _ := json.Marshal(string(b)) // a JSON string literal is a Python one
	return "__import__('os').environ.update(__import__('json').loads(" + string(lit) + "))"
}

// wake tells the refiller to look. sp.mu is held.
func (sp *spareSet) wake() {
	if sp.released || sp.held > 0 {
		return
	}
	select {
	case sp.kick <- struct{}{}:
	default:
	}
}

// anyBusy reports whether a context is running code.
func (cs *Contexts) anyBusy() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.anyBusyLocked()
}

func (cs *Contexts) anyBusyLocked() bool {
	for _, cc := range cs.ctxs {
		if cc.kernel != nil && cc.kernel.Busy() {
			return true
		}
	}
	return false
}

// refill keeps the spares at their count, forever: after each wake-up it
// waits for a quiet sandbox, then starts the missing spares one at a time.
func (cs *Contexts) refill() {
	sp := &cs.spares
	backoff := 5 * time.Second
	for range sp.kick {
		for {
			time.Sleep(refillDelay)
			for cs.anyBusy() {
				time.Sleep(refillDelay / 4)
			}
			sp.mu.Lock()
			var lang string
			for _, l := range sortedKeys(sp.want) {
				if len(sp.ready[l]) < sp.want[l] && !sp.released && sp.held == 0 {
					lang = l
					break
				}
			}
			start := sp.start[lang]
			if lang == "" {
				sp.mu.Unlock()
				break
			}
			sp.starting[lang]++
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			sp.abort = cancel
			sp.mu.Unlock()
			k, err := start(ctx)
			cancel()
			sp.mu.Lock()
			sp.starting[lang]--
			sp.abort = nil
			given := err != nil && sp.held > 0 // given up for a fork (hold.go)
			if err != nil {
				sp.signal() // a hand-out or a hold waiting for it looks again
			}
			sp.mu.Unlock()
			if given {
				continue // started again after the hold
			}
			if err != nil {
				sp.log("starting a spare kernel failed; retrying later", "language", lang, "err", err, "retry_in", backoff)
				time.Sleep(backoff)
				backoff = min(2*backoff, 2*time.Minute)
				continue
			}
			backoff = 5 * time.Second
			sp.add(lang, k)
		}
	}
}

// add keeps k as a spare of lang, or closes it if no longer wanted.
func (sp *spareSet) add(lang string, k *jupyter.Kernel) {
	sp.mu.Lock()
	keep := len(sp.ready[lang]) < sp.want[lang] && !sp.released
	if keep {
		sp.ready[lang] = append(sp.ready[lang], k)
	}
	if !keep {
		delete(sp.ids, k)
	}
	sp.signal()
	sp.mu.Unlock()
	if !keep {
		k.Close()
	}
}

// startedWith records the sandbox id a spare kernel k started with (its
// environment's), before it is added.
func (sp *spareSet) startedWith(k *jupyter.Kernel, id string) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.ids == nil {
		sp.ids = map[*jupyter.Kernel]string{}
	}
	sp.ids[k] = id
}

// restored is Contexts.Restored for the ready spares: with reseed each is
// reseeded, and with id (a hello's) each whose kernel has another sandbox
// id learns it, in one silent cell per spare queued behind what runs
// there. A spare handed out meanwhile may get the id twice, which does no
// harm.
func (sp *spareSet) restored(id string, reseed bool) {
	sp.mu.Lock()
	var ks, stale []*jupyter.Kernel
	for _, l := range sp.ready {
		for _, k := range l {
			if has, ok := sp.ids[k]; id != "" && (!ok || has != id) {
				stale = append(stale, k)
			} else if reseed {
				ks = append(ks, k)
			}
		}
	}
	sp.mu.Unlock()
	for _, k := range ks {
		k.Reseed()
	}
	for _, k := range stale {
		send := k.QueueSilent
		if reseed {
			send = k.ReseedThen
		}
		if send(sandboxIDCode(id)) != nil {
			continue // closed or dead: not handed out either
		}
		sp.mu.Lock()
		if _, ok := sp.ids[k]; ok { // not handed out or shut down since
			sp.ids[k] = id
		}
		sp.mu.Unlock()
	}
}

// sandboxIDCode is the silent cell that sets PANDASTACK_SANDBOX_ID to id
// in a spare's Python kernel.
func sandboxIDCode(id string) string {
	return pythonSetEnv(map[string]string{"PANDASTACK_SANDBOX_ID": id})
}

// signal wakes the hand-outs waiting for a spare. sp.mu is held.
func (sp *spareSet) signal() {
	if sp.added != nil {
		close(sp.added)
		sp.added = make(chan struct{})
	}
}

func sortedKeys(m map[string]int) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// prepareSpares answers POST /v1/contexts/spares: it sets how many spares
// of a language to keep and with which warm-up, and returns once that many
// are ready.
func (s *Server) prepareSpares(w http.ResponseWriter, r *http.Request) error {
	var req agentproto.SparesRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return pandastack.Errorf(pandastack.EInvalid, "bad spares request: %v", err)
	}
	if req.Language != "python" {
		return pandastack.Errorf(pandastack.EInvalid, "spare kernels are kept for python only, not %q", req.Language)
	}
	if req.Count < 0 || req.Count > maxSpares {
		return pandastack.Errorf(pandastack.EInvalid, "count must be between 0 and %d, got %d", maxSpares, req.Count)
	}
	argv, err := kernelArgv(req.Language)
	if err != nil {
		return err
	}
	cs := s.cfg.Contexts
	sp := &cs.spares
	var n int
	var nmu sync.Mutex
	start := func(ctx context.Context) (*jupyter.Kernel, error) {
		nmu.Lock()
		n++
		id := fmt.Sprintf("spare-%s-%d-%d", req.Language, s.epoch, n)
		nmu.Unlock()
		sandboxID := os.Getenv("PANDASTACK_SANDBOX_ID") // what the kernel's environment gets
		k, err := jupyter.Start(ctx, s.kernelOptions(req.Language, argv, id, s.home, nil))
		if err != nil {
			return nil, err
		}
		if req.Warmup != "" {
			if err := k.RunSilent(ctx, req.Warmup); err != nil {
				if ctx.Err() != nil {
					k.Kill() // given up (hold.go): nothing to shut down cleanly
				} else {
					k.Close()
				}
				return nil, fmt.Errorf("the warm-up failed: %w", err)
			}
			if err := k.RunSilent(ctx, sparePrimeCode()); err != nil {
				s.log.Warn("priming a spare kernel failed; it stays usable", "err", err)
			}
		}
		sp.startedWith(k, sandboxID)
		return k, nil
	}

	sp.mu.Lock()
	if sp.kick == nil {
		sp.want, sp.ready = map[string]int{}, map[string][]*jupyter.Kernel{}
		sp.start = map[string]func(context.Context) (*jupyter.Kernel, error){}
		sp.kick = make(chan struct{}, 1)
		sp.starting, sp.added = map[string]int{}, make(chan struct{})
		sp.log = func(msg string, args ...any) { s.cfg.Log.Warn(msg, args...) }
		go cs.refill()
	}
	sp.want[req.Language], sp.start[req.Language] = req.Count, start
	extra := sp.ready[req.Language][min(req.Count, len(sp.ready[req.Language])):]
	sp.ready[req.Language] = sp.ready[req.Language][:len(sp.ready[req.Language])-len(extra)]
	missing := req.Count - len(sp.ready[req.Language])
	for _, k := range extra {
		delete(sp.ids, k)
	}
	sp.mu.Unlock()
	for _, k := range extra {
		k.Close()
	}

	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Minute)
	defer cancel()
	for range missing {
		k, err := start(ctx)
		if err != nil {
			return fmt.Errorf("start a spare %s kernel: %w", req.Language, err)
		}
		sp.add(req.Language, k)
	}
	writeJSON(w, http.StatusOK, s.spareStats(req.Language))
	return nil
}

func (s *Server) spareStats(language string) agentproto.Spares {
	sp := &s.cfg.Contexts.spares
	sp.mu.Lock()
	defer sp.mu.Unlock()
	return agentproto.Spares{Language: language, Count: sp.want[language], Ready: len(sp.ready[language])}
}

// listSpares answers GET /v1/contexts/spares.
func (s *Server) listSpares(w http.ResponseWriter, r *http.Request) error {
	sp := &s.cfg.Contexts.spares
	sp.mu.Lock()
	langs := sortedKeys(sp.want)
	sp.mu.Unlock()
	out := make([]agentproto.Spares, 0, len(langs))
	for _, l := range langs {
		out = append(out, s.spareStats(l))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// touchSpares answers POST /v1/contexts/spares/touch: a silent cell in
// every ready spare that draws what its prime drew (spareTouchCode), which
// pulls the pages of a restored kernel in, and maps them, before anyone
// waits for them (the pool does it ahead of a claim).
func (s *Server) touchSpares(w http.ResponseWriter, r *http.Request) error {
	var ks []*jupyter.Kernel
	sp := &s.cfg.Contexts.spares
	sp.mu.Lock()
	for _, l := range sp.ready {
		ks = append(ks, l...)
	}
	sp.mu.Unlock()
	for _, k := range ks {
		err := k.RunSilent(r.Context(), spareTouchCode())
		switch {
		case err == nil, errors.Is(err, jupyter.ErrBusy), errors.Is(err, jupyter.ErrClosed):
			// A spare handed out meanwhile is busy or gone: not an error.
		case errors.Is(err, jupyter.ErrDead), r.Context().Err() != nil:
			return fmt.Errorf("touch a spare kernel: %w", err)
		default:
			// The drawing failed in a live kernel (as a prime may): the
			// spare stays usable, its first plot is just slower.
			s.log.Warn("touching a spare kernel failed; it stays usable", "err", err)
		}
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
