package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// warmProject owns the short-lived sandboxes that warm templates.
const warmProject = "_warmup"

// WarmSpares is how many warmed-up spare Python kernels a warm image holds
// for the contexts to come (each costs a kernel's memory: a sandbox holds
// ~50 MiB more PSS once its first context took one and a replacement is warm).
const WarmSpares = 1

// DefaultContextID is the id of a sandbox's default context of a language.
func DefaultContextID(language string) string { return "ctx_default_" + language }

// Warm boots tpl cold, has its agent start WarmSpares spare Python kernels
// with warmup run in each (silently), and checkpoints the whole sandbox into
// the image directory dir, which must not exist. Sandboxes created from the
// template afterwards restore that image: their first code context, the
// default one or any other, is a kernel with warmup's imports done. If dir
// appears meanwhile (another server warmed it), Warm succeeds.
func (m *Manager) Warm(ctx context.Context, tpl Template, warmup, dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	sb, err := m.launch(ctx, warmProject, plan{template: tpl.Name, rootfs: tpl.RootFS, cpu: tpl.CPU, mem: tpl.MemoryMB, disk: tpl.DiskMB, ttl: 15 * time.Minute})
	if err != nil {
		return fmt.Errorf("warm %s: %w", tpl.Name, err)
	}
	defer func() {
		if err := m.Kill(context.Background(), warmProject, sb.ID); err != nil {
			// Shutting down: the registry takes no claim any more, and
			// nobody else needs a warm-up sandbox; stop it here rather
			// than leave it running (with --kill-on-exit nothing may stay).
			m.teardown(sb.ID, "")
			m.store.DeleteSandbox(context.Background(), sb.ID)
		}
	}()
	agent := m.sbx.client(sb.ID)
	if agent == nil {
		return fmt.Errorf("warm %s: the sandbox stopped during warm-up", tpl.Name)
	}
	// No context yet: the image holds WarmSpares spare kernels with the
	// warm-up done, and the first context created in a sandbox restored
	// from it, the default one (run_code without a context) or any other,
	// takes one. An idle sandbox holds one kernel, not one per use to come.
	spares, err := agent.PrepareSpares(ctx, agentproto.SparesRequest{Language: "python", Count: WarmSpares, Warmup: warmup})
	if err != nil {
		return fmt.Errorf("warm %s: start the warmed-up python kernels: %w", tpl.Name, err)
	}
	if spares.Ready != WarmSpares {
		return fmt.Errorf("warm %s: %d of %d python kernels ready", tpl.Name, spares.Ready, WarmSpares)
	}
	// Left running for the Kill above: one stopped by its checkpoint was
	// taken for dead by the reaper first, and counted as a sandbox that
	// died.
	if _, err := m.checkpoint(ctx, sb, dir, true); err != nil {
		if _, statErr := os.Stat(dir); statErr == nil {
			return nil
		}
		return fmt.Errorf("warm %s: %w", tpl.Name, err)
	}
	m.log.Info("template warmed", "template", tpl.Name, "image", dir)
	return nil
}

// verifyWarm checks a warm image like verifyImage, once per process and
// version of its manifest: Warm writes a warm image once and nothing
// changes it, and checksumming its ~100 MB on every create cost 20-50 ms of
// CPU per create here. Creates that come together wait for one check
// rather than each checksumming the image (the first burst after a start
// did that 20 times over). A rewritten manifest (a new image in the same
// place) is checked again, and so is an image that failed.
func (m *Manager) verifyWarm(dir, what string) error {
	fi, err := os.Stat(filepath.Join(dir, "manifest.json"))
	if err != nil {
		_, err = verifyImage(dir, what) // the error that says why
		return err
	}
	key := fmt.Sprintf("%s|%d|%d", dir, fi.ModTime().UnixNano(), fi.Size())
	v, _ := m.warmVerified.LoadOrStore(key, &warmCheck{})
	wc := v.(*warmCheck)
	wc.once.Do(func() { _, wc.err = checkWarm(dir, what) })
	if wc.err != nil {
		m.warmVerified.CompareAndDelete(key, wc)
	}
	return wc.err
}

