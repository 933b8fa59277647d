package gvisor_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/runtime/gvisor"
	"github.com/pandastack/pandastack/internal/runtime/runtimetest"
	"github.com/pandastack/pandastack/internal/testutil"
)

// busyboxRootFS makes a tiny root filesystem from Debian's busybox-static.
func busyboxRootFS(t *testing.T) string {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("busybox not found (fix: apt-get install busybox-static; ./scripts/setup.sh does it)")
		}
		t.Skip("busybox not found (fix: apt-get install busybox-static)")
	}
	root := t.TempDir()
	for _, d := range []string{"bin", "proc", "dev", "sys", "tmp", "etc", "home/user"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chown(filepath.Join(root, "home/user"), 1000, 1000)
	// As in a template: a non-empty /tmp, which runsc leaves on the sandbox's disk.
	os.Chmod(filepath.Join(root, "tmp"), 0o1777)
	if err := os.WriteFile(filepath.Join(root, "tmp/.pandastack-disk"), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "bin/busybox"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, app := range []string{"sh", "echo", "cat", "head", "tail", "wc", "sleep", "id", "ps"} {
		if err := os.Symlink("busybox", filepath.Join(root, "bin", app)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBinaries()
	os.Exit(code)
}

func TestConformance(t *testing.T) {
	runsc := testutil.Runsc(t)
	agent := filepath.Join(testutil.Binaries(t), "pandastack-agent")
	before := conformanceCgroups()
	defer func() {
		// Every sandbox the suite made is gone; so are its cgroups.
		for _, d := range conformanceCgroups() {
			if !slices.Contains(before, d) {
				t.Errorf("cgroup left behind: %s", d)
			}
		}
	}()
	runtimetest.Run(t, runtimetest.Env{
		RootFS: busyboxRootFS(t),
		New: func(t *testing.T) pandastack.Runtime {
			rt, err := gvisor.New(gvisor.Config{Runsc: runsc, StateDir: t.TempDir(), AgentPath: agent})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rt.Close() })
			return rt
		},
	})
}

// conformanceCgroups lists the cgroup directories of the conformance
// suite's sandboxes (ids sbx_rt…), wherever runsc may have made them.
func conformanceCgroups() []string {
	var dirs []string
	for _, pat := range []string{"/sys/fs/cgroup/*/pandastack/sbx_rt*", "/sys/fs/cgroup/*/sbx_rt*", "/sys/fs/cgroup/pandastack/sbx_rt*", "/sys/fs/cgroup/sbx_rt*"} {
		m, _ := filepath.Glob(pat)
		dirs = append(dirs, m...)
	}
	return dirs
}
