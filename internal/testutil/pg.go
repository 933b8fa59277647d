//go:build unix

package testutil

import (
	"cmp"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Postgres is a throwaway PostgreSQL cluster: initdb into a temp dir, one
// server started with pg_ctl that listens only on a Unix socket in that dir
// (no TCP port to collide with anyone's), trust authentication for the
// superuser "postgres" (only the dir's owner and root can reach the socket).
// Durability is off (fsync, synchronous_commit): it is for tests.
type Postgres struct {
	dir  string // 0700, owned by the cluster's OS user; data/, the socket, the log
	bin  string
	cred *syscall.Credential // nil when the tests do not run as root

	mu     sync.Mutex
	n      int // databases made so far, for their names
	closed bool
}

// PostgresBin returns the directory holding initdb, pg_ctl and postgres:
// $PANDASTACK_PG_BIN, else the newest of Debian's /usr/lib/postgresql/*/bin.
func PostgresBin(t testing.TB) string {
	t.Helper()
	bin := findPostgresBin()
	if bin == "" {
		missing(t, "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found", pgFix)
	}
	return bin
}

const pgFix = "apt-get install postgresql-15 (./scripts/setup.sh does it), or point PANDASTACK_PG_BIN at a directory holding initdb and pg_ctl"

// findPostgresBin is PostgresBin without a test: "" when there is none.
func findPostgresBin() string {
	dirs := []string{os.Getenv("PANDASTACK_PG_BIN")}
	if dirs[0] == "" {
		found, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
		// Newest major version first: 15 before 9.6.
		slices.SortFunc(found, func(a, b string) int { return cmp.Compare(pgMajor(b), pgMajor(a)) })
		dirs = found
	}
	for _, d := range dirs {
		if isExecutable(filepath.Join(d, "initdb")) && isExecutable(filepath.Join(d, "pg_ctl")) && isExecutable(filepath.Join(d, "postgres")) {
			return d
		}
	}
	return ""
}

// pgMajor reads the version from /usr/lib/postgresql/<version>/bin.
func pgMajor(bin string) float64 {
	v, _ := strconv.ParseFloat(filepath.Base(filepath.Dir(bin)), 64)
	return v
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// StartPostgres starts a new cluster and stops and removes it when t ends.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	p, err := startPostgres(t)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("stop PostgreSQL: %v", err)
		}
	})
	return p
}

var (
	sharedPGMu sync.Mutex
	sharedPG   *Postgres
)

// SharedPostgres returns a cluster started once per test process; tests
// share it through NewDatabase. TestMain must call StopSharedPostgres.
func SharedPostgres(t testing.TB) *Postgres {
	t.Helper()
	sharedPGMu.Lock()
	defer sharedPGMu.Unlock()
	if sharedPG == nil {
		p, err := startPostgres(t)
		if err != nil {
			t.Fatal(err)
		}
		sharedPG = p
	}
	return sharedPG
}

// StopSharedPostgres stops and removes what SharedPostgres started; call it
// from TestMain after m.Run.
func StopSharedPostgres() error {
	sharedPGMu.Lock()
	defer sharedPGMu.Unlock()
	if sharedPG == nil {
		return nil
	}
	err := sharedPG.Stop()
	sharedPG = nil
	return err
}

func startPostgres(t testing.TB) (*Postgres, error) {
	t.Helper()
	bin := PostgresBin(t)
	if os.Getuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			missing(t, "the tests run as root and there is no user \"postgres\" to run PostgreSQL as", "apt-get install postgresql-15, which creates it (./scripts/setup.sh does it)")
			return nil, err
		}
	}
	return newPostgres(bin)
}

// NewPostgres starts a cluster for a program that is no test (the
// benchmark); the caller stops it.
func NewPostgres() (*Postgres, error) {
	bin := findPostgresBin()
	if bin == "" {
		return nil, fmt.Errorf("PostgreSQL server binaries not found: %s", pgFix)
	}
	return newPostgres(bin)
}

