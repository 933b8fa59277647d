package sandbox

import (
	"context"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
)

// Resumes prepared ahead. The request that wakes an idle-suspended sandbox
// waits for its whole restore, and the first part of a restore needs
// nothing of the image's content: the sandbox's network and runsc's gofer
// and sentry processes. So a runtime that can (pandastack.RuntimePreparer)
// does that part at the end of an idle suspend, for the
// Config.PreparedResumes sandboxes suspended last: each of those keeps two
// waiting host processes (no memory of its own processes) until it
// resumes, is killed or expires, or newer suspends take its place.
//
// Four by default (DefaultConfig): side by side with the same build, each
// resume starting on a quiet host (go run ./bench -quiet -only idle), a
// prepared resume answered its first result in 359 and 350 ms p50 against
// 489 and 567 ms, one run each way round
// (bench/results/2026-12-01-vm-idle-quiet-*.json).

// preparedResumes are the suspended sandboxes whose resume is prepared,
// oldest first, with their images held in the page cache (pin.go).
type preparedResumes struct {
	mu   sync.Mutex
	ids  []string
	pins map[string]*pinnedImage
}

// add records id's prepared resume and takes pin (nil: none) to release
// when the resume goes.
func (p *preparedResumes) add(id string, pin *pinnedImage) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ids = append(slices.DeleteFunc(p.ids, func(s string) bool { return s == id }), id)
	if p.pins == nil {
		p.pins = map[string]*pinnedImage{}
	}
	p.pins[id].release()
	p.pins[id] = pin
}

// unpin releases id's image; the caller holds p.mu.
func (p *preparedResumes) unpin(id string) {
	p.pins[id].release()
	delete(p.pins, id)
}

// forget drops id; true if it was there.
func (p *preparedResumes) forget(id string) bool {
	ok, pin := p.take(id)
	pin.release()
	return ok
}

// take drops id like forget, but hands its held image (or nil) to the
// caller to release: a resume does that once the restore is done, not on
// its way (unmapping a code-interpreter image takes 15-20 ms here).
func (p *preparedResumes) take(id string) (bool, *pinnedImage) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.ids)
	p.ids = slices.DeleteFunc(p.ids, func(s string) bool { return s == id })
	pin := p.pins[id]
	delete(p.pins, id)
	return len(p.ids) < n, pin
}

// releaseLater releases pin a while after a resume that used its image,
// once the resumed sandbox's first requests are likely served.
func releaseLater(pin *pinnedImage) {
	if pin != nil {
		time.AfterFunc(pinReleaseDelay, pin.release)
	}
}

// pinReleaseDelay is how long a resume keeps its image held after it.
const pinReleaseDelay = 5 * time.Second

// over returns the oldest ids beyond the newest keep; they stay listed
// until taken.
func (p *preparedResumes) over(keep int) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.ids[:max(len(p.ids)-keep, 0)])
}

// list returns the sandboxes whose resume is prepared, oldest first.
func (p *preparedResumes) list() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.ids)
}

// pinnedBytes is how much of the prepared resumes' images is held.
func (p *preparedResumes) pinnedBytes() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return heldBytes(p.pins)
}

// releaseAll lets every held image go (the manager's Close) and returns
// the ids prepared; the prepared containers are left to the runtime's
// clean-up on exit, or to the next start.
func (p *preparedResumes) releaseAll() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for id := range p.pins {
		p.unpin(id)
	}
	return slices.Clone(p.ids)
}

// resumeSpec is the runtime spec that resumes sb from its paused image.
//
// Lazy (runsc restore --background): the sandbox runs once its kernel's
// state is loaded, and its memory pages follow in the background, those
// it touches first. A resume minutes after its suspend finds its image
// out of the host's page cache, and an eager restore read all of it (110
// MiB for code-interpreter) before the agent could answer. Side by side,
// unprepared, the image dropped: first result 207 and 217 ms p50 lazy
// against 229 and 223 eager, 251 and 243 p95 against 355 and 316; a random
// one of 500 suspended, by hand, 234 ms median against 268
// (docs/code-and-snapshots.md, "Lazy resumes"). The
// runtime opens the image's files before the restore returns, so the
// resume may take its directory away (discardPaused) while pages load,
// and a pause that comes meanwhile waits for the load (gVisor's save
// awaits it).
func (m *Manager) resumeSpec(sb pandastack.Sandbox, man manifest) pandastack.RuntimeSpec {
	spec := pandastack.RuntimeSpec{ID: sb.ID, RootFS: man.RootFS, CPU: sb.CPU, MemoryMB: sb.MemoryMB, PIDs: m.cfg.PIDsLimit, Lazy: true}
	if m.networkOf(sb.ID) == nil {
		spec.Network = man.Network // the policy at pause time, if the network lost it
	}
	return spec
}

