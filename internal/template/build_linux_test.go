package template

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/paths"
	"github.com/pandastack/pandastack/internal/testutil"
)

// The build tests share paths.CacheDir() so the debootstrap stage is made
// once per machine; each spec carries a nonce so every run builds afresh,
// and each test removes its own template dir (never the stage).

func nonce(t *testing.T) string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// hostMountsUnder reads the test process's mount table directly, apart from
// the code under test.
func hostMountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && strings.HasPrefix(fields[4], dir) {
			out = append(out, fields[4])
		}
	}
	return out
}

// assertNoLeftovers checks that no build dir of name and no mount under the
// templates cache remain.
func assertNoLeftovers(t *testing.T, cache, name string) {
	t.Helper()
	root := filepath.Join(cache, templatesDir)
	if m := hostMountsUnder(t, root); len(m) > 0 {
		t.Errorf("still mounted: %v", m)
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".build."+name+".") || strings.HasPrefix(e.Name(), ".old."+name+".") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

func baseSpec(t *testing.T) Spec {
	r, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Get("base")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// syncWriter collects progress from concurrent builds and reports when a
// line containing want appears.
type syncWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *syncWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(b)
	if w.want != "" && strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(b), nil
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// requireBuild needs root and debootstrap, and skips in -short mode: the
// first build on a machine runs debootstrap (about 30 s with a fast mirror).
func requireBuild(t *testing.T) {
	t.Helper()
	testutil.RequireDebootstrap(t)
	if testing.Short() {
		t.Skip("skipping a real template build in -short mode")
	}
}

func TestBuild(t *testing.T) {
	requireBuild(t)
	cache := paths.CacheDir()
	n := nonce(t)
	spec := baseSpec(t)
	spec.Name = "buildtest"
	spec.Files = []File{{Path: "/opt/pandastack/marker", Content: "marker " + n + "\n"}, {Path: "/home/user/.config/app/settings.ini", Content: "a=1\n"}}
	spec.Run = []string{"cp /opt/pandastack/marker /etc/marker-copy && chown user:user /etc/marker-copy"}

	out := &syncWriter{}
	start := time.Now()
	b, err := Build(context.Background(), spec, BuildOptions{CacheDir: cache, Progress: out})
	t.Logf("progress:\n%s", out)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Remove(b); err != nil {
			t.Error(err)
		}
	})
	t.Logf("built in %s, %d bytes", time.Since(start), b.SizeBytes)

	if b.Dir != Dir(cache, spec) || b.RootFS != filepath.Join(b.Dir, "rootfs") || b.Hash != spec.Hash() {
		t.Errorf("Built = %+v", b)
	}
	for _, want := range []string{"apt-get install python3", "run: cp /opt/pandastack/marker", "done in", "template buildtest built in"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("progress lacks %q", want)
		}
	}
	if got, _ := os.ReadFile(filepath.Join(b.RootFS, "opt/pandastack/marker")); string(got) != "marker "+n+"\n" {
		t.Errorf("marker = %q", got)
	}
	if st, err := os.Stat(filepath.Join(b.RootFS, "opt/pandastack/marker")); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("marker mode: %v %v", st.Mode(), err)
	}
	st, err := os.Stat(filepath.Join(b.RootFS, "etc/marker-copy"))
	if err != nil || st.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Errorf("run command's output: %v (want owned by uid 1000 via the name user)", err)
	}
	// A file under the user's home, and the directories made for it, are
	// the user's: a sandbox can edit them.
	for _, p := range []string{"home/user/.config", "home/user/.config/app", "home/user/.config/app/settings.ini"} {
		if st, err := os.Lstat(filepath.Join(b.RootFS, p)); err != nil || st.Sys().(*syscall.Stat_t).Uid != 1000 || st.Sys().(*syscall.Stat_t).Gid != 1000 {
			t.Errorf("/%s not owned by 1000:1000: %v", p, err)
		}
	}
	passwd, _ := os.ReadFile(filepath.Join(b.RootFS, "etc/passwd"))
	if !strings.Contains(string(passwd), "\nuser:x:1000:1000::/home/user:/bin/bash\n") {
		t.Errorf("no user 1000 in /etc/passwd:\n%s", passwd)
	}
	if st, err := os.Stat(filepath.Join(b.RootFS, "home/user")); err != nil || st.Sys().(*syscall.Stat_t).Uid != 1000 || st.Sys().(*syscall.Stat_t).Gid != 1000 {
		t.Errorf("/home/user not owned by 1000:1000: %v", err)
	}
	if st, err := os.Lstat(filepath.Join(b.RootFS, "tmp")); err != nil || st.Mode() != fs.ModeDir|fs.ModeSticky|0o777 {
		t.Errorf("/tmp mode = %v, %v; want drwxrwxrwt", st.Mode(), err)
	}
	if _, err := os.Stat(filepath.Join(b.RootFS, "usr/bin/python3")); err != nil {
		t.Errorf("python3: %v", err)
	}
	if lists, _ := filepath.Glob(filepath.Join(b.RootFS, "var/lib/apt/lists/*_Packages")); len(lists) > 0 {
		t.Errorf("apt lists left: %v", lists)
	}
	if m := hostMountsUnder(t, b.Dir); len(m) > 0 {
		t.Errorf("mounted under the build: %v", m)
	}
	assertNoLeftovers(t, cache, spec.Name)

	// The second build is the first one, from the cache.
	out2 := &syncWriter{}
	start = time.Now()
	b2, err := Build(context.Background(), spec, BuildOptions{CacheDir: cache, Progress: out2})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("cached build took %s", took)
	}
	if !strings.Contains(out2.String(), "template buildtest is cached") || b2.BuiltAt != b.BuiltAt {
		t.Errorf("second build not cached: %q %+v", out2, b2)
	}
	if l, ok := Lookup(cache, spec); !ok || l.RootFS != b.RootFS || l.SizeBytes != b.SizeBytes {
		t.Errorf("Lookup = %+v, %v", l, ok)
	}
	spec.Run = append(spec.Run, "true")
	if _, ok := Lookup(cache, spec); ok {
		t.Error("Lookup found a build of a different spec")
	}
	all, err := ListBuilt(cache)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, x := range all {
		found = found || x.Dir == b.Dir
	}
	if !found {
		t.Errorf("ListBuilt lacks %s: %+v", b.Dir, all)
	}
}

