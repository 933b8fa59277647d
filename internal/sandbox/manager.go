// Package sandbox owns the life of sandboxes: create with rollback, the agent
// channel of each running sandbox, TTL expiry, kill, and re-adoption after a
// server restart. Runtime processes live under the Manager's lifetime, never
// under a request's context. Only internal/api and cmd/ import it.
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/imagestore"
	"github.com/pandastack/pandastack/internal/metrics"
)

// Config holds the manager's limits and timings. DefaultConfig has the
// defaults; New fills any zero field from it.
type Config struct {
	DefaultTTL       time.Duration // TTL of a sandbox created without one
	MaxTTL           time.Duration // the largest TTL a caller may ask for
	MaxCPU           int           // the most CPUs of one sandbox
	MaxMemoryMB      int           // the most memory of one sandbox, in MiB
	MaxDiskMB        int           // the largest disk_mb a caller may ask for
	PIDsLimit        int           // processes and threads per sandbox
	ReapInterval     time.Duration // how often TTLs and liveness are checked
	StoppedRetention time.Duration // how long records of stopped sandboxes stay visible
	StartTimeout     time.Duration // boot until the agent says hello
	SnapshotDir      string        // scratch space of snapshots and forks on their way (required)
	PausedDir        string        // where paused sandboxes are kept (required)
	WarmDir          string        // where warm template images are kept (required for StartWarming)
	DiskDir          string        // where the runtime writes the sandboxes' disks: a failed restore is blamed on a full disk by its filesystem's room ("": the image's)
	MaxFork          int           // the most children of one fork
	PoolSize         int           // sandboxes of each warm template kept restored ahead of creates (0: none; never filled in)
	IdleTimeout      time.Duration // idle timeout of a sandbox created without one (0: never; never filled in); see idle.go
	// PoolMemoryMB is the memory pools may hold to follow demand: each
	// keeps PoolSize ready and more while creates come faster (pool.go).
	// 0: every pool keeps exactly PoolSize; never filled in.
	PoolMemoryMB int
	// MaxRestores is how many creates restore at once; more wait in
	// line, first come first served (admit.go). 0: no limit; never
	// filled in (DefaultConfig has one per CPU).
	MaxRestores int
	// PreparedResumes is how many of the sandboxes suspended last for
	// idleness have their resume prepared ahead (prepare.go): each keeps
	// two waiting host processes. 0: none; DefaultConfig keeps 4.
	PreparedResumes int
	// PreparedCreates is how many containers of each warm template are
	// kept created ahead for the creates no pool sandbox serves
	// (standby.go): each holds two waiting host processes. 0: none;
	// DefaultConfig keeps 1.
	PreparedCreates int
	// MemoryReserveMB is the host memory (MemAvailable, MiB) the server
	// keeps free: below it, pools are emptied and quiet sandboxes are
	// suspended, and boots that cannot be made room for are refused
	// (pressure.go). 0: none; DefaultConfig keeps 1024.
	MemoryReserveMB int
	// UnpacedRefills lets every agent refill its spare kernels on its own
	// schedule, instead of when the host has a CPU to spare (refills.go).
	UnpacedRefills bool

	// Images keeps snapshots; nil means a local directory store on
	// SnapshotDir (imagestore.Local).
	Images pandastack.ImageStore

	Node NodeConfig // this server as one node of several (node.go); zero: the only one
	// Metrics is where the manager's series go (metrics.go); nil: none
	// are kept.
	Metrics *metrics.Registry
}

// DefaultConfig returns the defaults: the one place they are written.
func DefaultConfig() Config {
	return Config{
		DefaultTTL:       300 * time.Second,
		MaxTTL:           24 * time.Hour,
		MaxCPU:           2,
		MaxMemoryMB:      8192,
		MaxDiskMB:        65536,
		PIDsLimit:        1536,
		ReapInterval:     time.Second,
		StoppedRetention: 24 * time.Hour,
		StartTimeout:     30 * time.Second,
		MaxFork:          16,
		PoolSize:         2,
		IdleTimeout:      300 * time.Second,
		PoolMemoryMB:     1024,
		PreparedCreates:  1,
		PreparedResumes:  4,
		MemoryReserveMB:  1024,
		// One restore per CPU, the others in line: a burst's creates
		// then finish one after another instead of all at its end (a
		// burst of 20 here: median 1.6 s instead of 2.3, the last as late).
		MaxRestores: runtime.NumCPU(),
	}
}

func (c *Config) setDefaults() {
	d := DefaultConfig()
	def := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	defInt := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	def(&c.DefaultTTL, d.DefaultTTL)
	def(&c.MaxTTL, d.MaxTTL)
	def(&c.ReapInterval, d.ReapInterval)
	def(&c.StoppedRetention, d.StoppedRetention)
	def(&c.StartTimeout, d.StartTimeout)
	defInt(&c.MaxCPU, d.MaxCPU)
	defInt(&c.MaxMemoryMB, d.MaxMemoryMB)
	defInt(&c.MaxDiskMB, d.MaxDiskMB)
	defInt(&c.PIDsLimit, d.PIDsLimit)
	defInt(&c.MaxFork, d.MaxFork)
	if c.Node.ID != "" {
		c.Node.setDefaults()
	}
}

// Template is a built template as the manager needs it.
type Template struct {
	Name      string
	RootFS    string
	CPU       int
	MemoryMB  int
	DiskMB    int    // the sandbox's own disk; 0: the runtime's default
	WarmImage string // an image directory of the template booted warm, or ""
}

// Templates resolves template names. Resolve returns ENotFound for an
// unknown name and ETemplateMissing for one that is not built.
type Templates interface {
	Resolve(ctx context.Context, name string) (Template, error)
}

// CreateRequest is what a caller may set on a new sandbox.
type CreateRequest struct {
	Template   string
	TTLSeconds *int64
	Metadata   map[string]string
	Env        map[string]string
	CPU        int
	MemoryMB   int
	DiskMB     int    // the sandbox's own disk, in MiB; 0: the template's (a restore keeps the snapshot's)
	SnapshotID string // restore this snapshot instead of a template
	AutoResume bool   // resume automatically on any request while paused
	// IdleTimeoutSeconds: suspend after this long idle (0: never); nil
	// takes Config.IdleTimeout.
	IdleTimeoutSeconds *int64
	Network            *pandastack.NetworkPolicy // nil: the server's default (network.go)
}

