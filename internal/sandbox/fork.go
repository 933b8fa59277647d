package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
)

// Fork makes count independent copies of a sandbox, each starting from
// its state at this instant. A running parent keeps running; a paused one
// (as asked, or suspended for idleness) stays paused (forkPaused).
//
// Its path, as the log's "sandbox forked" line times it: the parent's
// checkpoint into a temp image, then every child restored from that image
// at once, each saying hello and being set up (forkSteps). The image is
// deleted after the answer, in the background: the children's lazy
// restores keep their files open, and deleting ~200 MB on ext4 took
// 10-600 ms of the answer here.
func (m *Manager) Fork(ctx context.Context, projectID, id string, count int, ttlSeconds *int64, metadata map[string]string) ([]pandastack.Sandbox, error) {
	return m.ForkWith(ctx, projectID, id, ForkOptions{Count: count, TTLSeconds: ttlSeconds, Metadata: metadata})
}

// ForkOptions are a fork's: how many children, their TTL and metadata (nil:
// the parent's), and their network policy (nil: the parent's).
type ForkOptions struct {
	Count      int
	TTLSeconds *int64
	Metadata   map[string]string
	// Network: the children start with this policy instead of the
	// parent's, so that none runs a moment with more than it should
	// (a PUT after the fork left that window).
	Network *pandastack.NetworkPolicy
}

// ForkWith is Fork with the children's own network policy.
func (m *Manager) ForkWith(ctx context.Context, projectID, id string, o ForkOptions) (children []pandastack.Sandbox, err error) {
	defer m.observe(opFork, time.Now(), &err)
	count, ttlSeconds, metadata := o.Count, o.TTLSeconds, o.Metadata
	if err := m.validNetwork(o.Network); err != nil {
		return nil, err
	}
	if count < 1 || count > m.cfg.MaxFork {
		return nil, pandastack.Errorf(pandastack.EInvalid, "count must be between 1 and %d, got %d", m.cfg.MaxFork, count)
	}
	ttl, err := m.ttl(ttlSeconds)
	if err != nil {
		return nil, err
	}
	parent, err := m.store.GetSandbox(ctx, projectID, id)
	if err != nil {
		return nil, err // before any memory is freed for it: not the caller's, or none
	}
	if err := m.fitsLimits("sandbox "+id, parent.CPU, parent.MemoryMB); err != nil {
		return nil, err
	}
	// What refuses the fork anyway is said before memory is freed for it
	// (pools drained, other sandboxes suspended): a fork of a stopped
	// sandbox, bad metadata, a command, a snapshot or a stop under way.
	if parent.State == pandastack.StateStopped {
		return nil, StoppedError(parent)
	}
	if m.pastTTL(parent) {
		return nil, busyError(id, phaseStopping)
	}
	if err := m.pausedElsewhere(parent); err != nil {
		return nil, err
	}
	if metadata != nil {
		if err := ValidateMetadata(metadata); err != nil {
			return nil, err
		}
	}
	if parent.State == pandastack.StateRunning {
		if err := m.sbx.refusesQuiesce(id, "fork it"); err != nil {
			return nil, err
		}
	}
	// Its children boot at once, each as large as the parent.
	booked, err := m.roomFor(ctx, fmt.Sprintf("a fork of sandbox %s into %d", id, count), count*m.memoryOf(ctx, parent))
	if err != nil {
		return nil, err
	}
	defer func() {
		// The booking fades as the children's cgroups fill (their pages
		// load after the fork returns); told none, it stood whole on top
		// of them, and the reaper freed memory for a shortage not there.
		for _, k := range children {
			booked.of(k.ID)
		}
		booked.done(err == nil)
	}()
	for {
		if kids, done, err := m.forkPaused(ctx, projectID, id, count, ttl, metadata, o.Network); done {
			return kids, err
		}
		if !m.awaitPause(ctx, id) {
			break
		}
	}
	sb, err := m.usable(ctx, projectID, id)
	if err != nil {
		return nil, err
	}
	if metadata == nil {
		metadata = sb.Metadata
	}
	if err := ValidateMetadata(metadata); err != nil {
		return nil, err
	}
	// Asked before the hold, which shuts the parent's ready spares down:
	// a fork refused for a command or cell under way would cost the
	// parent its spare for nothing.
	if err := m.sbx.refusesQuiesce(id, "fork it"); err != nil {
		return nil, err
	}
	tHold, heldAt := time.Now(), m.now()
	held, released := m.holdForFork(ctx, id)
	if held != nil {
		// Once the children run, the parent's refiller may start its
		// missing spares again (each child's hello does the same); not
		// before, so that it does not compete with their restores.
		defer m.unholdAfterFork(held, id, heldAt)
	}
	t0 := time.Now()
	if err := m.sbx.quiesce(id, phaseCheckpointing, "fork it"); err != nil {
		return nil, err
	}
	// A fork's image lives only until its children run, in this process:
	// no manifest or checksums, which would add a pass over every byte.
	rootfs, err := m.rootfs(ctx, sb)
	if err != nil {
		m.sbx.settle(id)
		return nil, err
	}
	img := filepath.Join(m.cfg.SnapshotDir, ".fork-"+pandastack.NewID("f"))
	err = os.MkdirAll(img, 0o700)
	if err == nil {
		err = m.rt.Checkpoint(context.WithoutCancel(ctx), id, img, true)
	}
	m.sbx.settle(id)
	if err != nil {
		os.RemoveAll(img)
		return nil, fmt.Errorf("fork %s: %w", id, m.checkpointError(ctx, id, "its fork", storageError(err, checkpointOutcome)))
	}
	tCheckpoint := time.Now()
	policy := o.Network
	if policy == nil {
		policy = m.networkOf(id)
	}
	kids, steps, err := m.forkChildren(ctx, projectID, sb, rootfs, img, policy, count, ttl, metadata)
	if err != nil {
		os.RemoveAll(img) // a failed fork leaves nothing, at once
		return nil, fmt.Errorf("fork %s: %w", id, err)
	}
	tChildren := time.Now()
	size := dirSize(img)
	m.removeLater(img)
	logFork(m.log, id, count, false, msSince(tHold, t0), released, msSince(t0, tCheckpoint), msSince(tCheckpoint, tChildren), size, steps)
	return kids, nil
}

