package sandbox

import (
	"context"
	"path/filepath"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
)

// Creates prepared ahead. A create that no pool sandbox serves restores
// the template's warm image, and the first part of that restore (the
// sandbox's network, runsc's gofer and sentry) needs nothing of the image's
// content. So for each warm template a runtime that can
// (pandastack.RuntimePreparer) keeps Config.PreparedCreates containers
// created ahead (runsc create), each with its own id and the default
// network policy, waiting; a plain create of the template takes one (its
// id becomes the sandbox's, as with a pool sandbox) and restores into it,
// and so does a fork's child or a restore of a snapshot of the template
// with its resources (takeStandby), and the resume of a suspended sandbox
// of the template whose own resume was not prepared, renamed to its id
// (standbyForResume).
// One holds two waiting host processes (about 11 MiB PSS) and a network
// namespace, not a sandbox's memory. The next one is prepared once the
// create that took one is done, and in the admission line's background
// (admit.go) like a pool refill, so that it competes with no create.
//
// One by default (Config.PreparedCreates). Side by side with the same
// build, each create starting on a quiet host (go run ./bench -quiet -only
// create), no-pool creates with it answered their first run_code in 363
// and 414 ms p50 against 522 and 521 ms without, one run each way round;
// the restore step took 208-234 ms against 341-343
// (bench/results/2026-12-01-vm-create-quiet-*.json). Without the quiet
// gate the side with prepared creates won or lost by a wide margin
// depending on which side it was: the prepares ran in the background of
// the other side's creates too.

// standby is a warm template's prepared containers.
type standby struct {
	tpl  Template
	kick chan struct{} // a container was taken: prepare another
	stop chan struct{} // closed when it is retired (retireWarm)
	mu   sync.Mutex
	ids  []string
	// preparing: a container is being prepared; ended is closed (and
	// replaced) when that prepare ends, with a container or without.
	preparing bool
	ended     chan struct{}
}

func newStandby(tpl Template) *standby {
	return &standby{tpl: tpl, kick: make(chan struct{}, 1), stop: make(chan struct{}), ended: make(chan struct{})}
}

// take hands out a prepared container's id. When none is ready but one is
// being prepared, it waits for that one until ctx ends: that container is
// further along than a restore starting afresh would be, and such a
// restore would compete with its prepare for the CPU (in a bench run, the
// creates that came while a prepare ran restored in 420-760 ms, most of
// those into a prepared container in 340-520).
func (s *standby) take(ctx context.Context) (string, bool) {
	s.mu.Lock()
	for {
		if n := len(s.ids); n > 0 {
			id := s.ids[n-1]
			s.ids = s.ids[:n-1]
			s.mu.Unlock()
			return id, true
		}
		if !s.preparing {
			s.mu.Unlock()
			return "", false
		}
		ended := s.ended
		s.mu.Unlock()
		select {
		case <-ended:
		case <-ctx.Done():
			return "", false
		}
		s.mu.Lock()
	}
}

// begin marks a prepare under way.
func (s *standby) begin() {
	s.mu.Lock()
	s.preparing = true
	s.mu.Unlock()
}

// end marks the prepare done: id is its container, "" if it failed.
func (s *standby) end(id string) {
	s.mu.Lock()
	if id != "" {
		s.ids = append(s.ids, id)
	}
	s.preparing = false
	close(s.ended)
	s.ended = make(chan struct{})
	s.mu.Unlock()
}

func (s *standby) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// standbySpec is the spec of a plain create of tpl as id: what launch
// restores with, so what a container prepared for it must match.
func (m *Manager) standbySpec(tpl Template, id string) pandastack.RuntimeSpec {
	return pandastack.RuntimeSpec{ID: id, RootFS: tpl.RootFS, Env: []string{"PANDASTACK_SANDBOX_ID=" + id},
		CPU: tpl.CPU, MemoryMB: tpl.MemoryMB, DiskMB: tpl.DiskMB, PIDs: m.cfg.PIDsLimit, Lazy: true}
}

// enableStandby keeps Config.PreparedCreates containers of tpl (which must
// have a WarmImage) prepared until Close.
func (m *Manager) enableStandby(tpl Template) {
	rp, ok := m.rt.(pandastack.RuntimePreparer)
	if !ok || m.cfg.PreparedCreates <= 0 || tpl.WarmImage == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped() {
		return
	}
	if m.standbys == nil {
		m.standbys = map[string]*standby{}
	}
	if _, ok := m.standbys[tpl.Name]; ok || !m.isWarmNowLocked(tpl) {
		return
	}
	s := newStandby(tpl)
	m.standbys[tpl.Name] = s
	m.wg.Add(1)
	go m.keepStandby(s, rp)
}