// Manager runs sandboxes for the API.
type Manager struct {
	cfg       Config
	store     pandastack.Store
	rt        pandastack.Runtime
	templates Templates
	log       *slog.Logger
	now       func() time.Time

	sbx *table // the sandboxes this process runs or works on, one entry each

	mu       sync.Mutex
	pools    map[string]*pool    // by template name
	standbys map[string]*standby // containers prepared for creates, by template name (standby.go)
	net      Network             // sandbox networking, or nil (network.go)
	caPEM    []byte              // certificates added to every sandbox's trust store (network.go)

	caDigest string     // of caPEM, hex (network.go)
	admit    *admission // the line of restores (admit.go)

	// Creates under way, and when the last one ended (unix ns of m.now):
	// pool refills yield to them and to the work that follows them
	// (yieldToCreates in pool.go).
	creates    atomic.Int32
	lastCreate atomic.Int64
	// idleCPUs measures the host's idle CPUs over a while (hostcpu.go;
	// unit tests replace it).
	idleCPUs func(context.Context, time.Duration) (float64, error)

	suspending    atomic.Bool            // idle suspends are under way (idle.go)
	relieving     chan struct{}          // held by the relief of memory pressure under way (pressure.go)
	reliefGen     atomic.Uint64          // reliefs of memory pressure done (pressure.go)
	reliefFutile  atomic.Int64           // when the last relief found nothing to free (m.now, unix ns); 0: it did
	lastRelief    relief                 // what the last relief did; m.relieving guards it
	bookMu        sync.Mutex             // guards bookings and their fields
	expiry        turns                  // per sandbox: orders a TTL's change against the reaper's last look (SetTTL, reapOnce)
	bookings      map[*booking]struct{}  // memory promised to boots under way (pressure.go)
	bootSettle    time.Duration          // how long a boot's memory stays booked after it (pressure.go; unit tests set 0)
	memAvailable  func() int             // the host's available memory in MiB (pressure.go; unit tests replace it)
	warmVerified  sync.Map               // key → *warmCheck: warm images checksummed (warm.go)
	node          nodeState              // the other nodes as of the last heartbeat (node.go)
	ownPaused     sync.Map               // sandbox id → ownPaused: paused images this process wrote (resume.go)
	checkedPaused sync.Map               // sandbox id → time.Time: the manifest's mtime of a paused image a restart found, once verified (resume.go)
	prepared      preparedResumes        // suspended sandboxes whose resume is prepared (prepare.go)
	warmHeld      heldImages             // the warm images, held in the page cache (pin.go)
	warmNow       map[string]warmCurrent // template name → the warm image it restores now (retireWarm; mu)
	metrics       managerMetrics         // the series it keeps (metrics.go); zero: none
	warmFailed    sync.Map               // warm image dir → string: why its warming failed (warm.go)
	refills       refillHolds            // sandboxes whose spare refills wait for the host (refills.go)
	snapUse       snapshotUse            // snapshots being restored from (images.go)

	stop chan struct{}
	wg   sync.WaitGroup
}

// New returns a manager; call Start before use.
func New(cfg Config, store pandastack.Store, rt pandastack.Runtime, templates Templates, log *slog.Logger) *Manager {
	cfg.setDefaults()
	if cfg.Images == nil {
		cfg.Images = imagestore.NewLocal(cfg.SnapshotDir)
	}
	m := &Manager{
		cfg: cfg, store: store, rt: rt, templates: templates, log: log, now: time.Now,
		sbx: newTable(), stop: make(chan struct{}), admit: newAdmission(cfg.MaxRestores), idleCPUs: idleCPUs,
		relieving: make(chan struct{}, 1), memAvailable: availableMiB, bootSettle: bootSettle,
	}
	if cfg.Metrics != nil {
		m.useMetrics(cfg.Metrics)
	}
	return m
}

// Config returns the effective configuration.
func (m *Manager) Config() Config { return m.cfg }

// Start re-adopts or cleans up the sandboxes of an earlier run, removes
// runtime state nobody owns, and starts the TTL reaper.
func (m *Manager) Start(ctx context.Context) error {
	total, _ := hostMemoryMB()
	if err := m.checkReserve(total); err != nil {
		return err // before this node shows itself to others
	}
	if err := m.startNode(ctx); err != nil {
		return fmt.Errorf("node %s: %w", m.cfg.Node.ID, err)
	}
	if err := m.recover(ctx); err != nil {
		return err
	}
	m.wg.Add(1)
	go m.reapLoop()
	return nil
}

// KillAll kills every sandbox of this node (running, paused or starting)
// of every project, for a server run with --kill-on-exit. Nothing starts
// from then on, and it lists again until nothing is left: creates under
// way when it began (their records written after a list) die too.
func (m *Manager) KillAll(ctx context.Context) {
	m.sbx.refuseStarts()
	for range killAllRounds {
		recs, err := m.store.ListSandboxes(ctx, pandastack.SandboxFilter{Node: m.cfg.Node.ID, States: []pandastack.SandboxState{pandastack.StateStarting, pandastack.StateRunning, pandastack.StatePaused}})
		if err != nil {
			m.log.Error("kill all", "err", err)
			return
		}
		if len(recs) == 0 {
			if !m.sbx.starting() {
				return
			}
			time.Sleep(50 * time.Millisecond) // a start under way writes its record
			continue
		}
		var wg sync.WaitGroup
		var failed atomic.Bool
		for _, sb := range recs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := m.kill(ctx, sb.ProjectID, sb.ID, reasonKillOnExit); err != nil && !pandastack.IsCode(err, pandastack.ENotFound) {
					failed.Store(true)
				}
			}()
		}
		wg.Wait()
		if failed.Load() {
			time.Sleep(100 * time.Millisecond) // a kill that failed is tried again, not at once
		}
	}
	m.log.Error("kill all: sandboxes were still there, or starting, after every round; they may outlive the server")
}

// killAllRounds bounds KillAll's lists: each waits for the starts under way.
const killAllRounds = 100

// Close stops the reaper and closes agent channels. Sandboxes keep running,
// so the next Start re-adopts them.
func (m *Manager) Close() {
	m.mu.Lock()
	if m.stopped() {
		m.mu.Unlock()
		return
	}
	close(m.stop) // under m.mu: no EnablePool or StartWarming adds to m.wg after this
	m.mu.Unlock()
	clients := m.sbx.close()
	m.wg.Wait()
	m.drainPools()
	for _, id := range m.prepared.releaseAll() {
		// Their sandboxes stay paused: the runtime's clean-up of the
		// prepared containers takes only their network down.
		if m.net != nil {
			m.net.Hold(id)
		}
	}
	m.warmHeld.releaseAll()
	for _, c := range clients {
		c.markStopped(reasonShutdown)
		c.Close()
	}
}

