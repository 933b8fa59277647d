package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/metrics"
	"github.com/pandastack/pandastack/internal/store/sqlite"
)

// fakeRuntime is a pandastack.Runtime whose sandboxes are in-process fake
// agents speaking the real channel protocol (epoch framing, yamux, the
// agent's HTTP API) over pipes. A sandbox's state is a map of variables;
// Checkpoint writes it to the image and Restore reads it back, so restores
// and forks carry state as real ones do. Hooks inject failures.
type fakeRuntime struct {
	mu    sync.Mutex
	boxes map[string]*fakeBox

	// Hooks, each optional; a non-nil error fails the call.
	startErr      func(spec pandastack.RuntimeSpec) error
	restoreErr    func(spec pandastack.RuntimeSpec) error
	checkpointErr func(id string) error
	restores      int             // Restore calls that succeeded
	envSets       map[string]int  // POST /v1/env calls (a sandbox's setup), by sandbox
	hellos        map[string]int  // hellos answered, by sandbox
	installs      int             // CA installs (the exec that writes caMarker)
	markerReads   int             // GET /v1/files of caMarker (an older agent's setup)
	helloSetup    bool            // the hello reports the CA marker when asked, as agents since ca_marker do
	noAgent       bool            // sandboxes boot with an agent that never answers
	agentDies     bool            // with noAgent: the sandbox is gone at once (its agent crashed)
	deadBoots     int             // so many next boots are gone at once, their agents silent (a crash at the start)
	deadReason    string          // the DeathReason of those
	setupDeaths   int             // so many next CA setups (after the hello) die once their answer has begun
	resetBoots    int             // so many next boots die as their hello comes: their pipes close, the host reads EOF
	unnamed       bool            // the hello does not name FeatureHostname, as agents before it
	stopHook      func(id string) // called before Stop does anything, without r.mu
	// sparesHold, when set, makes the spares request signal sparesAsked
	// and wait until the request is given up.
	sparesHold  bool
	sparesAsked chan struct{}
	// suspendLog records, in order, the agent's releases, holds, unholds
	// and refills of its spares and the checkpoints, each followed by the
	// sandbox's id.
	suspendLog []string
}

type fakeBox struct {
	id      string
	spec    pandastack.RuntimeSpec
	vars    map[string]string // what the sandbox's "code" set
	stdinW  *io.PipeWriter    // the host's end of the agent's stdin
	stdoutR *io.PipeReader    // the host's end of the agent's stdout
	stop    func()            // ends the current agent loop
	alive   bool
	reason  string
	cpu     int64 // CPU time used, in ns; tests move it
	mem     int64 // memory its cgroup holds, in bytes; tests set it
	// hold, when set, makes exec of "hold" wait until it is closed.
	hold chan struct{}
	// resetAtHello: the agent dies as its hello comes (resetBoots).
	resetAtHello bool
}

func newFakeRuntime() *fakeRuntime { return &fakeRuntime{boxes: map[string]*fakeBox{}} }

var _ pandastack.Runtime = (*fakeRuntime)(nil)

type pipeChannel struct {
	io.Reader
	io.Writer
	close func() error
}

func (p pipeChannel) Close() error { return p.close() }

