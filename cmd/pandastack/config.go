package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/internal/api"
	"github.com/pandastack/pandastack/internal/paths"
	"github.com/pandastack/pandastack/internal/sandbox"
)

// Config is every setting of `pandastack serve`. Each field has a flag and a
// PANDASTACK_* environment variable; a flag wins over the variable, which
// wins over the default.
type Config struct {
	Listen string // address of the REST API
	// MetricsListen is the address of GET /metrics (metrics.go), which
	// takes no API key; "" serves none.
	MetricsListen string
	DataDir       string // SQLite database, API key file, runtime state
	Store         string // "" or sqlite:///path: SQLite (default <data dir>/pandastack.db); postgres://…: PostgreSQL
	CacheDir      string // runsc and template root filesystems, shareable between data dirs
	Runsc         string // runsc binary; default: the pinned build in the cache, then PATH
	Agent         string // pandastack-agent binary; default: beside this executable
	TemplatesDir  string // a user's own template specs (*.yaml); default <data dir>/templates
	Mirror        string // Debian mirror for template builds
	BuildOnStart  string // templates built on start when missing, comma-separated ("" for none)
	Warm          bool   // snapshot templates warm in the background so creates restore them
	KillOnExit    bool   // kill every sandbox when serve stops, instead of keeping them for the next start
	LogLevel      string // debug, info, warn or error
	DiskMB        int    // each sandbox's own disk (the writable layer over its template), in MiB; negative: in memory

	// Where snapshots are kept: "" (<data dir>/snapshots), file:///path or
	// s3://bucket/prefix (see openImages), and the most bytes the local
	// cache of an s3 store keeps (0: no limit).
	SnapshotStore         string
	SnapshotCacheMaxBytes int64

	// The sandbox manager's and the API's settings, with their own
	// defaults (sandbox.DefaultConfig, api.DefaultConfig); the directories
	// in Sandbox are derived from DataDir and CacheDir.
	Sandbox sandbox.Config
	API     api.Config
	Net     NetConfig   // sandbox networking (network.go)
	Nodes   NodesConfig // this serve as one of several nodes (nodes.go)

	envErrs []error // malformed PANDASTACK_* values, refused by validate
}

func defaultConfig() Config {
	return Config{
		Listen:       "127.0.0.1:8080",
		DataDir:      paths.DataDir(),
		CacheDir:     paths.CacheDir(),
		BuildOnStart: "base",
		Warm:         true,
		LogLevel:     "info",
		DiskMB:       2048,
		Sandbox:      sandbox.DefaultConfig(),
		API:          api.DefaultConfig(),
	}
}