func (m *Manager) recover(ctx context.Context) error {
	if err := m.finishKills(ctx); err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	recs, err := m.store.ListSandboxes(ctx, pandastack.SandboxFilter{Node: m.cfg.Node.ID, States: []pandastack.SandboxState{pandastack.StateStarting, pandastack.StateRunning}})
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	owned := map[string]bool{}
	for _, s := range recs {
		switch {
		case s.State == pandastack.StateStarting:
			m.stopSandbox(s.ID, pandastack.StopFailed)
		case !s.ExpiresAt.After(m.now()):
			m.stopSandbox(s.ID, pandastack.StopExpired)
		case s.ProjectID == warmProject:
			// A warm-up cut short by the last shutdown: nobody needs it.
			m.teardown(s.ID, "")
			m.store.DeleteSandbox(context.Background(), s.ID)
		default:
			if ctx.Err() != nil {
				// Shutting down while re-adopting: leave the rest for the
				// next start rather than stop them as lost.
				return ctx.Err()
			}
			if err := m.adopt(context.WithoutCancel(ctx), s); err != nil {
				m.log.Warn("sandbox lost across restart", "sandbox", s.ID, "err", err)
				m.stopSandbox(s.ID, pandastack.StopLost)
				continue
			}
			owned[s.ID] = true
			m.log.Info("sandbox re-adopted", "sandbox", s.ID)
		}
	}
	m.sweepImages(ctx)
	ids, err := m.rt.List(ctx)
	if err != nil {
		return fmt.Errorf("recover: %w", err)
	}
	for _, id := range ids {
		if !owned[id] {
			m.log.Info("removing orphaned runtime state", "sandbox", id)
			if sb, err := m.store.GetSandbox(ctx, "", id); err == nil && sb.State == pandastack.StatePaused && m.net != nil {
				// A paused sandbox's prepared resume, or a resume cut short:
				// the sandbox keeps its policy for the next resume.
				m.net.Hold(id)
			}
			if err := m.rt.Stop(ctx, id); err != nil {
				m.log.Warn("remove orphan", "sandbox", id, "err", err)
			}
		}
	}
	m.forgetGoneNetworks(ctx, owned)
	return nil
}

// forgetGoneNetworks drops what the network keeps (a policy, its state
// file) of sandboxes an earlier run left it that neither run here now
// (owned) nor wait paused for a resume: killed while the server was down,
// or stopped by this recovery. Kept otherwise for good, one per sandbox.
func (m *Manager) forgetGoneNetworks(ctx context.Context, owned map[string]bool) {
	if m.net == nil {
		return
	}
	for _, id := range m.net.Known() {
		if owned[id] {
			continue
		}
		sb, err := m.store.GetSandbox(ctx, "", id)
		switch {
		case err == nil && sb.State == pandastack.StatePaused:
			continue
		case err != nil && !pandastack.IsCode(err, pandastack.ENotFound):
			continue // cannot tell: kept, as before
		}
		m.log.Info("dropping the network state of a sandbox that is gone", "sandbox", id)
		m.net.Release(id)
	}
}

func (m *Manager) adopt(ctx context.Context, sb pandastack.Sandbox) error {
	rwc, err := m.rt.Attach(ctx, sb.ID)
	if err != nil {
		return err
	}
	c, err := dialAgent(ctx, sb.ID, rwc, false)
	if err != nil {
		return err
	}
	m.countHostKills(sb.ID, c)
	if _, ok := m.sbx.run(sb.ID, c, time.Duration(sb.IdleTimeoutSeconds)*time.Second); !ok {
		c.Close()
	}
	return nil
}

const (
	// MaxMetadataKeys is the most keys a sandbox's or a snapshot's
	// metadata holds.
	MaxMetadataKeys = 64
	maxMetadataLen  = 1024
)

// ValidateMetadata checks metadata limits.
func ValidateMetadata(md map[string]string) error {
	if len(md) > MaxMetadataKeys {
		return pandastack.Errorf(pandastack.EInvalid, "metadata: at most %d keys, got %d", MaxMetadataKeys, len(md))
	}
	for k, v := range md {
		if k == "" || len(k) > 256 {
			return pandastack.Errorf(pandastack.EInvalid, "metadata: keys must be 1 to 256 bytes, got %q", k)
		}
		if len(v) > maxMetadataLen {
			return pandastack.Errorf(pandastack.EInvalid, "metadata %q: values must be at most %d bytes", k, maxMetadataLen)
		}
		if !pandastack.StorableText(k, v) {
			return pandastack.Errorf(pandastack.EInvalid, "metadata %q: keys and values must be UTF-8 without NUL characters", k)
		}
	}
	return nil
}

// fitsLimits refuses to make a sandbox of cpu and memoryMB, which what
// (a snapshot, a sandbox to fork) fixes, when they are over this server's
// limits (lowered since it was made): a restore cannot shrink them.
func (m *Manager) fitsLimits(what string, cpu, memoryMB int) error {
	if cpu > m.cfg.MaxCPU || memoryMB > m.cfg.MaxMemoryMB {
		return pandastack.Errorf(pandastack.EInvalid, "%s has cpu %d and memory_mb %d, over this server's limits (--max-cpu %d, --max-memory-mb %d); a sandbox made from it keeps them", what, cpu, memoryMB, m.cfg.MaxCPU, m.cfg.MaxMemoryMB)
	}
	return nil
}

// ValidateEnv checks environment variables as everything else does (create,
// exec, contexts, the agent): agentproto.CheckEnv is the one check.
func ValidateEnv(env map[string]string) error { return agentproto.CheckEnv(env) }

func (m *Manager) ttl(seconds *int64) (time.Duration, error) {
	if seconds == nil {
		return m.cfg.DefaultTTL, nil
	}
	if *seconds <= 0 || time.Duration(*seconds)*time.Second > m.cfg.MaxTTL || *seconds > int64(m.cfg.MaxTTL/time.Second) {
		return 0, pandastack.Errorf(pandastack.EInvalid, "ttl_seconds must be between 1 and %d, got %d", int64(m.cfg.MaxTTL/time.Second), *seconds)
	}
	return time.Duration(*seconds) * time.Second, nil
}

