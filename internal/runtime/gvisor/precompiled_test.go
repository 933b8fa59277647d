package gvisor_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/paths"
	"github.com/pandastack/pandastack/internal/runtime/gvisor"
	"github.com/pandastack/pandastack/internal/testutil"
)

// TestSeccompFiltersPrecompiled checks that the runsc scripts/setup.sh
// builds holds a precompiled seccomp program for each configuration this
// driver starts sandboxes with (no network and runsc's own network stack):
// its sandbox and gofer processes load one rather than compiling their
// filters at every start, which a create, a restore and a fork all wait for.
// Flags added to the driver that change runsc's filter options fail here.
func TestSeccompFiltersPrecompiled(t *testing.T) {
	runsc := testutil.Runsc(t)
	if want := paths.CachedRunsc(paths.CacheDir()); runsc != want {
		t.Skipf("runsc %s is not the setup's build (%s), which this test is about", runsc, want)
	}
	agent := filepath.Join(testutil.Binaries(t), "pandastack-agent")
	rootfs := busyboxRootFS(t)
	for _, network := range []string{"none", "sandbox"} {
		t.Run(network, func(t *testing.T) {
			logDir := t.TempDir()
			rt, err := gvisor.New(gvisor.Config{Runsc: runsc, StateDir: t.TempDir(), AgentPath: agent, DebugLogDir: logDir})
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Close()
			spec := pandastack.RuntimeSpec{ID: pandastack.NewID("sbx"), RootFS: rootfs}
			if network == "sandbox" {
				spec.NetNS = netNS(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			rwc, err := rt.Start(ctx, spec)
			if err != nil {
				t.Fatal(err)
			}
			defer rt.Stop(context.Background(), spec.ID)
			rwc.Close()
			for _, proc := range []string{"boot", "gofer"} {
				log := debugLog(t, logDir, proc)
				if !strings.Contains(log, "Loaded precompiled seccomp instructions") {
					miss := "no line about seccomp"
					if i := strings.Index(log, "No precompiled program found"); i >= 0 {
						miss = log[i:min(len(log), i+400)]
					}
					t.Errorf("runsc's %s process did not load a precompiled seccomp program: %s", proc, miss)
				}
			}
		})
	}
}

// debugLog returns the runsc debug logs of one kind of process ("boot" is
// the sandbox, "gofer" the gofer), joined.
func debugLog(t *testing.T, dir, proc string) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	var b strings.Builder
	for _, f := range files {
		if strings.Contains(filepath.Base(f), "."+proc) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			b.Write(data)
		}
	}
	if b.Len() == 0 {
		t.Fatalf("no runsc debug log of the %s process in %s (files: %v)", proc, dir, files)
	}
	return b.String()
}

// netNS makes a network namespace with loopback only, removed at the end
// of the test, and returns its path.
func netNS(t *testing.T) string {
	t.Helper()
	name := "pandastack-test-" + strings.TrimPrefix(pandastack.NewID("ns"), "ns_")
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return filepath.Join("/run/netns", name)
}