func newPostgres(bin string) (*Postgres, error) {
	p := &Postgres{bin: bin}
	uid, gid := os.Getuid(), os.Getgid()
	if uid == 0 {
		// PostgreSQL refuses to run as root; Debian's package made this user.
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root and no user \"postgres\" to run PostgreSQL as: %w", err)
		}
		uid, _ = strconv.Atoi(u.Uid)
		gid, _ = strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	dir, err := os.MkdirTemp("", "pandastack-pg-")
	if err != nil {
		return nil, err
	}
	p.dir = dir
	if err := os.Chown(dir, uid, gid); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if out, err := p.run("initdb", "--pgdata="+p.dataDir(), "--username=postgres", "--auth=trust",
		"--encoding=UTF8", "--locale=C", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v\n%s", err, out)
	}
	opts := strings.Join([]string{
		"-c listen_addresses=''",
		"-c unix_socket_directories=" + dir,
		"-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off",
		"-c max_connections=200", "-c shared_buffers=32MB",
	}, " ")
	if out, err := p.run("pg_ctl", "start", "--pgdata="+p.dataDir(), "--wait", "--timeout=120",
		"--log="+filepath.Join(dir, "server.log"), "--options="+opts); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "server.log"))
		p.Stop()
		return nil, fmt.Errorf("pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	return p, nil
}

func (p *Postgres) dataDir() string { return filepath.Join(p.dir, "data") }

// run runs one of the cluster's binaries as the cluster's OS user.
func (p *Postgres) run(name string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(p.bin, name), args...)
	cmd.Dir = p.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	if p.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	}
	return cmd.CombinedOutput()
}

// URL returns a connection URL for database db (user postgres, the socket).
func (p *Postgres) URL(db string) string {
	q := url.Values{"host": {p.dir}, "user": {"postgres"}, "sslmode": {"disable"}}
	return (&url.URL{Scheme: "postgres", Path: "/" + db, RawQuery: q.Encode()}).String()
}

// NewDatabase creates an empty database and returns its URL.
func (p *Postgres) NewDatabase(t testing.TB) string {
	t.Helper()
	u, err := p.CreateDatabase()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// CreateDatabase is NewDatabase without a test.
func (p *Postgres) CreateDatabase() (string, error) {
	p.mu.Lock()
	p.n++
	name := fmt.Sprintf("t%d", p.n)
	p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.URL("postgres"))
	if err != nil {
		return "", fmt.Errorf("connect to the test cluster: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+name); err != nil {
		return "", fmt.Errorf("create database %s: %w", name, err)
	}
	return p.URL(name), nil
}

// Stop stops the server (fast shutdown: sessions are ended) and removes
// the cluster's directory. It is safe to call twice.
func (p *Postgres) Stop() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var err error
	pid := p.postmasterPID()
	if pid > 0 {
		if out, e := p.run("pg_ctl", "stop", "--pgdata="+p.dataDir(), "--mode=fast", "--wait", "--timeout=60"); e != nil {
			err = fmt.Errorf("pg_ctl stop: %v\n%s", e, out)
		}
		// Whatever pg_ctl said, no server of ours outlives the test. It
		// removes postmaster.pid just before it exits: allow for that.
		deadline := time.Now().Add(10 * time.Second)
		for p.running(pid) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if p.running(pid) {
			syscall.Kill(pid, syscall.SIGKILL)
			err = fmt.Errorf("postmaster %d was still running after pg_ctl stop; killed it (%v)", pid, err)
		}
	}
	if e := os.RemoveAll(p.dir); e != nil && err == nil {
		err = e
	}
	return err
}

// running reports whether pid is this cluster's postmaster and not yet
// exited (a zombie waiting for its reaper has exited).
func (p *Postgres) running(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	if i := strings.LastIndexByte(string(stat), ')'); i >= 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
		return false
	}
	cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.Contains(string(cmdline), p.dir)
}

// postmasterPID reads the first line of postmaster.pid; 0 if there is none.
func (p *Postgres) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(p.dataDir(), "postmaster.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	return pid
}
