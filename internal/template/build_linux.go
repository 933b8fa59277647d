package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"
)

// chrootEnv is the whole environment of commands in the chroot, so nothing
// of the host's environment changes what gets built.
var chrootEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/root",
	"LANG=C.UTF-8",
	"DEBIAN_FRONTEND=noninteractive",
	"PIP_DISABLE_PIP_VERSION_CHECK=1",
	"PIP_ROOT_USER_ACTION=ignore",
	// Same as --break-system-packages, but older pips ignore it instead of failing.
	"PIP_BREAK_SYSTEM_PACKAGES=1",
}

// buildCA is where the host's CA bundle goes in the chroot during a build;
// the clean-up step empties /tmp.
const buildCA = "/tmp/.pandastack-build-ca.crt"

// buildEnv is chrootEnv plus what lets commands reach the network the way
// the host does: its proxy settings and, when it has one, its CA bundle (a
// host behind a TLS-inspecting proxy trusts a CA the template does not).
// Neither stays in the template.
func buildEnv(withCA bool) []string {
	env := slices.Clone(chrootEnv)
	for _, k := range []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	if withCA {
		for _, k := range []string{"SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"} {
			env = append(env, k+"="+buildCA)
		}
	}
	return env
}

// hostCABundle returns the host's CA bundle, or nil.
func hostCABundle() []byte {
	for _, p := range []string{os.Getenv("SSL_CERT_FILE"), "/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"} {
		if p == "" {
			continue
		}
		if b, err := os.ReadFile(p); err == nil && len(b) > 0 {
			return b
		}
	}
	return nil
}

// aptOpts are apt-get's options for upgrade and install.
var aptOpts = []string{"-q", "-y", "--no-install-recommends", "-o", "Acquire::Retries=3",
	"-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"}

// errorLines is how much of a failed command's output its error carries.
const errorLines = 30

// Build makes spec's root filesystem under opts.CacheDir and returns it: a
// copy of the debootstrap stage, then in a chroot apt-get update, upgrade and
// install, pip install, user "user" (1000:1000), files, run commands, clean
// up. A finished build with the same hash is returned at once (unless opts.Force).
// Builds of one name are serialised with a lock file, so a second builder
// waits and then finds the first one's result. Build needs root and
// debootstrap; a fresh build takes minutes (the debootstrap stage is cached
// per suite and mirror). Cancelling ctx kills the running command; a failed or
// cancelled build leaves no mounts, processes or directories behind.
func Build(ctx context.Context, spec Spec, opts BuildOptions) (Built, error) {
	spec, err := spec.complete()
	if err != nil {
		return Built{}, err
	}
	if opts.CacheDir == "" {
		return Built{}, fmt.Errorf("build template %s: no cache directory", spec.Name)
	}
	cache, err := filepath.Abs(opts.CacheDir)
	if err != nil {
		return Built{}, fmt.Errorf("build template %s: %w", spec.Name, err)
	}
	mirrors, err := opts.mirrors(spec)
	if err != nil {
		return Built{}, fmt.Errorf("build template %s: %w", spec.Name, err)
	}
	p := newProgress(opts.Progress)
	if b, ok := Lookup(cache, spec); ok && !opts.Force {
		p.line("%s", cachedLine(b))
		return b, nil
	}
	if os.Geteuid() != 0 {
		return Built{}, fmt.Errorf("build template %s: needs root (debootstrap, chroot and mounts)", spec.Name)
	}
	root := filepath.Join(cache, templatesDir)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return Built{}, fmt.Errorf("build template %s: %w", spec.Name, err)
	}
	unlock, err := lockFile(ctx, filepath.Join(root, "."+spec.Name+".lock"), func() {
		p.line("waiting for another build of template %s", spec.Name)
	})
	if err != nil {
		return Built{}, fmt.Errorf("build template %s: %w", spec.Name, err)
	}
	defer unlock()
	if b, ok := Lookup(cache, spec); ok && !opts.Force {
		p.line("%s", cachedLine(b))
		return b, nil
	}
	b := &builder{spec: spec, hash: spec.Hash(), cache: cache, mirror: mirrors.Debian, security: mirrors.Security, p: p, ca: hostCABundle()}
	b.env = append(buildEnv(b.ca != nil), hostPipEnv("/etc", os.Getenv("HOME"), os.Getenv)...)
	b.aptProxy = hostAptProxyOpts("/etc")
	built, err := b.build(ctx)
	if err != nil {
		return Built{}, fmt.Errorf("build template %s: %w", spec.Name, err)
	}
	return built, nil
}