// bind registers the flags on fs with the environment applied as defaults.
func (c *Config) bind(fs *flag.FlagSet) {
	str := func(p *string, name, env, usage string) {
		if v, ok := os.LookupEnv(env); ok {
			*p = v
		}
		fs.StringVar(p, name, *p, usage+" ($"+env+")")
	}
	bad := func(env, v, want string) {
		c.envErrs = append(c.envErrs, fmt.Errorf("%s=%q: want %s", env, v, want))
	}
	dur := func(p *time.Duration, name, env, usage string) {
		if v, ok := os.LookupEnv(env); ok {
			if d, err := parseDuration(v); err == nil {
				*p = d
			} else {
				bad(env, v, "a duration such as 300, 300s or 5m")
			}
		}
		fs.DurationVar(p, name, *p, usage+" ($"+env+")")
	}
	num := func(p *int, name, env, usage string) {
		if v, ok := os.LookupEnv(env); ok {
			if n, err := strconv.Atoi(v); err == nil {
				*p = n
			} else {
				bad(env, v, "a whole number")
			}
		}
		fs.IntVar(p, name, *p, usage+" ($"+env+")")
	}
	boolean := func(p *bool, name, env, usage string) {
		if v, ok := os.LookupEnv(env); ok {
			if b, err := strconv.ParseBool(v); err == nil {
				*p = b
			} else {
				bad(env, v, "true or false (or 1 or 0)")
			}
		}
		fs.BoolVar(p, name, *p, usage+" ($"+env+")")
	}
	str(&c.Listen, "listen", "PANDASTACK_LISTEN", "address of the REST API")
	str(&c.API.PublicURL, "public-url", "PANDASTACK_PUBLIC_URL", "URL clients reach this server at, such as https://sandboxes.example.com behind a proxy that ends TLS: port token URLs are made on its scheme and host, and their cookie is Secure when it is https (default: each request's own)")
	str(&c.MetricsListen, "metrics-listen", "PANDASTACK_METRICS_LISTEN", "address serving GET /metrics in Prometheus' text format, without an API key: keep it on loopback or a private network (empty: none)")
	str(&c.DataDir, "data-dir", "PANDASTACK_DATA_DIR", "data directory (database, API key, runtime state)")
	str(&c.Store, "store", "PANDASTACK_STORE", "database: empty for SQLite in the data dir, sqlite:///path, or postgres://user:pass@host/db")
	fs.Lookup("store").DefValue = redact(c.Store) // -h shows no password
	str(&c.SnapshotStore, "snapshot-store", "PANDASTACK_SNAPSHOT_STORE", "where snapshots are kept: empty for <data dir>/snapshots, file:///path, or s3://bucket/prefix (endpoint from $PANDASTACK_S3_ENDPOINT, credentials from $AWS_ACCESS_KEY_ID/$AWS_SECRET_ACCESS_KEY)")
	if v, ok := os.LookupEnv("PANDASTACK_SNAPSHOT_CACHE_MAX_BYTES"); ok {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			c.SnapshotCacheMaxBytes = n
		} else {
			bad("PANDASTACK_SNAPSHOT_CACHE_MAX_BYTES", v, "a whole number of bytes")
		}
	}
	fs.Int64Var(&c.SnapshotCacheMaxBytes, "snapshot-cache-max-bytes", c.SnapshotCacheMaxBytes, "most bytes of remote snapshots cached locally, least recently used evicted first (0: no limit) ($PANDASTACK_SNAPSHOT_CACHE_MAX_BYTES)")
	str(&c.CacheDir, "cache-dir", "PANDASTACK_CACHE_DIR", "cache of runsc and template root filesystems")
	str(&c.Runsc, "runsc", "PANDASTACK_RUNSC", "runsc binary (default: the pinned build in the cache, then PATH)")
	str(&c.Agent, "agent", "PANDASTACK_AGENT", "pandastack-agent binary (default: beside this executable)")
	str(&c.TemplatesDir, "templates-dir", "PANDASTACK_TEMPLATES_DIR", "directory of your own template specs (default <data dir>/templates)")
	str(&c.Mirror, "mirror", "PANDASTACK_DEBIAN_MIRROR", "Debian mirror for template builds")
	dur(&c.Sandbox.DefaultTTL, "default-ttl", "PANDASTACK_DEFAULT_TTL", "TTL of a sandbox created without ttl_seconds")
	dur(&c.Sandbox.MaxTTL, "max-ttl", "PANDASTACK_MAX_TTL", "largest TTL a caller may ask for")
	num(&c.Sandbox.MaxCPU, "max-cpu", "PANDASTACK_MAX_CPU", "most CPUs of one sandbox")
	num(&c.Sandbox.MaxMemoryMB, "max-memory-mb", "PANDASTACK_MAX_MEMORY_MB", "most memory of one sandbox, in MiB")
	num(&c.DiskMB, "disk-mb", "PANDASTACK_DISK_MB", "each sandbox's own disk in MiB: a full disk is ENOSPC to the writer (negative: writes stay in memory)")
	num(&c.Sandbox.MaxDiskMB, "max-disk-mb", "PANDASTACK_MAX_DISK_MB", "largest disk_mb a caller may ask for, in MiB; disks are sparse files in the data dir, which together may grow past its free space")
	num(&c.API.ExecOutputCap, "exec-output-cap", "PANDASTACK_EXEC_OUTPUT_CAP", "bytes kept per stream in a non-streamed exec answer")
	str(&c.BuildOnStart, "build-on-start", "PANDASTACK_BUILD_ON_START", "template to build on start when missing (empty: none)")
	num(&c.Sandbox.MaxFork, "max-fork", "PANDASTACK_MAX_FORK", "most children of one fork")
	dur(&c.Sandbox.IdleTimeout, "idle-timeout", "PANDASTACK_IDLE_TIMEOUT", "suspend a sandbox to disk after this long idle, unless it was created with its own idle_timeout_seconds (0: never)")
	num(&c.Sandbox.PoolSize, "pool-size", "PANDASTACK_POOL_SIZE", "sandboxes of each warm template kept restored ahead of creates (0: none)")
	num(&c.Sandbox.MemoryReserveMB, "memory-reserve-mb", "PANDASTACK_MEMORY_RESERVE_MB", "host memory kept available, in MiB: below it the pools are emptied and the quietest sandboxes suspended, and a create or resume that cannot be made room for is refused (insufficient_memory; 0: no reserve)")
	num(&c.Sandbox.PoolMemoryMB, "pool-memory-mb", "PANDASTACK_POOL_MEMORY_MB", "memory the pools may hold, in MiB: each keeps --pool-size ready, and more while creates come faster (0: exactly --pool-size)")
	num(&c.Sandbox.PreparedResumes, "prepared-resumes", "PANDASTACK_PREPARED_RESUMES", "sandboxes suspended last for idleness whose resume is prepared ahead: each keeps runsc's two processes waiting and its image in the page cache (0: none)")
	num(&c.Sandbox.PreparedCreates, "prepared-creates", "PANDASTACK_PREPARED_CREATES", "containers of each warm template created ahead for creates no pool sandbox serves: each keeps runsc's two processes waiting (0: none)")
	num(&c.Sandbox.MaxRestores, "max-restores", "PANDASTACK_MAX_RESTORES", "creates restoring at once, by default one per CPU; more wait in line, first come first served (0: no limit). Pool refills always wait for creates")
	boolean(&c.Sandbox.UnpacedRefills, "unpaced-refills", "PANDASTACK_UNPACED_REFILLS", "let each sandbox replace the spare kernel it handed out whenever it is quiet itself, instead of one sandbox at a time when the host has a CPU to spare")
	boolean(&c.Warm, "warm", "PANDASTACK_WARM", "snapshot templates warm so creates restore them")
	boolean(&c.KillOnExit, "kill-on-exit", "PANDASTACK_KILL_ON_EXIT", "kill every sandbox when serve stops (SIGTERM, SIGINT, SIGHUP), instead of re-adopting them on the next start; what a crash (SIGKILL) leaves running is re-adopted then all the same")
	str(&c.LogLevel, "log-level", "PANDASTACK_LOG_LEVEL", "debug, info, warn or error")
	if v, ok := os.LookupEnv("PANDASTACK_MAX_UPLOAD_BYTES"); ok {
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			c.API.MaxUploadBytes = n
		} else {
			bad("PANDASTACK_MAX_UPLOAD_BYTES", v, "a whole number of bytes")
		}
	}
	fs.Int64Var(&c.API.MaxUploadBytes, "max-upload-bytes", c.API.MaxUploadBytes, "largest file upload ($PANDASTACK_MAX_UPLOAD_BYTES)")
	c.Net.bind(fs, bad)
	c.Nodes.bind(str, dur)
}

