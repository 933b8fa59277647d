package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/imagestore"
)

// Snapshots are sealed in SnapshotDir and handed to Config.Images (see
// images.go); paused sandboxes live in PausedDir/<sandbox id>/; forks
// checkpoint into a temp image that is removed once every child runs.

func (m *Manager) pausedPath(id string) string { return filepath.Join(m.cfg.PausedDir, id) }

// rootfs is the root filesystem sb runs on, which a restore of its image
// needs: its record's, or for records older than that field the template's.
func (m *Manager) rootfs(ctx context.Context, sb pandastack.Sandbox) (string, error) {
	if sb.RootFS != "" {
		return sb.RootFS, nil
	}
	tpl, err := m.templates.Resolve(ctx, sb.Template)
	return tpl.RootFS, err
}

// checkpoint writes the sandbox's state into a new image directory final.
func (m *Manager) checkpoint(ctx context.Context, sb pandastack.Sandbox, final string, leaveRunning bool) (int64, error) {
	rootfs, err := m.rootfs(ctx, sb)
	if err != nil {
		return 0, err
	}
	tmp := filepath.Join(filepath.Dir(final), ".tmp-"+filepath.Base(final)+"-"+pandastack.NewID("t"))
	if err := os.MkdirAll(filepath.Join(tmp, "image"), 0o700); err != nil {
		return 0, storageError(err, checkpointOutcome)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	if err := m.rt.Checkpoint(context.WithoutCancel(ctx), sb.ID, filepath.Join(tmp, "image"), leaveRunning); err != nil {
		return 0, storageError(err, checkpointOutcome)
	}
	size, err := sealImage(tmp, final, manifest{
		SandboxID: sb.ID, Template: sb.Template, RootFS: rootfs, CPU: sb.CPU, MemoryMB: sb.MemoryMB, CreatedAt: m.now().UTC(),
		Network: m.networkOf(sb.ID),
	})
	if err != nil {
		return 0, storageError(err, checkpointOutcome)
	}
	ok = true
	return size, nil
}

// Snapshot saves a sandbox's state. A running sandbox keeps running; a
// paused one (as asked, or suspended for idleness) stays paused: its
// paused image, sealed with its manifest when it paused, becomes the
// snapshot's, linked rather than copied (savePausedSnapshot).
func (m *Manager) Snapshot(ctx context.Context, projectID, id string, metadata map[string]string) (_ pandastack.Snapshot, err error) {
	defer m.observe(opSnap, time.Now(), &err)
	if err := ValidateMetadata(metadata); err != nil {
		return pandastack.Snapshot{}, err
	}
	// Another project's sandbox is not found at once, as a missing one:
	// not after waiting out its pause (which said it was there).
	if _, err := m.store.GetSandbox(ctx, projectID, id); err != nil {
		return pandastack.Snapshot{}, err
	}
	for {
		sb, _, release, ok, err := m.claimPaused(ctx, projectID, id)
		if err != nil {
			return pandastack.Snapshot{}, err
		}
		if ok {
			release = sync.OnceFunc(release)
			defer release()
			return m.snapshotPaused(ctx, projectID, id, sb, metadata, release)
		}
		if !m.awaitPause(ctx, id) {
			break
		}
	}
	sb, err := m.usable(ctx, projectID, id)
	if err != nil {
		return pandastack.Snapshot{}, err
	}
	if err := m.sbx.quiesce(id, phaseCheckpointing, "take the snapshot"); err != nil {
		return pandastack.Snapshot{}, err
	}
	return m.recordSnapshot(ctx, projectID, sb, metadata, m.networkOf(id), func(snapID string) (int64, bool, error) {
		return m.saveSnapshot(ctx, sb, snapID)
	})
}

// snapshotPaused is Snapshot of a paused sandbox sb, whose image the
// caller has claimed: read from its image, left paused. release lets the
// claim go once the image is linked, before its upload: a resume, a pause
// or a kill of the sandbox need not wait for that.
func (m *Manager) snapshotPaused(ctx context.Context, projectID, id string, sb pandastack.Sandbox, metadata map[string]string, release func()) (pandastack.Snapshot, error) {
	// Its present policy (set while paused, perhaps), which a restore
	// applies, as a fork of it does; its image's, sealed when it paused,
	// when the network no longer knows it.
	network := m.networkOf(id)
	if network == nil {
		if man, err := imagestore.ReadManifest(m.pausedPath(id), "the paused image of "+id); err == nil {
			network = man.Network
		}
	}
	return m.recordSnapshot(ctx, projectID, sb, metadata, network, func(snapID string) (int64, bool, error) {
		return m.savePausedSnapshot(ctx, id, snapID, release)
	})
}

// recordSnapshot saves a snapshot of sb with save (its size, and whether
// the image store was given anything) and records it, with network, the
// policy its image holds; on a failure nothing is left of it.
func (m *Manager) recordSnapshot(ctx context.Context, projectID string, sb pandastack.Sandbox, metadata map[string]string, network *pandastack.NetworkPolicy, save func(snapID string) (int64, bool, error)) (pandastack.Snapshot, error) {
	id := sb.ID
	snap := pandastack.Snapshot{
		ID: pandastack.NewID("snap"), ProjectID: projectID, SandboxID: id, Template: sb.Template,
		Metadata: maps.Clone(metadata), CreatedAt: m.now().UTC().Truncate(time.Millisecond), CPU: sb.CPU, MemoryMB: sb.MemoryMB,
		Network: network,
	}
	if snap.Metadata == nil {
		snap.Metadata = map[string]string{}
	}
	// Until the record is written, this says the image store may hold an
	// image of no snapshot: a crash after the upload (whose staged image
	// became the cache's) leaves it for the next start (sweepImages).
	// A failed snapshot keeps it too when what its upload sent could not
	// be removed (the bucket stopped answering): the next start tries.
	pending := filepath.Join(m.cfg.SnapshotDir, pendingPrefix+snap.ID)
	os.WriteFile(pending, nil, 0o600)
	dropped := func() {
		// Briefly: the store's own clean-up has just tried, and the caller
		// waits for its 503; the next start tries again anyway.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := m.cfg.Images.Delete(dctx, snap.ID); err != nil {
			m.log.Warn("remove what a failed snapshot sent to the snapshot store; the next start tries again", "snapshot", snap.ID, "err", err)
			return
		}
		os.Remove(pending)
	}
	var given bool
	var err error
	if snap.SizeBytes, given, err = save(snap.ID); err != nil {
		if given {
			dropped()
		} else {
			os.Remove(pending)
		}
		return pandastack.Snapshot{}, fmt.Errorf("snapshot %s: %w", id, err)
	}
	if err := m.store.CreateSnapshot(context.WithoutCancel(ctx), snap); err != nil {
		// Made all the same if its answer was lost on the way back: a
		// listed snapshot keeps its image. When the store answers neither,
		// the image and its pending file stay for the next start, which
		// removes the image if no record was made (dropUnrecorded).
		_, gerr := m.store.GetSnapshot(context.WithoutCancel(ctx), "", snap.ID)
		switch {
		case pandastack.IsCode(gerr, pandastack.ENotFound):
			dropped()
			return pandastack.Snapshot{}, err
		case gerr != nil:
			m.log.Warn("a snapshot's record may or may not be written: its image stays until the next start settles it", "snapshot", snap.ID, "err", err, "read_err", gerr)
			return pandastack.Snapshot{}, err
		}
	}
	os.Remove(pending)
	m.log.Info("snapshot taken", "sandbox", id, "snapshot", snap.ID, "bytes", snap.SizeBytes)
	return snap, nil
}