// TestBuildChrootSeesNotTheHost: commands in the build chroot see a proc of
// their own PID namespace, with /proc/sys read-only and sysrq masked; they
// saw the host's proc, so a run step or a package script could set the
// host's sysctls and read every host process (probe O). The writes tried
// here change nothing even where they are allowed: the hostname is written
// back as it is.
func TestBuildChrootSeesNotTheHost(t *testing.T) {
	requireBuild(t)
	cache := paths.CacheDir()
	spec := cheapSpec(t, "chroottest",
		`ls -d /proc/[0-9]* | wc -l > /proc-pids`,
		`h=$(cat /proc/sys/kernel/hostname); if (echo "$h" > /proc/sys/kernel/hostname) 2>/dev/null; then echo writable; else echo read-only; fi > /proc-sys`,
		`if [ -c /proc/sysrq-trigger ] || [ ! -e /proc/sysrq-trigger ]; then echo masked; else echo open; fi > /proc-sysrq`,
		`cat /proc/1/cmdline | tr '\0' ' ' > /proc-init`,
	)
	b, err := Build(context.Background(), spec, BuildOptions{CacheDir: cache, Progress: io.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Remove(b) })
	read := func(name string) string {
		got, err := os.ReadFile(filepath.Join(b.RootFS, name))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(got))
	}
	if n, err := strconv.Atoi(read("proc-pids")); err != nil || n > 5 {
		t.Errorf("the chroot's /proc lists %q processes; want the few of its own namespace", read("proc-pids"))
	}
	if got := read("proc-init"); !strings.HasPrefix(got, "/bin/sh -c ") {
		t.Errorf("PID 1 in the chroot is %q, want the command's own shell", got)
	}
	if got := read("proc-sys"); got != "read-only" {
		t.Errorf("/proc/sys in the chroot is %s", got)
	}
	if got := read("proc-sysrq"); got != "masked" {
		t.Errorf("/proc/sysrq-trigger in the chroot is %s", got)
	}
	if m := hostMountsUnder(t, b.Dir); len(m) > 0 {
		t.Errorf("mounted under the build: %v", m)
	}
	assertNoLeftovers(t, cache, spec.Name)
}

// cheapSpec builds without apt: only the stage copy and the chroot steps.
func cheapSpec(t *testing.T, name string, run ...string) Spec {
	return Spec{Name: name, Files: []File{{Path: "/nonce", Content: nonce(t)}}, Run: run}
}

