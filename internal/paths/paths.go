// Package paths knows where PandaStack keeps things on the host by default
// and which runsc build it pins. Any package may import it.
package paths

import (
	"os"
	"os/exec"
	"path/filepath"
)

// RunscVersion is the gVisor release the setup builds from the Go module
// proxy (DESIGN.md §2). Changing it changes the cache key, so the next setup
// builds it afresh.
const RunscVersion = "v0.0.0-20260905035102-160fafc42237"

// RunscBuild names what PandaStack's build of runsc changes in gVisor's
// source (scripts/runsc-precompiled: precompiled seccomp filters, the
// systrap filter's PID, the pages file's parallel reads and its pages
// written into the memory file, no garbage collection during a restore's
// decode or (up to 256 MiB past the live heap) a checkpoint's encode
// until a first cycle, their statistics formatted only for a debug log,
// clocks calibrated sooner after a boot or restore, a checkpoint's scan
// for zeroed pages that skips a memfd's holes, its flush of only the
// files opened for writing, the sentry's signal forwarding registered
// before its start, its host fd table grown at its boot, Ps to spare for
// Go's scheduler while a kernel's tasks start, and the state's per-object
// statistics collected only for a debug log and its bytes read from the
// buffer).
// It keys the cached build with RunscVersion, so a changed build is built
// again; change it whenever that script changes what it patches.
const RunscBuild = "precompiled-18"

// DataDir is the default data directory: /var/lib/pandastack for root,
// $XDG_DATA_HOME/pandastack (or ~/.local/share/pandastack) otherwise.
func DataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/pandastack"
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "pandastack")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "share", "pandastack")
}

// CacheDir is the shared cache of heavy artifacts (runsc, template root
// filesystems): $PANDASTACK_CACHE_DIR, else /var/cache/pandastack for root,
// else $XDG_CACHE_HOME/pandastack (or ~/.cache/pandastack).
func CacheDir() string {
	if d := os.Getenv("PANDASTACK_CACHE_DIR"); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return "/var/cache/pandastack"
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "pandastack")
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".cache", "pandastack")
}

// CachedRunsc is where the setup script puts the pinned runsc build, ours
// (scripts/runsc-precompiled, RunscBuild).
func CachedRunsc(cacheDir string) string {
	return filepath.Join(cacheDir, "runsc", RunscVersion+"-"+RunscBuild, "runsc")
}

// FindRunsc returns the runsc to use: explicit (a flag or PANDASTACK_RUNSC)
// if set, else the pinned build in the cache, else runsc on PATH. It returns
// "" when none exists.
func FindRunsc(explicit, cacheDir string) string {
	if explicit != "" {
		return explicit
	}
	if p := CachedRunsc(cacheDir); isExecutable(p) {
		return p
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p
	}
	return ""
}

// FindAgent returns the pandastack-agent binary: explicit if set, else the
// one beside the running executable. It returns "" when none exists.
func FindAgent(explicit string) string {
	if explicit != "" {
		return explicit
	}
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(self), "pandastack-agent")
	if isExecutable(p) {
		return p
	}
	return ""
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}
