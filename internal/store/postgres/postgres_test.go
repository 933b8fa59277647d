package postgres

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/store/storetest"
	"github.com/pandastack/pandastack/internal/testutil"
)

// The tests share one throwaway cluster (a real PostgreSQL server, started
// by initdb and pg_ctl into a temp dir) and make a database per test.
func TestMain(m *testing.M) {
	code := m.Run()
	if err := testutil.StopSharedPostgres(); err != nil {
		fmt.Fprintf(os.Stderr, "FAIL: stop the test PostgreSQL cluster: %v\n", err)
		code = 1
	}
	os.Exit(code)
}

// newDatabase returns the URL of an empty database of the shared cluster.
func newDatabase(t *testing.T) string {
	t.Helper()
	return testutil.SharedPostgres(t).NewDatabase(t)
}

func open(t *testing.T, url string) *Store {
	t.Helper()
	s, err := Open(t.Context(), url)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) pandastack.Store {
		return open(t, newDatabase(t))
	})
}

func schemaVersion(t *testing.T, s *Store) (version, rows int) {
	t.Helper()
	err := s.pool.QueryRow(t.Context(), `SELECT coalesce(max(version), 0), count(*) FROM schema_migrations`).Scan(&version, &rows)
	if err != nil {
		t.Fatal(err)
	}
	return version, rows
}

func TestReopen(t *testing.T) {
	url := newDatabase(t)
	ctx := t.Context()
	created := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

	s := open(t, url)
	if err := s.CreateProject(ctx, pandastack.Project{ID: "prj_1", Name: "default", CreatedAt: created}); err != nil {
		t.Fatal(err)
	}
	sb := pandastack.Sandbox{
		ID: "sbx_1", ProjectID: "prj_1", Template: "python", State: pandastack.StateRunning,
		Metadata: map[string]string{"k": "v"}, CPU: 1, MemoryMB: 256,
		CreatedAt: created, ExpiresAt: created.Add(time.Hour),
	}
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	s.Close()

	for i := range 2 {
		s := open(t, url)
		if v, n := schemaVersion(t, s); v != len(migrations) || n != len(migrations) {
			t.Errorf("reopen %d: schema version %d in %d rows, want %d in %d", i, v, n, len(migrations), len(migrations))
		}
		// Re-running migrations on an up-to-date database changes nothing.
		if err := s.migrate(ctx); err != nil {
			t.Fatalf("reopen %d: migrate again: %v", i, err)
		}
		p, err := s.ProjectByName(ctx, "default")
		if err != nil || p.ID != "prj_1" || !p.CreatedAt.Equal(created) {
			t.Errorf("reopen %d: ProjectByName = %+v, %v", i, p, err)
		}
		got, err := s.GetSandbox(ctx, "prj_1", "sbx_1")
		if err != nil || got.Metadata["k"] != "v" || !got.ExpiresAt.Equal(sb.ExpiresAt) {
			t.Errorf("reopen %d: GetSandbox = %+v, %v", i, got, err)
		}
		s.Close()
	}
}

// A database migrated by a newer binary is refused rather than misread.
func TestNewerSchemaRefused(t *testing.T) {
	url := newDatabase(t)
	s := open(t, url)
	if _, err := s.pool.Exec(t.Context(), `INSERT INTO schema_migrations (version) VALUES (999)`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err := Open(t.Context(), url)
	if err == nil {
		s.Close()
		t.Fatal("Open of a database with a newer schema succeeded")
	}
	if !strings.Contains(err.Error(), "newer") {
		t.Errorf("err = %v, want it to say the schema is newer", err)
	}
}

// Several serve processes starting at once on one empty database: each
// migration runs once (the advisory lock), and every one of them opens.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	url := newDatabase(t)
	const n = 8
	stores := make([]*Store, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			stores[i], errs[i] = Open(t.Context(), url)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Open %d: %v", i, err)
			continue
		}
		defer stores[i].Close()
	}
	if t.Failed() {
		return
	}
	if v, rows := schemaVersion(t, stores[0]); v != len(migrations) || rows != len(migrations) {
		t.Errorf("schema version %d in %d rows, want %d in %d", v, rows, len(migrations), len(migrations))
	}
	// The stores see one database: what one writes, another reads.
	ctx := t.Context()
	if err := stores[1].CreateProject(ctx, pandastack.Project{ID: "prj_1", Name: "default"}); err != nil {
		t.Fatal(err)
	}
	if p, err := stores[n-1].ProjectByName(ctx, "default"); err != nil || p.ID != "prj_1" {
		t.Errorf("ProjectByName through another store = %+v, %v", p, err)
	}
}

