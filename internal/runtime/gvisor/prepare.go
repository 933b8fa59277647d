package gvisor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/pandastack/pandastack"
)

// A restore starts two host processes, runsc's gofer and its sandbox (the
// sentry), and only then loads the image into them. Prepare does that
// start ahead of time with `runsc create`, which leaves the container
// created and waiting; `runsc restore` of the same id then restores into
// it (runsc/cmd/restore.go loads an existing container before it would
// make one), so the restore's caller waits only for the image to load.
// Everything fixed when runsc creates a container (id, bundle, mounts,
// limits, network namespace, the disk's medium) must be as the restore
// wants it, so a prepared container serves one restore of one id with the
// same spec; any other restore of that id removes it and starts afresh.

// prepared is a container created ahead of a restore, or being created.
type prepared struct {
	done  chan struct{} // closed when the create ended; then err and disk are set
	err   error
	key   string // prepareKey of the spec it was created with
	disk  int    // its disk size (0: in memory), as the image has it
	caps  int    // its capability revision (caps.go), as the image has it
	agent string // the agent binary it mounts (agent.go), as the image has it
}

// prepareKey is what a restore must share with the prepared container.
// Not the environment: a restored sandbox's processes keep the one in the
// image. Not the network namespace's path either, only whether it has one:
// the container keeps the namespace it was created in, which the network
// in front of the runtime hands its restore (and moves with a Rename).
func prepareKey(s pandastack.RuntimeSpec, disk int) string {
	return fmt.Sprintf("%s|%d|%d|%d|%t|%d", s.RootFS, s.CPU, s.MemoryMB, s.PIDs, s.NetNS != "", disk)
}

// Prepare does the start of a later Restore of spec from imageDir now:
// the sandbox's directory and `runsc create`, which starts its gofer and
// sentry and leaves them waiting. A Restore of spec.ID with the same spec
// then only loads the image. Until restored, a prepared sandbox holds its
// two host processes (their memory, no image) and shows as stopped; Stop
// removes it. EConflict if the runtime has the id already. Costs what the
// start of a restore costs (50-100 ms here); ctx bounds the call only.
func (r *Runtime) Prepare(ctx context.Context, spec pandastack.RuntimeSpec, imageDir string) error {
	if !validID(spec.ID) {
		return pandastack.Errorf(pandastack.EInvalid, "invalid sandbox id %q", spec.ID)
	}
	if _, err := os.Stat(filepath.Join(imageDir, "checkpoint.img")); err != nil {
		return pandastack.Errorf(pandastack.ESnapshotCorrupt, "no checkpoint image in %s", imageDir)
	}
	p := &prepared{done: make(chan struct{})}
	r.mu.Lock()
	if _, busy := r.prep[spec.ID]; busy {
		r.mu.Unlock()
		return pandastack.Errorf(pandastack.EConflict, "sandbox %s is prepared already", spec.ID)
	}
	r.prep[spec.ID] = p
	r.mu.Unlock()
	disk, err := r.launch(ctx, spec, imageDir, modeCreate)
	p.err, p.disk, p.key = err, disk, prepareKey(spec, disk)
	p.caps, _ = r.capsFor(imageDir) // launch read it already
	p.agent, _ = r.agentFor(imageDir)
	close(p.done)
	if err != nil {
		r.mu.Lock()
		if r.prep[spec.ID] == p {
			delete(r.prep, spec.ID)
		}
		r.mu.Unlock()
		return fmt.Errorf("prepare %s: %w", spec.ID, err)
	}
	r.log.Debug("sandbox prepared", "sandbox", spec.ID)
	return nil
}

// takePrepared removes and returns id's prepared container, after its
// create ended, or nil if none. A create still running is waited for: it
// is bounded by the Prepare's ctx, and a restore started beside it could
// only fail on the id.
func (r *Runtime) takePrepared(id string) *prepared {
	r.mu.Lock()
	p := r.prep[id]
	delete(r.prep, id)
	r.mu.Unlock()
	if p != nil {
		<-p.done
	}
	return p
}