// forkChildren restores count children of sb from the image img at once,
// each with its own address and the network policy policy (sb's). If any
// fails, it removes those made and returns that error. The children's
// records say starting, and the children are claimed as being created,
// until all of them run; then each is recorded running, so that a server
// that dies before then stops them on its next start (recover) rather
// than take back some of a fork that never answered.
func (m *Manager) forkChildren(ctx context.Context, projectID string, sb pandastack.Sandbox, rootfs, img string, policy *pandastack.NetworkPolicy, count int, ttl time.Duration, metadata map[string]string) ([]pandastack.Sandbox, []*resumeSteps, error) {
	kids := make([]pandastack.Sandbox, count)
	clients := make([]*AgentClient, count)
	errs := make([]error, count)
	steps := make([]*resumeSteps, count)
	var wg sync.WaitGroup
	for i := range count {
		wg.Add(1)
		steps[i] = newResumeSteps()
		go func() {
			defer wg.Done()
			kids[i], errs[i] = m.launch(ctx, projectID, plan{
				template: sb.Template, rootfs: rootfs, image: img,
				cpu: sb.CPU, mem: sb.MemoryMB, ttl: ttl, metadata: metadata, autoResume: sb.AutoResume,
				idle:    time.Duration(sb.IdleTimeoutSeconds) * time.Second,
				network: policy, // each child its own address, the parent's policy
				steps:   steps[i],
				hold:    func(c *AgentClient) { clients[i] = c },
			})
		}()
	}
	wg.Wait()
	var err error
	for _, e := range errs {
		if err == nil {
			err = e // the first: the others most often say the same
		}
	}
	made, failed := 0, -1 // children recorded running; the one whose record failed
	for i := range kids {
		if err != nil {
			break
		}
		var k pandastack.Sandbox
		if k, err = m.started(ctx, kids[i], clients[i], true); err != nil {
			failed = i
			break
		}
		kids[i] = k
		made++
		steps[i].done("record_ms")
	}
	if err != nil {
		for i, k := range kids {
			switch {
			case i < made:
				m.kill(context.Background(), projectID, k.ID, pandastack.StopKilled) // not a kill a user asked for
			case clients[i] != nil:
				m.undoChild(k.ID, clients[i], i == failed) // started closed the channel it failed on
			}
		}
		return nil, nil, err
	}
	return kids, steps, nil
}

// undoChild removes a child of a failed fork that launch booted and left
// starting and claimed (plan.hold), as a kill would: its record goes.
// closed says its channel is closed already.
func (m *Manager) undoChild(id string, c *AgentClient, closed bool) {
	if !closed {
		c.Close()
	}
	ctx := context.Background()
	m.rt.Stop(ctx, id)
	m.recordStop(ctx, id, pandastack.StopKilled)
	m.store.DeleteSandbox(ctx, id)
	m.sbx.end(id)
}

