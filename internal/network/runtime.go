package network

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/pandastack/pandastack"
)

// Runtime puts a network in front of a pandastack.Runtime: every sandbox it
// starts or restores gets a fresh namespace with the policy of its spec
// (or the one it had, or the default), and loses it when it stops. The
// sandbox manager needs no change to run with networking.
type Runtime struct {
	pandastack.Runtime
	net      *Network
	prepared sync.Map // sandbox id → its namespace's path, for a prepared restore (Prepare)
}

var (
	_ pandastack.Runtime         = (*Runtime)(nil)
	_ pandastack.RuntimePreparer = (*Runtime)(nil)
	_ pandastack.RuntimeUsage    = (*Runtime)(nil)
	_ pandastack.RuntimeLogs     = (*Runtime)(nil)
	_ pandastack.RuntimeOOMKills = (*Runtime)(nil)
)

// CPUNanos implements pandastack.RuntimeUsage: the wrapped runtime's
// reading, or Stats' when it has no cheaper one.
func (r *Runtime) CPUNanos(ctx context.Context, id string) (int64, error) {
	if ru, ok := r.Runtime.(pandastack.RuntimeUsage); ok {
		return ru.CPUNanos(ctx, id)
	}
	st, err := r.Runtime.Stats(ctx, id)
	return st.CPUNanos, err
}

// MemoryBytes implements pandastack.RuntimeUsage, as CPUNanos does.
func (r *Runtime) MemoryBytes(ctx context.Context, id string) (int64, error) {
	if ru, ok := r.Runtime.(pandastack.RuntimeUsage); ok {
		return ru.MemoryBytes(ctx, id)
	}
	st, err := r.Runtime.Stats(ctx, id)
	return st.MemoryBytes, err
}

// LogTail implements pandastack.RuntimeLogs: the wrapped runtime's, or ""
// when it keeps none.
func (r *Runtime) LogTail(id string) string {
	if rl, ok := r.Runtime.(pandastack.RuntimeLogs); ok {
		return rl.LogTail(id)
	}
	return ""
}

// OOMKills implements pandastack.RuntimeOOMKills: the wrapped runtime's
// count, or -1 when it keeps none.
func (r *Runtime) OOMKills(id string) int64 {
	if ro, ok := r.Runtime.(pandastack.RuntimeOOMKills); ok {
		return ro.OOMKills(id)
	}
	return -1
}

// Wrap returns rt with sandbox networking from n.
func Wrap(rt pandastack.Runtime, n *Network) *Runtime { return &Runtime{Runtime: rt, net: n} }

// Start implements pandastack.Runtime.
func (r *Runtime) Start(ctx context.Context, spec pandastack.RuntimeSpec) (io.ReadWriteCloser, error) {
	return r.boot(spec, func(s pandastack.RuntimeSpec) (io.ReadWriteCloser, error) { return r.Runtime.Start(ctx, s) })
}

// Restore implements pandastack.Runtime. A restored stack takes the
// addresses of the namespace it finds, so a fork child gets its own. A
// sandbox prepared ahead (Prepare) keeps the network made for it then.
func (r *Runtime) Restore(ctx context.Context, spec pandastack.RuntimeSpec, imageDir string) (io.ReadWriteCloser, error) {
	if ns, ok := r.prepared.LoadAndDelete(spec.ID); ok {
		spec.NetNS = ns.(string)
		if spec.Network != nil {
			// Nothing ran in it since its network was made: no
			// connections to cut.
			if err := r.net.setPolicy(spec.ID, *spec.Network, false); err != nil {
				r.Runtime.Stop(ctx, spec.ID)
				r.net.Release(spec.ID)
				return nil, err
			}
		}
		rwc, err := r.Runtime.Restore(ctx, spec, imageDir)
		if err != nil {
			// A paused sandbox's resume that failed: it stays paused
			// with its policy (the one set meanwhile included).
			r.net.Down(spec.ID)
			return nil, err
		}
		return rwc, nil
	}
	return r.boot(spec, func(s pandastack.RuntimeSpec) (io.ReadWriteCloser, error) {
		return r.Runtime.Restore(ctx, s, imageDir)
	})
}

// Prepare implements pandastack.RuntimePreparer when the wrapped runtime
// does: the sandbox's network is made now, with the policy it has (a
// paused sandbox's) or spec's, and the restore keeps it. On failure a
// sandbox that had a policy keeps it.
func (r *Runtime) Prepare(ctx context.Context, spec pandastack.RuntimeSpec, imageDir string) error {
	p, ok := r.Runtime.(pandastack.RuntimePreparer)
	if !ok {
		return pandastack.Errorf(pandastack.EUnavailable, "the runtime cannot prepare restores")
	}
	_, had := r.net.Policy(spec.ID)
	ns, err := r.net.Prepare(spec.ID, spec.Network)
	if err != nil {
		return err
	}
	spec.NetNS = ns
	if err := p.Prepare(ctx, spec, imageDir); err != nil {
		if had {
			r.net.Down(spec.ID)
		} else {
			r.net.Release(spec.ID)
		}
		return err
	}
	r.prepared.Store(spec.ID, ns)
	return nil
}