// serve starts a fresh agent loop for b on new pipes and returns the host's
// channel. r.mu is held.
func (r *fakeRuntime) serve(b *fakeBox) io.ReadWriteCloser {
	if b.stop != nil {
		b.stop()
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	b.stdinW, b.stdoutR = inW, outR
	b.stop = func() { inW.Close(); outR.Close(); inR.Close(); outW.Close() }
	if r.noAgent || !b.alive {
		go io.Copy(io.Discard, inR)
		return pipeChannel{Reader: outR, Writer: inW, close: func() error { inW.Close(); return outR.Close() }}
	}
	go agentproto.Serve(inR, outW, func(epoch uint32, conn io.ReadWriteCloser) {
		sess, err := yamux.Server(conn, agentproto.MuxConfig())
		if err != nil {
			return
		}
		srv := &http.Server{Handler: r.agentHandler(b, epoch)}
		srv.Serve(sess)
	})
	return pipeChannel{Reader: outR, Writer: inW, close: func() error { inW.Close(); return outR.Close() }}
}

// agentHandler is the fake agent's API: hello, exec (cmd "set k=v" sets a
// variable, "get k" prints it, "hold" waits for the test), contexts and run.
func (r *fakeRuntime) agentHandler(b *fakeBox, epoch uint32) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/hello", func(w http.ResponseWriter, req *http.Request) {
		h := agentproto.Hello{ProtocolVersion: agentproto.ProtocolVersion, Epoch: epoch}
		r.mu.Lock()
		if b.resetAtHello {
			b.alive = false
			stop := b.stop
			r.mu.Unlock()
			stop()
			return
		}
		if r.hellos == nil {
			r.hellos = map[string]int{}
		}
		r.hellos[b.id]++
		if !r.unnamed {
			h.Features = []string{agentproto.FeatureHostname}
		}
		if r.helloSetup && req.URL.Query().Get("ca_marker") == "1" {
			mk := strings.TrimSpace(b.vars["file:"+caMarker])
			h.CAMarker = &mk
		}
		r.mu.Unlock()
		json.NewEncoder(w).Encode(h)
	})
	mux.HandleFunc("POST /v1/exec", func(w http.ResponseWriter, req *http.Request) {
		var er agentproto.ExecRequest
		json.NewDecoder(req.Body).Decode(&er)
		var out string
		r.mu.Lock()
		dies := strings.Contains(er.Cmd, " > "+caMarker) && r.setupDeaths > 0
		if dies {
			r.setupDeaths--
			b.alive = false
		}
		r.mu.Unlock()
		if dies {
			// The sandbox dies after the answer's head: it says nothing
			// more, whatever the host does.
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {} // not even the host's hang-up ends it
		}
		switch {
		case strings.Contains(er.Cmd, " > "+caMarker):
			// The CA setup: its last line writes the marker.
			line := er.Cmd[strings.LastIndex(strings.TrimSuffix(er.Cmd, "\n"), "\n")+1:]
			digest, _, _ := strings.Cut(strings.TrimPrefix(line, "echo "), " ")
			r.mu.Lock()
			b.vars["file:"+caMarker] = digest + "\n"
			r.installs++
			r.mu.Unlock()
		case strings.HasPrefix(er.Cmd, "fail "):
			w.WriteHeader(http.StatusBadRequest)
			var eb agentproto.ErrorBody
			eb.Error.Code, eb.Error.Message = er.Cmd[5:], "the agent says no"
			json.NewEncoder(w).Encode(eb)
			return
		case er.Cmd == "hold":
			r.mu.Lock()
			h := b.hold
			r.mu.Unlock()
			if h != nil {
				select {
				case <-h:
				case <-req.Context().Done():
				}
			}
		case len(er.Cmd) > 4 && er.Cmd[:4] == "set ":
			k, v, _ := strings.Cut(er.Cmd[4:], "=")
			r.mu.Lock()
			b.vars[k] = v
			r.mu.Unlock()
		case len(er.Cmd) > 4 && er.Cmd[:4] == "get ":
			r.mu.Lock()
			out = b.vars[er.Cmd[4:]]
			r.mu.Unlock()
		}
		enc := json.NewEncoder(w)
		if out != "" {
			enc.Encode(agentproto.ExecEvent{Type: "stdout", Data: []byte(out)})
		}
		enc.Encode(agentproto.ExecEvent{Type: "exit"})
	})
	// Files live among the variables, so checkpoints keep them.
	mux.HandleFunc("GET /v1/files", func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		if req.URL.Query().Get("path") == caMarker {
			r.markerReads++
		}
		data, ok := b.vars["file:"+req.URL.Query().Get("path")]
		r.mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			var eb agentproto.ErrorBody
			eb.Error.Code, eb.Error.Message = pandastack.ENotFound, "no such file"
			json.NewEncoder(w).Encode(eb)
			return
		}
		io.WriteString(w, data)
	})
	mux.HandleFunc("PUT /v1/files", func(w http.ResponseWriter, req *http.Request) {
		data, _ := io.ReadAll(req.Body)
		p := req.URL.Query().Get("path")
		r.mu.Lock()
		b.vars["file:"+p] = string(data)
		r.mu.Unlock()
		json.NewEncoder(w).Encode(agentproto.FileInfo{Path: p, Size: int64(len(data))})
	})
	mux.HandleFunc("POST /v1/env", func(w http.ResponseWriter, _ *http.Request) {
		r.mu.Lock()
		if r.envSets == nil {
			r.envSets = map[string]int{}
		}
		r.envSets[b.id]++
		r.mu.Unlock()
		w.Write([]byte("{}"))
	})
	mux.HandleFunc("POST /v1/contexts", func(w http.ResponseWriter, req *http.Request) {
		var cr agentproto.ContextRequest
		json.NewDecoder(req.Body).Decode(&cr)
		json.NewEncoder(w).Encode(agentproto.Context{ID: cr.ID, Language: cr.Language})
	})
	mux.HandleFunc("POST /v1/contexts/{id}/run", func(w http.ResponseWriter, req *http.Request) {
		json.NewEncoder(w).Encode(agentproto.CodeEvent{Type: "execution", Execution: &agentproto.Execution{}})
	})
	// Spare kernels (warm images): the fake has them ready at once, and
	// remembers the warm-up it was given as the variable "spares".
	mux.HandleFunc("POST /v1/contexts/spares", func(w http.ResponseWriter, req *http.Request) {
		var sr agentproto.SparesRequest
		json.NewDecoder(req.Body).Decode(&sr)
		if r.sparesHold {
			close(r.sparesAsked)
			<-req.Context().Done()
			return
		}
		if strings.HasPrefix(sr.Warmup, "raise ") { // a warm-up that fails
			w.WriteHeader(http.StatusInternalServerError)
			var eb agentproto.ErrorBody
			eb.Error.Code, eb.Error.Message = pandastack.EInternal, "the warm-up failed: "+sr.Warmup
			json.NewEncoder(w).Encode(eb)
			return
		}
		r.mu.Lock()
		b.vars["spares"] = fmt.Sprintf("%s %d %s", sr.Language, sr.Count, sr.Warmup)
		r.mu.Unlock()
		json.NewEncoder(w).Encode(agentproto.Spares{Language: sr.Language, Count: sr.Count, Ready: sr.Count})
	})
	mux.HandleFunc("POST /v1/contexts/spares/touch", func(w http.ResponseWriter, req *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/contexts/spares/release", func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.suspendLog = append(r.suspendLog, "release "+b.id)
		r.mu.Unlock()
		json.NewEncoder(w).Encode(agentproto.Released{Spares: 1})
	})
	mux.HandleFunc("POST /v1/contexts/spares/hold", func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		q := req.URL.Query()
		r.suspendLog = append(r.suspendLog, "hold "+b.id+" wait_ms="+q.Get("wait_ms")+" release="+q.Get("release"))
		r.mu.Unlock()
		if q.Get("release") == "1" {
			json.NewEncoder(w).Encode(agentproto.Held{Released: 1})
			return
		}
		json.NewEncoder(w).Encode(agentproto.Held{Ready: 1})
	})
	mux.HandleFunc("DELETE /v1/contexts/spares/hold", func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.suspendLog = append(r.suspendLog, "unhold "+b.id)
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/contexts/spares/refill", func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.suspendLog = append(r.suspendLog, "refill "+b.id)
		r.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

func (r *fakeRuntime) Start(ctx context.Context, spec pandastack.RuntimeSpec) (io.ReadWriteCloser, error) {
	return r.boot(spec, map[string]string{}, r.startErr)
}

func (r *fakeRuntime) boot(spec pandastack.RuntimeSpec, vars map[string]string, hook func(pandastack.RuntimeSpec) error) (io.ReadWriteCloser, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if hook != nil {
		if err := hook(spec); err != nil {
			return nil, err
		}
	}
	if _, ok := r.boxes[spec.ID]; ok {
		return nil, pandastack.Errorf(pandastack.EConflict, "sandbox %s exists", spec.ID)
	}
	b := &fakeBox{id: spec.ID, spec: spec, vars: vars, alive: !(r.noAgent && r.agentDies) && r.deadBoots == 0}
	if r.deadBoots > 0 {
		b.reason = r.deadReason
	}
	r.deadBoots = max(r.deadBoots-1, 0)
	if r.resetBoots > 0 {
		b.resetAtHello = true
		r.resetBoots--
	}
	r.boxes[spec.ID] = b
	return r.serve(b), nil
}

func (r *fakeRuntime) Attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.boxes[id]
	if b == nil || !b.alive {
		return nil, pandastack.Errorf(pandastack.ENotFound, "no sandbox %s", id)
	}
	return r.serve(b), nil
}

