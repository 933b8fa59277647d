// Command pandastack is the PandaStack server and CLI: `pandastack serve`
// runs the REST API and the gVisor runtime on this machine; the other verbs
// manage keys, templates and sandboxes. This is the only package that picks
// concrete adapters.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/api"
	"github.com/pandastack/pandastack/internal/metrics"
	"github.com/pandastack/pandastack/internal/network"
	"github.com/pandastack/pandastack/internal/paths"
	"github.com/pandastack/pandastack/internal/runtime/gvisor"
	"github.com/pandastack/pandastack/internal/sandbox"
	"github.com/pandastack/pandastack/internal/store/sqlite"
	"github.com/pandastack/pandastack/internal/template"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

const usage = `pandastack: secure sandboxes for AI-generated code

Usage:
  pandastack serve [flags]                 run the REST API and the sandbox runtime
  pandastack keys create [--project P]     create an API key (printed once)
  pandastack keys list                     list API keys
  pandastack keys revoke ID|PREFIX         revoke an API key
  pandastack template build NAME [--force] build a template's root filesystem
  pandastack template ls                   list template specs and their builds
  pandastack template gc [--dry-run] [--min-age 24h]
                                           remove template builds and warm images nothing uses
  pandastack sandbox create [flags]        create a sandbox (through the API)
  pandastack sandbox ls                    list sandboxes
  pandastack sandbox exec ID -- CMD...     run a command in a sandbox
  pandastack sandbox kill-processes ID     end every process in a sandbox but its kernels
  pandastack sandbox pause|resume ID       suspend a sandbox to disk, or bring it back
  pandastack sandbox kill ID...            kill sandboxes
  pandastack mcp [flags]                   serve MCP tools on stdio (run code, exec, files, snapshots)
  pandastack nodes ls                      list the nodes sharing the store (--store postgres://…)
  pandastack nodes forget ID               forget a lost node retired for good (its paused sandboxes stop)
  pandastack version

Run "pandastack serve -h" for the server's flags and their PANDASTACK_* variables.
The sandbox and mcp verbs read PANDASTACK_API (default http://localhost:8080) and
PANDASTACK_API_KEY (default: the key file in the data directory).
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	err := run(os.Args[1], os.Args[2:])
	if code := exitCode(err); code != 0 {
		if !errors.Is(err, errUsage) { // the flag package has said it
			fmt.Fprintln(os.Stderr, "pandastack:", err)
		}
		os.Exit(code)
	}
}

// run runs one command of pandastack: verb, with its arguments.
func run(verb string, args []string) error {
	switch verb {
	case "serve":
		return serve(args)
	case "keys":
		return keys(args)
	case "template", "templates":
		return templates(args)
	case "sandbox", "sandboxes", "sbx":
		return sandboxCmd(args)
	case "mcp":
		return mcpCmd(args)
	case "nodes", "node":
		return nodesCmd(args)
	case "version", "--version":
		fmt.Println("pandastack", version)
	case "help", "-h", "--help":
		fmt.Print(usage)
	default:
		return badUsage{fmt.Sprintf("unknown command %q\n\n%s", verb, strings.TrimSuffix(usage, "\n"))}
	}
	return nil
}

// exitCode is pandastack's exit status for what a command returned, as the
// README says: 0 for success or -h, 2 for a command line it cannot parse,
// 1 for anything else (sandbox exec exits with codes of its own first).
func exitCode(err error) int {
	var bad badUsage
	switch {
	case err == nil, errors.Is(err, errHelp):
		return 0
	case errors.Is(err, errUsage), errors.As(err, &bad):
		return 2
	}
	return 1
}

// badUsage is a command line pandastack cannot parse: an unknown verb, an
// argument missing or one too many. It exits 2, as an unknown flag or a
// flag value of the wrong kind does (errUsage); a command line that parses
// but asks for what cannot be (--ttl -5s, a key that is not there) exits 1.
type badUsage struct{ msg string }

func (b badUsage) Error() string { return b.msg }

// buildFlags are the flags of `pandastack template build` that make it
// build where this configuration looks, those not at their defaults.
func (cfg *Config) buildFlags() string {
	def := defaultConfig()
	var f string
	if cfg.DataDir != def.DataDir {
		f += " --data-dir " + cfg.DataDir
	}
	if cfg.TemplatesDir != def.TemplatesDir {
		f += " --templates-dir " + cfg.TemplatesDir
	}
	if cfg.CacheDir != def.CacheDir {
		f += " --cache-dir " + cfg.CacheDir
	}
	return f
}

// existingStore refuses a SQLite store that is not there yet, or is not
// PandaStack's, for the commands that work on the server's own (what says
// verb): one made in a mistaken data dir would look valid and empty.
func (cfg *Config) existingStore(verb string) error {
	db := ""
	switch {
	case cfg.Store == "":
		db = cfg.dbPath()
	case strings.HasPrefix(cfg.Store, "sqlite://"):
		db = strings.TrimPrefix(cfg.Store, "sqlite://")
	}
	if db == "" {
		return nil
	}
	if _, err := os.Stat(db); errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s: no PandaStack store at %s: this command works on the server's store; give its --data-dir or --store, or start `pandastack serve` there first", verb, db)
	}
	if err := sqlite.IsStore(db); err != nil {
		return fmt.Errorf("%s: %s is not a PandaStack store: %v; give the server's --data-dir or --store", verb, db, err)
	}
	return nil
}

func newLogger(level string, w io.Writer) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l}))
}

func serve(args []string) error {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.bind(fs)
	if err := parseFlags(fs, args, false); err != nil {
		return err
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	log := newLogger(cfg.LogLevel, os.Stderr)
	if os.Geteuid() != 0 {
		return errors.New("serve needs root: gVisor's runsc creates namespaces and cgroups (run it with sudo)")
	}
	runsc := paths.FindRunsc(cfg.Runsc, cfg.CacheDir)
	if runsc == "" {
		return fmt.Errorf("runsc (gVisor) not found: run ./scripts/setup.sh, which builds the pinned version into %s, or pass --runsc / PANDASTACK_RUNSC", paths.CachedRunsc(cfg.CacheDir))
	}
	agent := paths.FindAgent(cfg.Agent)
	if agent == "" {
		return errors.New("pandastack-agent not found beside this binary: build it with `CGO_ENABLED=0 go build -o bin/ ./cmd/...` or pass --agent / PANDASTACK_AGENT")
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return err
	}
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return err
	}
	defer unlock()
	store, storeDesc, err := openStore(context.Background(), &cfg)
	if err != nil {
		return err
	}
	defer store.Close()
	// SIGHUP too: a serve started in a terminal that closes stops as it
	// would on Ctrl-C (--kill-on-exit applies), not killed outright;
	// unless it was started to ignore it (nohup), which a handler would undo.
	stopOn := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		stopOn = append(stopOn, syscall.SIGHUP)
	}
	ctx, stop := signal.NotifyContext(context.Background(), stopOn...)
	defer stop()
	// A log reader that goes away (a killed `| tee`) must not end serve
	// halfway through its work: with SIGPIPE caught, writes to a closed
	// stdout or stderr fail instead. (Caught, not ignored: an ignored
	// signal would stay ignored in every process serve starts.)
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	// What cannot start is refused before the first key is made and
	// printed as if the server were starting: the address (tried, and let
	// go: held through a first start's template build, connections would
	// wait minutes unanswered rather than be refused), and the templates
	// to build.
	probe, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", cfg.Listen, err)
	}
	probe.Close()
	if cfg.MetricsListen != "" {
		probe, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("--metrics-listen %s: %w", cfg.MetricsListen, err)
		}
		probe.Close()
	}
	reg, err := loadTemplates(&cfg)
	if err != nil {
		return err
	}
	var buildOnStart []template.Spec
	for _, name := range strings.Split(cfg.BuildOnStart, ",") {
		if name = strings.TrimSpace(name); name == "" {
			continue
		}
		spec, err := reg.Get(name)
		if err != nil {
			return fmt.Errorf("--build-on-start: %w", err)
		}
		buildOnStart = append(buildOnStart, spec)
	}
	if err := ensureFirstKey(ctx, store, cfg.keyPath(), os.Stdout, isTerminal(os.Stdout)); err != nil {
		return err
	}
	for _, spec := range buildOnStart {
		if _, ok := template.Lookup(cfg.CacheDir, spec); !ok {
			fmt.Fprintf(os.Stderr, "Template %q is not built yet; building it now (once; later starts reuse it).\n", spec.Name)
			if _, err := template.Build(ctx, spec, template.BuildOptions{CacheDir: cfg.CacheDir, Mirror: cfg.Mirror, Progress: os.Stderr}); err != nil {
				return err // it names the template
			}
		}
	}

	// Restores need the agent at the path it had at checkpoint time, so
	// sandboxes mount a copy kept in the cache under its own hash.
	agent, agentHash, err := stableAgent(agent, cfg.CacheDir)
	if err != nil {
		return err
	}
	for _, d := range []string{cfg.snapshotDir(), cfg.pausedDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	rt, err := gvisor.New(gvisor.Config{Runsc: runsc, StateDir: cfg.runtimeDir(), AgentPath: agent, Log: log, DiskMB: cfg.DiskMB})
	if err != nil {
		return err
	}
	defer rt.Close()
	var sandboxes pandastack.Runtime = rt
	netw, err := startNetwork(cfg.Net, cfg.DataDir, log)
	if err != nil {
		return err
	}
	if netw != nil {
		wrapped := network.Wrap(rt, netw)
		defer func() {
			if err := wrapped.Close(context.Background()); err != nil {
				log.Error("removing the sandbox network", "err", err)
			}
		}()
		sandboxes = wrapped
	}
	tpls := &templateSource{reg: reg, load: func() (*template.Registry, error) { return loadTemplates(&cfg) }, dir: cfg.templatesDir(),
		cacheDir: cfg.CacheDir, warmDir: cfg.warmDir(), agentHash: agentHash, diskMB: cfg.DiskMB, buildFlags: cfg.buildFlags(), log: log}
	scfg := cfg.Sandbox
	scfg.SnapshotDir, scfg.PausedDir, scfg.WarmDir = cfg.snapshotDir(), cfg.pausedDir(), cfg.warmDir()
	scfg.DiskDir = cfg.runtimeDir() // the runtime's state directory, where the disks are
	images, imagesDesc, err := openImages(ctx, &cfg)
	if err != nil {
		return err
	}
	scfg.Images = images
	if scfg.Node, err = cfg.Nodes.node(cfg.DataDir, cfg.Listen, strings.HasPrefix(cfg.SnapshotStore, "s3://")); err != nil {
		return err
	}
	var series *metrics.Registry
	if cfg.MetricsListen != "" {
		series = metrics.New()
		metrics.RegisterProcess(series, "pandastack", version)
		scfg.Metrics, cfg.API.Metrics = series, series
	}
	mgr := sandbox.New(scfg, store, sandboxes, tpls, log)
	if netw != nil {
		mgr.UseNetwork(netw)
	}
	caPEM, err := sandboxCA(cfg.Net.CACerts, log)
	if err != nil {
		return err
	}
	mgr.UseSandboxCA(caPEM)
	if err := mgr.Start(ctx); err != nil {
		return err
	}
	defer mgr.Close()
	tpls.mgr = mgr
	// Builds a --force rebuild set aside while sandboxes ran on them (none
	// run now but another server's, whose mounts keep theirs), and what
	// killed builds left: the build's own message promises this.
	go func() {
		left, err := template.RemoveStale(cfg.CacheDir, false)
		for _, l := range left {
			log.Info("removed a template build left aside", "dir", l.Dir, "mb", l.SizeBytes>>20)
		}
		if err != nil {
			log.Warn("removing template builds left aside", "err", err)
		}
	}()
	if cfg.Warm {
		mgr.StartWarming(tpls.warmSpecs())
		tpls.startWarmingLater(mgr.WarmLater)
	}
	cfg.API.PublicDomain = cfg.Net.PublicDomain
	srv := api.New(cfg.API, mgr, store, tpls, log)

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", cfg.Listen, err)
	}
	hs := newHTTPServer(srv.Handler())
	hs.RegisterOnShutdown(srv.Draining)
	if !cfg.KillOnExit {
		// Terminals close with a reason; with --kill-on-exit each says
		// its sandbox was killed by the shutdown instead (4410).
		hs.RegisterOnShutdown(srv.Stopping)
	}
	// Said before the first request is served: whoever sees the server
	// answer (a health check) finds this line in its log already.
	fmt.Printf("Web console: http://%s/ (sign in with an API key)\n", ln.Addr())
	log.Info("pandastack serving", "url", "http://"+ln.Addr().String(), "data_dir", cfg.DataDir, "store", storeDesc, "snapshot_store", imagesDesc, "cache_dir", cfg.CacheDir, "runsc", runsc, "version", version, "node", scfg.Node.ID, "advertise_url", scfg.Node.URL)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	if series != nil {
		ms, at, err := serveMetrics(cfg.MetricsListen, series, errc)
		if err != nil {
			hs.Close()
			return err
		}
		defer ms.Close()
		log.Info("serving metrics", "url", "http://"+at.String()+"/metrics")
		if !loopback(at) {
			log.Warn("GET /metrics takes no API key and listens beyond this host: keep --metrics-listen on a network only your monitoring reaches", "addr", at.String())
		}
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("stopping: no new requests; waiting up to 10 s for those under way")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = hs.Shutdown(sctx)
	if !cfg.KillOnExit {
		srv.WaitTerminals(2 * time.Second) // their close frames out before the exit
	}
	if cfg.KillOnExit {
		log.Info("shutting down; killing every sandbox (--kill-on-exit)")
		mgr.KillAll(context.Background())
	} else {
		log.Info("shutting down; running sandboxes keep running and are re-adopted on the next start")
	}
	if errors.Is(err, context.DeadlineExceeded) {
		// Requests still running (a long exec, a followed output) are cut
		// off, and their callers told why.
		log.Warn("requests still running after 10 s were cut off by the shutdown")
		mgr.Close()
		fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
		hs.Shutdown(fctx) // the cut-off requests answer
		fcancel()
		hs.Close()
		err = nil
	}
	return err
}

// ensureFirstKey creates the default project and its first key when the
// store has no key at all and writes it to keyPath. It prints the key to
// out once when out is a terminal; otherwise (systemd's journal, a pod's
// log, read by more than the key file's owner) only its prefix and where
// to read it.
func ensureFirstKey(ctx context.Context, store pandastack.Store, keyPath string, out io.Writer, terminal bool) error {
	keys, err := store.ListAPIKeys(ctx)
	if err != nil {
		return err
	}
	if len(keys) > 0 {
		return nil
	}
	secret, _, err := createKey(ctx, store, "default", "first key", pandastack.ScopeAll)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, []byte(secret+"\n"), 0o600); err != nil {
		return err
	}
	if terminal {
		fmt.Fprintf(out, "Created API key (shown once; also saved to %s, readable only by its owner):\n\n    export PANDASTACK_API_KEY=%s\n\n", keyPath, secret)
		return nil
	}
	fmt.Fprintf(out, "Created API key %s… (its prefix, as keys list shows it), saved to %s, readable only by its owner; not printed here, since this output is not a terminal and may be a log. Read it with:\n\n    export PANDASTACK_API_KEY=$(cat %s)\n\n", keyPrefix(secret), keyPath, keyPath)
	return nil
}

// keyPrefix is the start of secret kept in its key's record, by which keys
// list shows it and keys revoke finds it.
func keyPrefix(secret string) string { return secret[:10] }

// isTerminal reports whether f is a terminal (a character device: /dev/null
// is one too, and what is written there is read by no one).
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// createKey makes a key in the project named project (or, failing that,
// whose id it is, as keys list shows both), creating a project of that
// name if there is none; made says it did.
func createKey(ctx context.Context, store pandastack.Store, project, name, scope string) (secret string, made bool, _ error) {
	p, err := store.ProjectByName(ctx, project)
	if pandastack.IsCode(err, pandastack.ENotFound) {
		all, lerr := store.ListProjects(ctx)
		if lerr != nil {
			return "", false, lerr
		}
		if i := slices.IndexFunc(all, func(q pandastack.Project) bool { return q.ID == project }); i >= 0 {
			p, err = all[i], nil
		} else if strings.HasPrefix(project, "prj_") {
			return "", false, fmt.Errorf("no project has the id %s (keys list shows the projects' names and ids); to make a project of that name, choose a name that does not look like an id", project)
		} else {
			p = pandastack.Project{ID: pandastack.NewID("prj"), Name: project, CreatedAt: time.Now().UTC()}
			err = store.CreateProject(ctx, p)
			made = err == nil
			if pandastack.IsCode(err, pandastack.EConflict) {
				// Another serve on a shared store made it first.
				p, err = store.ProjectByName(ctx, project)
			}
		}
	}
	if err != nil {
		return "", false, err
	}
	secret = pandastack.NewAPIKeySecret()
	k := pandastack.APIKey{ID: pandastack.NewID("key"), ProjectID: p.ID, Name: name, Prefix: keyPrefix(secret), Hash: api.HashKey(secret), CreatedAt: time.Now().UTC(), Scope: scope}
	if err := store.CreateAPIKey(ctx, k); err != nil {
		return "", false, err
	}
	return secret, made, nil
}

// stableAgent copies the agent binary to <cache>/agent/<sha256>/ (once) and
// returns that path and the hash.
func stableAgent(path, cacheDir string) (string, string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", "", err
	}
	sum := sha256.Sum256(b)
	h := hex.EncodeToString(sum[:])
	dst := filepath.Join(cacheDir, "agent", h[:16], "pandastack-agent")
	if _, err := os.Stat(dst); err == nil {
		return dst, h, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", "", err
	}
	tmp := dst + ".tmp-" + pandastack.NewID("t")
	if err := os.WriteFile(tmp, b, 0o755); err != nil {
		return "", "", err
	}
	return dst, h, os.Rename(tmp, dst)
}

func loadTemplates(cfg *Config) (*template.Registry, error) {
	dir := cfg.templatesDir()
	st, err := os.Stat(dir)
	if err == nil && st.IsDir() {
		return template.Load(dir)
	}
	// The default directory may be missing (no templates of your own); a
	// directory named on purpose must be there: a typo would leave the
	// server without your specs, without a word.
	if cfg.TemplatesDir != "" {
		if err == nil {
			err = errors.New("not a directory")
		}
		return nil, fmt.Errorf("--templates-dir %s: %w", dir, err)
	}
	return template.Load()
}

func keys(args []string) error {
	cfg := defaultConfig()
	if len(args) == 0 || isHelp(args[0]) {
		return verbsHelp(args, "usage: pandastack keys create|list|revoke [flags] (pandastack keys VERB -h for its flags)")
	}
	switch args[0] {
	case "create", "list", "ls", "revoke":
	default:
		return badUsage{fmt.Sprintf("keys: unknown verb %q; want create, list or revoke", args[0])}
	}
	fs := flag.NewFlagSet("keys "+args[0], flag.ContinueOnError)
	cfg.bind(fs)
	project := fs.String("project", "default", "project the key belongs to: its name (a new name makes a new project) or its id")
	name := fs.String("name", "", "a label for the key")
	scope := fs.String("scope", pandastack.ScopeAll, "what the key may do: all (the project's keys too) or sandboxes (everything but the keys)")
	if args[0] == "create" {
		showOnly(fs, "project", "name", "scope", "data-dir", "store")
	} else {
		showOnly(fs, "data-dir", "store")
	}
	if err := parseInterspersed(fs, args[1:]); err != nil {
		return err
	}
	if args[0] != "revoke" && fs.NArg() > 0 {
		return badUsage{fmt.Sprintf("keys %s: unexpected argument %q: it takes flags only (see pandastack keys %s -h)", args[0], fs.Arg(0), args[0])}
	}
	if args[0] == "revoke" && fs.NArg() != 1 {
		return badUsage{"keys revoke: give one key: its id, its prefix (as keys list shows it) or the whole key"}
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	// The server's store, not a new one: a key made in an empty store of
	// a mistaken data dir would look valid and be refused by the server.
	if err := cfg.existingStore("keys " + args[0]); err != nil {
		return err
	}
	store, _, err := openStore(context.Background(), &cfg)
	if err != nil {
		return err
	}
	defer store.Close()
	ctx := context.Background()
	switch args[0] {
	case "create":
		if *project == "" {
			return errors.New("keys create: --project must name a project")
		}
		for what, v := range map[string]string{"--project": *project, "--name": *name} {
			if err := pandastack.ValidLabel(what, v); err != nil {
				return err
			}
		}
		sc, err := pandastack.ParseScope(*scope)
		if err != nil {
			return err
		}
		secret, made, err := createKey(ctx, store, *project, *name, sc)
		if err != nil {
			return err
		}
		fmt.Println(secret)
		if made {
			fmt.Fprintf(os.Stderr, "Created project %q (new: no project had that name) and a key in it. The key is shown only now; store it safely.\n", *project)
		} else {
			fmt.Fprintf(os.Stderr, "Created a key in project %q. It is shown only now; store it safely.\n", *project)
		}
	case "list", "ls":
		ks, err := store.ListAPIKeys(ctx)
		if err != nil {
			return err
		}
		projects, err := store.ListProjects(ctx)
		if err != nil {
			return err
		}
		names := map[string]string{}
		for _, p := range projects {
			names[p.ID] = p.Name
		}
		fmt.Printf("%-22s %-22s %-14s %-20s %-20s %-20s %-10s %s\n", "ID", "PROJECT", "PREFIX", "NAME", "CREATED", "REVOKED", "SCOPE", "PROJECT NAME")
		for _, k := range ks {
			revoked := "-"
			if k.RevokedAt != nil {
				revoked = k.RevokedAt.Format(time.RFC3339)
			}
			fmt.Printf("%-22s %-22s %-14s %-20s %-20s %-20s %-10s %s\n", k.ID, k.ProjectID, k.Prefix+"…", printable(k.Name), k.CreatedAt.Format(time.RFC3339), revoked, k.Scope, printable(names[k.ProjectID]))
		}
	case "revoke":
		which := strings.TrimSuffix(fs.Arg(0), "…") // the prefix as keys list shows it
		if k, err := store.APIKeyByHash(ctx, api.HashKey(which)); err == nil {
			which = k.ID // the whole key, as someone revoking a leaked one has it
		} else if !pandastack.IsCode(err, pandastack.ENotFound) {
			return err
		}
		if err := store.RevokeAPIKey(ctx, which, time.Now().UTC()); err != nil {
			if pandastack.IsCode(err, pandastack.ENotFound) {
				// A prefix matches unrevoked keys only: one of a revoked key
				// is not unknown.
				if ks, lerr := store.ListAPIKeys(ctx); lerr == nil {
					var revoked []pandastack.APIKey
					for _, k := range ks {
						if k.RevokedAt != nil && len(which) >= len(k.Prefix) && strings.HasPrefix(which, k.Prefix) {
							revoked = append(revoked, k)
						}
					}
					if len(revoked) == 1 {
						fmt.Fprintln(os.Stderr, "already revoked:", revoked[0].ID, "at", revoked[0].RevokedAt.Format(time.RFC3339))
						return nil
					}
				}
				shown := which
				if len(shown) > 14 {
					shown = shown[:10] + "…" // maybe a whole key: not on the screen
				}
				return pandastack.Errorf(pandastack.ENotFound, "no API key %s: give its id, its prefix (the first 10 characters, as keys list shows them) or the whole key", printable(shown))
			}
			return err
		}
		fmt.Fprintln(os.Stderr, "revoked", printable(which))
	default:
		return badUsage{fmt.Sprintf("keys: unknown verb %q; want create, list or revoke", args[0])}
	}
	return nil
}

func templates(args []string) error {
	cfg := defaultConfig()
	if len(args) == 0 || isHelp(args[0]) {
		return verbsHelp(args, "usage: pandastack template build|ls|gc [flags] [NAME] (pandastack template VERB -h for its flags)")
	}
	fs := flag.NewFlagSet("template "+args[0], flag.ContinueOnError)
	cfg.bind(fs)
	force := fs.Bool("force", false, "rebuild even when cached")
	minAge := fs.Duration("min-age", 24*time.Hour, "gc: spare builds and warm images younger than this")
	dryRun := fs.Bool("dry-run", false, "gc: only say what would be removed")
	switch args[0] {
	case "build":
		showOnly(fs, "force", "cache-dir", "templates-dir", "data-dir", "mirror")
	case "gc":
		showOnly(fs, "min-age", "dry-run", "cache-dir", "templates-dir", "data-dir", "store", "snapshot-store")
	default:
		showOnly(fs, "cache-dir", "templates-dir", "data-dir")
	}
	if err := parseInterspersed(fs, args[1:]); err != nil {
		return err
	}
	if args[0] != "build" && fs.NArg() > 0 {
		return badUsage{fmt.Sprintf("template %s: unexpected argument %q: it takes flags only (see pandastack template %s -h)", args[0], fs.Arg(0), args[0])}
	}
	if *minAge < 0 {
		return fmt.Errorf("template gc: --min-age %s is negative; give 0 to spare nothing for its age", *minAge)
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	reg, err := loadTemplates(&cfg)
	if err != nil {
		return err
	}
	switch args[0] {
	case "build":
		if fs.NArg() != 1 {
			return badUsage{fmt.Sprintf("template build: give one template name, one of %s", strings.Join(reg.Names(), ", "))}
		}
		if os.Geteuid() != 0 {
			return errors.New("template build needs root (debootstrap and chroot)")
		}
		spec, err := reg.Get(fs.Arg(0))
		if err != nil {
			return err
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		sigc := make(chan os.Signal, 1)
		signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
		defer signal.Stop(sigc)
		var sig atomic.Value
		go func() {
			if s, ok := <-sigc; ok {
				sig.Store(s)
				cancel()
			}
		}()
		b, err := template.Build(ctx, spec, template.BuildOptions{CacheDir: cfg.CacheDir, Mirror: cfg.Mirror, Progress: os.Stderr, Force: *force})
		if s, ok := sig.Load().(syscall.Signal); ok && err != nil {
			// As a shell reports a command a signal ended, 128+N (130
			// for Ctrl-C, 143 for SIGTERM), so a script tells an
			// interrupted build from a failed one.
			fmt.Fprintln(os.Stderr, "pandastack:", err)
			os.Exit(128 + int(s))
		}
		if err != nil {
			return err
		}
		fmt.Printf("%s %s %d MB %s\n", b.Name, b.Hash[:16], (b.SizeBytes+500_000)/1_000_000, b.RootFS)
	case "ls", "list":
		fmt.Printf("%-20s %-18s %-10s %s\n", "NAME", "HASH", "SIZE", "BUILT")
		for _, spec := range reg.List() {
			size, built := "-", "not built"
			if b, ok := template.Lookup(cfg.CacheDir, spec); ok {
				size, built = fmt.Sprintf("%d MB", (b.SizeBytes+500_000)/1_000_000), b.BuiltAt.Format(time.RFC3339)
			}
			fmt.Printf("%-20s %-18s %-10s %s\n", spec.Name, spec.Hash()[:16], size, built)
		}
	case "gc":
		return templateGC(context.Background(), &cfg, reg, *minAge, *dryRun, os.Stdout)
	default:
		return badUsage{fmt.Sprintf("template: unknown verb %q; want build, ls or gc", args[0])}
	}
	return nil
}
