// Package testutil holds helpers for tests that need the real host setup
// (root, runsc, debootstrap, PostgreSQL, built binaries). On a laptop without them the
// tests skip with a message naming the fix; under CI=true a missing
// prerequisite fails the test, because a skipped suite is not green.
// Only _test.go files import it.
package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/pandastack/pandastack/internal/paths"
)

// missing skips, or fails under CI=true.
func missing(t testing.TB, what, fix string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("prerequisite missing: %s (fix: %s)", what, fix)
	}
	t.Skipf("skipping: %s (fix: %s)", what, fix)
}

// RequireMemory needs mib MiB of the host's memory available (MemAvailable).
func RequireMemory(t testing.TB, mib int) {
	t.Helper()
	if avail := MemAvailableMiB(t); avail < mib {
		missing(t, fmt.Sprintf("this test needs %d MiB of memory available, the host has %d", mib, avail), "run it on a larger host, or with less else running")
	}
}

// MemAvailableMiB reads the host's MemAvailable from /proc/meminfo.
func MemAvailableMiB(t testing.TB) int {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				t.Fatalf("MemAvailable: %q", v)
			}
			return kb / 1024
		}
	}
	t.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}

// RequireRoot needs euid 0.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "this test needs root", "run the tests as root: ./scripts/test.sh")
	}
}

// Runsc returns the runsc binary, or skips/fails when it is missing.
func Runsc(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	p := paths.FindRunsc(os.Getenv("PANDASTACK_RUNSC"), paths.CacheDir())
	if p == "" {
		missing(t, "runsc not found", "run ./scripts/setup.sh, which builds the pinned runsc into the cache")
	}
	return p
}

// RequireDebootstrap needs root and debootstrap.
func RequireDebootstrap(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	if _, err := exec.LookPath("debootstrap"); err != nil {
		missing(t, "debootstrap not found", "apt-get install debootstrap (./scripts/setup.sh does it)")
	}
}

// RepoRoot returns the module's root directory.
func RepoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
	buildOut  []byte
)

// Binaries builds cmd/pandastack and cmd/pandastack-agent (static) once per
// test process and returns the directory holding both.
func Binaries(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "pandastack-bin-")
		if buildErr != nil {
			return
		}
		root := RepoRoot(t)
		cmd := exec.Command("go", "build", "-o", buildDir, "./cmd/pandastack", "./cmd/pandastack-agent")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("go build: %v\n%s", buildErr, buildOut)
	}
	return buildDir
}

// RemoveBinaries deletes what Binaries built; call it from TestMain after m.Run.
func RemoveBinaries() {
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
}