// checkWarm is verifyImage; a test counts its calls.
var checkWarm = verifyImage

// warmCheck is one check of a warm image, shared by the creates that ask
// for it at once.
type warmCheck struct {
	once sync.Once
	err  error
}

// WarmImageDir is WarmImageDirOfBuild for a build with no identity of its
// own (a directory no build of today's is warmed into).
func WarmImageDir(root, template, specHash, agentHash string) string {
	return WarmImageDirOfBuild(root, template, specHash, "", agentHash)
}

// WarmImageDirOfBuild is where the warm image of a template build lives
// under root: keyed by the spec's hash, the build's identity
// (template.Built.ID) and the agent's build, since a restore needs the
// three as they were at checkpoint time (a forced rebuild has the hash of
// the build before it, not its files), and by warmRevision. A warm image
// of an older key is never restored; gc and removeStaleWarm remove it.
func WarmImageDirOfBuild(root, template, specHash, buildID, agentHash string) string {
	build := ""
	if buildID != "" {
		build = "-" + short(buildID)
	}
	return filepath.Join(root, template+"-"+short(specHash)+build+"-"+short(agentHash)+warmRevision)
}

// warmRevision names what the manager itself puts into a warm image
// besides the template and the agent; it changes when that does, so that
// servers warm the template again. "-s2": the CA marker (caMarker).
// "-s3": the agent's RLIMIT_NPROC, which it sets on itself at boot from
// the pids limit (Config.PIDsLimit), now 384 of 1536: an image warmed
// before kept 256 (or 384 of 1024) in every sandbox restored from it.
// "-s4": the runtime's spec revision 3, /dev/shm sized to half the
// sandbox's memory: a sandbox restored from an image warmed before kept
// the unsized mount the image was taken with.
const warmRevision = "-s4"

func short(h string) string { return h[:min(len(h), 16)] }

// WarmSpec is a template to keep warm: its Template.WarmImage (see
// WarmImageDir) is made by booting it and running Warmup.
type WarmSpec struct {
	Template Template
	Warmup   string
	// Built is when the template's build was made: of two warm images of
	// one template (a build replaced while the server runs), the newer
	// build's is the one kept (retireWarm), whichever is warmed last.
	Built time.Time
}

// StartWarming removes stale warm images from cfg.WarmDir, then, in the
// background, warms each spec that has no image yet and keeps a pool of
// cfg.PoolSize sandboxes of it. Until a template is warm its creates boot
// cold. The work belongs to the manager: Close stops it and waits for it.
func (m *Manager) StartWarming(specs []WarmSpec) {
	m.goBackground(func() {
		ctx, cancel := m.untilClose()
		defer cancel()
		keep := map[string]bool{}
		for _, s := range specs {
			keep[filepath.Base(s.Template.WarmImage)] = true
		}
		m.removeStaleWarm(keep)
		m.keepWarmFreshUntilClose(specs)
		for _, s := range specs {
			if ctx.Err() != nil {
				return
			}
			m.warmOne(ctx, s)
		}
	})
}

// WarmLater warms one template that was built after StartWarming (serve
// started before its build), and keeps its pool, as StartWarming does for
// the templates built at the start. Until it is warm its creates boot cold.
func (m *Manager) WarmLater(s WarmSpec) {
	m.goBackground(func() {
		ctx, cancel := m.untilClose()
		defer cancel()
		m.keepWarmFreshUntilClose([]WarmSpec{s})
		m.warmOne(ctx, s)
	})
}

// keepWarmFreshUntilClose runs keepWarmFresh for specs until the manager
// closes, on a context of its own: on the warming's, the marks stopped as
// soon as the warming was done, and a day later another server sharing the
// cache, or template gc, could remove a warm image in use. Call it from
// the manager's background work (goBackground).
func (m *Manager) keepWarmFreshUntilClose(specs []WarmSpec) {
	m.wg.Add(1) // safe while Close waits: the caller's count is still held
	go func() {
		defer m.wg.Done()
		ctx, cancel := m.untilClose()
		defer cancel()
		m.keepWarmFresh(ctx, specs)
	}()
}