// GetSnapshot returns a snapshot of the project.
func (m *Manager) GetSnapshot(ctx context.Context, projectID, id string) (pandastack.Snapshot, error) {
	return m.store.GetSnapshot(ctx, projectID, id)
}

// ListSnapshots returns the project's snapshots matching metadata.
func (m *Manager) ListSnapshots(ctx context.Context, projectID string, metadata map[string]string) ([]pandastack.Snapshot, error) {
	return m.store.ListSnapshots(ctx, projectID, metadata)
}

// DeleteSnapshot removes a snapshot and its files. Sandboxes restored from
// it are not affected.
func (m *Manager) DeleteSnapshot(ctx context.Context, projectID, id string) error {
	var done func()
	for done == nil {
		if _, err := m.store.GetSnapshot(ctx, projectID, id); err != nil {
			return err
		}
		var deleting <-chan struct{}
		var ok bool
		if done, deleting, ok = m.snapUse.deleteStarts(id); ok {
			break
		}
		if deleting == nil {
			return pandastack.Errorf(pandastack.EConflict, "snapshot %s is being restored into a new sandbox; delete it once that is done", id)
		}
		// Another delete of it (a client's retry after its own timeout):
		// its outcome, then, as the record says (not found once it is
		// through).
		select {
		case <-deleting:
		case <-ctx.Done():
			return pandastack.Errorf(pandastack.ETimeout, "gave up waiting for another delete of snapshot %s: %v", id, ctx.Err())
		}
	}
	defer done()
	ctx = context.WithoutCancel(ctx) // not cut short by a caller that hangs up
	// The record first, then the files: a delete cut short (a crash, the
	// store stopped answering) leaves files of no snapshot, which the
	// pending file names for the next start to remove (sweepImages), not
	// a snapshot still listed over half its files.
	// A pending file that cannot be written (a full disk) does not stop
	// the delete, which frees space: only a crash between the record and
	// the files would then leave files of no snapshot.
	pending := filepath.Join(m.cfg.SnapshotDir, pendingPrefix+id)
	os.WriteFile(pending, nil, 0o600)
	if err := m.store.DeleteSnapshot(ctx, id); err != nil {
		// The pending file stays: the record may be gone all the same
		// (an answer lost on its way back), and the next start, which
		// finds it there or not, does what is left (dropUnrecorded).
		return err
	}
	if err := m.cfg.Images.Delete(ctx, id); err != nil {
		m.log.Warn("remove a deleted snapshot's files; the next start tries again", "snapshot", id, "err", err)
		return nil
	}
	os.Remove(pending)
	return nil
}