// Create boots a sandbox for the project: from a snapshot when
// req.SnapshotID is set, else from the template (restoring its warm
// snapshot when it has one). On any failure nothing of it is left on the
// host and its record says why it stopped.
func (m *Manager) Create(ctx context.Context, projectID string, req CreateRequest) (_ pandastack.Sandbox, err error) {
	op := opCreate
	if req.SnapshotID != "" {
		op = opRestore
	}
	if projectID != warmProject { // the server's own
		defer m.observe(op, time.Now(), &err)
	}
	ttl, err := m.ttl(req.TTLSeconds)
	if err != nil {
		return pandastack.Sandbox{}, err
	}
	if err := ValidateMetadata(req.Metadata); err != nil {
		return pandastack.Sandbox{}, err
	}
	if err := ValidateEnv(req.Env); err != nil {
		return pandastack.Sandbox{}, err
	}
	idle, err := m.idleTimeout(req.IdleTimeoutSeconds)
	if err != nil {
		return pandastack.Sandbox{}, err
	}
	if err := m.validNetwork(req.Network); err != nil {
		return pandastack.Sandbox{}, err
	}
	p := plan{ttl: ttl, idle: idle, metadata: req.Metadata, env: req.Env, autoResume: req.AutoResume, network: req.Network, line: true}
	if req.SnapshotID != "" {
		if req.Template != "" || req.CPU != 0 || req.MemoryMB != 0 || req.DiskMB != 0 || len(req.Env) > 0 {
			return pandastack.Sandbox{}, pandastack.Errorf(pandastack.EInvalid, "a sandbox from a snapshot takes its template, cpu, memory, disk and env from the snapshot; give only snapshot_id, ttl_seconds, metadata, auto_resume, idle_timeout_seconds and network")
		}
		snap, err := m.store.GetSnapshot(ctx, projectID, req.SnapshotID)
		if err != nil {
			return pandastack.Sandbox{}, err
		}
		if err := m.fitsLimits("snapshot "+snap.ID, snap.CPU, snap.MemoryMB); err != nil {
			return pandastack.Sandbox{}, err
		}
		man, img, err := m.openSnapshot(ctx, snap.ID)
		if err != nil {
			if _, gerr := m.store.GetSnapshot(ctx, projectID, snap.ID); pandastack.IsCode(gerr, pandastack.ENotFound) {
				return pandastack.Sandbox{}, pandastack.Errorf(pandastack.ENotFound, "snapshot %s was deleted", snap.ID)
			}
			return pandastack.Sandbox{}, err
		}
		defer img.Close() // the restore has its files open by then
		p.template, p.rootfs, p.image, p.cpu, p.mem = snap.Template, man.RootFS, filepath.Join(img.Dir(), imagestore.FilesDir), snap.CPU, snap.MemoryMB
		if p.network == nil {
			// The snapshotted sandbox's policy: the record's (what the
			// snapshot shows; a paused sandbox's present one), else, for
			// a snapshot recorded before it was kept, its image's.
			policy := snap.Network
			if policy == nil {
				policy = man.Network
			}
			p.network = m.keptNetwork(snap.ID, policy)
		}
		return m.launch(ctx, projectID, p)
	}
	if req.Template == "" {
		req.Template = "base"
	}
	tpl, err := m.templates.Resolve(ctx, req.Template)
	if err != nil {
		return pandastack.Sandbox{}, err
	}
	p.template, p.rootfs, p.cpu, p.mem, p.disk = tpl.Name, tpl.RootFS, tpl.CPU, tpl.MemoryMB, tpl.DiskMB
	// Each of the three comes from the request or, left out, from the
	// template; either must fit this server's limits. A template's default
	// over them is the operator's to fix, and the message says so rather
	// than quoting a value the caller never sent.
	asked := [3]int{req.CPU, req.MemoryMB, req.DiskMB}
	for i, v := range [3]*int{&p.cpu, &p.mem, &p.disk} {
		r := m.limits()[i]
		if asked[i] != 0 {
			*v = asked[i]
		}
		if *v == 0 && r.field == "disk_mb" {
			continue // the server's --disk-mb
		}
		if *v >= r.lo && *v <= r.hi {
			continue
		}
		if asked[i] == 0 {
			return pandastack.Sandbox{}, pandastack.Errorf(pandastack.EInvalid, "template %s asks for %s: give %s between %d and %d in the create, or lower the template's %s", tpl.Name, r.over(*v), r.field, r.lo, r.hi, r.field)
		}
		return pandastack.Sandbox{}, pandastack.Errorf(pandastack.EInvalid, "%s must be between %d and %d, got %d", r.field, r.lo, r.hi, *v)
	}
	// A warm snapshot was taken with the template's own resources and no
	// env, so only a plain create can use it.
	if tpl.WarmImage != "" && req.CPU == 0 && req.MemoryMB == 0 && req.DiskMB == 0 && len(req.Env) == 0 {
		if err := m.verifyWarm(tpl.WarmImage, "warm snapshot of template "+tpl.Name); err == nil {
			p.image = filepath.Join(tpl.WarmImage, "image")
		} else {
			m.log.Warn("warm template snapshot unusable; booting cold", "template", tpl.Name, "err", err)
		}
	}
	return m.launch(ctx, projectID, p)
}

// plan is what launch boots.
type plan struct {
	template   string
	rootfs     string
	image      string // restore this checkpoint image instead of booting cold
	cpu, mem   int
	disk       int // MiB; 0: the runtime's default
	ttl        time.Duration
	idle       time.Duration // idle timeout; 0 never
	metadata   map[string]string
	env        map[string]string
	autoResume bool
	network    *pandastack.NetworkPolicy // nil: the default, or the sandbox's own on a resume
	pooled     bool                      // served from a pool (launch sets it)
	prepared   bool                      // restored into a container prepared for creates (launch sets it)
	line       bool                      // wait in the admission line for the boot (admit.go)
	// hold, for a fork's child, takes the booted child's channel instead
	// of launch recording it running: the child stays starting, claimed
	// as being created (a kill or reconcile waits), until every child of
	// the fork runs and forkChildren records them running (or undoes
	// them). A crash in between leaves records a restart stops as
	// start_failed, not sandboxes nobody was told of.
	hold  func(*AgentClient)
	steps *resumeSteps // times the boot's steps (a fork's children); nil: launch times and logs them itself
}

