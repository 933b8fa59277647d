//go:build pandastack_generated

// This test runs only inside the gVisor copy, after the generator wrote its
// files there (scripts/setup.sh: go test -tags pandastack_generated). It
// checks each precompiled program against the program runsc builds when it
// finds none: the same rules compiled at run time for the same options and
// the same run-time values must give the very same BPF instructions.

package main

import (
	"bytes"
	"os"
	"runtime"
	"syscall"
	"testing"

	"gvisor.dev/gvisor/pkg/bpf"
	"gvisor.dev/gvisor/pkg/seccomp"
	"gvisor.dev/gvisor/pkg/seccomp/precompiledseccomp"
	"gvisor.dev/gvisor/pkg/sentry/platform/systrap"
	"gvisor.dev/gvisor/pkg/sentry/state/stateio"
	sentryfilter "gvisor.dev/gvisor/runsc/boot/filter"
	sentryconfig "gvisor.dev/gvisor/runsc/boot/filter/config"
	goferfilter "gvisor.dev/gvisor/runsc/fsgofer/filter"
	goferconfig "gvisor.dev/gvisor/runsc/fsgofer/filter/config"
)

// check fails the test unless the program precompiled for key (looked up
// with get), rendered with the run-time values vars, encodes the same
// instructions as prog, the program runsc builds at run time.
func check(t *testing.T, key string, get func(string) (precompiledseccomp.Program, bool), vars precompiledseccomp.Values, prog *seccomp.Program) {
	t.Helper()
	p, ok := get(key)
	if !ok {
		t.Fatalf("no precompiled program for %s", key)
	}
	got, err := p.RenderInstructions(vars)
	if err != nil {
		t.Fatalf("%s: render: %v", key, err)
	}
	want, _, err := prog.Build()
	if err != nil {
		t.Fatalf("%s: build: %v", key, err)
	}
	if !bytes.Equal(bpf.ToBytecode(got), bpf.ToBytecode(want)) {
		t.Errorf("%s: the precompiled program (%d instructions) differs from the one built at run time (%d instructions)", key, len(got), len(want))
	}
}

func bools() []bool { return []bool{false, true} }

func TestSentryProgramsMatchRuntimeBuild(t *testing.T) {
	if sentryfilter.PrecompilationDisabledAtBuildTime {
		t.Fatal("runsc/boot/filter has no precompiled programs: run the generator first")
	}
	checked := map[string]bool{}
	// Every variant the generator keeps: systrap, each network mode
	// (netstack, which --network=sandbox and --network=none both use; host;
	// host with raw sockets), directfs on and off. Two controller FDs show
	// that the run-time value lands where it should.
	for _, net := range []struct{ host, raw bool }{{false, false}, {true, false}, {true, true}} {
		for _, directfs := range bools() {
			for _, fd := range []uint32{5, 1234} {
				opt := sentryconfig.Options{
					Platform:              (*systrap.Systrap)(nil).SeccompInfo(),
					HostNetwork:           net.host,
					HostNetworkRawSockets: net.raw,
					HostFilesystem:        directfs,
					ControllerFD:          fd,
				}
				key := opt.ConfigKey()
				rules, deny := sentryconfig.Rules(opt)
				check(t, key, sentryfilter.GetPrecompiled, opt.Vars(), &seccomp.Program{
					RuleSets: []seccomp.RuleSet{{Rules: deny}, {Rules: rules, Action: seccomp.Allow}},
					Options:  sentryconfig.SeccompOptions(opt),
				})
				checked[key] = true
			}
		}
	}
	if n := len(sentryfilter.ListPrecompiled()); n != len(checked) {
		t.Errorf("%d sentry programs precompiled, %d checked: every program must be checked", n, len(checked))
	}
}

func TestGoferProgramsMatchRuntimeBuild(t *testing.T) {
	if goferfilter.PrecompilationDisabledAtBuildTime {
		t.Fatal("runsc/fsgofer/filter has no precompiled programs: run the generator first")
	}
	checked := map[string]bool{}
	for _, udsOpen := range bools() {
		for _, udsCreate := range bools() {
			for _, directfs := range bools() {
				for _, lisafs := range bools() {
					for _, cgo := range bools() {
						opt := goferconfig.Options{UDSOpenEnabled: udsOpen, UDSCreateEnabled: udsCreate, DirectFS: directfs, LisafsNeeded: lisafs, CgoEnabled: cgo}
						key := opt.ConfigKey()
						rules, deny := goferconfig.Rules(opt)
						check(t, key, goferfilter.GetPrecompiled, opt.Vars(), &seccomp.Program{
							RuleSets: []seccomp.RuleSet{{Rules: deny}, {Rules: rules, Action: seccomp.Allow}},
						})
						checked[key] = true
					}
				}
			}
		}
	}
	if n := len(goferfilter.ListPrecompiled()); n != len(checked) {
		t.Errorf("%d gofer programs precompiled, %d checked: every program must be checked", n, len(checked))
	}
}

// TestPagesFileReadsFollowTheCPUs: the runsc built beside this test reads a
// restore's pages file with one read fewer than the host has CPUs at once
// (pagesEdits), not gVisor's 128.
func TestPagesFileReadsFollowTheCPUs(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "pages")
	if err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Dup(int(f.Fd())) // the reader owns and closes it
	if err != nil {
		t.Fatal(err)
	}
	r := stateio.NewPagesFileFDReaderDefault(int32(fd))
	defer r.Close()
	if got, want := r.MaxParallel(), max(1, runtime.NumCPU()-1); got != min(want, 128) {
		t.Fatalf("the pages file reader runs %d reads at once, want %d", got, min(want, 128))
	}
}