// checkpointError is err, a failed checkpoint's, once the sandbox has
// settled back to running: when the checkpoint killed it (runsc encoding
// its state ran it out of memory), it is recorded stopped with its reason
// at once, and that is the error, rather than unavailable, which says to
// retry.
func (m *Manager) checkpointError(ctx context.Context, id, during string, err error) error {
	if err == nil || m.rt.Alive(id) {
		return err
	}
	m.Reconcile(id)
	if sb, gerr := m.store.GetSandbox(ctx, "", id); gerr == nil && sb.State == pandastack.StateStopped {
		return pandastack.Errorf(pandastack.EStopped, "sandbox %s died during %s (%s) and was stopped", id, during, sb.StopReason)
	}
	return err
}

// Pause checkpoints a running sandbox to disk and frees its memory and CPU.
// A sandbox suspended for idleness stays paused as asked: from then on a
// request no longer wakes it (unless it has auto_resume). An idle suspend
// or a resume under way is waited for, and so is a snapshot or fork; so is
// another pause, which then answers as if this one had (as concurrent
// resumes do).
func (m *Manager) Pause(ctx context.Context, projectID, id string) (_ pandastack.Sandbox, err error) {
	defer m.observe(opPause, time.Now(), &err)
	waitedPause := false
	for {
		sb, err := m.store.GetSandbox(ctx, projectID, id)
		if err != nil {
			return sb, err
		}
		if sb.State == pandastack.StateStarting {
			if sb, err = m.settled(ctx, projectID, id); err != nil { // a create under way: wait for it
				return sb, err
			}
		}
		if sb.State == pandastack.StatePaused && pandastack.Suspended(sb.PauseReason) {
			sb, err = m.pauseSuspended(ctx, sb)
		} else if sb.State == pandastack.StatePaused {
			if m.sbx.waitOut(ctx, id, phaseResuming) {
				continue // being resumed: pause what that makes
			}
			if waitedPause && sb.PauseReason == pandastack.PauseRequested {
				return sb, nil // paused as asked by the pause waited for
			}
			return sb, pandastack.Errorf(pandastack.EConflict, "sandbox %s is already paused", id)
		} else if sb, err = m.running(ctx, projectID, id); err == nil {
			sb, err = m.pause(ctx, sb, pandastack.PauseRequested)
		}
		if pandastack.IsCode(err, pandastack.EConflict) && m.sbx.waitOut(ctx, id, phasePausing) {
			waitedPause = true
			continue
		}
		if errors.Is(err, errResumedMeanwhile) || pandastack.IsCode(err, pandastack.EConflict) && m.sbx.waitOut(ctx, id, phaseSuspending, phaseResuming, phaseCheckpointing, phaseReadingImage) {
			continue
		}
		return sb, err
	}
}