func cachedLine(b Built) string {
	return fmt.Sprintf("template %s is cached: %s (%s, built %s in %.1fs)",
		b.Name, b.RootFS, fmtSize(b.SizeBytes), b.BuiltAt.Local().Format(time.DateTime), b.BuildSeconds)
}

type builder struct {
	spec   Spec
	hash   string
	cache  string // absolute
	mirror string
	// security is the archive of the suite's security updates ("" for
	// none): apt-get upgrade and install take them.
	security string
	p        *progress
	ca       []byte   // the host's CA bundle, or nil
	env      []string // of commands in the chroot
	aptProxy []string // apt-get options for the host's apt proxies (hostindex.go)
	// record, when set (a test's), is told each command instead of its
	// run: chrooted or not, the program, its arguments and its input.
	record func(chroot bool, name string, args []string, stdin []byte)
}

type buildStep struct {
	title string
	run   func(ctx context.Context, rootfs string) error
}

func (b *builder) build(ctx context.Context) (Built, error) {
	start := time.Now()
	root := filepath.Join(b.cache, templatesDir)
	// Leftovers of crashed builds of this name; the lock says none is running.
	b.removeStale(root, ".build."+b.spec.Name+".")
	b.removeStale(root, ".old."+b.spec.Name+".")

	steps := b.chrootSteps()
	b.p.total = 2 + len(steps)
	stage, err := b.ensureStage(ctx)
	if err != nil {
		return Built{}, err
	}

	tmp, err := os.MkdirTemp(root, ".build."+b.spec.Name+".")
	if err != nil {
		return Built{}, err
	}
	done := false
	defer func() {
		if !done {
			if err := removeTree(tmp); err != nil {
				b.p.line("warning: %v", err)
			}
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Built{}, err
	}
	rootfs := filepath.Join(tmp, rootfsDir)
	err = b.step(ctx, "copy stage", rootfs, func() error {
		return b.command(ctx, "", nil, "cp", "-a", "--reflink=auto", stage, rootfs)
	})
	if err != nil {
		return Built{}, err
	}

	err = inMountNS(func() (err error) {
		undo, err := mountBuildFS(rootfs)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, undo()) }()
		for _, s := range steps {
			if err := b.step(ctx, s.title, rootfs, func() error { return s.run(ctx, rootfs) }); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return Built{}, err
	}
	if left, err := mountsUnder(rootfs); err != nil || len(left) > 0 {
		return Built{}, fmt.Errorf("mounts left under the rootfs: %v %v", left, err)
	}

	built := Built{
		Name:         b.spec.Name,
		Hash:         b.hash,
		SizeBytes:    dirSize(rootfs),
		BuildSeconds: time.Since(start).Seconds(),
		BuiltAt:      time.Now().UTC(),
		BuildID:      newBuildID(),
		Spec:         b.spec,
	}
	syncFS()
	data, err := json.MarshalIndent(built, "", "  ")
	if err != nil {
		return Built{}, err
	}
	if err := writeFileSync(filepath.Join(tmp, markerFile), append(data, '\n')); err != nil {
		return Built{}, err
	}
	final := Dir(b.cache, b.spec)
	old := ""
	if _, err := os.Lstat(final); err == nil {
		// Forced rebuild (or a damaged build): move the old one aside first,
		// since rename cannot replace a non-empty directory.
		old = filepath.Join(root, fmt.Sprintf(".old.%s.%d", b.spec.Name, time.Now().UnixNano()))
		if err := os.Rename(final, old); err != nil {
			return Built{}, err
		}
	}
	if err := os.Rename(tmp, final); err != nil {
		if old != "" {
			os.Rename(old, final)
		}
		return Built{}, err
	}
	done = true
	if old != "" {
		if err := removeTree(old); errors.Is(err, errInUse) {
			b.p.line("the previous build stays at %s while a running sandbox uses it; the next start of serve, or `pandastack template gc`, removes it once nothing does", old)
		} else if err != nil {
			b.p.line("warning: %v", err)
		}
	}
	built.Dir = final
	built.RootFS = filepath.Join(final, rootfsDir)
	b.p.line("template %s built in %.1fs: %s (%s)", built.Name, built.BuildSeconds, built.RootFS, fmtSize(built.SizeBytes))
	return built, nil
}

// ensureStage returns the pristine debootstrap output for the spec's suite
// and mirror, making it once: it is built in a temp dir and renamed into
// place, so its presence means it is complete.
func (b *builder) ensureStage(ctx context.Context) (string, error) {
	sum := sha256.Sum256([]byte(strings.Join([]string{stageVersion, b.spec.Suite, b.mirror, runtime.GOARCH}, "\n")))
	name := b.spec.Suite + "-" + hex.EncodeToString(sum[:])[:12]
	dir := filepath.Join(b.cache, templatesDir, stagesDir)
	final := filepath.Join(dir, name)
	title := "debootstrap " + b.spec.Suite
	cached := func() bool {
		if _, err := os.Stat(final); err != nil {
			return false
		}
		b.p.begin(title)
		b.p.end("cached (" + final + ")")
		return true
	}
	if cached() {
		return final, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	unlock, err := lockFile(ctx, filepath.Join(dir, "."+name+".lock"), func() {
		b.p.line("waiting for another debootstrap of %s", b.spec.Suite)
	})
	if err != nil {
		return "", err
	}
	defer unlock()
	if cached() {
		return final, nil
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		return "", errors.New("debootstrap not found: install it (apt-get install debootstrap)")
	}
	b.removeStale(dir, ".tmp."+name+".")
	tmp, err := os.MkdirTemp(dir, ".tmp."+name+".")
	if err != nil {
		return "", err
	}
	debs := filepath.Join(b.cache, "debs")
	err = os.Chmod(tmp, 0o755) // becomes the rootfs's "/"
	if err == nil {
		err = os.MkdirAll(debs, 0o755)
	}
	if err == nil {
		err = b.step(ctx, title+" (minbase from "+b.mirror+")", tmp, func() error {
			// debootstrap mounts proc and sys in the target itself; the
			// private namespace keeps those off the host even if it dies.
			return inMountNS(func() error {
				return b.command(ctx, "", nil, "debootstrap", "--variant=minbase", "--cache-dir="+debs,
					b.spec.Suite, tmp, b.mirror)
			})
		})
	}
	if err == nil {
		// The .debs are kept in debs/; a copy in every template is waste.
		err = removeMatching(filepath.Join(tmp, "var/cache/apt/archives/*.deb"))
	}
	if err == nil {
		err = os.Rename(tmp, final)
	}
	if err != nil {
		if rmErr := removeTree(tmp); rmErr != nil {
			b.p.line("warning: %v", rmErr)
		}
		return "", err
	}
	return final, nil
}

func (b *builder) chrootSteps() []buildStep {
	s := b.spec
	steps := []buildStep{{"prepare chroot", b.prepare}}
	apt := append([]string(nil), s.Apt...)
	if len(s.Pip) > 0 && !slices.Contains(apt, "python3-pip") {
		apt = append(apt, "python3-pip")
	}
	if len(apt) > 0 {
		steps = append(steps,
			buildStep{"apt-get update", func(ctx context.Context, rootfs string) error {
				return b.command(ctx, rootfs, nil, "/usr/bin/apt-get", slices.Concat([]string{"-q", "-o", "Acquire::Retries=3"}, b.aptProxy, []string{"update"})...)
			}},
			// The stage is cached for long; bring its packages up to date.
			buildStep{"apt-get upgrade", func(ctx context.Context, rootfs string) error {
				return b.command(ctx, rootfs, nil, "/usr/bin/apt-get", slices.Concat(aptOpts, b.aptProxy, []string{"upgrade"})...)
			}},
			buildStep{shorten("apt-get install "+strings.Join(apt, " "), 72), func(ctx context.Context, rootfs string) error {
				return b.command(ctx, rootfs, nil, "/usr/bin/apt-get", slices.Concat(aptOpts, b.aptProxy, []string{"install"}, apt)...)
			}})
	}
	if len(s.Pip) > 0 {
		steps = append(steps, buildStep{shorten("pip install "+strings.Join(s.Pip, " "), 72), func(ctx context.Context, rootfs string) error {
			args := append([]string{"-m", "pip", "install", "--no-cache-dir"}, s.Pip...)
			return b.command(ctx, rootfs, nil, "/usr/bin/python3", args...)
		}})
	}
	// The user exists before files and run commands, so they can use it.
	steps = append(steps, buildStep{"create user user (1000:1000)", func(ctx context.Context, rootfs string) error {
		return b.shell(ctx, rootfs, createUserScript)
	}})
	if len(s.Files) > 0 {
		steps = append(steps, buildStep{fmt.Sprintf("write %d file(s)", len(s.Files)), func(ctx context.Context, rootfs string) error {
			for _, f := range s.Files {
				if err := b.writeFile(ctx, rootfs, f.Path, []byte(f.Content), f.Mode); err != nil {
					return fmt.Errorf("%s: %w", f.Path, err)
				}
			}
			return nil
		}})
	}
	for _, r := range s.Run {
		steps = append(steps, buildStep{"run: " + shorten(r, 60), func(ctx context.Context, rootfs string) error {
			return b.shell(ctx, rootfs, r)
		}})
	}
	steps = append(steps, buildStep{"clean up", func(ctx context.Context, rootfs string) error {
		return b.shell(ctx, rootfs, cleanupScript)
	}})
	return steps
}

// prepare keeps package scripts from starting services, keeps docs out of
// the image, and gives the build the host's DNS servers and CA bundle.
func (b *builder) prepare(ctx context.Context, rootfs string) error {
	if err := b.writeFile(ctx, rootfs, "/usr/sbin/policy-rc.d", []byte("#!/bin/sh\nexit 101\n"), 0o755); err != nil {
		return err
	}
	if err := b.writeFile(ctx, rootfs, "/etc/dpkg/dpkg.cfg.d/pandastack-nodoc", []byte(noDocs), 0o644); err != nil {
		return err
	}
	if resolv, err := os.ReadFile("/etc/resolv.conf"); err == nil && len(resolv) > 0 {
		if err := b.writeFile(ctx, rootfs, "/etc/resolv.conf", resolv, 0o644); err != nil {
			return err
		}
	}
	if b.security != "" {
		line := "deb " + b.security + " " + b.spec.Suite + "-security main\n"
		if err := b.writeFile(ctx, rootfs, "/etc/apt/sources.list.d/security.list", []byte(line), 0o644); err != nil {
			return err
		}
	} else {
		b.p.line("warning: the host's apt sources name no security archive; template %s is built without security updates", b.spec.Name)
	}
	if b.ca != nil {
		return b.writeFile(ctx, rootfs, buildCA, b.ca, 0o644)
	}
	return nil
}

const noDocs = `# Sandboxes never read docs or translations; leaving them out saves space.
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
`

// writeFileScript runs in the chroot, so symlinks resolve inside it; a
// symlink at the path itself is replaced, not written through.
// Beneath the user's home the file, and the directories made for it,
// belong to the user.
const writeFileScript = `if [ -L "$1" ]; then rm -f "$1"; fi
mkdir -p "$(dirname "$1")"
cat > "$1"
chmod "$2" "$1"
case "$1" in /home/user/*)
	p="$1"
	while [ "$p" != /home/user ]; do chown -h 1000:1000 "$p"; p="$(dirname "$p")"; done
esac`

const createUserScript = `groupadd --gid 1000 user
useradd --uid 1000 --gid 1000 --home-dir /home/user --create-home --shell /bin/bash user
chown 1000:1000 /home/user`

const cleanupScript = `apt-get clean
rm -rf /var/lib/apt/lists/* /root/.cache
rm -rf /usr/share/man/* /usr/share/info/* /usr/share/locale/*
find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete
find /usr/share/doc -mindepth 1 -type d -empty -delete
rm -f /var/log/apt/* /var/log/dpkg.log /var/log/alternatives.log /var/cache/debconf/*-old /var/lib/dpkg/*-old
mkdir -p /tmp /var/tmp
find /tmp /var/tmp -mindepth 1 -delete
chmod 1777 /tmp /var/tmp
# runsc mounts a tmpfs (memory) over an empty /tmp; with this file /tmp stays
# on the sandbox's own disk, so filling it is ENOSPC, not out of memory.
echo 'Keeps /tmp on the sandbox disk (PandaStack).' > /tmp/.pandastack-disk
chmod 0444 /tmp/.pandastack-disk
# The agent's mount point, so runsc never has to create it in the template.
mkdir -p /.pandastack
touch /.pandastack/agent`

func (b *builder) writeFile(ctx context.Context, rootfs, path string, content []byte, mode FileMode) error {
	return b.command(ctx, rootfs, bytes.NewReader(content), "/bin/sh", "-ec", writeFileScript, "sh", path, mode.String())
}

// shell runs script with /bin/sh -e in the chroot.
func (b *builder) shell(ctx context.Context, rootfs, script string) error {
	return b.command(ctx, rootfs, nil, "/bin/sh", "-ec", script)
}

// command runs a program on the host (rootfs "") or chrooted into rootfs,
// where name must be an absolute path inside the chroot. A shell runs it as
// PID 1 of a new PID namespace, so when that shell ends or is killed (ctx,
// or by Pdeathsig when the builder dies) everything it started dies with it.
// The shell is there because apt-get switches its euid, which clears its own
// parent-death signal. The output is kept and its end goes into the error.
func (b *builder) command(ctx context.Context, rootfs string, stdin io.Reader, name string, args ...string) error {
	if b.record != nil {
		var in []byte
		if stdin != nil {
			in, _ = io.ReadAll(stdin)
		}
		b.record(rootfs != "", name, args, in)
		return nil
	}
	// Not `exec "$@"`: the shell itself must stay PID 1.
	script := `"$@"; exit $?`
	flags := uintptr(syscall.CLONE_NEWPID)
	if rootfs != "" {
		script = chrootProc + script
		flags |= syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", append([]string{"-c", script, "sh", name}, args...)...)
	out := &tailBuffer{max: 64 << 10}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: flags, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = append(os.Environ(), "LANG=C.UTF-8", "DEBIAN_FRONTEND=noninteractive")
	if rootfs != "" {
		cmd.SysProcAttr.Chroot = rootfs
		cmd.Dir = "/"
		cmd.Env = b.env
	}
	err := cmd.Run()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		if tail := out.lastLines(errorLines); tail != "" {
			return fmt.Errorf("%w; last output:\n%s", err, tail)
		}
		return err
	}
	return nil
}

// chrootProc starts every command in the chroot: its shell, PID 1 of its
// own PID, mount, UTS and IPC namespaces, mounts a proc of that PID
// namespace on /proc, with /proc/sys read-only and /proc/sysrq-trigger
// masked (where the kernel has one). A proc mounted by the builder would be the host's: package
// scripts, run steps and files could then set the host's sysctls (its
// hostname, say) and read every host process's files and environment
// (probe O). A root filesystem without mount(8) (a spec removed it) gets
// no /proc at all.
const chrootProc = `if command -v mount >/dev/null 2>&1; then
	mount -t proc -o nosuid,nodev,noexec proc /proc &&
	mount --bind /proc/sys /proc/sys &&
	mount -o remount,bind,ro,nosuid,nodev,noexec /proc/sys /proc/sys &&
	{ [ ! -e /proc/sysrq-trigger ] || mount --bind /dev/null /proc/sysrq-trigger; } || { echo "pandastack: cannot mount /proc in the build chroot" >&2; exit 125; }
fi
`

// step runs fn as one numbered step, with a heartbeat while it takes long.
// sizeOf is the directory whose size the lines report.
func (b *builder) step(ctx context.Context, title, sizeOf string, fn func() error) error {
	b.p.begin(title)
	start := time.Now()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(heartbeatEvery)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				b.p.heartbeat(time.Since(start), ", rootfs "+fmtSize(dirSize(sizeOf)))
			}
		}
	}()
	err := fn()
	close(stop)
	<-stopped
	took := fmtDuration(time.Since(start))
	switch {
	case err != nil && ctx.Err() != nil:
		b.p.end("interrupted after " + took)
		return fmt.Errorf("%s: %w", title, errInterrupted{ctx.Err()})
	case err != nil:
		b.p.end("failed after " + took)
		return fmt.Errorf("%s: %w", title, err)
	}
	b.p.end(fmt.Sprintf("done in %s (rootfs %s)", took, fmtSize(dirSize(sizeOf))))
	return nil
}