// forgetPrepared drops id's prepared container from the books, waiting
// for a create under way to end (Stop then removes what it made).
func (r *Runtime) forgetPrepared(id string) {
	r.mu.Lock()
	p := r.prep[id]
	delete(r.prep, id)
	r.mu.Unlock()
	if p != nil {
		<-p.done
	}
}

// imageDisk is the disk size recorded in an image (0 when unreadable: the
// mismatch then makes a fresh start, whose own check says what is wrong).
func (r *Runtime) imageDisk(imageDir string) int {
	n, err := r.diskFor(pandastack.RuntimeSpec{}, imageDir)
	if err != nil {
		return -1
	}
	return n
}

// restorePrepared restores imageDir into the container prepared for
// spec.ID. On failure the container is removed.
func (r *Runtime) restorePrepared(ctx context.Context, spec pandastack.RuntimeSpec, imageDir string, p *prepared) (_ io.ReadWriteCloser, err error) {
	defer func() {
		if err != nil {
			r.remove(spec.ID)
		}
	}()
	cid := r.cid(spec.ID)
	if err := r.runDetached(ctx, spec, p.disk, restoreArgs(r.dir(cid), imageDir, cid, spec.Lazy), nil, nil); err != nil {
		return nil, err
	}
	conn, err := r.open(spec.ID)
	if err != nil {
		return nil, err
	}
	r.log.Debug("sandbox restored into its prepared container", "sandbox", spec.ID)
	return conn, nil
}

// Rename implements pandastack.RuntimePreparer: the container prepared as
// from keeps its runsc id, and a symlink sandboxes/<to> → <from> says
// that to is it (cid); a file in from's directory says it is no longer
// from (container), while that link exists. Both outlive a restart of the
// server, so List, State, Stop and the rest find the container by to then
// as now, and not by from.
// A Restore of to then restores into it as if it had been prepared as to.
func (r *Runtime) Rename(ctx context.Context, from, to string) error {
	if !validID(from) || !validID(to) {
		return pandastack.Errorf(pandastack.EInvalid, "invalid sandbox id %q or %q", from, to)
	}
	r.renameMu.Lock() // one at a time: the marker below is written once
	defer r.renameMu.Unlock()
	r.mu.Lock()
	p := r.prep[from]
	_, busy := r.prep[to]
	r.mu.Unlock()
	if p == nil {
		return pandastack.Errorf(pandastack.ENotFound, "no sandbox %q prepared in the runtime", from)
	}
	if busy {
		return pandastack.Errorf(pandastack.EConflict, "sandbox %s is prepared already", to)
	}
	select {
	case <-p.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if p.err != nil {
		return pandastack.Errorf(pandastack.ENotFound, "sandbox %s was not prepared: %v", from, p.err)
	}
	// The link first: the marker counts only beside a link back to from
	// (container), so a crash between the two leaves from as it was.
	if err := os.Symlink(from, r.dir(to)); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return pandastack.Errorf(pandastack.EConflict, "sandbox %s already exists in the runtime", to)
		}
		return fmt.Errorf("rename %s to %s: %w", from, to, err)
	}
	if err := os.WriteFile(filepath.Join(r.dir(from), renamedFile), []byte(to), 0o600); err != nil {
		os.Remove(r.dir(to))
		return fmt.Errorf("rename %s to %s: %w", from, to, err)
	}
	r.mu.Lock()
	if r.prep[from] != p || r.prep[to] != nil {
		// Taken meanwhile (a Stop or Restore of from, a Prepare of to).
		r.mu.Unlock()
		os.Remove(r.dir(to))
		os.Remove(filepath.Join(r.dir(from), renamedFile))
		return pandastack.Errorf(pandastack.EConflict, "sandbox %s or %s changed during the rename", from, to)
	}
	delete(r.prep, from)
	r.prep[to] = p
	r.mu.Unlock()
	r.forgetPID(from)
	r.forgetPID(to)
	r.log.Debug("prepared sandbox renamed", "from", from, "sandbox", to)
	return nil
}
