package testutil

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// WaitStubRaised waits until a stub of the sandbox whose memory cgroup is
// dir (a process with no command line: the ones that run its tasks)
// scores above this test process for the host's OOM killer, as runsc's
// processes start: the driver raised its stubs (it looks a moment after
// the start, so as not to slow it), and a sandbox filled from now on
// leaves the host's OOM killer a task, not the sentry.
func WaitStubRaised(t testing.TB, dir string) {
	t.Helper()
	own, _ := os.ReadFile("/proc/self/oom_score_adj")
	host, _ := strconv.Atoi(strings.TrimSpace(string(own)))
	if host >= 1000 {
		return // nothing scores above it
	}
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		for _, p := range strings.Fields(string(b)) {
			cmd, err1 := os.ReadFile("/proc/" + p + "/cmdline")
			adj, err2 := os.ReadFile("/proc/" + p + "/oom_score_adj")
			if n, err := strconv.Atoi(strings.TrimSpace(string(adj))); err1 == nil && err2 == nil && len(cmd) == 0 && err == nil && n > host {
				return
			}
		}
		if time.Now().After(end) {
			t.Fatalf("the stubs of the sandbox in %s were never raised above the host's OOM score %d", dir, host)
		}
	}
}
