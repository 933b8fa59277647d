package sandbox

import (
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/imagestore"
)

// Paused images this process wrote. A resume of one of them needs neither
// of the two costly checks a foreign image gets:
//
//   - its checksums: the pause computed them while sealing it moments (or
//     hours) ago, as verifyWarm trusts a warm image it checked once; and
//   - the sandbox's setup (the CA bundle and its variables, an exec in the
//     sandbox): the image holds the filesystem and the agent's environment
//     that this process's setup left, with this process's bundle.
//
// Nor does the first run in the default context after such a resume ask
// the agent whether that context exists: the pause recorded the contexts
// its session knew (AgentClient.HasContext), and the image holds them.
//
// An image from before a server restart is checked in full, and set up
// again (the bundle may have changed with the restart). The record is
// dropped when the image goes (resume, kill, expiry).

// ownPaused is what a pause of this process recorded of its image.
type ownPaused struct {
	man      manifest
	modTime  time.Time // of manifest.json, so a rewritten image is not trusted
	contexts []string  // the code contexts the paused session knew
	// names: its agent sets the sandbox's hostname in its hello
	// (agentproto.FeatureHostname), so it may resume into a container
	// made under another id (standbyForResume).
	names bool
}

// rememberPaused records the image a pause of this process just sealed.
func (m *Manager) rememberPaused(id, dir string) {
	man, err := imagestore.ReadManifest(dir, "paused sandbox "+id)
	if err != nil {
		return // the resume verifies it in full
	}
	fi, err := os.Stat(filepath.Join(dir, imagestore.ManifestName))
	if err != nil {
		return
	}
	m.ownPaused.Store(id, ownPaused{man: man, modTime: fi.ModTime()})
}

// pausedContexts records the code contexts the session of a sandbox this
// process just paused knew (c, its agent channel, about to be closed), and
// whether its agent names the sandbox itself.
func (m *Manager) pausedContexts(id string, c *AgentClient) {
	if v, ok := m.ownPaused.Load(id); ok && c != nil {
		own := v.(ownPaused)
		own.contexts = c.KnownContexts()
		own.names = c.Hello().HasFeature(agentproto.FeatureHostname)
		m.ownPaused.Store(id, own)
	}
}

// namesItself reports whether the agent of the sandbox this process
// paused as id sets its hostname (pausedContexts).
func (m *Manager) namesItself(id string) bool {
	v, ok := m.ownPaused.Load(id)
	return ok && v.(ownPaused).names
}

// contextsAtPause returns the code contexts recorded by pausedContexts.
func (m *Manager) contextsAtPause(id string) []string {
	if v, ok := m.ownPaused.Load(id); ok {
		return v.(ownPaused).contexts
	}
	return nil
}

// pausedByUs returns the manifest of id's paused image in dir when this
// process wrote it and it is still the same file.
func (m *Manager) pausedByUs(id, dir string) (manifest, bool) {
	v, ok := m.ownPaused.Load(id)
	if !ok {
		return manifest{}, false
	}
	own := v.(ownPaused)
	fi, err := os.Stat(filepath.Join(dir, imagestore.ManifestName))
	if err != nil || !fi.ModTime().Equal(own.modTime) {
		return manifest{}, false
	}
	return own.man, true
}

// forgetPaused drops the records of id's paused image.
func (m *Manager) forgetPaused(id string) {
	m.ownPaused.Delete(id)
	m.checkedPaused.Delete(id)
}

// verifyPaused checks id's paused image in dir, one this process did not
// write (a restart found it), in full the first time and then as long as
// its manifest is the same file: every fork or snapshot of a sandbox
// paused before a restart read its whole image again.
func (m *Manager) verifyPaused(id, dir, what string) (manifest, error) {
	mpath := filepath.Join(dir, imagestore.ManifestName)
	if v, ok := m.checkedPaused.Load(id); ok {
		if fi, err := os.Stat(mpath); err == nil && fi.ModTime().Equal(v.(time.Time)) {
			if man, err := imagestore.ReadManifest(dir, what); err == nil {
				return man, checkRootFS(man, what)
			}
		}
		m.checkedPaused.Delete(id)
	}
	before, err := os.Stat(mpath)
	if err != nil {
		return verifyImage(dir, what) // the error that says why
	}
	man, err := verifyImage(dir, what)
	if err == nil {
		m.checkedPaused.Store(id, before.ModTime())
	}
	return man, err
}