func TestBuildFailureCleansUp(t *testing.T) {
	requireBuild(t)
	cache := paths.CacheDir()
	spec := cheapSpec(t, "failtest", "echo first line; echo the-reason-it-failed >&2; exit 3")
	_, err := Build(context.Background(), spec, BuildOptions{CacheDir: cache})
	if err == nil {
		t.Fatal("build with a failing run command succeeded")
	}
	t.Logf("error: %v", err)
	for _, want := range []string{"build template failtest", "run: echo first line", "exit status 3", "the-reason-it-failed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if _, err := os.Stat(Dir(cache, spec)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("failed build left %s: %v", Dir(cache, spec), err)
	}
	assertNoLeftovers(t, cache, spec.Name)
}

func TestBuildCancel(t *testing.T) {
	requireBuild(t)
	cache := paths.CacheDir()
	// An odd duration identifies our sleep among the host's processes.
	spec := cheapSpec(t, "canceltest", "sleep 987.654 & sleep 987.654")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &syncWriter{want: "run: sleep", seen: make(chan struct{})}
	errc := make(chan error, 1)
	go func() {
		_, err := Build(ctx, spec, BuildOptions{CacheDir: cache, Progress: out})
		errc <- err
	}()
	select {
	case <-out.seen:
	case err := <-errc:
		t.Fatalf("build ended before its run step: %v\n%s", err, out)
	case <-time.After(5 * time.Minute):
		t.Fatalf("run step never started:\n%s", out)
	}
	time.Sleep(500 * time.Millisecond) // let the sleeps start
	cancel()
	start := time.Now()
	err := <-errc
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled build returned %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("cancel took %s", took)
	}
	if !strings.Contains(out.String(), "interrupted after") || !strings.HasSuffix(err.Error(), ": interrupted") {
		t.Errorf("progress or error does not say interrupted: %v\n%s", err, out)
	}
	assertNoLeftovers(t, cache, spec.Name)
	// Both sleeps, the backgrounded one too, died with the step.
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, _ := os.ReadFile(p); bytes.Contains(b, []byte("987.654")) {
			t.Errorf("process left running: %s %q", p, b)
		}
	}
}