// forkPaused forks a sandbox paused on this node straight from its paused
// image, which is its state as much as a checkpoint taken now would be:
// no resume, no checkpoint, and the parent stays paused, its memory still
// free. The parent is claimed (claimPaused) while its children restore, so
// the image stays in place until runsc has opened its files. done is false
// when the usual path (resume, then checkpoint) is to fork it instead.
func (m *Manager) forkPaused(ctx context.Context, projectID, id string, count int, ttl time.Duration, metadata map[string]string, network *pandastack.NetworkPolicy) (_ []pandastack.Sandbox, done bool, _ error) {
	sb, man, release, ok, err := m.claimPaused(ctx, projectID, id)
	if err != nil {
		return nil, true, err
	}
	if !ok {
		return nil, false, nil
	}
	defer release()
	// Kept for its resume (pause holds it), and in its image's manifest.
	policy := network
	if policy == nil {
		policy = m.networkOf(id)
	}
	if policy == nil {
		policy = m.keptNetwork(id, man.Network)
	}
	if metadata == nil {
		metadata = sb.Metadata
	}
	if err := ValidateMetadata(metadata); err != nil {
		return nil, true, err
	}
	rootfs, err := m.rootfs(ctx, sb)
	if err != nil {
		return nil, true, err
	}
	t0 := time.Now()
	img := filepath.Join(m.pausedPath(id), "image")
	kids, steps, err := m.forkChildren(ctx, projectID, sb, rootfs, img, policy, count, ttl, metadata)
	if err != nil {
		return nil, true, fmt.Errorf("fork %s: %w", id, err)
	}
	logFork(m.log, id, count, true, 0, 0, 0, msSince(t0, time.Now()), dirSize(img), steps)
	return kids, true, nil
}

// pastTTL reports whether sb's TTL has passed: the reaper stops it.
func (m *Manager) pastTTL(sb pandastack.Sandbox) bool {
	return !sb.ExpiresAt.IsZero() && !sb.ExpiresAt.After(m.now())
}

// claimPaused claims sandbox id, paused on this node, for a read of its
// paused image (phaseReadingImage): its resume,
// by request or asked for, and its kill wait until release. It returns the
// record as of the claim and the image's manifest (one this process did
// not write, found by a restart, is verified first). ok is false, with
// nothing claimed, when the sandbox is not paused, is paused on another
// node or by an image that fails its check, or is claimed for something else right
// now (a resume, a kill): the caller then takes the usual path, through a
// resume. A pause still stopping its container, and another read of the
// image (a fork or snapshot of it), are waited for. A sandbox past its TTL
// is refused (err, conflict: it is being stopped).
func (m *Manager) claimPaused(ctx context.Context, projectID, id string) (_ pandastack.Sandbox, _ manifest, release func(), ok bool, _ error) {
	for {
		sb, err := m.store.GetSandbox(ctx, projectID, id)
		if err != nil || sb.State != pandastack.StatePaused || m.pausedElsewhere(sb) != nil {
			return sb, manifest{}, nil, false, nil
		}
		if m.sbx.begin(id, phaseReadingImage) == nil {
			break
		}
		// Recorded paused just before its container stops, or another
		// fork or snapshot reading the image: wait for that.
		if !m.sbx.waitOut(ctx, id, phasePausing, phaseSuspending, phaseReadingImage) || ctx.Err() != nil {
			return sb, manifest{}, nil, false, nil
		}
	}
	// The record as of the claim: a resume may have ended just before it.
	sb, err := m.store.GetSandbox(ctx, projectID, id)
	if err == nil && sb.State == pandastack.StatePaused {
		if m.pastTTL(sb) {
			// Past its TTL: the reaper stops it, and a claim it met
			// marked it on an entry that went with the claim, so reads
			// back to back kept it from its stop.
			m.sbx.end(id)
			return sb, manifest{}, nil, false, busyError(id, phaseStopping)
		}
		if man, own := m.pausedByUs(id, m.pausedPath(id)); own {
			return sb, man, func() { m.sbx.end(id) }, true, nil
		}
		// An image a restart found (or one that changed): read only once
		// checked, as a resume checks it. A damaged one takes the usual
		// path, whose resume says what is wrong.
		if man, err := m.verifyPaused(id, m.pausedPath(id), "paused sandbox "+id); err == nil {
			return sb, man, func() { m.sbx.end(id) }, true, nil
		}
	}
	m.sbx.end(id)
	return sb, manifest{}, nil, false, nil
}

// awaitPause waits out a pause or an idle suspend of sandbox id under way,
// and reports whether it did: a fork or snapshot then looks again and
// reads the paused image (usable would refuse it, paused as asked, or
// resume it, undoing the pause).
func (m *Manager) awaitPause(ctx context.Context, id string) bool {
	return m.sbx.waitOut(ctx, id, phasePausing, phaseSuspending) && ctx.Err() == nil
}