// Leftover is a directory a build left in the cache.
type Leftover struct {
	Dir       string
	SizeBytes int64
}

// errInterrupted is a build step cut short by its context (a Ctrl-C or
// SIGTERM of the builder): "interrupted", not Go's "context canceled".
type errInterrupted struct{ err error }

func (e errInterrupted) Error() string { return "interrupted" }
func (e errInterrupted) Unwrap() error { return e.err }

// RemoveStale removes what builds left in cacheDir: the temp directories of
// crashed (killed) builds, and the builds a --force rebuild set aside while
// a sandbox ran on them, unless a live builder holds their lock or a
// process still has them mounted. Build cleans up after a crash of its own
// name; serve calls this at its start, and template gc, to reclaim the
// rest. It returns the directories removed (with dryRun: those it would
// remove now; one in use is kept either way).
func RemoveStale(cacheDir string, dryRun bool) ([]Leftover, error) {
	root := filepath.Join(cacheDir, templatesDir)
	var errs []error
	var removed []Leftover
	clean := func(dir string, prefixes ...string) {
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			for _, prefix := range prefixes {
				// prefix NAME.RANDOM: the name may hold dots itself (a
				// stage's suite), the random suffix does not.
				rest := strings.TrimPrefix(e.Name(), prefix)
				dot := strings.LastIndexByte(rest, '.')
				if !strings.HasPrefix(e.Name(), prefix) || dot <= 0 {
					continue
				}
				name := rest[:dot]
				p := filepath.Join(dir, e.Name())
				if dryRun {
					// As the removal would: a build under way keeps its
					// directory (its lock is held).
					if !treeInUse(p) && !lockHeld(filepath.Join(dir, "."+name+".lock")) {
						removed = append(removed, Leftover{p, dirSize(p)})
					}
					continue
				}
				unlock, err := tryLock(filepath.Join(dir, "."+name+".lock"))
				if err != nil {
					continue // a build is running, or the lock is unusable
				}
				size := dirSize(p)
				if err := removeTree(p); err != nil {
					if !errors.Is(err, errInUse) {
						errs = append(errs, err)
					}
				} else {
					removed = append(removed, Leftover{p, size})
				}
				unlock()
			}
		}
	}
	clean(root, ".build.", ".old.")
	clean(filepath.Join(root, stagesDir), ".tmp.")
	return removed, errors.Join(errs...)
}