// prepareResume prepares the resume of sb, which this process just
// suspended and whose claim (suspending) the caller still holds, making
// room among the prepared ones first. Failure only costs the head start.
func (m *Manager) prepareResume(sb pandastack.Sandbox) {
	rp, ok := m.rt.(pandastack.RuntimePreparer)
	if !ok || m.cfg.PreparedResumes <= 0 {
		return
	}
	dir := m.pausedPath(sb.ID)
	man, own := m.pausedByUs(sb.ID, dir)
	if !own {
		return
	}
	m.dropPrepared(m.cfg.PreparedResumes - 1)
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.StartTimeout)
	defer cancel()
	// Its image stays in the page cache until the resume (pin.go), held
	// first: it is cached now, just written.
	pin, err := pinImage(filepath.Join(dir, "image"))
	if err != nil {
		m.log.Warn("holding a suspended sandbox's image in memory; its resume may read it from disk", "sandbox", sb.ID, "err", err)
	}
	if err := rp.Prepare(ctx, m.resumeSpec(sb, man), filepath.Join(dir, "image")); err != nil {
		pin.release()
		m.log.Warn("preparing the resume of a suspended sandbox", "sandbox", sb.ID, "err", err)
		return
	}
	m.prepared.add(sb.ID, pin)
	m.log.Debug("resume prepared", "sandbox", sb.ID)
}

// dropPrepared removes the prepared resumes beyond the newest keep. One
// whose sandbox is claimed right now (resuming, its image read by a fork
// or a snapshot, being killed) stays listed, for that or a later drop:
// taken off the list first, it was left standing and never counted again.
// The drop holds the sandbox as a read of its image does (it stays
// paused, held a moment), which a resume, a pause, a snapshot or fork and
// a kill wait for; as stopping, they were told it would not run again, or
// resumed it to read it.
func (m *Manager) dropPrepared(keep int) {
	for _, id := range m.prepared.over(keep) {
		if m.sbx.begin(id, phaseReadingImage) != nil {
			continue
		}
		m.dropOnePrepared(id)
		m.sbx.end(id)
	}
}

// dropPreparedResumes removes every prepared resume whose sandbox nobody
// is resuming, reading or killing right now (those keep theirs, image
// held and all) and returns how many it removed: the relief of memory
// pressure (pressure.go) wants their memory.
func (m *Manager) dropPreparedResumes() int {
	n := 0
	for _, id := range m.prepared.list() {
		if m.sbx.begin(id, phaseReadingImage) != nil { // as dropPrepared
			continue
		}
		if m.dropOnePrepared(id) {
			n++
		}
		m.sbx.end(id)
	}
	return n
}

// dropOnePrepared removes id's prepared resume, the caller holding the
// sandbox's claim, and says whether it stopped a container. A record the
// store cannot read leaves it listed, for a later drop; a sandbox no
// longer paused (its record gone: its kill stops what it had) is only
// taken off the list.
func (m *Manager) dropOnePrepared(id string) bool {
	sb, err := m.store.GetSandbox(context.Background(), "", id)
	if err != nil && !pandastack.IsCode(err, pandastack.ENotFound) {
		m.log.Warn("dropping a prepared resume: its record could not be read; it stays for now", "sandbox", id, "err", err)
		return false
	}
	ok, pin := m.prepared.take(id)
	pin.release()
	if !ok || err != nil || sb.State != pandastack.StatePaused {
		return false
	}
	m.stopPrepared(id)
	return true
}

// stopPrepared removes the prepared resume of paused sandbox id, taken out
// of m.prepared; the caller holds its claim.
func (m *Manager) stopPrepared(id string) {
	if m.net != nil {
		m.net.Hold(id) // the stop takes only the network down
	}
	if err := m.rt.Stop(context.Background(), id); err != nil {
		m.log.Warn("removing a prepared resume", "sandbox", id, "err", err)
	}
}