func (r *fakeRuntime) Stop(ctx context.Context, id string) error {
	if r.stopHook != nil {
		r.stopHook(id)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.boxes[id]; b != nil {
		b.stop()
		delete(r.boxes, id)
	}
	return nil
}

func (r *fakeRuntime) State(ctx context.Context, id string) (pandastack.RuntimeState, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.boxes[id]
	switch {
	case b == nil:
		return "", pandastack.Errorf(pandastack.ENotFound, "no sandbox %s", id)
	case b.alive:
		return pandastack.RuntimeRunning, nil
	}
	return pandastack.RuntimeStopped, nil
}

func (r *fakeRuntime) List(ctx context.Context) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for id := range r.boxes {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// CPUNanos implements pandastack.RuntimeUsage.
func (r *fakeRuntime) CPUNanos(ctx context.Context, id string) (int64, error) {
	st, err := r.Stats(ctx, id)
	return st.CPUNanos, err
}

// MemoryBytes implements pandastack.RuntimeUsage.
func (r *fakeRuntime) MemoryBytes(ctx context.Context, id string) (int64, error) {
	st, err := r.Stats(ctx, id)
	return st.MemoryBytes, err
}

func (r *fakeRuntime) Stats(ctx context.Context, id string) (pandastack.RuntimeStats, error) {
	if !r.Alive(id) {
		return pandastack.RuntimeStats{}, pandastack.Errorf(pandastack.ENotFound, "no sandbox %s", id)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return pandastack.RuntimeStats{PSSBytes: 1 << 20, CPUNanos: r.boxes[id].cpu, MemoryBytes: r.boxes[id].mem}, nil
}

type fakeImage struct {
	ID     string            `json:"id"`
	RootFS string            `json:"rootfs"`
	Vars   map[string]string `json:"vars"`
}

// fakePagesSize is the size of the pages.img the fake's checkpoints write.
const fakePagesSize = 64 << 10

func (r *fakeRuntime) Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.boxes[id]
	if b == nil || !b.alive {
		return pandastack.Errorf(pandastack.ENotFound, "no sandbox %s", id)
	}
	r.suspendLog = append(r.suspendLog, "checkpoint "+id)
	if r.checkpointErr != nil {
		if err := r.checkpointErr(id); err != nil {
			os.WriteFile(filepath.Join(imageDir, "partial"), []byte("x"), 0o600)
			if !leaveRunning {
				// As runsc: a checkpoint that was to stop the sandbox
				// stops it even when writing the image fails.
				b.stop()
				b.alive = false
			}
			return err
		}
	}
	data, _ := json.Marshal(fakeImage{ID: id, RootFS: b.spec.RootFS, Vars: b.vars})
	if err := os.WriteFile(filepath.Join(imageDir, "state.json"), data, 0o600); err != nil {
		return err
	}
	// runsc's image has its memory in pages.img: what a prepared resume
	// holds in the page cache (pin.go).
	if err := os.WriteFile(filepath.Join(imageDir, "pages.img"), make([]byte, fakePagesSize), 0o600); err != nil {
		return err
	}
	if !leaveRunning {
		b.stop()
		delete(r.boxes, id)
	}
	return nil
}

func (r *fakeRuntime) Restore(ctx context.Context, spec pandastack.RuntimeSpec, imageDir string) (io.ReadWriteCloser, error) {
	data, err := os.ReadFile(filepath.Join(imageDir, "state.json"))
	if err != nil {
		return nil, err
	}
	var img fakeImage
	if err := json.Unmarshal(data, &img); err != nil {
		return nil, err
	}
	if img.RootFS != spec.RootFS {
		return nil, fmt.Errorf("restore %s: image taken on %s, not %s", spec.ID, img.RootFS, spec.RootFS)
	}
	rwc, err := r.boot(spec, img.Vars, r.restoreErr)
	if err == nil {
		r.mu.Lock()
		r.restores++
		r.mu.Unlock()
	}
	return rwc, err
}

// failRestoreOnce makes the next restore fail with err and the ones after
// it go through; it returns the count of restores tried from now on.
// (restoreErr runs under r.mu.)
func (r *fakeRuntime) failRestoreOnce(err error) *int {
	calls := new(int)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restoreErr = func(pandastack.RuntimeSpec) error {
		if *calls++; *calls == 1 {
			return err
		}
		return nil
	}
	return calls
}

func (r *fakeRuntime) Alive(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.boxes[id]
	return b != nil && b.alive
}

func (r *fakeRuntime) DeathReason(id string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.boxes[id]; b != nil {
		return b.reason
	}
	return ""
}

// die makes a sandbox die as a crash would: its processes end, its state
// stays until Stop.
func (r *fakeRuntime) die(id, reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if b := r.boxes[id]; b != nil {
		b.stop()
		b.alive, b.reason = false, reason
	}
}

func (r *fakeRuntime) ids() []string {
	ids, _ := r.List(context.Background())
	return ids
}

func (r *fakeRuntime) setHold(id string, h chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.boxes[id].hold = h
}

// fakeTemplates resolves one template, "base", onto a directory that stands
// for its root filesystem.
type fakeTemplates struct{ tpl Template }

func (f *fakeTemplates) Resolve(ctx context.Context, name string) (Template, error) {
	if name != f.tpl.Name {
		return Template{}, pandastack.Errorf(pandastack.ENotFound, "no template %q", name)
	}
	return f.tpl, nil
}

// harness is a manager over a fake runtime and a real SQLite store.
type harness struct {
	t     *testing.T
	dir   string
	rt    *fakeRuntime
	store *hookStore
	tpls  *fakeTemplates
	m     *Manager

	images pandastack.ImageStore // Config.Images of the next newManager (nil: the default)
	node   NodeConfig            // Config.Node of the next newManager (node_test.go)
	reap   time.Duration         // Config.ReapInterval of the next newManager (0: an hour; tests call reapOnce)
	net    *fakeNet              // the network of the next newManager (nil: none)
	logs   logLines              // what its managers logged
	// metrics holds the series of the last newManager.
	metrics *metrics.Registry
}

const project = "prj_test"

func newHarness(t *testing.T) *harness {
	t.Helper()
	dir := t.TempDir()
	db, err := sqlite.Open(filepath.Join(dir, "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store := &hookStore{Store: db}
	rootfs := filepath.Join(dir, "rootfs")
	os.MkdirAll(rootfs, 0o700)
	h := &harness{t: t, dir: dir, rt: newFakeRuntime(), store: store, tpls: &fakeTemplates{tpl: Template{Name: "base", RootFS: rootfs, CPU: 1, MemoryMB: 256}}}
	h.m = h.newManager()
	return h
}

// newManager starts a manager on the harness's runtime and store (a server
// start); it is closed when the test ends.
func (h *harness) newManager() *Manager {
	h.t.Helper()
	cfg := Config{
		SnapshotDir: filepath.Join(h.dir, "snapshots"), PausedDir: filepath.Join(h.dir, "paused"), WarmDir: filepath.Join(h.dir, "warm"),
		ReapInterval: cmp.Or(h.reap, time.Hour), // tests call reapOnce themselves
		Images:       h.images,
		Node:         h.node,
		Metrics:      metrics.New(),
	}
	h.metrics = cfg.Metrics
	for _, d := range []string{cfg.SnapshotDir, cfg.PausedDir, cfg.WarmDir} {
		os.MkdirAll(d, 0o700)
	}
	log := slog.New(slog.NewTextHandler(testWriter{h.t, &h.logs}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	m := New(cfg, h.store, h.rt, h.tpls, log)
	// The host's CPU load is no business of these tests: always idle
	// (TestRefillYieldsToCreates sets its own).
	m.idleCPUs = func(context.Context, time.Duration) (float64, error) { return 64, nil }
	if h.net != nil {
		m.UseNetwork(h.net)
		h.rt.stopHook = h.net.release
	}
	if err := m.Start(context.Background()); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(m.Close)
	return m
}

// testWriter passes a manager's log to the test's and keeps its lines.
type testWriter struct {
	t    *testing.T
	keep *logLines
}

func (w testWriter) Write(p []byte) (int, error) {
	line := string(p[:len(p)-1])
	w.t.Log(line)
	w.keep.add(line)
	return len(p), nil
}

// logLines is what a harness's managers logged, one entry a line.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
}

// with returns the lines that contain s.
func (l *logLines) with(s string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			out = append(out, line)
		}
	}
	return out
}

// warmBase makes a warm image of the harness's template (the warm-up
// "import x") and returns the template with it, not yet in h.tpls.
func (h *harness) warmBase() Template {
	h.t.Helper()
	tpl := h.tpls.tpl
	tpl.WarmImage = WarmImageDir(h.m.cfg.WarmDir, tpl.Name, "0123456789abcdef0123", "fedcba9876543210ffff")
	if err := h.m.Warm(context.Background(), tpl, "import x", tpl.WarmImage); err != nil {
		h.t.Fatal(err)
	}
	return tpl
}

// holdCheckpoint makes the next checkpoint signal inCheckpoint and wait
// until release is closed, letting other calls into the runtime through.
func (h *harness) holdCheckpoint() (inCheckpoint, release chan struct{}) {
	inCheckpoint, release = make(chan struct{}), make(chan struct{})
	h.rt.checkpointErr = func(string) error {
		close(inCheckpoint)
		h.rt.mu.Unlock() // let the test's calls into the runtime through while we wait
		<-release
		h.rt.mu.Lock()
		return nil
	}
	return inCheckpoint, release
}

func (h *harness) create() pandastack.Sandbox {
	h.t.Helper()
	sb, err := h.m.Create(context.Background(), project, CreateRequest{Template: "base"})
	if err != nil {
		h.t.Fatalf("create: %v", err)
	}
	return sb
}

// snapshot takes a snapshot of sandbox id, without metadata.
func (h *harness) snapshot(id string) pandastack.Snapshot {
	h.t.Helper()
	snap, err := h.m.Snapshot(context.Background(), project, id, nil)
	if err != nil {
		h.t.Fatalf("snapshot: %v", err)
	}
	return snap
}

// exec runs cmd in the sandbox through the manager and returns its stdout.
func (h *harness) exec(id, cmd string) (string, error) {
	c, done, err := h.m.Acquire(context.Background(), project, id)
	if err != nil {
		return "", err
	}
	defer done()
	var out string
	_, err = c.Exec(context.Background(), agentproto.ExecRequest{Cmd: cmd}, func(ev agentproto.ExecEvent) error {
		out += string(ev.Data)
		return nil
	})
	return out, err
}

// wantStopped fails the test unless sandbox id's record says stopped for
// reason.
func (h *harness) wantStopped(id, reason string) {
	h.t.Helper()
	if rec := h.record(id); rec.State != pandastack.StateStopped || rec.StopReason != reason {
		h.t.Fatalf("%s: %s %s, want stopped %s", id, rec.State, rec.StopReason, reason)
	}
}

func (h *harness) record(id string) pandastack.Sandbox {
	h.t.Helper()
	sb, err := h.store.GetSandbox(context.Background(), "", id)
	if err != nil {
		h.t.Fatalf("get %s: %v", id, err)
	}
	return sb
}

func wantCode(t *testing.T, err error, code string) {
	t.Helper()
	if !pandastack.IsCode(err, code) {
		t.Fatalf("got %v, want an error with code %s", err, code)
	}
}

// entries returns the ids the manager holds, sorted.
func (m *Manager) entryIDs() []string {
	m.sbx.mu.Lock()
	defer m.sbx.mu.Unlock()
	var ids []string
	for id := range m.sbx.entries {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

var errInjected = errors.New("injected failure")

// hookStore is the real store with one failure to inject.
type hookStore struct {
	pandastack.Store
	mu          sync.Mutex
	setStateErr func(id string, state pandastack.SandboxState) error
	// afterExpired, if set, runs once the expired sandboxes are listed.
	afterExpired func(expired []pandastack.Sandbox)
	// lostAnswer, if set and true for a state written, fails the write
	// after it was made, as a database whose answer is lost does.
	lostAnswer func(id string, state pandastack.SandboxState) bool
	// lostSnapshot: a snapshot's record is made, its answer lost.
	lostSnapshot bool
	// getSnapshotErr, if set, fails reads of a snapshot.
	getSnapshotErr error
	// beforeSetExpiry, if set, runs before a sandbox's expiry is written.
	beforeSetExpiry func(id string)
}

// set changes the store's hooks, under its lock.
func (s *hookStore) set(f func(*hookStore)) {
	s.mu.Lock()
	f(s)
	s.mu.Unlock()
}

func (s *hookStore) SetSandboxExpiry(ctx context.Context, id string, at time.Time) error {
	s.mu.Lock()
	hook := s.beforeSetExpiry
	s.mu.Unlock()
	if hook != nil {
		hook(id)
	}
	return s.Store.SetSandboxExpiry(ctx, id, at)
}

func (s *hookStore) ExpiredSandboxes(ctx context.Context, now time.Time) ([]pandastack.Sandbox, error) {
	expired, err := s.Store.ExpiredSandboxes(ctx, now)
	s.mu.Lock()
	hook := s.afterExpired
	s.mu.Unlock()
	if hook != nil && err == nil {
		hook(expired)
	}
	return expired, err
}

func (s *hookStore) GetSnapshot(ctx context.Context, projectID, id string) (pandastack.Snapshot, error) {
	s.mu.Lock()
	err := s.getSnapshotErr
	s.mu.Unlock()
	if err != nil {
		return pandastack.Snapshot{}, err
	}
	return s.Store.GetSnapshot(ctx, projectID, id)
}

func (s *hookStore) CreateSnapshot(ctx context.Context, snap pandastack.Snapshot) error {
	s.mu.Lock()
	lost := s.lostSnapshot
	s.mu.Unlock()
	err := s.Store.CreateSnapshot(ctx, snap)
	if err == nil && lost {
		return errInjected
	}
	return err
}

func (s *hookStore) SetSandboxState(ctx context.Context, id string, state pandastack.SandboxState, reason string, at time.Time) error {
	s.mu.Lock()
	hook, lost := s.setStateErr, s.lostAnswer
	s.mu.Unlock()
	if hook != nil {
		if err := hook(id, state); err != nil {
			return err
		}
	}
	err := s.Store.SetSandboxState(ctx, id, state, reason, at)
	if err == nil && lost != nil && lost(id, state) {
		return errInjected // made, but its answer lost on the way back
	}
	return err
}

// clock is a settable time for idleness.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// takeSuspendLog returns the suspend log so far and empties it.
func (r *fakeRuntime) takeSuspendLog() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.suspendLog
	r.suspendLog = nil
	return l
}

// setFor sets *v, a package's tunable, to x for the test and back at its
// end. Called before the test's harnesses are made, its cleanup runs after
// theirs, once their managers' background work (which reads *v) is over.
func setFor[T any](t *testing.T, v *T, x T) {
	old := *v
	*v = x
	t.Cleanup(func() { *v = old })
}
