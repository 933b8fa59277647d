package agent

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agent/jupyter"
	"github.com/pandastack/pandastack/internal/agentproto"
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

// A kernel's matplotlib directory is the sandbox's one, shared by its
// kernels (its font list built once), unless the context's environment
// names another.
func TestKernelOptionsMPLConfigDir(t *testing.T) {
	defer func(d string) { kernelMPLConfigDir = d }(kernelMPLConfigDir)
	kernelMPLConfigDir = filepath.Join(t.TempDir(), "matplotlib") // not the host's
	s := NewServer(Config{Home: t.TempDir()}, 1)
	mpl := func(env []string) []string {
		var got []string
		for _, kv := range env {
			if strings.HasPrefix(kv, "MPLCONFIGDIR=") {
				got = append(got, kv)
			}
		}
		return got
	}
	a := s.kernelOptions("python", []string{"python3"}, "c1", s.home, nil).Env
	b := s.kernelOptions("python", []string{"python3"}, "c2", s.home, nil).Env
	if want := []string{"MPLCONFIGDIR=" + kernelMPLConfigDir}; !slices.Equal(mpl(a), want) || !slices.Equal(mpl(b), want) {
		t.Errorf("two contexts' MPLCONFIGDIR: %q and %q, want %q for both", mpl(a), mpl(b), want)
	}
	own := s.kernelOptions("python", []string{"python3"}, "c3", s.home, map[string]string{"MPLCONFIGDIR": "/home/user/mpl"}).Env
	if want := []string{"MPLCONFIGDIR=/home/user/mpl"}; !slices.Equal(mpl(own), want) {
		t.Errorf("a context that names its own: %q, want %q", mpl(own), want)
	}
}

// The shared matplotlib directory is used while it is missing or a
// directory of the sandbox user's; otherwise (root's, a file, a link) a
// context gets its own beside it.
func TestMPLConfigDir(t *testing.T) {
	root := t.TempDir()
	shared := filepath.Join(root, "matplotlib")
	if got := mplConfigDir(shared, "c1"); got != shared {
		t.Errorf("missing: %s, want %s", got, shared)
	}
	if err := os.Mkdir(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	user := os.Getuid()
	if runningAsRoot() {
		user = agentproto.UserUID
		if err := os.Lchown(shared, user, user); err != nil {
			t.Fatal(err)
		}
	}
	if got := mplConfigDir(shared, "c1"); got != shared {
		t.Errorf("the user's directory: %s, want %s", got, shared)
	}
	own := shared + "-c1"
	// A lock of matplotlib's: fresh, a kernel writing the list; stale, one
	// left by a kernel killed while it wrote.
	lock := filepath.Join(shared, "fontlist-v390.json.matplotlib-lock")
	if err := os.WriteFile(lock, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := mplConfigDir(shared, "c1"); got != shared {
		t.Errorf("with a fresh lock: %s, want %s", got, shared)
	}
	old := time.Now().Add(-time.Minute)
	os.Chtimes(lock, old, old)
	if got := mplConfigDir(shared, "c1"); got != own {
		t.Errorf("with a stale lock: %s, want %s", got, own)
	}
	os.Remove(lock)
	if runningAsRoot() {
		if err := os.Lchown(shared, 0, 0); err != nil {
			t.Fatal(err)
		}
		if got := mplConfigDir(shared, "c1"); got != own {
			t.Errorf("root's directory: %s, want %s", got, own)
		}
	}
	os.Remove(shared)
	target := filepath.Join(root, "elsewhere")
	os.Mkdir(target, 0o755)
	os.Lchown(target, user, user)
	if err := os.Symlink(target, shared); err != nil {
		t.Fatal(err)
	}
	if got := mplConfigDir(shared, "c1"); got != own {
		t.Errorf("a link to a directory: %s, want %s", got, own)
	}
	os.Remove(shared)
	os.WriteFile(shared, nil, 0o644)
	os.Lchown(shared, user, user)
	if got := mplConfigDir(shared, "c1"); got != own {
		t.Errorf("a file: %s, want %s", got, own)
	}
}

// The kernelspec of ipykernel's wheel runs "python", which Debian lacks:
// such a spec gets python3; any other command is left as it is.
func TestWithPython(t *testing.T) {
	has := func(names ...string) func(string) (string, error) {
		return func(n string) (string, error) {
			if slices.Contains(names, n) {
				return "/usr/bin/" + n, nil
			}
			return "", errors.New("not found")
		}
	}
	spec := []string{"python", "-m", "ipykernel_launcher", "-f", "{connection_file}"}
	for _, c := range []struct {
		argv  []string
		found []string
		want  string
	}{
		{spec, []string{"python3"}, "python3"},
		{spec, []string{"python", "python3"}, "python"},
		{spec, nil, "python"}, // nothing better: its own error says what is missing
		{[]string{"/opt/venv/bin/python", "-m", "ipykernel_launcher"}, []string{"python3"}, "/opt/venv/bin/python"},
		{[]string{"deno", "jupyter", "--kernel"}, []string{"python3"}, "deno"},
	} {
		got := withPython(c.argv, has(c.found...))
		if got[0] != c.want || !slices.Equal(got[1:], c.argv[1:]) {
			t.Errorf("withPython(%q) with %v on PATH = %q, want %s first", c.argv, c.found, got, c.want)
		}
	}
}

// A kernel's program is looked for on the sandbox's PATH, then on the
// default one.
func TestKernelLookPath(t *testing.T) {
	own := t.TempDir()
	if err := os.WriteFile(filepath.Join(own, "sh"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if p, err := kernelLookPath("sh", own, "/"); err != nil || p != filepath.Join(own, "sh") {
		t.Errorf("on the sandbox's PATH: %q %v", p, err)
	}
	if p, err := kernelLookPath("true", own, "/"); err != nil || !strings.HasSuffix(p, "/true") {
		t.Errorf("on the default PATH only: %q %v", p, err)
	}
	if _, err := kernelLookPath("no-such-kernel-program", own, "/"); err == nil || !strings.Contains(err.Error(), own) {
		t.Errorf("nowhere: %v, want the sandbox's PATH named", err)
	}
}

// A bash kernel whose PATH has no bash finds one on the default PATH, and
// its shell gets the sandbox's PATH back.
func TestKernelOptionsBashPath(t *testing.T) {
	s := NewServer(Config{Home: t.TempDir()}, 1)
	argv := []string{"python3", "-m", "bash_kernel"}
	o := s.kernelOptions("bash", argv, "c1", s.home, map[string]string{"PATH": "/nowhere"})
	if !slices.Contains(o.Env, "PATH=/nowhere:"+defaultPath) || o.SetupCode != "export PATH='/nowhere'\n" {
		t.Errorf("PATH=/nowhere: env %q, setup %q", o.Env, o.SetupCode)
	}
	o = s.kernelOptions("bash", argv, "c2", s.home, map[string]string{"PATH": "/usr/bin:/bin"})
	if !slices.Contains(o.Env, "PATH=/usr/bin:/bin") || o.SetupCode != "" {
		t.Errorf("a PATH with bash: env %q, setup %q", o.Env, o.SetupCode)
	}
}