// launch records a new sandbox, boots or restores it, and says hello.
func (m *Manager) launch(ctx context.Context, projectID string, p plan) (_ pandastack.Sandbox, err error) {
	now := m.now().UTC().Truncate(time.Millisecond) // what the store keeps, so every answer agrees
	sb := pandastack.Sandbox{
		ID: pandastack.NewID("sbx"), ProjectID: projectID, Template: p.template,
		State: pandastack.StateStarting, Metadata: maps.Clone(p.metadata),
		CPU: p.cpu, MemoryMB: p.mem, CreatedAt: now, ExpiresAt: now.Add(p.ttl), AutoResume: p.autoResume,
		IdleTimeoutSeconds: int64(p.idle / time.Second), RootFS: p.rootfs, NodeID: m.cfg.Node.ID,
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	m.creates.Add(1)
	defer func() {
		m.lastCreate.Store(m.now().UnixNano()) // before the count drops: a refill that sees none also sees this
		m.creates.Add(-1)
		if err == nil && p.line { // a create's, not a fork child's or a warm-up's
			m.countCreate(p)
		}
	}()
	if p.steps == nil {
		// A create's own steps (a fork logs its children's): a boot's at
		// info level ("sandbox booted"), a pool hand-out's at debug level.
		p.steps = newResumeSteps()
		defer func() {
			switch {
			case err != nil:
			case p.pooled:
				p.steps.debug(m.log, "sandbox create steps", sb.ID)
			default:
				p.steps.logCreate(m.log, sb.ID, p.prepared)
			}
		}()
	}
	pd, pooledOK := m.fromPool(p)
	p.steps.done("pool_ms")
	p.pooled = pooledOK
	var booked *booking // the memory promised to this boot (pressure.go)
	defer func() { booked.done(err == nil) }()
	if pooledOK {
		sb.ID = pd.id
	} else if p.line {
		// In line before the record: a caller that gives up waiting
		// leaves nothing behind.
		release, err := m.admit.acquire(ctx, false)
		if err != nil {
			return pandastack.Sandbox{}, pandastack.Errorf(pandastack.ETimeout, "gave up waiting for a free restore slot (%d creates in line): %v", m.admit.waiting(), err)
		}
		defer release()
		p.steps.done("admit_ms")
		// Looked at in the slot, not before the wait: creates that
		// queued together would all pass on one early reading.
		if booked, err = m.roomFor(ctx, "a new sandbox", imageMiB(p.image)); err != nil {
			return pandastack.Sandbox{}, err
		}
		p.steps.done("memory_ms")
	}
	standbyOK := false
	if !pooledOK {
		var done func()
		if sb.ID, done, standbyOK = m.takeStandby(ctx, p, sb.ID); standbyOK {
			defer done() // restored into the container prepared as sb.ID
		}
		p.prepared = standbyOK
		p.steps.prepared = standbyOK
		booked.of(sb.ID)
	}
	if err := m.sbx.begin(sb.ID, phaseCreating); err != nil {
		if pooledOK {
			pd.client.Close()
		}
		if pooledOK || standbyOK {
			m.rt.Stop(context.Background(), sb.ID)
		}
		return pandastack.Sandbox{}, err
	}
	if err := m.store.CreateSandbox(ctx, sb); err != nil {
		m.sbx.end(sb.ID)
		if pooledOK {
			pd.client.Close()
		}
		if pooledOK || standbyOK {
			m.rt.Stop(context.Background(), sb.ID)
		}
		return pandastack.Sandbox{}, err
	}
	p.steps.done("store_ms")
	defer func() {
		if err != nil {
			// Rollback runs outside the request's context: a client that
			// hung up must not leave a half-made sandbox behind.
			m.rt.Stop(context.Background(), sb.ID)
			if sb.ProjectID == warmProject { // the server's own: not a user's stop
				m.store.SetSandboxState(context.Background(), sb.ID, pandastack.StateStopped, pandastack.StopFailed, m.now())
			} else {
				m.recordStop(context.Background(), sb.ID, pandastack.StopFailed)
			}
			m.sbx.end(sb.ID)
		}
	}()

	if pooledOK {
		// Pool sandboxes were restored with the default policy.
		if err := m.applyNetwork(sb.ID, p.network); err != nil {
			pd.client.Close()
			return pandastack.Sandbox{}, err
		}
		if p.steps != nil {
			p.steps.attrs = append(p.steps.attrs, "pooled", true)
		}
		return m.started(ctx, sb, pd.client, true)
	}
	env := make([]string, 0, len(p.env)+1)
	for k, v := range p.env {
		env = append(env, k+"="+v)
	}
	env = append(env, "PANDASTACK_SANDBOX_ID="+sb.ID)
	// The boot is not cancelled with the request (STYLE habit 5): a client
	// that hangs up gets nothing, and the rollback cleans up.
	startCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StartTimeout)
	defer cancel()
	spec := pandastack.RuntimeSpec{ID: sb.ID, RootFS: p.rootfs, Env: env, CPU: p.cpu, MemoryMB: p.mem, DiskMB: p.disk, PIDs: m.cfg.PIDsLimit, Lazy: true, Network: p.network}
	var rwc io.ReadWriteCloser
	var client *AgentClient
	for retried := false; ; retried = true {
		if p.image != "" {
			rwc, err = m.rt.Restore(startCtx, spec, p.image)
		} else {
			rwc, err = m.rt.Start(startCtx, spec)
		}
		p.steps.done("restore_ms")
		booted := err == nil
		if !booted && p.image != "" {
			// runsc fails for want of disk without saying so: the disk's
			// fault is a refusal, not tried again.
			err = roomError(err, p.image, m.cfg.DiskDir, "the sandbox was not created")
		} else if !booted {
			err = storageError(err, "the sandbox was not created")
		}
		if booted {
			client, err = m.dialAndSetup(startCtx, sb.ID, rwc, hello{reseed: p.image != "", holdSpares: p.image != "" && m.pacesRefills()}, p.steps, true)
		}
		if retried || !bootAgain(err, booted) || startCtx.Err() != nil {
			break
		}
		// A sandbox that died during its start for no reason the runtime
		// knows (helloFailed logged what it does) is booted once more,
		// afresh: nothing of the first boot was handed out yet, and the
		// caller gets a sandbox, not an internal error for a crash that
		// may not come again. One that ran out of memory or processes
		// would only do so again.
		m.log.Warn("booting the sandbox afresh", "sandbox", sb.ID, "err", err)
		m.rt.Stop(context.Background(), sb.ID)
		// Its steps are the new boot's; the dead one's are kept apart.
		p.steps.deadBoot(booted)
		p.prepared, p.steps.prepared = false, false
	}
	if err == nil {
		p.steps.done("setup_ms")
		if p.hold != nil {
			p.hold(client)
			return sb, nil
		}
		out, err := m.started(ctx, sb, client, true)
		p.steps.done("record_ms")
		return out, err
	}
	if startCtx.Err() != nil {
		return pandastack.Sandbox{}, pandastack.Errorf(pandastack.ETimeout, "sandbox %s did not start within %s", sb.ID, m.cfg.StartTimeout)
	}
	return pandastack.Sandbox{}, fmt.Errorf("create %s: %w", sb.ID, storageError(err, "the sandbox was not created"))
}

// limit is the range this server allows of a sandbox's cpu, memory_mb or
// disk_mb, and the flag that sets its top.
type limit struct {
	field, flag string
	lo, hi      int
}

// over says that v, a template's default, is over the limit.
func (l limit) over(v int) string {
	return fmt.Sprintf("%s %d by default, more than this server allows (%s %d)", l.field, v, l.flag, l.hi)
}

// limits are the server's limits of cpu, memory_mb and disk_mb, in that
// order.
func (m *Manager) limits() [3]limit {
	return [3]limit{
		{"cpu", "--max-cpu", 1, m.cfg.MaxCPU},
		{"memory_mb", "--max-memory-mb", 64, m.cfg.MaxMemoryMB},
		{"disk_mb", "--max-disk-mb", 64, m.cfg.MaxDiskMB},
	}
}

// helloFailed explains a hello (or a setup after it) that failed in a
// container that is gone: the agent exited (it crashed at its start, or
// was restored with another build of itself), which no wait would have
// helped; a timeout's own message said the host might be overloaded, and
// a request cut by the death (its stream reset) named no cause at all.
func (m *Manager) helloFailed(id string, err error) error {
	if err == nil || m.rt.Alive(id) {
		return err
	}
	args := []any{"sandbox", id, "err", err}
	reason := m.rt.DeathReason(id)
	if reason != "" {
		args = append(args, "reason", reason)
	}
	if rl, ok := m.rt.(pandastack.RuntimeLogs); ok {
		args = append(args, "runtime_log", rl.LogTail(id))
	}
	m.log.Error("the sandbox died during its start", args...)
	return agentDied{pandastack.Errorf(pandastack.EInternal, "sandbox %s: its agent exited during the sandbox's start (a crash; the server's log tells more)", id), reason}
}

// dialAndSetup says hello to a sandbox just booted (dialAgentWith), with
// setup also its setup (withSetup, then setupSandbox), timing the hello
// as agent_ms, while it watches whether the sandbox still runs
// (watchAlive): one that dies on the way, before its hello or after it,
// ends the wait at once and is said to have died (helloFailed,
// agentDied), not to have run out of time on an overloaded host.
func (m *Manager) dialAndSetup(ctx context.Context, id string, rwc io.ReadWriteCloser, h hello, steps *resumeSteps, setup bool) (*AgentClient, error) {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer watchAlive(wctx, cancel, id, m.rt.Alive)()
	if setup {
		h = m.withSetup(id, h)
	}
	client, err := dialAgentWith(wctx, id, rwc, h)
	if err == nil {
		steps.done("agent_ms")
		if setup {
			err = m.setupSandbox(wctx, client)
		}
		if err != nil {
			client.Close()
			client = nil
		}
	}
	if err != nil && context.Cause(wctx) == errSandboxGone {
		err = fmt.Errorf("sandbox %s: it stopped answering during its start, and the sandbox is gone", id)
	}
	return client, m.helloFailed(id, err)
}