var (
	errResumedMeanwhile = errors.New("resumed meanwhile")
	errNotOnDemand      = errors.New("no longer to be resumed on demand")
)

// pauseSuspended turns the idle suspend of sb into a pause as asked, and
// drops its prepared resume: nothing expects it back soon.
func (m *Manager) pauseSuspended(ctx context.Context, sb pandastack.Sandbox) (pandastack.Sandbox, error) {
	id := sb.ID
	if err := m.pausedElsewhere(sb); err != nil {
		return sb, err
	}
	if err := m.sbx.begin(id, phasePausing); err != nil {
		return sb, err
	}
	defer m.sbx.end(id)
	// Still suspended? A resume may have ended just before the claim.
	if rec, err := m.store.GetSandbox(ctx, sb.ProjectID, id); err != nil || rec.State != pandastack.StatePaused || !pandastack.Suspended(rec.PauseReason) {
		if err == nil {
			err = errResumedMeanwhile
		}
		return rec, err
	}
	if err := m.store.SetSandboxState(ctx, id, pandastack.StatePaused, pandastack.PauseRequested, m.now()); err != nil {
		return sb, fmt.Errorf("pause %s: %w", id, err)
	}
	// Its prepared resume, if any (one that dropPrepared found claimed
	// by this pause stayed listed).
	_, pin := m.prepared.take(id)
	pin.release()
	m.stopPrepared(id)
	m.log.Info("sandbox paused", "sandbox", id, "reason", pandastack.PauseRequested, "was", sb.PauseReason)
	return m.store.GetSandbox(ctx, sb.ProjectID, id)
}

// recordPaused records sandbox id paused for reason. A write that fails
// may have been made all the same (its answer lost on the way back, a
// database failing over): the record is read, and the write tried again
// (it may be repeated) a few times over about a second while neither
// tells. It returns nil once the record says paused. (Should the store
// answer neither all that while, the caller undoes the pause: a paused
// image kept for a record that says running would stand in the way of the
// sandbox's next pause.)
func (m *Manager) recordPaused(ctx context.Context, id, reason string) (err error) {
	for _, wait := range recordRetry {
		if err = m.store.SetSandboxState(ctx, id, pandastack.StatePaused, reason, m.now()); err == nil {
			return nil
		}
		rec, gerr := m.store.GetSandbox(ctx, "", id)
		switch {
		case gerr == nil && rec.State == pandastack.StatePaused:
			return nil
		case gerr == nil && rec.State != pandastack.StateRunning:
			return err // stopped or gone meanwhile: no retry
		}
		time.Sleep(wait)
	}
	return err
}