// Rename implements pandastack.RuntimePreparer when the wrapped runtime
// does: the network made for from goes to to (Network.Rename), with to's
// own policy when it has one (a suspended sandbox's), and the restore of
// to keeps it.
func (r *Runtime) Rename(ctx context.Context, from, to string) error {
	p, ok := r.Runtime.(pandastack.RuntimePreparer)
	if !ok {
		return pandastack.Errorf(pandastack.EUnavailable, "the runtime cannot prepare restores")
	}
	if _, ok := r.prepared.Load(from); !ok {
		return pandastack.Errorf(pandastack.ENotFound, "no sandbox %q prepared", from)
	}
	if _, ok := r.prepared.Load(to); ok {
		return pandastack.Errorf(pandastack.EConflict, "sandbox %s is prepared already", to)
	}
	// The runtime's part first: it can only refuse (nothing changed then),
	// and past the network's part the container's id must be to's.
	if err := p.Rename(ctx, from, to); err != nil {
		if !pandastack.IsCode(err, pandastack.ENotFound) && !pandastack.IsCode(err, pandastack.EConflict) {
			r.Stop(ctx, from)
		}
		return err
	}
	r.prepared.Delete(from)
	ns, err := r.net.Rename(from, to)
	if err != nil {
		// The container, now to's, goes; to's own policy stays. Past the
		// runtime's part something changed, so the error carries no code
		// that says nothing did.
		r.Runtime.Stop(ctx, to)
		r.net.Release(from)
		return fmt.Errorf("rename the network of %s to %s: %v", from, to, err)
	}
	r.prepared.Store(to, ns)
	return nil
}

func (r *Runtime) boot(spec pandastack.RuntimeSpec, start func(pandastack.RuntimeSpec) (io.ReadWriteCloser, error)) (io.ReadWriteCloser, error) {
	_, had := r.net.Policy(spec.ID) // a paused sandbox's, for its resume
	ns, err := r.net.Prepare(spec.ID, spec.Network)
	if err != nil {
		return nil, err
	}
	spec.NetNS = ns
	rwc, err := start(spec)
	if err != nil {
		// A resume that failed leaves the sandbox paused with its
		// policy, as Prepare does; a new sandbox's network goes.
		if had {
			r.net.Down(spec.ID)
		} else {
			r.net.Release(spec.ID)
		}
		return nil, err
	}
	return rwc, nil
}

// Attach implements pandastack.Runtime: after a server restart the
// sandbox's network is taken over too.
func (r *Runtime) Attach(ctx context.Context, id string) (io.ReadWriteCloser, error) {
	rwc, err := r.Runtime.Attach(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := r.net.Adopt(id); err != nil {
		rwc.Close()
		return nil, err
	}
	return rwc, nil
}

// Stop implements pandastack.Runtime.
func (r *Runtime) Stop(ctx context.Context, id string) error {
	r.prepared.Delete(id)
	err := r.Runtime.Stop(ctx, id)
	r.net.Release(id)
	return err
}

// Checkpoint implements pandastack.Runtime. A paused sandbox (not left
// running) gives its namespace up and keeps its policy for the resume.
func (r *Runtime) Checkpoint(ctx context.Context, id, imageDir string, leaveRunning bool) error {
	if err := r.Runtime.Checkpoint(ctx, id, imageDir, leaveRunning); err != nil {
		return err
	}
	if !leaveRunning {
		r.net.Down(id)
	}
	return nil
}

// List implements pandastack.Runtime: namespaces of ours whose sandbox the
// runtime no longer has are listed too, so recovery removes them.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	ids, err := r.Runtime.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, id := range r.net.Namespaces() {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// Close ends networking on server exit: no new namespaces, the network of
// every sandbox the runtime no longer runs released (a warm-up or a pool
// restore cut short by the shutdown), then Network.Close. Running
// sandboxes keep theirs, with their veths down, for the next start.
func (r *Runtime) Close(ctx context.Context) error {
	r.net.Drain()
	r.Sweep(ctx)
	return r.net.Close()
}

// Sweep releases the network of every sandbox the runtime no longer runs.
func (r *Runtime) Sweep(ctx context.Context) {
	for _, id := range r.net.Namespaces() {
		st, err := r.Runtime.State(ctx, id)
		if pandastack.IsCode(err, pandastack.ENotFound) || (err == nil && st != pandastack.RuntimeRunning) {
			r.Runtime.Stop(ctx, id)
			r.net.Release(id)
		}
	}
}