// resumeSteps times a resume, for the log (and the bench's breakdown).
type resumeSteps struct {
	start, last time.Time
	attrs       []any
	prepared    bool // restored into a container prepared for creates (launch sets it)
}

func newResumeSteps() *resumeSteps {
	now := time.Now()
	return &resumeSteps{start: now, last: now}
}

// done ends the step named step (its key in the log, e.g. "restore_ms").
func (s *resumeSteps) done(step string) {
	if s == nil {
		return
	}
	now := time.Now()
	s.attrs = append(s.attrs, step, msSince(s.last, now))
	s.last = now
}

// rename gives the step done under old the key new.
func (s *resumeSteps) rename(old, new string) {
	if s == nil {
		return
	}
	for i := 0; i+1 < len(s.attrs); i += 2 {
		if s.attrs[i] == old {
			s.attrs[i] = new
		}
	}
}

// deadBoot keeps the steps of a boot that failed apart from the next
// one's: its restore as dead_restore_ms, and, if it booted, its hello (or
// the wait that found it dead) as dead_agent_ms and what followed as
// dead_setup_ms.
func (s *resumeSteps) deadBoot(booted bool) {
	if s == nil {
		return
	}
	s.rename("restore_ms", "dead_restore_ms")
	if !booted {
		return
	}
	if _, ok := s.get("agent_ms"); ok {
		s.rename("agent_ms", "dead_agent_ms")
		s.done("dead_setup_ms")
	} else {
		s.done("dead_agent_ms")
	}
}

// drop removes the attribute key (one not a step, such as "standby").
func (s *resumeSteps) drop(key string) {
	if s == nil {
		return
	}
	for i := 0; i+1 < len(s.attrs); i += 2 {
		if s.attrs[i] == key {
			s.attrs = append(s.attrs[:i], s.attrs[i+2:]...)
			return
		}
	}
}

// get returns the time of a step that is done.
func (s *resumeSteps) get(step string) (float64, bool) {
	if s == nil {
		return 0, false
	}
	for i := 0; i+1 < len(s.attrs); i += 2 {
		if s.attrs[i] == step {
			return s.attrs[i+1].(float64), true
		}
	}
	return 0, false
}

func (s *resumeSteps) log(log *slog.Logger, id string, own, prepared bool) {
	attrs := append([]any{"sandbox", id, "own_image", own, "prepared", prepared, "total_ms", msSince(s.start, time.Now())}, s.attrs...)
	log.Info("sandbox resumed", attrs...)
}

// debug logs the steps at debug level under msg.
func (s *resumeSteps) debug(log *slog.Logger, msg, id string) {
	attrs := append([]any{"sandbox", id, "total_ms", msSince(s.start, time.Now())}, s.attrs...)
	log.Debug(msg, attrs...)
}

// logCreate logs the steps of a create's boot (pool_ms: the look in the
// pool; admit_ms: the wait in the admission line; memory_ms: the look for
// room in the host's memory (pressure.go); store_ms: the new record; restore_ms: the network and
// the runtime's restore or start; agent_ms: the hello; setup_ms: resolver
// and trust store; record_ms: the record says running), and whether it
// restored into a container prepared for creates (standby.go).
func (s *resumeSteps) logCreate(log *slog.Logger, id string, prepared bool) {
	attrs := append([]any{"sandbox", id, "prepared", prepared, "total_ms", msSince(s.start, time.Now())}, s.attrs...)
	log.Info("sandbox booted", attrs...)
}

func msSince(t0, t1 time.Time) float64 {
	return float64(t1.Sub(t0).Microseconds()) / 1000
}

// discardPaused takes a resumed sandbox's image out of its place at once
// (a rename, so the next pause can write there) and deletes its files in
// the background: deleting a synced 200 MB file took 65-137 ms on the resume's path
// here. Close waits for the delete; a crash before it leaves a .tmp- dir
// that the next start sweeps (sweepImages).
func (m *Manager) discardPaused(id string) {
	dir := m.pausedPath(id)
	m.forgetPaused(id)
	trash := filepath.Join(filepath.Dir(dir), ".tmp-"+id+"-resumed-"+pandastack.NewID("t"))
	if err := os.Rename(dir, trash); err != nil {
		os.RemoveAll(dir)
		return
	}
	m.removeLater(trash)
}