// forkSpareWait bounds how long a fork waits for its parent's agent to give
// up a spare kernel's start in flight (the kernel killed and reaped).
const forkSpareWait = 5 * time.Second

// holdForFork has the parent's agent start no spare kernel until the fork
// is done, give up a start in flight (agentproto.Held), and shut its ready
// spares down: otherwise the image holds a kernel halfway through its
// start, which every child finishes at once, beside the other children's
// restores, or a ready one, half the image, which the checkpoint writes
// and every child loads (a parent whose spare was ready: 225 MB, its
// checkpoint 212 ms and its child's restore 183 ms, against 115 MB, 128
// and 97 ms). The parent and each child start their spares again, paced
// (refills.go), once the children run. It returns the agent to end the
// hold with, or nil when there was none (an agent of an older build, or
// none connected), and how many ready spares were shut down.
func (m *Manager) holdForFork(ctx context.Context, id string) (*AgentClient, int) {
	c := m.sbx.client(id)
	if c == nil {
		return nil, 0
	}
	hctx, cancel := context.WithTimeout(ctx, forkSpareWait+releaseTimeout)
	defer cancel()
	h, err := c.HoldSpares(hctx, forkSpareWait, true)
	if err != nil {
		m.log.Warn("holding the spare kernels for a fork; forking as they are", "sandbox", id, "err", err)
		return nil, 0
	}
	if h.Starting > 0 {
		m.log.Info("forking with a spare kernel's start under way: each child finishes it", "sandbox", id, "starting", h.Starting)
	}
	return c, h.Released
}

// unholdAfterFork ends the hold holdForFork took at since: the parent's
// agent may start its missing spares again once no other fork holds them.
// Where the manager paces refills, the pacer ends it in its turn, before
// the children's (the parent's hold is older, and the parent is the
// sandbox its user was working in); otherwise it ends now, in the
// background.
func (m *Manager) unholdAfterFork(c *AgentClient, id string, since time.Time) {
	if m.pacesRefills() {
		m.paceHold(id, c, since)
		return
	}
	m.goBackground(func() {
		ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
		defer cancel()
		if err := c.UnholdSpares(ctx); err != nil {
			m.log.Warn("letting the spare kernels start again after a fork", "sandbox", id, "err", err)
		}
	})
}

// dirSize is the bytes of the files directly in dir (a checkpoint image is
// flat), or -1 if it cannot be read.
func dirSize(dir string) int64 {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return -1
	}
	var n int64
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
	}
	return n
}

// logFork logs a fork's breakdown: whether the parent was paused (its
// paused image restored: no hold, no checkpoint), the wait for the
// parent's spares (holdForFork) and how many ready ones it shut down, the
// parent's checkpoint (with the wait for its quiet), the image's size,
// the children's restores as a whole, how many children
// restored into a container prepared for creates (standby.go), and the
// median child's steps (restore_ms: the network and runsc restore;
// agent_ms: the new session's hello; setup_ms: resolver and trust store;
// record_ms: the store).
func logFork(log *slog.Logger, id string, count int, paused bool, sparesMS float64, released int, checkpointMS, childrenMS float64, imageBytes int64, steps []*resumeSteps) {
	attrs := []any{"sandbox", id, "count", count, "paused", paused, "spares_ms", sparesMS, "spares_released", released, "checkpoint_ms", checkpointMS, "children_ms", childrenMS}
	if imageBytes >= 0 {
		attrs = append(attrs, "image_mb", math.Round(float64(imageBytes)/1e5)/10)
	}
	prepared := 0
	for _, s := range steps {
		if s.prepared {
			prepared++
		}
	}
	attrs = append(attrs, "children_prepared", prepared)
	for _, key := range []string{"restore_ms", "agent_ms", "setup_ms", "record_ms"} {
		var xs []float64
		for _, s := range steps {
			if v, ok := s.get(key); ok {
				xs = append(xs, v)
			}
		}
		if len(xs) > 0 {
			slices.Sort(xs)
			attrs = append(attrs, "child_"+key, xs[len(xs)/2])
		}
	}
	log.Info("sandbox forked", attrs...)
}

// removeLater deletes dir in the background; Close waits for it. A crash
// before it is done leaves what the next start's sweepImages removes.
func (m *Manager) removeLater(dir string) {
	m.mu.Lock()
	if m.stopped() {
		m.mu.Unlock()
		os.RemoveAll(dir)
		return
	}
	m.wg.Add(1)
	m.mu.Unlock()
	go func() {
		defer m.wg.Done()
		os.RemoveAll(dir)
	}()
}
