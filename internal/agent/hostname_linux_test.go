package agent

import (
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// capsChildEnv makes the test binary, run again, the child of the test
// below: KeepAdminToItself changes the capabilities of every thread of its
// process, which the other tests of this one must keep.
const capsChildEnv = "PANDASTACK_TEST_CAPS_CHILD"

func init() {
	if os.Getenv(capsChildEnv) != "1" {
		return
	}
	if err := capsChild(); err != nil {
		fmt.Println("FAIL:", err)
		os.Exit(1)
	}
	fmt.Println("OK")
	os.Exit(0)
}

// adminIn reports, for every thread of this process, whether
// CAP_SYS_ADMIN is in its set named field (CapEff, CapPrm, CapBnd).
func adminIn(field string) (map[string]bool, error) {
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(tasks) == 0 {
		return nil, fmt.Errorf("no threads: %v", err)
	}
	got := map[string]bool{}
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // a thread that ended
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, field+":"); ok {
				n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
				if err != nil {
					return nil, err
				}
				got[f] = n&(1<<unix.CAP_SYS_ADMIN) != 0
			}
		}
	}
	return got, nil
}

func capsChild() error {
	KeepAdminToItself(slog.New(slog.NewTextHandler(os.Stdout, nil)))
	if !canSetHostname() {
		return fmt.Errorf("after KeepAdminToItself the agent cannot set the hostname")
	}
	for _, c := range []struct {
		field string
		want  bool
	}{{"CapEff", false}, {"CapBnd", false}, {"CapPrm", true}} {
		got, err := adminIn(c.field)
		if err != nil {
			return err
		}
		for task, has := range got {
			if has != c.want {
				return fmt.Errorf("%s of %s has CAP_SYS_ADMIN: %v, want %v", c.field, task, has, c.want)
			}
		}
	}
	// Raised on the thread that uses it, and there only.
	var raised, others bool
	err := withAdmin(func() error {
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		var data [2]unix.CapUserData
		if err := unix.Capget(&hdr, &data[0]); err != nil {
			return err
		}
		raised = data[adminWord].Effective&adminBit != 0
		got, err := adminIn("CapEff")
		if err != nil {
			return err
		}
		n := 0
		for _, has := range got {
			if has {
				n++
			}
		}
		others = n > 1
		return nil
	})
	if err != nil || !raised || others {
		return fmt.Errorf("withAdmin: err %v, raised on its thread %v, on others too %v", err, raised, others)
	}
	// A thread that acted as the user and went back to root has its
	// permitted set effective again: not this capability.
	for range 4 {
		if err := asUser(func() error { return nil }); err != nil {
			return err
		}
		if err := asRealUser(agentproto.UserUID, agentproto.UserGID, func() {}); err != nil {
			return err
		}
	}
	if got, err := adminIn("CapEff"); err != nil {
		return err
	} else {
		for task, has := range got {
			if has {
				return fmt.Errorf("after withAdmin, asUser and asRealUser, %s has CAP_SYS_ADMIN effective", task)
			}
		}
	}
	// A command the agent starts as root has none of it.
	out, err := exec.Command("grep", "-E", "^Cap(Eff|Prm|Bnd)", "/proc/self/status").Output()
	if err != nil {
		return err
	}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		n, err := strconv.ParseUint(f[len(f)-1], 16, 64)
		if err != nil || n&(1<<unix.CAP_SYS_ADMIN) != 0 {
			return fmt.Errorf("a command started as root: %q", out)
		}
	}
	return nil
}

// TestAdminOnlyWhileSettingTheName: the agent keeps CAP_SYS_ADMIN out of
// its threads' effective sets and out of the bounding set, and raises it
// only on the thread that sets the hostname. It needs root, as the agent
// has in a sandbox, and a test binary built as the agent is, without cgo
// (AllThreadsSyscall refuses to run in a program with cgo).
func TestAdminOnlyWhileSettingTheName(t *testing.T) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); os.Geteuid() != 0 || err != nil || data[adminWord].Permitted&adminBit == 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("this test needs root with CAP_SYS_ADMIN under CI")
		}
		t.Skip("needs root with CAP_SYS_ADMIN")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "agent.test")
	build := exec.Command(goBin, "test", "-c", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the test without cgo: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), capsChildEnv+"=1")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "OK" {
		t.Fatalf("the child: %v\n%s", err, out)
	}
}