// warmOne makes s's warm image unless it exists, holds it in memory, and
// keeps a pool and a standby of the template.
func (m *Manager) warmOne(ctx context.Context, s WarmSpec) {
	dir := s.Template.WarmImage
	if !m.retireWarm(s) {
		m.log.Info("not warming a build older than the one the template has now", "template", s.Template.Name, "image", filepath.Base(dir))
		return
	}
	if over := m.defaultOver(s.Template); over != "" {
		// Its warm image, pool and prepared container would serve only
		// plain creates, which Create refuses: they would hold memory
		// and runsc processes for nothing.
		why := fmt.Sprintf("template %s asks for %s: every create that leaves that out is refused, so it is not warmed and has no pool; lower the template's default, or raise the flag", s.Template.Name, over)
		m.log.Warn(why, "template", s.Template.Name)
		m.warmFailed.Store(dir, why)
		return
	}
	if _, err := os.Stat(dir); err != nil {
		os.MkdirAll(filepath.Dir(dir), 0o700)
		start := time.Now()
		m.log.Info("warming template (creates boot cold until this is done)", "template", s.Template.Name)
		if err := m.Warm(ctx, s.Template, s.Warmup, dir); err != nil {
			m.log.Error("warming template failed; its sandboxes boot cold", "template", s.Template.Name, "err", err)
			if ctx.Err() == nil {
				m.warmFailed.Store(dir, pandastack.ErrorMessage(err))
			}
			return
		}
		m.warmFailed.Delete(dir)
		m.log.Info("template warm", "template", s.Template.Name, "seconds", time.Since(start).Seconds())
	}
	// Held in the page cache while the server runs (pin.go); made by an
	// earlier start, it is read from disk here, not by the first create.
	if err := m.warmHeld.hold(filepath.Join(dir, "image")); err != nil {
		m.log.Warn("holding a warm image in memory; creates may read it from disk", "template", s.Template.Name, "err", err)
	}
	if !m.isWarmNow(s.Template) {
		// A newer build came while this one was warmed: its warming
		// retired what this one had, and its pool is the template's.
		m.warmHeld.release(filepath.Join(dir, "image"))
		return
	}
	m.EnablePool(s.Template, m.cfg.PoolSize)
	m.enableStandby(s.Template)
}

// isWarmNow reports whether tpl's warm image is the one its template has
// now (retireWarm), or the template has none recorded (a caller that does
// not warm through warmOne).
func (m *Manager) isWarmNow(tpl Template) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.isWarmNowLocked(tpl)
}

func (m *Manager) isWarmNowLocked(tpl Template) bool {
	cur, ok := m.warmNow[tpl.Name]
	return !ok || cur.dir == tpl.WarmImage
}

// defaultOver names the first of tpl's defaults (cpu, memory_mb, disk_mb)
// over this server's limit, with the flag that sets it; "" when none is.
func (m *Manager) defaultOver(tpl Template) string {
	defaults := [3]int{tpl.CPU, tpl.MemoryMB, tpl.DiskMB}
	for i, l := range m.limits() {
		if defaults[i] > l.hi {
			return l.over(defaults[i])
		}
	}
	return ""
}

// WarmError says why the warming of the warm image dir failed, if it did
// in this process ("" otherwise): its template's sandboxes boot cold.
func (m *Manager) WarmError(dir string) string {
	if why, ok := m.warmFailed.Load(dir); ok {
		return why.(string)
	}
	return ""
}

// goBackground runs f in the background as the manager's own work, which
// Close waits for; once the manager is closed it runs nothing and returns
// false.
func (m *Manager) goBackground(f func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped() {
		return false
	}
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		f()
	}()
	return true
}

