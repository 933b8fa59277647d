package sqlite

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/store/storetest"
)

func open(t *testing.T, path string) *Store {
	t.Helper()
	s, err := Open(path)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	return s
}

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) pandastack.Store {
		return open(t, filepath.Join(t.TempDir(), "pandastack.db"))
	})
}

// Characters that mean something in a URI must not break the path.
func TestOpenAwkwardPath(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a?b#c%20d e")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "x?.db")
	s := open(t, path)
	defer s.Close()
	if err := s.CreateProject(t.Context(), pandastack.Project{ID: "prj_1", Name: "default"}); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "x?.db" && e.Name() != "x?.db-wal" && e.Name() != "x?.db-shm" {
			t.Errorf("unexpected file %q in %s", e.Name(), dir)
		}
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("database not at its path: %v", err)
	}
}

func TestFileModeAndPragmas(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pandastack.db")
	s := open(t, path)
	defer s.Close()
	ctx := t.Context()
	// A write makes SQLite create the -wal file.
	if err := s.CreateProject(ctx, pandastack.Project{ID: "prj_1", Name: "default"}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if perm := fi.Mode().Perm(); perm != 0o600 {
			t.Errorf("%s mode = %o, want 600", filepath.Base(p), perm)
		}
	}

	// Each pooled connection must carry the settings, so hold several.
	const n = 3
	conns := make([]*sql.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range n {
		c, err := s.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		var mode string
		var fk, busy int
		if err := c.QueryRowContext(ctx, `PRAGMA journal_mode`).Scan(&mode); err != nil {
			t.Fatal(err)
		}
		if err := c.QueryRowContext(ctx, `PRAGMA foreign_keys`).Scan(&fk); err != nil {
			t.Fatal(err)
		}
		if err := c.QueryRowContext(ctx, `PRAGMA busy_timeout`).Scan(&busy); err != nil {
			t.Fatal(err)
		}
		if mode != "wal" || fk != 1 || busy < 1000 {
			t.Errorf("connection has journal_mode=%s foreign_keys=%d busy_timeout=%d; want wal, 1, >=1000", mode, fk, busy)
		}
	}
}

func TestReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pandastack.db")
	ctx := t.Context()
	created := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

	s := open(t, path)
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
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	for i := range 2 {
		s := open(t, path)
		var version int
		if err := s.db.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&version); err != nil {
			t.Fatal(err)
		}
		if version != len(migrations) {
			t.Errorf("reopen %d: user_version = %d, want %d", i, version, len(migrations))
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
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// A database written by a newer binary is refused rather than misread.
func TestNewerSchemaRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pandastack.db")
	s := open(t, path)
	if _, err := s.db.ExecContext(t.Context(), `PRAGMA user_version = 999`); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if s, err := Open(path); err == nil {
		s.Close()
		t.Fatal("Open of a database with a newer schema succeeded")
	}
}

// A database left by an older binary, at any earlier schema version, opens
// and upgrades with its records intact.
func TestUpgradeFromEveryOlderSchema(t *testing.T) {
	created := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	for applied := 1; applied < len(migrations); applied++ {
		t.Run(fmt.Sprintf("from_%d", applied), func(t *testing.T) {
			ctx := t.Context()
			path := filepath.Join(t.TempDir(), "pandastack.db")
			db, err := sql.Open("sqlite", dsn(path))
			if err != nil {
				t.Fatal(err)
			}
			old := &Store{db: db}
			if err := old.applyMigrations(ctx, migrations[:applied]); err != nil {
				t.Fatalf("apply %d migrations: %v", applied, err)
			}
			// Written with the columns of the first schema only, as the
			// oldest binary would.
			if _, err := db.ExecContext(ctx,
				`INSERT INTO sandboxes (id, project_id, template, state, metadata, cpu, memory_mb, created_at, expires_at)
				 VALUES ('sbx_old', 'prj_1', 'python', 'running', '{"k":"v"}', 1, 256, ?, ?)`,
				created.UnixMilli(), created.Add(time.Hour).UnixMilli()); err != nil {
				t.Fatal(err)
			}
			if err := old.Close(); err != nil {
				t.Fatal(err)
			}

			s := open(t, path)
			defer s.Close()
			var version int
			if err := s.db.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&version); err != nil {
				t.Fatal(err)
			}
			if version != len(migrations) {
				t.Errorf("user_version = %d, want %d", version, len(migrations))
			}
			got, err := s.GetSandbox(ctx, "prj_1", "sbx_old")
			if err != nil {
				t.Fatalf("GetSandbox of a pre-upgrade record: %v", err)
			}
			if got.Metadata["k"] != "v" || got.AutoResume || got.State != pandastack.StateRunning ||
				!got.ExpiresAt.Equal(created.Add(time.Hour)) {
				t.Errorf("pre-upgrade record = %+v", got)
			}

			// The new columns and tables work on the upgraded file.
			sb := got
			sb.ID, sb.State, sb.AutoResume = "sbx_new", pandastack.StatePaused, true
			if err := s.CreateSandbox(ctx, sb); err != nil {
				t.Fatal(err)
			}
			if got, err := s.GetSandbox(ctx, "", "sbx_new"); err != nil || !got.AutoResume || got.State != pandastack.StatePaused {
				t.Errorf("GetSandbox(sbx_new) = %+v, %v", got, err)
			}
			snap := pandastack.Snapshot{ID: "snap_1", ProjectID: "prj_1", SandboxID: "sbx_old", Template: "python",
				SizeBytes: 1 << 20, Metadata: map[string]string{"k": "v"}, CreatedAt: created, CPU: 1, MemoryMB: 256}
			if err := s.CreateSnapshot(ctx, snap); err != nil {
				t.Fatal(err)
			}
			if got, err := s.ListSnapshots(ctx, "prj_1", map[string]string{"k": "v"}); err != nil || len(got) != 1 || got[0].ID != "snap_1" {
				t.Errorf("ListSnapshots = %+v, %v", got, err)
			}
		})
	}
}