// treeInUse reports whether removeTree would keep dir: something is mounted
// under it, or a process has it mounted in a namespace of its own.
func treeInUse(dir string) bool {
	if m, err := mountsUnder(dir); err != nil || len(m) > 0 {
		return true
	}
	used, err := inUseBy()
	return err != nil || used(dir) != ""
}

// removeStale removes leftovers named prefix* in dir; the caller holds
// their lock.
func (b *builder) removeStale(dir, prefix string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
				b.p.line("warning: leftover of an earlier build: %v", err)
			}
		}
	}
}

// dirSize is the disk usage of the tree at root, like du: hard links count
// once, and other filesystems mounted inside are skipped.
func dirSize(root string) int64 {
	st, err := os.Lstat(root)
	if err != nil {
		return 0
	}
	rootDev := uint64(st.Sys().(*syscall.Stat_t).Dev)
	type inode struct{ dev, ino uint64 }
	seen := map[inode]bool{}
	var total int64
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // files come and go while a step runs
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return nil
		}
		if uint64(st.Dev) != rootDev {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if !d.IsDir() && st.Nlink > 1 {
			k := inode{uint64(st.Dev), uint64(st.Ino)}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		total += int64(st.Blocks) * 512
		return nil
	})
	return total
}

func removeMatching(pattern string) error {
	names, err := filepath.Glob(pattern)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := os.Remove(n); err != nil {
			return err
		}
	}
	return nil
}

func writeFileSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