// bootAgain says whether a start that failed with err is worth one more
// boot: its sandbox died during the start for no reason the runtime
// knows (agentDied), or, not booted, the runtime's boot failed with no
// cause the server can name (an error without a code: runsc's exit
// status, as when a process of the sandbox is killed half-way through
// runsc's run or restore). A refused boot (a bad image, a full disk,
// a conflict) carries a code, and would only fail again.
func bootAgain(err error, booted bool) bool {
	var died agentDied
	if errors.As(err, &died) {
		return died.reason == ""
	}
	var coded *pandastack.Error
	return err != nil && !booted && !errors.As(err, &coded) &&
		!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
}

// agentDied is helloFailed's error for a sandbox that died during its
// start, with the runtime's reason for its death ("" unknown).
type agentDied struct {
	error
	reason string
}

func (e agentDied) Unwrap() error { return e.error }

// countHostKills lets client tell a command the host's out-of-memory
// killer killed (hostoom.go), when the runtime counts those kills. Before
// the client is shared.
func (m *Manager) countHostKills(id string, client *AgentClient) {
	if o, ok := m.rt.(pandastack.RuntimeOOMKills); ok {
		client.hostOOMKills = func() int64 { return o.OOMKills(id) }
	}
}

// started records a claimed, booted sandbox as running and makes it so;
// created says whether to log it as a new sandbox (a resume logs its own
// line).
func (m *Manager) started(ctx context.Context, sb pandastack.Sandbox, client *AgentClient, created bool) (pandastack.Sandbox, error) {
	if err := m.store.SetSandboxState(context.WithoutCancel(ctx), sb.ID, pandastack.StateRunning, "", m.now()); err != nil {
		client.Close()
		return pandastack.Sandbox{}, err
	}
	m.countHostKills(sb.ID, client)
	idle, ok := m.sbx.run(sb.ID, client, time.Duration(sb.IdleTimeoutSeconds)*time.Second)
	if !ok {
		client.Close() // shutting down: the next start re-adopts it
	} else {
		m.holdRefills(sb.ID, client)
	}
	sb.IdleTimeoutSeconds = int64(idle / time.Second) // a change during the boot
	sb.State, sb.PauseReason = pandastack.StateRunning, ""
	sb.Network = m.networkOf(sb.ID)
	if created {
		m.log.Info("sandbox created", "sandbox", sb.ID, "template", sb.Template, "project", sb.ProjectID)
	}
	return sb, nil
}

// Get returns a sandbox of the project.
func (m *Manager) Get(ctx context.Context, projectID, id string) (pandastack.Sandbox, error) {
	sb, err := m.store.GetSandbox(ctx, projectID, id)
	if err == nil {
		sb.Network = m.networkOf(id)
	}
	return sb, err
}

// List returns the project's sandboxes matching f (f.ProjectID is forced).
func (m *Manager) List(ctx context.Context, projectID string, f pandastack.SandboxFilter) ([]pandastack.Sandbox, error) {
	f.ProjectID = projectID
	return m.store.ListSandboxes(ctx, f)
}

// SetTTL makes the sandbox expire ttl from now.
func (m *Manager) SetTTL(ctx context.Context, projectID, id string, seconds int64) (pandastack.Sandbox, error) {
	ttl, err := m.ttl(&seconds)
	if err != nil {
		return pandastack.Sandbox{}, err
	}
	sb, err := m.settled(ctx, projectID, id)
	if err != nil {
		return sb, err
	}
	if sb.State != pandastack.StateRunning && sb.State != pandastack.StatePaused {
		return m.running(ctx, projectID, id) // the error that says why
	}
	// The reaper looks at an expired sandbox's record once more and claims
	// it in its turn (m.expiry): a change written before that keeps it,
	// and one that comes after finds it being stopped and says so, rather
	// than answering a TTL the sandbox will not live to see.
	done, err := m.expiry.take(ctx, id)
	if err != nil {
		return sb, pandastack.Errorf(pandastack.ETimeout, "gave up waiting to change the TTL of %s: %v", id, err)
	}
	defer done()
	if m.sbx.stopping(id) {
		return sb, busyError(id, phaseStopping)
	}
	if now, err := m.store.GetSandbox(ctx, projectID, id); err != nil {
		return now, err
	} else if now.State == pandastack.StateStopped {
		return m.running(ctx, projectID, id) // stopped since the look above
	}
	sb.ExpiresAt = m.now().UTC().Add(ttl).Truncate(time.Millisecond)
	if err := m.store.SetSandboxExpiry(ctx, id, sb.ExpiresAt); err != nil {
		return sb, err
	}
	m.sbx.unexpire(func(other string) bool { return other != id }) // its mark of an earlier expiry
	return sb, nil
}

// settled returns the sandbox's record once a create of it here is done
// (a change of its TTL or policy waits for that, as requests do).
func (m *Manager) settled(ctx context.Context, projectID, id string) (pandastack.Sandbox, error) {
	for {
		sb, err := m.store.GetSandbox(ctx, projectID, id)
		if err != nil || sb.State != pandastack.StateStarting || !m.sbx.waitOut(ctx, id, phaseCreating) {
			return sb, err
		}
		if err := ctx.Err(); err != nil {
			return sb, err
		}
	}
}

// running returns the record of a running sandbox, or EStopped for one
// that has stopped, or EUnavailable.
func (m *Manager) running(ctx context.Context, projectID, id string) (pandastack.Sandbox, error) {
	sb, err := m.store.GetSandbox(ctx, projectID, id)
	if err != nil {
		return sb, err
	}
	switch sb.State {
	case pandastack.StateRunning:
		return sb, nil
	case pandastack.StateStopped:
		return sb, StoppedError(sb)
	}
	return sb, pandastack.Errorf(pandastack.EUnavailable, "sandbox %s is %s; retry once it runs", id, sb.State)
}

// StoppedError is the error of a request on sb, a stopped sandbox: it
// never runs again.
func StoppedError(sb pandastack.Sandbox) error {
	return pandastack.Errorf(pandastack.EStopped, "sandbox %s is stopped (%s); create a new one", sb.ID, sb.StopReason)
}

// Agent returns the agent client of a running sandbox of the project,
// resuming it first if it is paused with auto_resume.
func (m *Manager) Agent(ctx context.Context, projectID, id string) (*AgentClient, error) {
	c, _, err := m.use(ctx, projectID, id, func(id string) (*AgentClient, func(), error) {
		c, err := m.sbx.agent(id)
		return c, nil, err
	})
	return c, err
}