func TestConcurrentBuildsShareOne(t *testing.T) {
	requireBuild(t)
	cache := paths.CacheDir()
	spec := cheapSpec(t, "locktest", "sleep 2")
	out := &syncWriter{}
	var wg sync.WaitGroup
	results := make([]Built, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = Build(context.Background(), spec, BuildOptions{CacheDir: cache, Progress: out})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	defer Remove(results[0])
	if results[0].Dir != results[1].Dir || !results[0].BuiltAt.Equal(results[1].BuiltAt) {
		t.Errorf("two builds: %+v %+v", results[0], results[1])
	}
	if s := out.String(); !strings.Contains(s, "waiting for another build of template locktest") || !strings.Contains(s, "is cached") {
		t.Errorf("the second builder did not wait and reuse:\n%s", s)
	}
	assertNoLeftovers(t, cache, spec.Name)
}

func TestForceRebuilds(t *testing.T) {
	requireBuild(t)
	cache := paths.CacheDir()
	spec := cheapSpec(t, "forcetest")
	b1, err := Build(context.Background(), spec, BuildOptions{CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	b2, err := Build(context.Background(), spec, BuildOptions{CacheDir: cache, Force: true})
	if err != nil {
		t.Fatal(err)
	}
	defer Remove(b2)
	if b2.Dir != b1.Dir || !b2.BuiltAt.After(b1.BuiltAt) {
		t.Errorf("forced build did not replace the first: %v %v", b1.BuiltAt, b2.BuiltAt)
	}
	assertNoLeftovers(t, cache, spec.Name)
}

func TestMountNamespaceIsPrivate(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	err := inMountNS(func() error {
		undo, err := mountBuildFS(dir)
		if err != nil {
			return err
		}
		inside, err := mountsUnder(dir)
		if err != nil || len(inside) != 3 {
			t.Errorf("inside the namespace: %v %v, want sys, dev, dev/pts", inside, err)
		}
		if m := hostMountsUnder(t, dir); len(m) > 0 {
			t.Errorf("the host sees the build mounts: %v", m)
		}
		// The builder's proc would be the host's; each command mounts its own.
		if _, err := os.Stat(filepath.Join(dir, "proc/self/status")); err == nil {
			t.Error("the builder mounted a proc (the host's) in the chroot")
		}
		return undo()
	})
	if err != nil {
		t.Fatal(err)
	}
	if m, _ := mountsUnder(dir); len(m) > 0 {
		t.Errorf("left mounted: %v", m)
	}
}

func TestRemoveStale(t *testing.T) {
	cache := t.TempDir()
	root := filepath.Join(cache, templatesDir)
	for _, d := range []string{".build.gone.1/rootfs/etc", ".old.gone.2", ".build.held.3", "stages/.tmp.bookworm-abc.4/usr", "stages/.tmp.v1.5-abc.6/usr", "kept-0123456789abcdef/rootfs"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	unlock, err := lockFile(context.Background(), filepath.Join(root, ".held.lock"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	// A stage whose suite has a dot in it, being made by another builder.
	unlockStage, err := lockFile(context.Background(), filepath.Join(root, "stages", ".v1.5-abc.lock"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer unlockStage()
	// The dry run lists what the removal removes: not what a build under
	// way holds.
	would, err := RemoveStale(cache, true)
	var wouldNames []string
	for _, l := range would {
		wouldNames = append(wouldNames, strings.TrimPrefix(l.Dir, root+"/"))
	}
	slices.Sort(wouldNames)
	if want := []string{".build.gone.1", ".old.gone.2", "stages/.tmp.bookworm-abc.4"}; err != nil || !slices.Equal(wouldNames, want) {
		t.Fatalf("dry run: %q %v, want %q", wouldNames, err, want)
	}
	if _, err := os.Stat(filepath.Join(root, ".gone.lock")); !os.IsNotExist(err) {
		t.Errorf("the dry run made a lock file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, ".old.gone.2")); err != nil {
		t.Fatalf("the dry run removed: %v", err)
	}
	removed, err := RemoveStale(cache, false)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range removed {
		names = append(names, strings.TrimPrefix(l.Dir, root+"/"))
	}
	slices.Sort(names)
	if want := []string{".build.gone.1", ".old.gone.2", "stages/.tmp.bookworm-abc.4"}; !slices.Equal(names, want) {
		t.Errorf("removed %q, want %q", names, want)
	}
	for d, want := range map[string]bool{
		".build.gone.1": false, ".old.gone.2": false, "stages/.tmp.bookworm-abc.4": false,
		".build.held.3": true, "kept-0123456789abcdef": true, "stages/.tmp.v1.5-abc.6": true,
	} {
		if _, err := os.Stat(filepath.Join(root, d)); (err == nil) != want {
			t.Errorf("%s: exists=%v, want %v", d, err == nil, want)
		}
	}
}

// TestBuildPip installs from PyPI through the host's network settings (CA
// bundle, proxies), which the template must not keep.
func TestBuildPip(t *testing.T) {
	requireBuild(t)
	cache := paths.CacheDir()
	spec := Spec{
		Name: "piptest",
		Apt:  []string{"python3"},
		Pip:  []string{"six==1.16.0"},
		Run:  []string{"python3 -c 'import six; print(six.__version__)' > /six-version"},
	}
	spec.Files = []File{{Path: "/nonce", Content: nonce(t)}}
	b, err := Build(context.Background(), spec, BuildOptions{CacheDir: cache})
	if err != nil {
		t.Fatal(err)
	}
	defer Remove(b)
	if v, _ := os.ReadFile(filepath.Join(b.RootFS, "six-version")); string(v) != "1.16.0\n" {
		t.Errorf("six version file = %q", v)
	}
	if _, err := os.Stat(filepath.Join(b.RootFS, buildCA)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the build's CA bundle stayed in the template: %v", err)
	}
	assertNoLeftovers(t, cache, spec.Name)
}

// A build interrupted while another build of its template holds the lock
// says it was interrupted waiting, as one interrupted in a step says it
// was interrupted, not Go's "context canceled"; it still unwraps to the
// context's error.
func TestLockWaitInterrupted(t *testing.T) {
	path := filepath.Join(t.TempDir(), ".t.lock")
	unlock, err := lockFile(context.Background(), path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	ctx, cancel := context.WithCancel(context.Background())
	_, err = lockFile(ctx, path, cancel) // told it waits: interrupted then
	if err == nil || err.Error() != "waiting for another build: interrupted" || !errors.Is(err, context.Canceled) {
		t.Fatalf("interrupted while waiting: %v", err)
	}
}
