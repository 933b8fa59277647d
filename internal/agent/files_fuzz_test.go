//go:build linux

package agent

import (
	"path/filepath"
	"testing"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// FuzzGuard: any path a client may send (one CheckPath accepts) that lies
// on a pseudo-filesystem is refused, and so is any write under our own
// mounts, whatever the spelling ("..", "//", "."). guard only reads the
// filesystem (it resolves symlinks), so fuzzing it on the host is safe.
func FuzzGuard(f *testing.F) {
	for _, s := range []string{"/proc/self/mem", "/proc/../proc/1/task", "//sys//kernel", "/dev/null", "/home/user/x", "/.pandastack/agent", "/.pandastack/../.pandastack/x", "/tmp", "relative/../../proc/1", "/procfs"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if agentproto.CheckPath(p) != nil {
			return
		}
		if !filepath.IsAbs(p) {
			p = filepath.Join("/home/user", p)
		}
		p = filepath.Clean(p)
		for _, follow := range []bool{false, true} {
			for _, write := range []bool{false, true} {
				err := guard(p, follow, write)
				if err != nil && !pandastack.IsCode(err, pandastack.EInvalid) {
					t.Fatalf("guard(%q) = %v, want invalid_request", p, err)
				}
				pseudo := false
				for _, d := range agentproto.PseudoFS {
					pseudo = pseudo || agentproto.Under(p, d)
				}
				if pseudo && err == nil {
					t.Fatalf("guard(%q, follow=%v, write=%v) let a pseudo-filesystem path through", p, follow, write)
				}
				if write && agentproto.Under(p, agentproto.ProtectedPrefix) && err == nil {
					t.Fatalf("guard(%q) let a write under %s through", p, agentproto.ProtectedPrefix)
				}
			}
		}
	})
}