// use makes the sandbox usable and then takes its channel with take (one
// of the table's agent, acquire or hold). An idle suspend that began in
// between is waited out, and the sandbox resumed, as for any request; so
// is a snapshot or fork under way (a checkpoint takes a second or so, and
// an agent's parallel calls must not fail for it).
func (m *Manager) use(ctx context.Context, projectID, id string, take func(string) (*AgentClient, func(), error)) (*AgentClient, func(), error) {
	var release func() // counted as waiting for a checkpoint's end
	defer func() {
		if release != nil {
			release()
		}
	}()
	// Bounded: a checkpoint that hangs answers conflict, as it did before
	// requests waited for checkpoints. Made at the first wait: most
	// requests never wait.
	var waitCtx context.Context
	relooks := 0
	for {
		sb, err := m.usable(ctx, projectID, id)
		if err != nil {
			return nil, nil, err
		}
		c, done, err := take(id)
		if release != nil {
			release()
			release = nil
		}
		if err != nil && waitCtx == nil {
			var cancel context.CancelFunc
			waitCtx, cancel = context.WithTimeout(ctx, phaseWait)
			defer cancel()
		}
		if err != nil && waitCtx.Err() == nil && m.sbx.waitTurn(waitCtx, id, &release) {
			continue
		}
		if err != nil && relooks < maxRelooks {
			// Paused (or stopped) between the look that found it running
			// and the take, with no phase left to wait for: look again.
			if now, gerr := m.store.GetSandbox(ctx, projectID, id); gerr == nil && now.State != sb.State {
				relooks++
				continue
			}
		}
		return c, done, err
	}
}

// phaseWait bounds how long a request waits for a sandbox's phase (a
// snapshot, fork, pause or create under way) to end before it answers what
// the phase refuses it with. A variable for tests.
var phaseWait = time.Minute

// Acquire is Agent for work that changes the sandbox (exec, run, upload):
// it also counts the work as in flight, in the same step, so a snapshot,
// fork or pause either sees it and answers conflict, or is already under
// way and this waits for it (up to phaseWait, then answers conflict). Call done when the work ends. While work
// is in flight the sandbox is never idle (idle.go); a long-lived use that
// must not block snapshots (a proxied connection) takes Hold instead.
func (m *Manager) Acquire(ctx context.Context, projectID, id string) (_ *AgentClient, done func(), _ error) {
	return m.use(ctx, projectID, id, m.sbx.acquire)
}

// AcquireTerminal is Acquire for a terminal session, with ending too: call
// it once the session's client has gone and only its teardown is left (the
// agent killing the shell). A snapshot, fork or pause that finds nothing in
// flight but terminal sessions waits a moment for them to end (up to 3 s
// for those ending, 250 ms for those still open, whose close may be on its
// way) instead of answering conflict at once: a client that closes its
// terminal and snapshots right away is not refused.
func (m *Manager) AcquireTerminal(ctx context.Context, projectID, id string) (_ *AgentClient, ending, done func(), _ error) {
	c, done, err := m.use(ctx, projectID, id, func(id string) (*AgentClient, func(), error) {
		c, w, err := m.sbx.acquireWork(id, true)
		if err != nil {
			return nil, nil, err
		}
		ending = w.ending
		return c, w.done, nil
	})
	return c, ending, done, err
}

// Kill stops the sandbox and deletes its record. A stop already under way
// (its TTL, running out of memory, the reaper, another kill) is waited
// for; the kill then removes what that stop left. So are a create, a
// resume, a pause and an idle suspend: the kill then stops what they made
// (a user who never asked for the suspend must not be told to retry).
// So is a snapshot or fork under way, and no other begins while the kill
// waits (clients snapshotting in a loop kept a kill out: 409 for 11 s).
func (m *Manager) Kill(ctx context.Context, projectID, id string) (err error) {
	if projectID != warmProject { // the server's own
		defer m.observe(opKill, time.Now(), &err)
	}
	return m.kill(ctx, projectID, id, pandastack.StopKilled)
}

// kill is Kill, telling the requests it cuts off why (a Stop* reason, or
// reasonKillOnExit).
func (m *Manager) kill(ctx context.Context, projectID, id, why string) error {
	var sb pandastack.Sandbox
	var release func()
	retried := false
	defer func() {
		if release != nil {
			release()
		}
	}()
	for {
		var err error
		if sb, err = m.store.GetSandbox(ctx, projectID, id); err != nil {
			return err
		}
		err = m.sbx.begin(id, phaseStopping)
		if err == nil {
			break
		}
		if !m.sbx.waitToStop(ctx, id, &release) {
			// What refused it ended just now: one more try.
			if retried {
				return err
			}
			retried = true
			continue
		}
		retried = false
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	defer m.sbx.end(id)
	// Until the record goes, it says killed: a run cut off by this kill
	// fails saying so, and a GET meanwhile must not say running.
	if projectID == warmProject || sb.State == pandastack.StateStopped {
		// The server's own, or stopped already (and counted then).
		m.store.SetSandboxState(context.Background(), id, pandastack.StateStopped, pandastack.StopKilled, m.now())
	} else {
		m.recordStop(context.Background(), id, pandastack.StopKilled)
	}
	if m.owns(sb) {
		m.teardown(id, why)
	} // else another node's (lost, or paused there): nothing of it runs here, and that node removes what is left once back
	if err := m.store.DeleteSandbox(context.Background(), id); err != nil && !pandastack.IsCode(err, pandastack.ENotFound) {
		return err
	}
	m.log.Info("sandbox killed", "sandbox", id)
	return nil
}

// teardown closes the channel and removes the sandbox from the runtime.
// The caller holds the sandbox's claim. reason (a Stop* reason, or "") is
// told to the channel first, so that requests it cuts off say why.
func (m *Manager) teardown(id, reason string) {
	if c := m.sbx.detach(id); c != nil {
		if reason != "" {
			c.markStopped(reason)
		}
		c.Close()
	}
	m.prepared.forget(id) // the stop removes it
	if err := m.rt.Stop(context.Background(), id); err != nil {
		m.log.Error("runtime stop", "sandbox", id, "err", err)
	}
	if m.cfg.PausedDir != "" {
		os.RemoveAll(m.pausedPath(id))
		m.forgetPaused(id)
	}
}

// finishKills deletes the records of this node's sandboxes whose kill the
// last run did not finish: a kill records the sandbox stopped as killed,
// tears it down, then deletes its record, and a crash in between left a
// record that answered GET (stopped, killed) until the purge a day later.
// What ran of them is removed with the rest of the runtime's orphans.
func (m *Manager) finishKills(ctx context.Context) error {
	recs, err := m.store.ListSandboxes(ctx, pandastack.SandboxFilter{Node: m.cfg.Node.ID, States: []pandastack.SandboxState{pandastack.StateStopped}})
	if err != nil {
		return err
	}
	for _, s := range recs {
		if s.StopReason != pandastack.StopKilled || s.NodeID != m.cfg.Node.ID {
			continue
		}
		if m.cfg.PausedDir != "" {
			os.RemoveAll(m.pausedPath(s.ID))
		}
		if err := m.store.DeleteSandbox(ctx, s.ID); err != nil && !pandastack.IsCode(err, pandastack.ENotFound) {
			return err
		}
		m.log.Info("finished a kill the last run left half-done", "sandbox", s.ID)
	}
	return nil
}

// stopSandbox tears a sandbox down and records why. The caller holds the
// sandbox's claim.
func (m *Manager) stopSandbox(id, reason string) {
	// Recorded first: teardown fails the requests in flight, and a caller
	// that looks right after must see why.
	if err := m.recordStop(context.Background(), id, reason); err != nil && !pandastack.IsCode(err, pandastack.ENotFound) {
		m.log.Error("record stop", "sandbox", id, "err", err)
	}
	m.teardown(id, reason)
	m.log.Info("sandbox stopped", "sandbox", id, "reason", reason)
}

func (m *Manager) reapLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.ReapInterval)
	defer t.Stop()
	lastPurge := time.Time{}
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		m.reapOnce()
		m.suspendIdle()
		m.sampleCPU()
		m.relievePressure()
		if time.Since(lastPurge) > housekeepEvery {
			lastPurge = time.Now()
			// Beside the loop: a sweep of a large snapshot cache takes up
			// to its minute, and the reaper's CPU readings and memory
			// relief must not wait for it. At most one runs: it is bounded
			// well within the hour.
			m.wg.Add(1) // safe while Close waits: this loop's count is held
			go func() {
				defer m.wg.Done()
				m.housekeep()
			}()
		}
	}
}