// keepStandby prepares containers while s has fewer than it keeps, and
// after each kick; on Close, or once s is retired, it removes those left.
func (m *Manager) keepStandby(s *standby, rp pandastack.RuntimePreparer) {
	defer m.wg.Done()
	ctx, cancel := m.untilClose()
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	image := filepath.Join(s.tpl.WarmImage, "image")
	for {
		for s.count() < m.cfg.PreparedCreates && ctx.Err() == nil {
			// As a pool refill: after the creates under way and their
			// first work, in the line's background.
			if m.yieldToCreates(ctx) != nil {
				continue // shutting down
			}
			release, err := m.admit.acquire(ctx, true)
			if err != nil {
				continue // shutting down
			}
			id := pandastack.NewID("sbx")
			s.begin()
			pctx, done := context.WithTimeout(ctx, m.cfg.StartTimeout)
			err = rp.Prepare(pctx, m.standbySpec(s.tpl, id), image)
			done()
			release()
			if err != nil {
				s.end("")
				if ctx.Err() == nil {
					m.log.Warn("preparing a container for creates; retrying in 5 s", "template", s.tpl.Name, "err", err)
				}
				select {
				case <-ctx.Done():
				case <-time.After(5 * time.Second):
				}
				continue
			}
			s.end(id)
			m.log.Debug("container prepared for creates", "template", s.tpl.Name, "sandbox", id)
		}
		select {
		case <-ctx.Done():
			for {
				id, ok := s.take(ctx) // nothing is being prepared now: no wait
				if !ok {
					return
				}
				m.rt.Stop(context.Background(), id)
			}
		case <-s.kick:
		}
	}
}

// takeStandby hands a restore of a warm template's sandbox a container
// prepared for it: its id, and a func to call once the restore is done
// (it has the next one prepared). One being prepared is waited for (see
// standby.take) until ctx ends. ok false: none fits or none is ready or
// under way, and id is the one given.
//
// A plain create restores the warm image; a fork's child, or a sandbox
// made from a snapshot, restores another image of the same root
// filesystem into the same kind of container (runsc create needs nothing
// of the image's content), so each of those may take one too when its
// resources are the template's. Such an image keeps the disk it was
// taken with: when that is not the container's, the runtime removes the
// container and restores afresh.
func (m *Manager) takeStandby(ctx context.Context, p plan, id string) (_ string, done func(), ok bool) {
	if p.image == "" || len(p.env) > 0 {
		return id, nil, false
	}
	m.mu.Lock()
	s := m.standbys[p.template]
	m.mu.Unlock()
	if s == nil || p.rootfs != s.tpl.RootFS || p.cpu != s.tpl.CPU || p.mem != s.tpl.MemoryMB {
		return id, nil, false
	}
	if p.image == filepath.Join(s.tpl.WarmImage, "image") && p.disk != s.tpl.DiskMB {
		return id, nil, false
	}
	prepared, ok := s.take(ctx)
	if !ok {
		return id, nil, false
	}
	return prepared, func() {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}, true
}

// standbyForResume has the resume of a suspended sandbox whose own resume
// was not prepared (prepare.go: only the last few suspends' are) restore
// into a container prepared for creates of its template instead, renamed
// to the sandbox's id (RuntimePreparer.Rename): a restore into it is the
// same, only the sandbox's image differs. It returns that container's id
// and a func to call once the resume is done (it has the next one
// prepared), or nil when none fits or the rename failed. The caller makes
// sure the sandbox's agent names it (agentproto.FeatureHostname): gVisor
// names a restored sandbox after the container's id.
func (m *Manager) standbyForResume(ctx context.Context, sb pandastack.Sandbox, man manifest) (string, func()) {
	rp, ok := m.rt.(pandastack.RuntimePreparer)
	if !ok {
		return "", nil
	}
	m.mu.Lock()
	s := m.standbys[sb.Template]
	m.mu.Unlock()
	if s == nil || man.RootFS != s.tpl.RootFS || sb.CPU != s.tpl.CPU || sb.MemoryMB != s.tpl.MemoryMB {
		return "", nil
	}
	cid, ok := s.take(ctx)
	if !ok {
		return "", nil
	}
	next := func() {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
	if err := rp.Rename(ctx, cid, sb.ID); err != nil {
		m.log.Warn("resuming into a container prepared for creates; resuming without", "sandbox", sb.ID, "container", cid, "err", err)
		m.rt.Stop(context.Background(), cid) // what a refused rename left as it was
		next()
		return "", nil
	}
	return cid, next
}