// recordRetry is how long recordPaused waits after each failed try, one
// per try (a variable for tests).
var recordRetry = []time.Duration{250 * time.Millisecond, time.Second, 0}

// pause checkpoints sb into its paused image and then stops it, recording
// reason. The checkpoint leaves the sandbox running, so a pause that fails
// (a full disk) leaves it running as it was.
func (m *Manager) pause(ctx context.Context, sb pandastack.Sandbox, reason string) (pandastack.Sandbox, error) {
	id := sb.ID
	ph := phasePausing
	if pandastack.Suspended(reason) {
		ph = phaseSuspending
	}
	if err := m.sbx.quiesce(id, ph, "pause it"); err != nil {
		return sb, err
	}
	ctx = context.WithoutCancel(ctx) // half a pause helps nobody
	var released *AgentClient
	if ph == phaseSuspending {
		released = m.releaseForSuspend(id) // its image without the spare kernels
	}
	dir := m.pausedPath(id)
	if _, err := m.checkpoint(ctx, sb, dir, true); err != nil {
		m.sbx.settle(id)
		m.refillAfter(id, released)
		return sb, fmt.Errorf("pause %s: %w", id, m.checkpointError(ctx, id, "its pause", err))
	}
	m.rememberPaused(id, dir)
	// A node stalled during the checkpoint may have been found lost, and
	// the sandbox recorded stopped or deleted by another node: writing
	// paused would bring back a sandbox its clients saw end.
	if rec, err := m.store.GetSandbox(ctx, "", id); err != nil || rec.State != pandastack.StateRunning {
		os.RemoveAll(dir)
		m.forgetPaused(id)
		m.sbx.settle(id)
		m.refillAfter(id, released) // running still, for all it knows: its spares back
		if err == nil && rec.State == pandastack.StateStopped {
			err = pandastack.Errorf(pandastack.EStopped, "sandbox %s was stopped (%s) while it was being paused", id, rec.StopReason)
		} else if err == nil {
			err = pandastack.Errorf(pandastack.EUnavailable, "sandbox %s was %s while it was being paused", id, rec.State)
		}
		return sb, fmt.Errorf("pause %s: %w", id, err)
	}
	// Recorded before the sandbox stops: a record that says running must
	// never outlive its sandbox, nor may one that says paused lack its image.
	// A write that failed may have been made all the same (its answer lost
	// on the way back): the pause goes on when the record says so.
	if err := m.recordPaused(ctx, id, reason); err != nil {
		os.RemoveAll(dir)
		m.forgetPaused(id)
		m.sbx.settle(id)
		m.refillAfter(id, released)
		return sb, fmt.Errorf("pause %s: %w", id, err)
	}
	if c := m.sbx.detach(id); c != nil {
		m.pausedContexts(id, c)
		c.markStopped(reasonPaused)
		c.Close()
	}
	if m.net != nil {
		m.net.Hold(id) // the policy and egress log stay for the resume
	}
	if err := m.rt.Stop(ctx, id); err != nil {
		m.log.Error("runtime stop after pause", "sandbox", id, "err", err)
	}
	sb.State, sb.PauseReason = pandastack.StatePaused, reason
	if reason == pandastack.PauseIdle {
		// Still suspending: a request that comes meanwhile waits, then
		// resumes into what this prepared. Not on a host short of memory
		// (pressure.go): a prepared resume holds its image in memory.
		if _, short := m.memoryShort(0); !short {
			m.prepareResume(sb)
		}
	}
	m.sbx.end(id)
	m.log.Info("sandbox paused", "sandbox", id, "reason", reason)
	return sb, nil
}

// Resume restores a paused sandbox with everything in place.
//
// A resume, pause or suspend under way is waited for first: a resume that
// another request finished meanwhile answers as if this one had.
func (m *Manager) Resume(ctx context.Context, projectID, id string) (pandastack.Sandbox, error) {
	return m.resumeWaiting(ctx, projectID, id, false)
}