// parseDuration accepts Go durations ("5m") and plain seconds ("300").
func parseDuration(s string) (time.Duration, error) {
	if n, err := strconv.Atoi(s); err == nil {
		return time.Duration(n) * time.Second, nil
	}
	return time.ParseDuration(s)
}

func (c *Config) templatesDir() string {
	if c.TemplatesDir != "" {
		return c.TemplatesDir
	}
	return filepath.Join(c.DataDir, "templates")
}

func (c *Config) dbPath() string      { return filepath.Join(c.DataDir, "pandastack.db") }
func (c *Config) keyPath() string     { return filepath.Join(c.DataDir, "api-key") }
func (c *Config) runtimeDir() string  { return filepath.Join(c.DataDir, "runtime") }
func (c *Config) snapshotDir() string { return filepath.Join(c.DataDir, "snapshots") }
func (c *Config) pausedDir() string   { return filepath.Join(c.DataDir, "paused") }
func (c *Config) warmDir() string     { return filepath.Join(c.CacheDir, "warm") }

func (c *Config) snapshotCacheDir() string { return filepath.Join(c.DataDir, "snapshot-cache") }

// validate refuses settings that make no sense, and environment values
// that did not parse (rather than ignore them).
func (c *Config) validate() error {
	if len(c.envErrs) > 0 {
		return fmt.Errorf("malformed environment: %w", errors.Join(c.envErrs...))
	}
	if c.MetricsListen != "" && c.MetricsListen == c.Listen {
		return fmt.Errorf("--metrics-listen %s: want an address of its own, not the API's (--listen)", c.MetricsListen)
	}
	if c.Sandbox.IdleTimeout < 0 {
		return fmt.Errorf("idle timeout %s must not be negative (0 disables idle suspend)", c.Sandbox.IdleTimeout)
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("log level %q: want debug, info, warn or error", c.LogLevel)
	}
	if err := c.Nodes.validate(); err != nil {
		return err
	}
	if c.Sandbox.MaxDiskMB < 64 || (c.DiskMB > 0 && c.DiskMB > c.Sandbox.MaxDiskMB) {
		return fmt.Errorf("--max-disk-mb %d must be at least 64 and at least --disk-mb (%d)", c.Sandbox.MaxDiskMB, c.DiskMB)
	}
	// A negative count or size would not mean "none" or "no limit" (an
	// exec output cap of -1 emptied every answer, an upload limit of -5
	// refused every upload): refused, naming the flag.
	for _, n := range []struct {
		flag  string
		value int64
		least int64
	}{
		{"pool-size", int64(c.Sandbox.PoolSize), 0},
		{"pool-memory-mb", int64(c.Sandbox.PoolMemoryMB), 0},
		{"memory-reserve-mb", int64(c.Sandbox.MemoryReserveMB), 0},
		{"prepared-resumes", int64(c.Sandbox.PreparedResumes), 0},
		{"prepared-creates", int64(c.Sandbox.PreparedCreates), 0},
		{"max-restores", int64(c.Sandbox.MaxRestores), 0},
		{"max-cpu", int64(c.Sandbox.MaxCPU), 0},
		{"max-memory-mb", int64(c.Sandbox.MaxMemoryMB), 0},
		{"max-fork", int64(c.Sandbox.MaxFork), 0},
		{"snapshot-cache-max-bytes", c.SnapshotCacheMaxBytes, 0},
		{"exec-output-cap", int64(c.API.ExecOutputCap), 0}, // 0: the default
		{"max-upload-bytes", c.API.MaxUploadBytes, 0},
	} {
		if n.value < n.least {
			return fmt.Errorf("--%s %d: want a whole number, at least %d", n.flag, n.value, n.least)
		}
	}
	if v := c.API.PublicURL; v != "" {
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
			return fmt.Errorf("--public-url %q: want the scheme and host clients reach this server at, such as https://sandboxes.example.com (no path, query or user)", v)
		}
		c.API.PublicURL = u.Scheme + "://" + u.Host
	}
	if d := c.Net.PublicDomain; strings.ContainsAny(d, ":/") {
		return fmt.Errorf("--public-domain %q: want a bare domain name, such as sandboxes.example.com (no scheme, port or path)", d)
	}
	if c.Sandbox.DefaultTTL <= 0 || c.Sandbox.MaxTTL <= 0 || c.Sandbox.DefaultTTL > c.Sandbox.MaxTTL {
		return fmt.Errorf("default TTL %s must be positive and at most the max TTL %s", c.Sandbox.DefaultTTL, c.Sandbox.MaxTTL)
	}
	return nil
}