// The stored values of auto_resume are 0 and 1 only.
func TestAutoResumeColumn(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "pandastack.db"))
	defer s.Close()
	ctx := t.Context()
	for _, on := range []bool{false, true} {
		id := fmt.Sprintf("sbx_%v", on)
		if err := s.CreateSandbox(ctx, pandastack.Sandbox{ID: id, ProjectID: "prj_1", Template: "python",
			State: pandastack.StatePaused, AutoResume: on}); err != nil {
			t.Fatal(err)
		}
		var v any
		if err := s.db.QueryRowContext(ctx, `SELECT auto_resume FROM sandboxes WHERE id = ?`, id).Scan(&v); err != nil {
			t.Fatal(err)
		}
		want := int64(0)
		if on {
			want = 1
		}
		if v != want {
			t.Errorf("%s: auto_resume stored as %#v, want %d", id, v, want)
		}
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET auto_resume = 2`); err == nil {
		t.Error("auto_resume = 2 was accepted")
	}
}

// A database that has no room left (here: SQLite's page limit, as a full
// disk does) fails a write with an error ClassifyError names EStorage;
// other errors pass unchanged.
func TestClassifyError(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "pandastack.db"))
	defer s.Close()
	ctx := t.Context()
	s.db.SetMaxOpenConns(1) // the page limit is the connection's
	var pages int
	if err := s.db.QueryRowContext(ctx, `PRAGMA page_count`).Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := s.db.ExecContext(ctx, fmt.Sprintf(`PRAGMA max_page_count = %d`, pages)); err != nil {
		t.Fatal(err)
	}
	var err error
	for i := 0; i < 10000 && err == nil; i++ {
		err = s.CreateProject(ctx, pandastack.Project{ID: fmt.Sprintf("prj_%06d", i), Name: fmt.Sprintf("project %06d %0200d", i, i), CreatedAt: time.Now()})
	}
	if err == nil {
		t.Fatal("10000 projects fitted in a database held to its first pages")
	}
	if got := s.ClassifyError(err); !pandastack.IsCode(got, pandastack.EStorage) {
		t.Fatalf("a write to a full database: %v, classified %v", err, got)
	}
	plain := fmt.Errorf("something else")
	if got := s.ClassifyError(plain); got != plain {
		t.Fatalf("a plain error became %v", got)
	}
}

// IsStore tells a store that Open made from other files, and leaves each as
// it was.
func TestIsStore(t *testing.T) {
	dir := t.TempDir()
	ours := filepath.Join(dir, "pandastack.db")
	open(t, ours).Close()
	if err := IsStore(ours); err != nil {
		t.Errorf("a store Open made: %v", err)
	}
	foreign := filepath.Join(dir, "other.db")
	db, err := sql.Open("sqlite", foreign)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE notes (body TEXT)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	text := filepath.Join(dir, "notes.txt")
	if err := os.WriteFile(text, []byte("not a database, but long enough to look like a page header to a careless reader\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{foreign, text} {
		before, _ := os.ReadFile(path)
		if err := IsStore(path); err == nil {
			t.Errorf("%s taken for a store", filepath.Base(path))
		}
		if after, _ := os.ReadFile(path); string(after) != string(before) {
			t.Errorf("IsStore changed %s", filepath.Base(path))
		}
	}
}

// The reaper's query (every second) and the list of a project's live
// sandboxes reach their rows through indexes that leave out the stopped
// records kept for a day: SQLite's plan says which index it searches.
func TestLiveQueriesSkipStoppedRecords(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "pandastack.db"))
	defer s.Close()
	plan := func(q string, args ...any) string {
		rows, err := s.db.Query(`EXPLAIN QUERY PLAN `+q, args...)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var out string
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			out += detail + "; "
		}
		return out
	}
	if p := plan(expiredQuery, 0); !strings.Contains(p, "sandboxes_live_expires") {
		t.Errorf("the reaper's query: %s; want the index sandboxes_live_expires", p)
	}
	live, args := listSandboxesQuery(pandastack.SandboxFilter{ProjectID: "prj_a", States: []pandastack.SandboxState{pandastack.StateStarting, pandastack.StateRunning, pandastack.StatePaused}})
	if p := plan(live, args...); !strings.Contains(p, "sandboxes_project_state") {
		t.Errorf("the list of live sandboxes: %s; want the index sandboxes_project_state", p)
	}
	// Pages start at their cursor in an index that is in the list's
	// order: no walk from the start, no sort.
	after := &pandastack.SandboxCursor{CreatedAt: time.UnixMilli(1e12), ID: "sbx_x"}
	for _, c := range []struct {
		what, index string
		f           pandastack.SandboxFilter
	}{
		{"a page of every state", "sandboxes_project_order (project_id=? AND (created_at,id)>(?,?))", pandastack.SandboxFilter{ProjectID: "prj_a", Limit: 501, After: after}},
		{"a page of every state, newest first", "sandboxes_project_order (project_id=? AND (created_at,id)<(?,?))", pandastack.SandboxFilter{ProjectID: "prj_a", Limit: 501, After: after, Newest: true}},
		{"a page of stopped ones, newest first", "sandboxes_project_state (project_id=? AND state=? AND (created_at,id)<(?,?))",
			pandastack.SandboxFilter{ProjectID: "prj_a", States: []pandastack.SandboxState{pandastack.StateStopped}, Limit: 501, After: after, Newest: true}},
	} {
		q, args := listSandboxesQuery(c.f)
		if p := plan(q, args...); !strings.Contains(p, c.index) || strings.Contains(p, "TEMP B-TREE") {
			t.Errorf("%s: %s; want the index %s and no sort", c.what, p, c.index)
		}
	}
}

// The history's totals follow its entries through puts, rewrites, keeps
// and trims, also at once.
func TestHistoryTotals(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "pandastack.db"))
	defer s.Close()
	storetest.ChurnHistory(t, s, func(stage string) {
		t.Helper()
		rows, err := s.db.Query(`SELECT t.project_id, t.bytes, COALESCE((SELECT SUM(size) FROM history h WHERE h.project_id = t.project_id), 0)
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

// A total that says more than the entries hold is summed again by the
// next trim, which takes nothing for it (taking the project's whole
// history would have been the result).
func TestHistoryTotalTooHighIsMended(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "pandastack.db"))
	defer s.Close()
	ctx := t.Context()
	code := 0
	for i := range 3 {
		e := pandastack.HistoryEntry{ID: fmt.Sprintf("h_%d", i), Kind: "exec", Command: strings.Repeat("x", 100), ExitCode: &code}
		if err := s.PutHistory(ctx, "prj_a", "sbx_a", e, 0); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.db.Exec(`UPDATE history_totals SET bytes = bytes + 100000`); err != nil {
		t.Fatal(err)
	}
	if n, err := s.TrimHistory(ctx, 50000); err != nil || n != 0 {
		t.Fatalf("trim by a total too high: %d gone, %v; want none", n, err)
	}
	var kept, sum int64
	s.db.QueryRow(`SELECT bytes, (SELECT SUM(size) FROM history) FROM history_totals WHERE project_id = 'prj_a'`).Scan(&kept, &sum)
	if kept != sum {
		t.Errorf("the total after the trim: %d, the entries hold %d", kept, sum)
	}
}