// Two stores on one database, as two serve processes would be: racing
// creates of one id have one winner, racing revokes agree on the time.
func TestTwoStoresShareOneDatabase(t *testing.T) {
	url := newDatabase(t)
	a, b := open(t, url), open(t, url)
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	stores := []*Store{a, b}
	base := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

	const rounds = 20
	for r := range rounds {
		id := fmt.Sprintf("sbx_%d", r)
		errs := make([]error, len(stores))
		var wg sync.WaitGroup
		for i, s := range stores {
			wg.Go(func() {
				errs[i] = s.CreateSandbox(ctx, pandastack.Sandbox{ID: id, ProjectID: "prj_1", Template: "python",
					State: pandastack.StateRunning, CPU: 1, MemoryMB: 256, CreatedAt: base, ExpiresAt: base.Add(time.Hour)})
			})
		}
		wg.Wait()
		wins := 0
		for i, err := range errs {
			switch {
			case err == nil:
				wins++
			case !pandastack.IsCode(err, pandastack.EConflict):
				t.Errorf("round %d store %d: %v", r, i, err)
			}
		}
		if wins != 1 {
			t.Errorf("round %d: %d stores created %s, want 1", r, wins, id)
		}
	}
	for i, s := range stores {
		got, err := s.ListSandboxes(ctx, pandastack.SandboxFilter{})
		if err != nil || len(got) != rounds {
			t.Errorf("store %d lists %d sandboxes (%v), want %d", i, len(got), err, rounds)
		}
	}

	if err := a.CreateProject(ctx, pandastack.Project{ID: "prj_1", Name: "default", CreatedAt: base}); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateAPIKey(ctx, pandastack.APIKey{ID: "key_1", ProjectID: "prj_1", Name: "k", Prefix: "pds_a", Hash: "h1", CreatedAt: base}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Go(func() {
			if err := s.RevokeAPIKey(ctx, "key_1", base.Add(time.Duration(i+1)*time.Minute)); err != nil {
				t.Errorf("revoke through store %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	ka, errA := a.APIKeyByHash(ctx, "h1")
	kb, errB := b.APIKeyByHash(ctx, "h1")
	if errA != nil || errB != nil || ka.RevokedAt == nil || kb.RevokedAt == nil || !ka.RevokedAt.Equal(*kb.RevokedAt) {
		t.Fatalf("after racing revokes: %+v %v / %+v %v", ka, errA, kb, errB)
	}
	if t1, t2 := base.Add(time.Minute), base.Add(2*time.Minute); !ka.RevokedAt.Equal(t1) && !ka.RevokedAt.Equal(t2) {
		t.Errorf("RevokedAt = %v, want %v or %v", ka.RevokedAt, t1, t2)
	}
}

// A malformed URL is EInvalid without echoing it (it may hold a password);
// a server that is not there is an error, not a hang.
func TestOpenErrors(t *testing.T) {
	_, err := Open(t.Context(), "postgres://user:s3cret@%zz/db")
	if !pandastack.IsCode(err, pandastack.EInvalid) {
		t.Errorf("malformed URL: err = %v, want %s", err, pandastack.EInvalid)
	}
	if err != nil && strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error shows the password: %v", err)
	}

	dir := t.TempDir() // no server listens here
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	s, err := Open(ctx, "postgres:///db?host="+dir+"&user=postgres&password=s3cret&connect_timeout=5")
	if err == nil {
		s.Close()
		t.Fatal("Open of a missing server succeeded")
	}
	if strings.Contains(err.Error(), "s3cret") {
		t.Errorf("error shows the password: %v", err)
	}
}

// The schema enforces what the code assumes, whoever writes to it.
func TestSchemaConstraints(t *testing.T) {
	s := open(t, newDatabase(t))
	defer s.Close()
	ctx := t.Context()
	if _, err := s.pool.Exec(ctx, `INSERT INTO sandboxes (id, project_id, template, state, metadata, cpu, memory_mb, created_at, expires_at)
		VALUES ('sbx_1', 'prj_1', 'python', 'running', '["not an object"]', 1, 256, now(), now())`); err == nil {
		t.Error("a sandbox whose metadata is a JSON array was accepted")
	}
	if _, err := s.pool.Exec(ctx, `INSERT INTO api_keys (id, project_id, name, prefix, hash, created_at)
		VALUES ('key_1', 'prj_nope', 'k', 'pds_a', 'h1', now())`); err == nil {
		t.Error("a key of an unknown project was accepted")
	}
}

// A store whose server went away fails with errors ClassifyError names
// EUnavailable (the API's 503: retry); other errors pass unchanged.
func TestClassifyErrorServerGone(t *testing.T) {
	pg := testutil.StartPostgres(t) // its own cluster: this test stops it
	url := pg.NewDatabase(t)
	s := open(t, url)
	defer s.Close()
	ctx := t.Context()
	if err := s.CreateProject(ctx, pandastack.Project{ID: "prj_a", Name: "a", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := pg.Stop(); err != nil {
		t.Fatal(err)
	}
	// The pool's connection dies with the server, and a new one is refused.
	for range 2 {
		_, err := s.ProjectByName(ctx, "a")
		if err == nil {
			t.Fatal("a query answered with the server stopped")
		}
		if got := s.ClassifyError(err); !pandastack.IsCode(got, pandastack.EUnavailable) {
			t.Fatalf("with the server stopped: %v, classified %v", err, got)
		}
	}
	// Not the database's: another part's network error or EOF (an agent,
	// an object store) stays as it is.
	for _, other := range []error{
		fmt.Errorf("something else"),
		fmt.Errorf("upload: %w", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}),
		fmt.Errorf("agent: %w", io.ErrUnexpectedEOF),
	} {
		if got := s.ClassifyError(other); got != other {
			t.Fatalf("%v became %v", other, got)
		}
	}
}

// The history's totals follow its entries through puts, rewrites, keeps
// and trims, also at once (a put and a trim deadlocked, each holding what
// the other wanted).
func TestHistoryTotals(t *testing.T) {
	s := open(t, newDatabase(t))
	defer s.Close()
	storetest.ChurnHistory(t, s, func(stage string) {
		t.Helper()
		rows, err := s.pool.Query(t.Context(), `SELECT t.project_id, t.bytes, COALESCE((SELECT SUM(size) FROM history h WHERE h.project_id = t.project_id), 0)
			FROM history_totals t`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var p string
			var kept, sum int64
			if err := rows.Scan(&p, &kept, &sum); err != nil {
				t.Fatal(err)
			}
			if kept != sum {
				t.Errorf("%s: %s's total %d, its entries %d bytes", stage, p, kept, sum)
			}
		}
	})
}