// housekeepEvery is how often the reaper purges old records and sweeps
// the snapshot cache.
const housekeepEvery = time.Hour

// housekeep purges the records of sandboxes stopped longer than the
// retention and drops cached copies of deleted snapshots. Its store calls
// end within a minute or at Close (the sweep's look-ups then keep every
// copy); what takes longer is the removal of the copies it drops.
func (m *Manager) housekeep() {
	ctx, cancel := m.untilClose()
	defer cancel()
	ctx, cancelTimeout := context.WithTimeout(ctx, time.Minute)
	defer cancelTimeout()
	if n, err := m.store.PurgeStoppedSandboxes(ctx, m.now().Add(-m.cfg.StoppedRetention)); err == nil && n > 0 {
		m.log.Info("purged old sandbox records", "count", n)
	}
	m.sweepSnapshotCache(ctx)
}

// maxConcurrentStops bounds the expired sandboxes the reaper stops at once.
const maxConcurrentStops = 8

// reapOnce stops expired sandboxes and those whose agent channel died.
func (m *Manager) reapOnce() {
	ctx := context.Background()
	expired, err := m.store.ExpiredSandboxes(ctx, m.now())
	if err != nil {
		m.log.Error("list expired sandboxes", "err", err)
	}
	ids := make([]string, 0, len(expired))
	foreign := map[string]bool{} // a lost node's paused ones: nothing of them runs here
	for _, s := range expired {
		if m.reapsFor(s) { // another node reaps its own
			ids = append(ids, s.ID)
			foreign[s.ID] = !m.owns(s)
		}
	}
	if err == nil {
		// Marked in an earlier round, their TTL extended since.
		m.sbx.unexpire(func(id string) bool { _, ok := foreign[id]; return ok })
	}
	// Concurrently, since each stop may take a while (runsc delete), but
	// bounded, so a burst of expiries cannot start hundreds at once.
	forEachBounded(ids, maxConcurrentStops, func(id string) {
		// The list is a moment old, and a stop may have waited behind
		// others: a TTL extended since (its PATCH answered) stands. The
		// look and the claim are one step, in the sandbox's turn, so a PATCH
		// after them finds the sandbox stopping (SetTTL). Looked at
		// after the claim, a sandbox kept had lost its entry with the
		// claim's end: it ran on with no channel to its agent.
		turnDone, _ := m.expiry.take(ctx, id) // ctx never ends
		now, err := m.store.GetSandbox(ctx, "", id)
		if err != nil || now.State == pandastack.StateStopped || now.ExpiresAt.After(m.now()) {
			turnDone()
			return
		}
		err = m.sbx.begin(id, phaseStopping)
		if err != nil {
			// Being created, checkpointed or killed right now: the next
			// round, and nothing new begins on it meanwhile.
			m.sbx.expire(id)
		}
		turnDone()
		if err != nil {
			return
		}
		defer m.sbx.end(id)
		if foreign[id] {
			if err := m.recordStop(ctx, id, pandastack.StopExpired); err != nil && !pandastack.IsCode(err, pandastack.ENotFound) {
				m.log.Error("record stop", "sandbox", id, "err", err)
			}
			m.log.Info("sandbox of a lost node expired; its node removes its image once back", "sandbox", id)
			return
		}
		m.stopSandbox(id, pandastack.StopExpired)
	})
	var dead []string
	for id, c := range m.sbx.running() {
		if !c.Alive() || !m.rt.Alive(id) {
			dead = append(dead, id)
		}
	}
	for _, id := range dead {
		m.Reconcile(id)
	}
}

// Reconcile checks at once whether a sandbox whose channel failed is dead,
// and if so records it stopped with the reason (as the reaper would within
// a second), so the caller's next GET already shows it.
func (m *Manager) Reconcile(id string) {
	c := m.sbx.client(id)
	if c == nil || (c.Alive() && m.rt.Alive(id)) {
		return
	}
	if m.sbx.begin(id, phaseStopping) != nil {
		return
	}
	defer m.sbx.end(id)
	reason := pandastack.StopDied
	switch m.rt.DeathReason(id) {
	case pandastack.ReasonOutOfMemory:
		reason = pandastack.StopOOM
	case pandastack.ReasonPIDsLimit:
		reason = pandastack.StopPIDsLimit
	}
	m.stopSandbox(id, reason)
}

// Stats returns the host-side resource use of a running sandbox.
func (m *Manager) Stats(ctx context.Context, projectID, id string) (pandastack.RuntimeStats, error) {
	// A paused sandbox holds no memory and uses no CPU; a look at its
	// figures must not wake it (a console polling them would keep every
	// idle sandbox from sleeping).
	if sb, err := m.store.GetSandbox(ctx, projectID, id); err != nil {
		return pandastack.RuntimeStats{}, err
	} else if sb.State == pandastack.StatePaused {
		return pandastack.RuntimeStats{}, nil
	}
	if _, err := m.usable(ctx, projectID, id); err != nil {
		return pandastack.RuntimeStats{}, err
	}
	return m.rt.Stats(ctx, id)
}

// diskWait bounds Disk's question to the agent.
const diskWait = 2 * time.Second

// Disk returns the size and use of a running sandbox's disk, as its agent
// measures them; ok is false when it cannot say (paused, starting, an agent
// of an older build, or one that does not answer within diskWait). Like
// Stats, a look neither wakes the sandbox nor counts as its use, so a
// console polling it lets an idle sandbox sleep.
func (m *Manager) Disk(ctx context.Context, projectID, id string) (_ agentproto.Disk, ok bool) {
	if _, err := m.store.GetSandbox(ctx, projectID, id); err != nil {
		return agentproto.Disk{}, false
	}
	c := m.sbx.client(id)
	if c == nil {
		return agentproto.Disk{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, diskWait)
	defer cancel()
	d, err := c.Disk(ctx)
	if err != nil {
		m.log.Debug("measuring a sandbox's disk", "sandbox", id, "err", err)
		return agentproto.Disk{}, false
	}
	return d, true
}