// keepWarmFresh marks the warm images of specs as in use, now and then
// every warmTouchEvery until ctx ends: removeStaleWarm and template gc, of
// this server or another one sharing the cache, remove only warm images
// nobody marked for a day. An image being made is marked on the next round.
func (m *Manager) keepWarmFresh(ctx context.Context, specs []WarmSpec) {
	t := time.NewTicker(warmTouchEvery)
	defer t.Stop()
	for {
		now := time.Now()
		for _, s := range specs {
			if !m.isWarmNow(s.Template) {
				continue // of a build replaced since (retireWarm): gc may take it
			}
			os.Chtimes(s.Template.WarmImage, now, now) // none yet: nothing to mark
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// warmCurrent is the warm image a template restores now, and when its
// build was made.
type warmCurrent struct {
	dir   string
	built time.Time
}

// retireWarm makes s's image the warm image of its template from now on,
// unless the template has one of a newer build already (false: s is not to
// be warmed). A template rebuilt while the server runs (template build
// --force: the same spec, a new build at the same path) has a new warm
// image, keyed by the build's id; the pool and the prepared containers of
// the build before restore the old one, onto the new build's files (its
// libraries in memory, the new ones on disk), and no create would take
// from them. So they are retired, their sandboxes and containers stopped,
// and the old image let go: no longer held in memory, nor marked in use
// (keepWarmFresh), so gc removes it. Newer goes by the builds' times, not
// by the order of the warmings: the server's start may reach a template
// after a rebuild's warming began.
func (m *Manager) retireWarm(s WarmSpec) bool {
	name, dir := s.Template.Name, s.Template.WarmImage
	m.mu.Lock()
	prev, had := m.warmNow[name]
	if had && prev.dir != dir && s.Built.Before(prev.built) {
		m.mu.Unlock()
		return false
	}
	if m.warmNow == nil {
		m.warmNow = map[string]warmCurrent{}
	}
	m.warmNow[name] = warmCurrent{dir: dir, built: s.Built}
	if !had || prev.dir == dir {
		m.mu.Unlock()
		return true
	}
	if p := m.pools[name]; p != nil && p.tpl.WarmImage != dir {
		delete(m.pools, name)
		close(p.stop) // its fill stops what it holds (drain)
	}
	if sb := m.standbys[name]; sb != nil && sb.tpl.WarmImage != dir {
		delete(m.standbys, name)
		close(sb.stop) // keepStandby removes its containers
	}
	m.mu.Unlock()
	m.warmHeld.release(filepath.Join(prev.dir, "image"))
	m.log.Info("template rebuilt: the pool and prepared containers of the build before are stopped, and its warm image let go", "template", name, "was", filepath.Base(prev.dir), "now", filepath.Base(dir))
	return true
}

// warmTouchEvery is how often a server marks its warm images in use.
var warmTouchEvery = time.Hour // a variable for tests

// removeStaleWarm deletes warm images of other template or agent builds
// that nobody touched for a day: every rebuild of either leaves one behind,
// and another server sharing the cache may still restore a recent one.
func (m *Manager) removeStaleWarm(keep map[string]bool) {
	if m.cfg.WarmDir == "" {
		return
	}
	ents, _ := os.ReadDir(m.cfg.WarmDir)
	for _, e := range ents {
		info, err := e.Info()
		if err != nil || keep[e.Name()] || time.Since(info.ModTime()) < 24*time.Hour {
			continue
		}
		if err := os.RemoveAll(filepath.Join(m.cfg.WarmDir, e.Name())); err == nil {
			m.log.Info("removed a stale warm template snapshot", "dir", e.Name())
		}
	}
}

// untilClose returns a context that Close cancels, for the manager's own
// background work; call cancel when the work ends.
func (m *Manager) untilClose() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		select {
		case <-m.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// stopped reports whether Close began. m.mu is held by callers that must
// not race Close's wg.Wait with a wg.Add.
func (m *Manager) stopped() bool {
	select {
	case <-m.stop:
		return true
	default:
		return false
	}
}
