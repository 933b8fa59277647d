package template

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// GCOptions configures GC.
type GCOptions struct {
	// Keep reports whether a build is still referenced (the current build
	// of a template, the root filesystem of a live or paused sandbox, of a
	// snapshot or of a warm image) and why. Required.
	Keep func(Built) (reason string, keep bool)
	// MinAge spares builds younger than this: another server sharing the
	// cache may have just built one and not started anything on it yet.
	MinAge time.Duration
	DryRun bool             // report what would go, remove nothing
	Now    func() time.Time // default time.Now
}

// GCResult is one build GC looked at.
type GCResult struct {
	Build   Built
	Removed bool   // removed (or, with DryRun, would have been)
	Reason  string // why it was kept, or the error that kept it
}

// GC removes the builds in cacheDir that nothing references: a build goes
// only when o.Keep refuses it, no running server holds it (Hold), it is
// older than o.MinAge, and no process on this machine has its root
// filesystem mounted (a sandbox of another server
// sharing the cache, which o.Keep cannot know about). Removal refuses
// anything mounted beneath the build. The debootstrap stages and builds in
// progress are never touched. Cost: a read of every process's mount table
// and a recursive delete per removed build. Once ctx ends GC looks at no
// further build (a removal under way finishes) and returns what it did
// with ctx's error.
func GC(ctx context.Context, cacheDir string, o GCOptions) ([]GCResult, error) {
	if o.Keep == nil {
		return nil, fmt.Errorf("template gc: no Keep function")
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	builds, err := ListBuilt(cacheDir)
	if err != nil {
		return nil, err
	}
	mounted, err := inUseBy()
	if err != nil {
		return nil, fmt.Errorf("template gc: %w", err)
	}
	var out []GCResult
	for _, b := range builds {
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("template gc: stopped: %w", err)
		}
		r := GCResult{Build: b}
		if reason, keep := o.Keep(b); keep {
			r.Reason = reason
		} else if held := heldBy(b); held != "" {
			r.Reason = held
		} else if age := now().Sub(builtAt(b)); age < o.MinAge {
			r.Reason = fmt.Sprintf("built %s ago (younger than %s)", age.Round(time.Second), o.MinAge)
		} else if m := mounted(b.Dir); m != "" {
			r.Reason = "mounted by a running process: " + m
		} else if o.DryRun {
			r.Removed = true
		} else {
			r.Removed, r.Reason = removeUnlessBuilding(cacheDir, b)
		}
		out = append(out, r)
	}
	return out, nil
}

// builtAt is the later of the recorded build time and the marker's mtime,
// so a marker copied in with an old date still counts as new.
func builtAt(b Built) time.Time {
	t := b.BuiltAt
	if fi, err := os.Stat(filepath.Join(b.Dir, markerFile)); err == nil && fi.ModTime().After(t) {
		t = fi.ModTime()
	}
	return t
}

// removeUnlessBuilding removes b under the lock of its template name, so
// that no build of that name (a --force rebuild of the same hash) runs
// meanwhile; a running build keeps it.
func removeUnlessBuilding(cacheDir string, b Built) (bool, string) {
	unlock, err := tryLockName(cacheDir, b.Name)
	if err != nil {
		return false, "a build of " + b.Name + " is running"
	}
	defer unlock()
	// Held until the build has left its place: no server takes it meanwhile.
	unlockBuild, err := lockBuild(b)
	if err != nil {
		return false, err.Error()
	}
	defer unlockBuild()
	// Again, right before: a sandbox may have started on it since.
	if mounted, err := inUseBy(); err != nil {
		return false, err.Error()
	} else if m := mounted(b.Dir); m != "" {
		return false, "mounted by a running process: " + m
	}
	if err := Remove(b); err != nil {
		return false, err.Error()
	}
	return true, ""
}

// heldBy says why b is kept when a running server holds it (Hold), or "".
func heldBy(b Built) string {
	unlock, err := lockBuild(b)
	if errors.Is(err, errHeld) {
		return err.Error()
	}
	if err == nil {
		unlock()
	}
	return ""
}