// resumeWaiting is Resume; onDemand is a resume that a request wants (the
// sandbox has auto_resume or was suspended for idleness), which does not
// happen if a pause asked for meanwhile made it paused as asked.
func (m *Manager) resumeWaiting(ctx context.Context, projectID, id string, onDemand bool) (pandastack.Sandbox, error) {
	waited := false
	for {
		sb, err := m.resume(ctx, projectID, id, onDemand)
		if pandastack.IsCode(err, pandastack.EConflict) && m.sbx.waitOut(ctx, id, phaseResuming, phasePausing, phaseSuspending, phaseReadingImage) {
			waited = true
			continue
		}
		if waited && pandastack.IsCode(err, pandastack.EConflict) && sb.State == pandastack.StateRunning {
			return m.Get(ctx, projectID, id)
		}
		return sb, err
	}
}

func (m *Manager) resume(ctx context.Context, projectID, id string, onDemand bool) (_ pandastack.Sandbox, err error) {
	sb, err := m.store.GetSandbox(ctx, projectID, id)
	if err != nil {
		return sb, err
	}
	if sb.State == pandastack.StateStopped {
		return sb, StoppedError(sb)
	}
	if sb.State != pandastack.StatePaused {
		return sb, pandastack.Errorf(pandastack.EConflict, "sandbox %s is %s, not paused", id, sb.State)
	}
	if err := m.pausedElsewhere(sb); err != nil {
		return sb, err
	}
	if err := m.sbx.begin(id, phaseResuming); err != nil {
		return sb, err
	}
	// Counted from here: a resume this request runs (not the ones it
	// waited for, nor a look that found nothing to do).
	op := opResume
	if onDemand {
		op = opWake
	}
	defer func(start time.Time) {
		if !errors.Is(err, errNotOnDemand) {
			m.observe(op, start, &err)
		}
	}(time.Now())
	resumed := false
	kept := m.networkOf(id) // its policy now, set while paused perhaps
	defer func() {
		if !resumed {
			m.keepNetwork(id, kept)
			m.sbx.end(id)
		}
	}()
	if onDemand {
		// The record as of the claim: a pause asked for may have made an
		// idle suspend a pause as asked since the caller looked.
		if sb, err = m.store.GetSandbox(ctx, projectID, id); err != nil {
			return sb, err
		}
		if sb.State != pandastack.StatePaused || !sb.AutoResume && !pandastack.Suspended(sb.PauseReason) {
			return sb, errNotOnDemand
		}
	}
	// Under the claim: requests that come meanwhile wait for this resume
	// instead of each being refused for the memory it is about to take.
	booked, err := m.roomFor(ctx, "the resume of sandbox "+id, imageMiB(filepath.Join(m.pausedPath(id), "image")))
	if err != nil {
		return sb, err
	}
	booked.of(id)
	defer func() { booked.done(err == nil) }()
	steps := newResumeSteps()
	dir := m.pausedPath(id)
	what := "paused sandbox " + id
	man, own := m.pausedByUs(id, dir)
	if own {
		err = checkRootFS(man, what)
	} else {
		man, err = m.verifyPaused(id, dir, what)
	}
	if err != nil {
		return sb, err
	}
	steps.done("verify_ms")
	// Counted as a create: the work done in the background (pool refills,
	// the prepare of the next container for creates, which a resume may
	// just have taken, spare kernels) waits for it and its first requests.
	m.creates.Add(1)
	defer func() {
		m.lastCreate.Store(m.now().UnixNano())
		m.creates.Add(-1)
	}()
	startCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.StartTimeout)
	defer cancel()
	// Lazy (resumeSpec): the image's files are open once Restore returns.
	prepared, pin := m.prepared.take(id) // the restore takes it, or removes it
	defer releaseLater(pin)
	if !prepared && own && m.namesItself(id) {
		if cid, done := m.standbyForResume(startCtx, sb, man); done != nil {
			defer done()
			steps.attrs = append(steps.attrs, "standby", cid)
		}
	}
	var contexts []string
	if own {
		contexts = m.contextsAtPause(id) // before a check of the image forgets them
	}
	var client *AgentClient
	checked, retried := false, false
	for ; ; retried = true {
		var rwc io.ReadWriteCloser
		rwc, err = m.rt.Restore(startCtx, m.resumeSpec(sb, man), filepath.Join(dir, "image"))
		// runsc fails for want of disk without saying so (exit status 128, no
		// message); the disk's fault only when the restore itself failed.
		err = roomError(err, filepath.Join(dir, "image"), m.cfg.DiskDir, "the sandbox stays paused")
		steps.done("restore_ms")
		booted := err == nil
		if booted {
			// An image a restart found is set up again (its CA, resolver
			// and variables may have changed); one this process paused
			// has its own, only its resolver may have moved with its slot.
			h := hello{holdSpares: m.pacesRefills()}
			if ns, ok := m.resolverOf(id); ok && own {
				h.resolver = ns
			}
			if client, err = m.dialAndSetup(startCtx, id, rwc, h, steps, !own); err == nil {
				if own {
					client.knowContexts(contexts)
				}
				steps.done("setup_ms")
			} else {
				m.stopFailedResume(id)
			}
		}
		if retried || !bootAgain(err, booted) || startCtx.Err() != nil {
			break
		}
		// As a create's (launch): a sandbox that died during its resume for
		// no reason the runtime knows, or whose restore failed for none the
		// server can name, is restored once more from the same image,
		// which nothing has used yet, unless that image is damaged. Its
		// policy goes back first: a failed restore's clean-up may have
		// released it, and the next restore would apply the one of pause
		// time.
		steps.deadBoot(booted)
		m.keepNetwork(id, kept)
		if own {
			checked = true
			if verr := m.damagedPaused(id, dir, what, err); verr != nil {
				return sb, verr
			}
			steps.done("dead_verify_ms")
		}
		m.log.Warn("restoring the sandbox again", "sandbox", id, "err", err)
		prepared = false
		steps.drop("standby") // the container it took went with the failed boot
	}
	if err != nil {
		if own && !checked {
			if verr := m.damagedPaused(id, dir, what, err); verr != nil {
				return sb, verr
			}
		}
		if startCtx.Err() != nil {
			return sb, pandastack.Errorf(pandastack.ETimeout, "sandbox %s did not resume within %s; it is still paused", id, m.cfg.StartTimeout)
		}
		m.log.Warn("resume failed; the sandbox stays paused", "sandbox", id, "err", err)
		var died agentDied
		if errors.As(err, &died) {
			how := "a crash"
			switch died.reason {
			case pandastack.ReasonOutOfMemory:
				how = "out of memory"
			case pandastack.ReasonPIDsLimit:
				how = "at its process limit"
			}
			if retried {
				how += ", after its restore was tried again"
			}
			return sb, fmt.Errorf("resume %s: %w", id, pandastack.Errorf(pandastack.EInternal, "sandbox %s died during its resume (%s; the server's log tells more); it stays paused", id, how))
		}
		return sb, fmt.Errorf("resume %s: %w", id, err)
	}
	// The record as it is now: a TTL or idle timeout changed since the
	// resume began (the entry keeps one changed from here on).
	if now, err := m.store.GetSandbox(ctx, projectID, id); err == nil {
		sb.IdleTimeoutSeconds, sb.ExpiresAt = now.IdleTimeoutSeconds, now.ExpiresAt
	}
	// Recorded running first: the image goes only once nothing needs it.
	if sb, err = m.started(ctx, sb, client, false); err != nil {
		m.stopFailedResume(id)
		return sb, err
	}
	steps.done("record_ms")
	steps.log(m.log, id, own, prepared)
	resumed = true
	m.discardPaused(id)
	return sb, nil
}

