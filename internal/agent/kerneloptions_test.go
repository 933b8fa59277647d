package agent

import (
	"slices"
	"testing"

	"github.com/pandastack/pandastack/internal/agent/jupyter"
)

// Python kernels start through the agent's launcher; other kernels with
// their kernelspec's command as is.
func TestKernelOptionsArgv(t *testing.T) {
	s := NewServer(Config{Home: t.TempDir()}, 1)
	spec := []string{"/usr/bin/python3", "-Xfrozen_modules=off", "-m", "ipykernel_launcher", "-f", "{connection_file}"}
	got := s.kernelOptions("python", spec, "c1", s.home, nil).Argv
	if want := jupyter.PythonLauncherArgv(spec); !slices.Equal(got, want) || slices.Contains(got, "ipykernel_launcher") {
		t.Errorf("python argv %q", got)
	}
	bash := []string{"/usr/bin/python3", "-m", "bash_kernel", "-f", "{connection_file}"}
	if got := s.kernelOptions("bash", bash, "c2", s.home, nil).Argv; !slices.Equal(got, bash) {
		t.Errorf("bash argv %q", got)
	}
}