// damagedPaused looks at the files of the image in dir that this process
// paused sandbox id into, after a resume from it failed with err: trusted
// as this process wrote it until then, it is checked now and from now on
// (a damaged image hung the hello for the whole start timeout, each time,
// saying "overloaded"). It returns why the image is damaged, nil if sound.
func (m *Manager) damagedPaused(id, dir, what string, err error) error {
	m.forgetPaused(id)
	_, verr := verifyImage(dir, what)
	if verr != nil {
		m.log.Warn("resume failed: the paused image is damaged; the sandbox stays paused", "sandbox", id, "err", err, "check", verr)
	}
	return verr
}

// stopFailedResume stops what a failed resume of paused sandbox id
// restored: the sandbox stays paused, its network policy kept (the one set
// while it resumed included) for the next resume.
func (m *Manager) stopFailedResume(id string) {
	if m.net != nil {
		m.net.Hold(id) // the stop takes only the network down
	}
	m.rt.Stop(context.Background(), id)
}

// usable returns a running sandbox, resuming a paused one when it was
// created with auto_resume or suspended for idleness. A request that finds
// it resuming or suspending waits for that, then looks again.
func (m *Manager) usable(ctx context.Context, projectID, id string) (pandastack.Sandbox, error) {
	t0 := time.Now()
	relooks := 0
	for {
		sb, err := m.store.GetSandbox(ctx, projectID, id)
		if err != nil {
			return sb, err
		}
		switch {
		case sb.State == pandastack.StatePaused && !sb.AutoResume && !pandastack.Suspended(sb.PauseReason):
			if err := m.pausedElsewhere(sb); err != nil {
				return sb, err // a resume could not help: its node is gone
			}
			if m.sbx.waitOut(ctx, id, phaseResuming, phaseReadingImage) {
				continue // resumed on request right now: the next look finds it running
			}
			return sb, pandastack.Errorf(pandastack.EConflict, "sandbox %s is paused; resume it first (POST /v1/sandboxes/%s/resume), or create sandboxes with auto_resume", id, id)
		case sb.State == pandastack.StatePaused:
			if _, err := m.resumeWaiting(ctx, projectID, id, true); err != nil {
				if errors.Is(err, errNotOnDemand) {
					continue // paused as asked meanwhile: the next look says so
				}
				// Another request is resuming it, or its prepared resume is
				// being removed (dropPrepared), or it is being killed: the
				// next look finds it running, paused or stopped.
				if pandastack.IsCode(err, pandastack.EConflict) && m.sbx.waitOut(ctx, id, phaseCreating, phaseResuming, phasePausing, phaseSuspending, phaseStopping, phaseReadingImage) {
					continue
				}
				if !pandastack.IsCode(err, pandastack.EConflict) {
					return sb, err
				}
			} else {
				// With the wait for a suspend still stopping the sandbox.
				m.log.Info("sandbox resumed on demand", "sandbox", id, "request_ms", msSince(t0, time.Now()))
			}
		case sb.State == pandastack.StateRunning && m.sbx.wait(ctx, id):
			continue // being suspended or paused; the next look resumes it
		case sb.State == pandastack.StateStarting && m.sbx.wait(ctx, id):
			continue // being created here: it runs in a moment
		}
		if err := ctx.Err(); err != nil {
			return sb, err
		}
		got, err := m.running(ctx, projectID, id)
		if err != nil && got.State != sb.State && relooks < maxRelooks {
			// It changed between the two looks: a whole pause can fit
			// between them (found running, no phase under way, then
			// paused). The next look resumes it, or says what it is.
			relooks++
			continue
		}
		return got, err
	}
}

// maxRelooks bounds how many times a request looks again at a sandbox
// that changed under it (usable, use) before it answers what it found.
const maxRelooks = 3
