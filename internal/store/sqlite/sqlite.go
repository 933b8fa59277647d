// Package sqlite is the pandastack.Store on an embedded SQLite database
// (pure Go, modernc.org/sqlite). Only cmd/ and tests import it.
package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/store/metajson"
)

var _ pandastack.Store = (*Store)(nil)

// Store is a pandastack.Store backed by one SQLite file.
type Store struct {
	db *sql.DB
}

// Open opens (creating it with mode 0600 if needed) the database at path and
// applies any pending migrations.
func Open(path string) (*Store, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	// SQLite would create the file with 0644; it holds API key hashes.
	// Its -wal and -shm files inherit this file's mode.
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	f.Close()

	db, err := sql.Open("sqlite", dsn(abs))
	if err != nil {
		return nil, fmt.Errorf("open store %s: %w", abs, err)
	}
	// WAL lets readers run beside the one writer; more connections than
	// this only queue on SQLite's lock.
	db.SetMaxOpenConns(8)
	db.SetMaxIdleConns(8)
	s := &Store{db: db}
	if err := s.migrate(context.Background()); err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", abs, err)
	}
	return s, nil
}

// IsStore says why the existing file at path is not a store that Open
// made (nil when it is), without changing it: not an SQLite database, or
// one without this schema (another program's).
func IsStore(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return err
	}
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(abs), RawQuery: url.Values{"mode": {"ro"}}.Encode()}
	db, err := sql.Open("sqlite", u.String())
	if err != nil {
		return err
	}
	defer db.Close()
	var version, keys int
	err = db.QueryRow(`PRAGMA user_version`).Scan(&version)
	if err == nil {
		err = db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'api_keys'`).Scan(&keys)
	}
	switch {
	case err != nil:
		return fmt.Errorf("not an SQLite database (%v)", err)
	case version < 1 || keys == 0:
		return errors.New("an SQLite database without PandaStack's tables")
	}
	return nil
}

// dsn names the file as a URI so that '?', '#' and '%' in the path are not
// taken for parameters. Every pooled connection gets these settings.
func dsn(abs string) string {
	q := url.Values{}
	q.Set("_busy_timeout", "5000")
	q.Set("_journal_mode", "WAL")
	q.Set("_foreign_keys", "1")
	// NORMAL is crash-safe under WAL; a power cut may lose the last commits.
	q.Set("_synchronous", "NORMAL")
	// Take the write lock at BEGIN: a deferred transaction that upgrades
	// from read to write fails with SQLITE_BUSY instead of waiting.
	q.Set("_txlock", "immediate")
	u := url.URL{Scheme: "file", Path: filepath.ToSlash(abs), RawQuery: q.Encode()}
	return u.String()
}

// migrations are applied in order, each once; PRAGMA user_version counts
// those applied. Append new ones; never edit or reorder a released one.
var migrations = []string{
	`CREATE TABLE projects (
		id         TEXT PRIMARY KEY,
		name       TEXT NOT NULL UNIQUE,
		created_at INTEGER NOT NULL
	) STRICT;
	CREATE TABLE api_keys (
		id         TEXT PRIMARY KEY,
		project_id TEXT NOT NULL REFERENCES projects(id),
		name       TEXT NOT NULL,
		prefix     TEXT NOT NULL,
		hash       TEXT NOT NULL UNIQUE,
		created_at INTEGER NOT NULL,
		revoked_at INTEGER
	) STRICT;
	CREATE INDEX api_keys_project ON api_keys(project_id);
	CREATE INDEX api_keys_prefix ON api_keys(prefix);
	CREATE TABLE sandboxes (
		id          TEXT PRIMARY KEY,
		project_id  TEXT NOT NULL,
		template    TEXT NOT NULL,
		state       TEXT NOT NULL,
		metadata    TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)),
		cpu         INTEGER NOT NULL,
		memory_mb   INTEGER NOT NULL,
		created_at  INTEGER NOT NULL,
		expires_at  INTEGER NOT NULL,
		stopped_at  INTEGER,
		stop_reason TEXT NOT NULL DEFAULT ''
	) STRICT;
	CREATE INDEX sandboxes_project ON sandboxes(project_id, created_at);
	CREATE INDEX sandboxes_expires ON sandboxes(expires_at);
	CREATE INDEX sandboxes_stopped ON sandboxes(stopped_at);`,

	// Snapshots outlive the sandbox they were taken of, so sandbox_id is no
	// foreign key: stopped sandbox records are purged.
	`CREATE TABLE snapshots (
		id         TEXT PRIMARY KEY,
		project_id TEXT NOT NULL,
		sandbox_id TEXT NOT NULL,
		template   TEXT NOT NULL,
		size_bytes INTEGER NOT NULL,
		metadata   TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(metadata)),
		cpu        INTEGER NOT NULL,
		memory_mb  INTEGER NOT NULL,
		created_at INTEGER NOT NULL
	) STRICT;
	CREATE INDEX snapshots_project ON snapshots(project_id, created_at);`,

	`ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0 CHECK (auto_resume IN (0, 1));`,
	`ALTER TABLE sandboxes ADD COLUMN idle_timeout_seconds INTEGER NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN pause_reason TEXT NOT NULL DEFAULT '';
	ALTER TABLE sandboxes ADD COLUMN rootfs TEXT NOT NULL DEFAULT '';`,
	// Several hosts (nodes.go): each sandbox belongs to a node.
	`ALTER TABLE sandboxes ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
	CREATE INDEX sandboxes_node ON sandboxes(node_id, state);
	CREATE TABLE nodes (
		id             TEXT PRIMARY KEY,
		url            TEXT NOT NULL,
		state          TEXT NOT NULL,
		started_at     INTEGER NOT NULL,
		heartbeat_at   INTEGER NOT NULL,
		cpus           INTEGER NOT NULL,
		memory_mb      INTEGER NOT NULL,
		free_memory_mb INTEGER NOT NULL,
		pool           TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(pool)),
		placed_at      INTEGER NOT NULL DEFAULT 0
	) STRICT;`,
	historyMigration,
	// API key scopes: the keys made before them may do everything.
	`ALTER TABLE api_keys ADD COLUMN scope TEXT NOT NULL DEFAULT 'all';`,
	// A snapshot's egress policy, as JSON; '' for none (those taken before).
	`ALTER TABLE snapshots ADD COLUMN network TEXT NOT NULL DEFAULT '' CHECK (network = '' OR json_valid(network));`,
	// Stopped records stay a day (the purge): the reaper, which looks
	// every second, and the lists of live sandboxes go past them.
	// (project_id, created_at) ordered the list without a sort, but made
	// SQLite walk every record of the project, stopped ones too.
	`CREATE INDEX sandboxes_live_expires ON sandboxes(expires_at) WHERE state != 'stopped';
	DROP INDEX sandboxes_expires;
	DROP INDEX sandboxes_project;
	CREATE INDEX sandboxes_project_state ON sandboxes(project_id, state, created_at);`,
	historyTotalsMigration,
	// Pages of a list: a project's records in the list's order (creation,
	// then id), for pages of every state (state=all); and of one state
	// (stopped ones, newest first, in the console), without a sort.
	`CREATE INDEX sandboxes_project_order ON sandboxes(project_id, created_at, id);
	DROP INDEX sandboxes_project_state;
	CREATE INDEX sandboxes_project_state ON sandboxes(project_id, state, created_at, id);`,
}

// keyScope is the scope stored for s: ScopeAll when empty.
func keyScope(s string) string {
	if s == "" {
		return pandastack.ScopeAll
	}
	return s
}

func (s *Store) migrate(ctx context.Context) error {
	return s.applyMigrations(ctx, migrations)
}

// applyMigrations brings the database to len(ms) applied migrations. Tests
// pass a prefix of migrations to build a database as an older binary left it.
func (s *Store) applyMigrations(ctx context.Context, ms []string) error {
	// The immediate transaction also keeps two processes opening the same
	// file from both applying a migration.
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback()
	var version int
	if err := tx.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&version); err != nil {
		return fmt.Errorf("migrate: read version: %w", err)
	}
	if version > len(ms) {
		return fmt.Errorf("migrate: database schema version %d is newer than this binary's %d", version, len(ms))
	}
	if version == len(ms) {
		return nil
	}
	for i := version; i < len(ms); i++ {
		if _, err := tx.ExecContext(ctx, ms[i]); err != nil {
			return fmt.Errorf("migrate: migration %d: %w", i+1, err)
		}
	}
	// PRAGMA takes no bound parameters; the value is our own integer.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf(`PRAGMA user_version = %d`, len(ms))); err != nil {
		return fmt.Errorf("migrate: set version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("migrate: commit: %w", err)
	}
	return nil
}

// Close releases the database.
func (s *Store) Close() error { return s.db.Close() }

// --- encoding ---

func millis(t time.Time) int64 { return t.UnixMilli() }

func fromMillis(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

func millisPtr(t *time.Time) sql.NullInt64 {
	if t == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: t.UnixMilli(), Valid: true}
}

func fromNullMillis(n sql.NullInt64) *time.Time {
	if !n.Valid {
		return nil
	}
	t := fromMillis(n.Int64)
	return &t
}

// constraint reports whether err is the given extended SQLite constraint code.
func constraint(err error, code int) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code() == code
}

// isFull reports whether err is SQLite's "database or disk is full".
func isFull(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_FULL
}

func isUnique(err error) bool {
	return constraint(err, sqlite3.SQLITE_CONSTRAINT_UNIQUE) || constraint(err, sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY)
}

func notFound(what, name string) error {
	return pandastack.Errorf(pandastack.ENotFound, "%s %.64q not found", what, name) // an id of 100 kB is not echoed whole
}

// rowsAffectedOrNotFound turns an UPDATE or DELETE that matched nothing into
// ENotFound.
func rowsAffectedOrNotFound(res sql.Result, what, name string) error {
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return notFound(what, name)
	}
	return nil
}

// metadataWhere returns one condition (and its arguments) per entry of md,
// each requiring table.metadata to hold that key with exactly that text
// value. json_each compares whole keys, so a key is never parsed as a path.
// table is one of our own table names, never user input.
func metadataWhere(table string, md map[string]string) (where []string, args []any) {
	for k, v := range md {
		where = append(where, `EXISTS (SELECT 1 FROM json_each(`+table+`.metadata) AS m
			WHERE m.key = ? AND m.type = 'text' AND m.value = ?)`)
		args = append(args, k, v)
	}
	return where, args
}

// --- projects ---

// CreateProject implements pandastack.Store.
func (s *Store) CreateProject(ctx context.Context, p pandastack.Project) error {
	if !pandastack.StorableText(p.ID, p.Name) {
		return pandastack.ErrUnstorableText("project", p.Name)
	}
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO projects (id, name, created_at) VALUES (?, ?, ?)`,
		p.ID, p.Name, millis(p.CreatedAt))
	if isUnique(err) {
		return pandastack.Errorf(pandastack.EConflict, "project %q or its name %q already exists", p.ID, p.Name)
	}
	if err != nil {
		return fmt.Errorf("create project %s: %w", p.ID, err)
	}
	return nil
}

// ListProjects implements pandastack.Store.
func (s *Store) ListProjects(ctx context.Context) ([]pandastack.Project, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, name, created_at FROM projects ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	defer rows.Close()
	var out []pandastack.Project
	for rows.Next() {
		var p pandastack.Project
		var created int64
		if err := rows.Scan(&p.ID, &p.Name, &created); err != nil {
			return nil, fmt.Errorf("list projects: %w", err)
		}
		p.CreatedAt = fromMillis(created)
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	return out, nil
}

// ProjectByName implements pandastack.Store.
func (s *Store) ProjectByName(ctx context.Context, name string) (pandastack.Project, error) {
	var p pandastack.Project
	var created int64
	err := s.db.QueryRowContext(ctx,
		`SELECT id, name, created_at FROM projects WHERE name = ?`, name).
		Scan(&p.ID, &p.Name, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return pandastack.Project{}, notFound("project", name)
	}
	if err != nil {
		return pandastack.Project{}, fmt.Errorf("project %s: %w", name, err)
	}
	p.CreatedAt = fromMillis(created)
	return p, nil
}

// --- API keys ---

const keyColumns = `id, project_id, name, prefix, hash, created_at, revoked_at, scope`

func scanKey(row interface{ Scan(...any) error }) (pandastack.APIKey, error) {
	var k pandastack.APIKey
	var created int64
	var revoked sql.NullInt64
	if err := row.Scan(&k.ID, &k.ProjectID, &k.Name, &k.Prefix, &k.Hash, &created, &revoked, &k.Scope); err != nil {
		return pandastack.APIKey{}, err
	}
	k.CreatedAt = fromMillis(created)
	k.RevokedAt = fromNullMillis(revoked)
	return k, nil
}

// CreateAPIKey implements pandastack.Store. An unknown project is ENotFound.
func (s *Store) CreateAPIKey(ctx context.Context, k pandastack.APIKey) error {
	if !pandastack.StorableText(k.ID, k.ProjectID, k.Name, k.Prefix, k.Hash, k.Scope) {
		return pandastack.ErrUnstorableText("API key", k.ID)
	}
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO api_keys (`+keyColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		k.ID, k.ProjectID, k.Name, k.Prefix, k.Hash, millis(k.CreatedAt), millisPtr(k.RevokedAt), keyScope(k.Scope))
	switch {
	case isUnique(err):
		return pandastack.Errorf(pandastack.EConflict, "API key %q or its hash already exists", k.ID)
	case constraint(err, sqlite3.SQLITE_CONSTRAINT_FOREIGNKEY):
		return notFound("project", k.ProjectID)
	case err != nil:
		return fmt.Errorf("create API key %s: %w", k.ID, err)
	}
	return nil
}

// APIKeyByHash implements pandastack.Store.
func (s *Store) APIKeyByHash(ctx context.Context, hash string) (pandastack.APIKey, error) {
	k, err := scanKey(s.db.QueryRowContext(ctx,
		`SELECT `+keyColumns+` FROM api_keys WHERE hash = ?`, hash))
	if errors.Is(err, sql.ErrNoRows) {
		// The hash is a credential's digest; keep it out of messages.
		return pandastack.APIKey{}, pandastack.Errorf(pandastack.ENotFound, "API key not found")
	}
	if err != nil {
		return pandastack.APIKey{}, fmt.Errorf("API key by hash: %w", err)
	}
	return k, nil
}

// ListAPIKeys implements pandastack.Store.
func (s *Store) ListAPIKeys(ctx context.Context) ([]pandastack.APIKey, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT `+keyColumns+` FROM api_keys ORDER BY created_at, rowid`)
	if err != nil {
		return nil, fmt.Errorf("list API keys: %w", err)
	}
	defer rows.Close()
	var keys []pandastack.APIKey
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list API keys: %w", err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list API keys: %w", err)
	}
	return keys, nil
}

// RevokeAPIKey implements pandastack.Store. An ambiguous or empty prefix is
// EInvalid and revokes nothing; revoking a revoked key keeps its first time.
func (s *Store) RevokeAPIKey(ctx context.Context, idOrPrefix string, t time.Time) error {
	if idOrPrefix == "" {
		return pandastack.Errorf(pandastack.EInvalid, "an API key id or prefix is required")
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("revoke API key %s: %w", idOrPrefix, err)
	}
	defer tx.Rollback()

	id := idOrPrefix
	var exists bool
	err = tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM api_keys WHERE id = ?)`, id).Scan(&exists)
	if err != nil {
		return fmt.Errorf("revoke API key %s: %w", idOrPrefix, err)
	}
	if !exists {
		// substr, not LIKE, so '%' and '_' in the prefix are literal.
		rows, err := tx.QueryContext(ctx,
			`SELECT id FROM api_keys
			 WHERE revoked_at IS NULL AND substr(prefix, 1, length(?1)) = ?1
			 LIMIT 2`, idOrPrefix)
		if err != nil {
			return fmt.Errorf("revoke API key %s: %w", idOrPrefix, err)
		}
		var matches []string
		for rows.Next() {
			var m string
			if err := rows.Scan(&m); err != nil {
				rows.Close()
				return fmt.Errorf("revoke API key %s: %w", idOrPrefix, err)
			}
			matches = append(matches, m)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("revoke API key %s: %w", idOrPrefix, err)
		}
		switch len(matches) {
		case 0:
			return notFound("API key", idOrPrefix)
		case 1:
			id = matches[0]
		default:
			return pandastack.Errorf(pandastack.EInvalid, "prefix %q matches more than one API key; give more characters or the key id", idOrPrefix)
		}
	}
	if _, err := tx.ExecContext(ctx,
		`UPDATE api_keys SET revoked_at = coalesce(revoked_at, ?) WHERE id = ?`, millis(t), id); err != nil {
		return fmt.Errorf("revoke API key %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("revoke API key %s: %w", id, err)
	}
	return nil
}

// --- sandboxes ---

const sandboxColumns = `id, project_id, template, state, metadata, cpu, memory_mb,
	created_at, expires_at, stopped_at, stop_reason, auto_resume, idle_timeout_seconds, pause_reason, rootfs, node_id`

func scanSandbox(row interface{ Scan(...any) error }) (pandastack.Sandbox, error) {
	var sb pandastack.Sandbox
	var md string
	var created, expires int64
	var stopped sql.NullInt64
	if err := row.Scan(&sb.ID, &sb.ProjectID, &sb.Template, &sb.State, &md, &sb.CPU, &sb.MemoryMB,
		&created, &expires, &stopped, &sb.StopReason, &sb.AutoResume, &sb.IdleTimeoutSeconds, &sb.PauseReason, &sb.RootFS, &sb.NodeID); err != nil {
		return pandastack.Sandbox{}, err
	}
	var err error
	if sb.Metadata, err = metajson.Decode([]byte(md)); err != nil {
		return pandastack.Sandbox{}, fmt.Errorf("sandbox %s metadata: %w", sb.ID, err)
	}
	sb.CreatedAt = fromMillis(created)
	sb.ExpiresAt = fromMillis(expires)
	sb.StoppedAt = fromNullMillis(stopped)
	return sb, nil
}

func querySandboxes(ctx context.Context, db *sql.DB, query string, args ...any) ([]pandastack.Sandbox, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []pandastack.Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// CreateSandbox implements pandastack.Store.
func (s *Store) CreateSandbox(ctx context.Context, sb pandastack.Sandbox) error {
	if !pandastack.StorableText(sb.ID, sb.ProjectID, sb.Template, string(sb.State), sb.StopReason, sb.PauseReason, sb.RootFS, sb.NodeID) {
		return pandastack.ErrUnstorableText("sandbox", sb.ID)
	}
	md, err := metajson.Encode(sb.Metadata)
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	_, err = s.db.ExecContext(ctx,
		`INSERT INTO sandboxes (`+sandboxColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sb.ID, sb.ProjectID, sb.Template, string(sb.State), md, sb.CPU, sb.MemoryMB,
		millis(sb.CreatedAt), millis(sb.ExpiresAt), millisPtr(sb.StoppedAt), sb.StopReason, sb.AutoResume,
		sb.IdleTimeoutSeconds, sb.PauseReason, sb.RootFS, sb.NodeID)
	if isUnique(err) {
		return pandastack.Errorf(pandastack.EConflict, "sandbox %q already exists", sb.ID)
	}
	if isFull(err) {
		return fmt.Errorf("%w (%v)", pandastack.Errorf(pandastack.EStorage, "the server's disk is full; the sandbox was not created"), err)
	}
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// GetSandbox implements pandastack.Store.
func (s *Store) GetSandbox(ctx context.Context, projectID, id string) (pandastack.Sandbox, error) {
	sb, err := scanSandbox(s.db.QueryRowContext(ctx,
		`SELECT `+sandboxColumns+` FROM sandboxes WHERE id = ?1 AND (?2 = '' OR project_id = ?2)`,
		id, projectID))
	if errors.Is(err, sql.ErrNoRows) {
		return pandastack.Sandbox{}, notFound("sandbox", id)
	}
	if err != nil {
		return pandastack.Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return sb, nil
}

// ListSandboxes implements pandastack.Store.
func (s *Store) ListSandboxes(ctx context.Context, f pandastack.SandboxFilter) ([]pandastack.Sandbox, error) {
	q, args := listSandboxesQuery(f)
	out, err := querySandboxes(ctx, s.db, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	return out, nil
}

// listSandboxesQuery is ListSandboxes' query and its arguments.
func listSandboxesQuery(f pandastack.SandboxFilter) (string, []any) {
	var where []string
	var args []any
	if f.ProjectID != "" {
		where = append(where, `project_id = ?`)
		args = append(args, f.ProjectID)
	}
	if len(f.States) > 0 {
		where = append(where, `state IN (?`+strings.Repeat(`, ?`, len(f.States)-1)+`)`)
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	if f.Node != "" {
		where = append(where, `node_id IN ('', ?)`)
		args = append(args, f.Node)
	}
	mdWhere, mdArgs := metadataWhere("sandboxes", f.Metadata)
	where = append(where, mdWhere...)
	args = append(args, mdArgs...)
	// Pages: oldest (or newest) first, those of the same millisecond by
	// id, so that the last of a page is a place in the list (a cursor);
	// the row value lets an index start at the cursor.
	cmp, order := `>`, ` ORDER BY %[1]screated_at, %[1]sid`
	if f.Newest {
		cmp, order = `<`, ` ORDER BY %[1]screated_at DESC, %[1]sid DESC`
	}
	// Of several states (the live ones), the few records of each come
	// from sandboxes_project_state and are sorted: ordered by the plain
	// columns, SQLite would rather walk the project's whole list in order
	// (sandboxes_project_order), stopped records and all. The + keeps the
	// order from any index.
	plus := ""
	if len(f.States) > 1 {
		plus = "+"
	}
	order = fmt.Sprintf(order, plus)
	if f.After != nil {
		where = append(where, `(created_at, id) `+cmp+` (?, ?)`)
		args = append(args, millis(f.After.CreatedAt), f.After.ID)
	}
	q := `SELECT ` + sandboxColumns + ` FROM sandboxes`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, ` AND `)
	}
	q += order
	if f.Limit > 0 {
		q += ` LIMIT ?`
		args = append(args, f.Limit)
	}
	return q, args
}

// SetSandboxState implements pandastack.Store.
func (s *Store) SetSandboxState(ctx context.Context, id string, state pandastack.SandboxState, reason string, at time.Time) error {
	stoppedAt := sql.NullInt64{}
	var stopReason, pauseReason string
	switch state {
	case pandastack.StateStopped:
		stoppedAt = sql.NullInt64{Int64: millis(at), Valid: true}
		stopReason = reason
	case pandastack.StatePaused:
		pauseReason = reason
	}
	if !pandastack.StorableText(string(state), reason) {
		return pandastack.ErrUnstorableText("sandbox", id)
	}
	res, err := s.db.ExecContext(ctx,
		`UPDATE sandboxes SET state = ?, stop_reason = ?, stopped_at = ?, pause_reason = ? WHERE id = ?`,
		string(state), stopReason, stoppedAt, pauseReason, id)
	if err != nil {
		return fmt.Errorf("set sandbox %s state: %w", id, err)
	}
	return rowsAffectedOrNotFound(res, "sandbox", id)
}

// SetSandboxIdleTimeout implements pandastack.Store.
func (s *Store) SetSandboxIdleTimeout(ctx context.Context, id string, seconds int64) error {
	res, err := s.db.ExecContext(ctx,
		`UPDATE sandboxes SET idle_timeout_seconds = ? WHERE id = ?`, seconds, id)
	if err != nil {
		return fmt.Errorf("set sandbox %s idle timeout: %w", id, err)
	}
	return rowsAffectedOrNotFound(res, "sandbox", id)
}

// SetSandboxExpiry implements pandastack.Store.
func (s *Store) SetSandboxExpiry(ctx context.Context, id string, expiresAt time.Time) error {
	res, err := s.db.ExecContext(ctx,
		`UPDATE sandboxes SET expires_at = ? WHERE id = ?`, millis(expiresAt), id)
	if err != nil {
		return fmt.Errorf("set sandbox %s expiry: %w", id, err)
	}
	return rowsAffectedOrNotFound(res, "sandbox", id)
}

// DeleteSandbox implements pandastack.Store.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return rowsAffectedOrNotFound(res, "sandbox", id)
}

// expiredQuery is ExpiredSandboxes'. 'stopped' is written out: the partial
// index sandboxes_live_expires serves only a query that names its condition.
const expiredQuery = `SELECT ` + sandboxColumns + ` FROM sandboxes
	WHERE expires_at <= ? AND state != 'stopped'
	ORDER BY expires_at, rowid`

// ExpiredSandboxes implements pandastack.Store. The oldest expiry comes first;
// paused sandboxes count as not stopped.
func (s *Store) ExpiredSandboxes(ctx context.Context, now time.Time) ([]pandastack.Sandbox, error) {
	out, err := querySandboxes(ctx, s.db, expiredQuery, millis(now))
	if err != nil {
		return nil, fmt.Errorf("expired sandboxes: %w", err)
	}
	return out, nil
}

// PurgeStoppedSandboxes implements pandastack.Store.
func (s *Store) PurgeStoppedSandboxes(ctx context.Context, before time.Time) (int, error) {
	res, err := s.db.ExecContext(ctx,
		`DELETE FROM sandboxes WHERE state = ? AND stopped_at < ?`,
		string(pandastack.StateStopped), millis(before))
	if err != nil {
		return 0, fmt.Errorf("purge stopped sandboxes: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("purge stopped sandboxes: %w", err)
	}
	return int(n), nil
}

// --- snapshots ---

const snapshotColumns = `id, project_id, sandbox_id, template, size_bytes, metadata,
	cpu, memory_mb, created_at, network`

func scanSnapshot(row interface{ Scan(...any) error }) (pandastack.Snapshot, error) {
	var sn pandastack.Snapshot
	var md, network string
	var created int64
	if err := row.Scan(&sn.ID, &sn.ProjectID, &sn.SandboxID, &sn.Template, &sn.SizeBytes, &md,
		&sn.CPU, &sn.MemoryMB, &created, &network); err != nil {
		return pandastack.Snapshot{}, err
	}
	var err error
	if sn.Metadata, err = metajson.Decode([]byte(md)); err != nil {
		return pandastack.Snapshot{}, fmt.Errorf("snapshot %s metadata: %w", sn.ID, err)
	}
	if network != "" {
		sn.Network = new(pandastack.NetworkPolicy)
		if err := json.Unmarshal([]byte(network), sn.Network); err != nil {
			return pandastack.Snapshot{}, fmt.Errorf("snapshot %s network: %w", sn.ID, err)
		}
	}
	sn.CreatedAt = fromMillis(created)
	return sn, nil
}

// snapshotNetwork is sn's policy as stored: JSON, or "" for none.
func snapshotNetwork(sn pandastack.Snapshot) (string, error) {
	if sn.Network == nil {
		return "", nil
	}
	b, err := json.Marshal(sn.Network)
	if err != nil {
		return "", fmt.Errorf("create snapshot %s: %w", sn.ID, err)
	}
	return string(b), nil
}

// CreateSnapshot implements pandastack.Store.
func (s *Store) CreateSnapshot(ctx context.Context, sn pandastack.Snapshot) error {
	if !pandastack.StorableText(sn.ID, sn.ProjectID, sn.SandboxID, sn.Template) {
		return pandastack.ErrUnstorableText("snapshot", sn.ID)
	}
	md, err := metajson.Encode(sn.Metadata)
	if err != nil {
		return fmt.Errorf("create snapshot %s: %w", sn.ID, err)
	}
	network, err := snapshotNetwork(sn)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx,
		`INSERT INTO snapshots (`+snapshotColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		sn.ID, sn.ProjectID, sn.SandboxID, sn.Template, sn.SizeBytes, md,
		sn.CPU, sn.MemoryMB, millis(sn.CreatedAt), network)
	if isUnique(err) {
		return pandastack.Errorf(pandastack.EConflict, "snapshot %q already exists", sn.ID)
	}
	if err != nil {
		return fmt.Errorf("create snapshot %s: %w", sn.ID, err)
	}
	return nil
}

// GetSnapshot implements pandastack.Store.
func (s *Store) GetSnapshot(ctx context.Context, projectID, id string) (pandastack.Snapshot, error) {
	sn, err := scanSnapshot(s.db.QueryRowContext(ctx,
		`SELECT `+snapshotColumns+` FROM snapshots WHERE id = ?1 AND (?2 = '' OR project_id = ?2)`,
		id, projectID))
	if errors.Is(err, sql.ErrNoRows) {
		return pandastack.Snapshot{}, notFound("snapshot", id)
	}
	if err != nil {
		return pandastack.Snapshot{}, fmt.Errorf("get snapshot %s: %w", id, err)
	}
	return sn, nil
}

// ListSnapshots implements pandastack.Store.
func (s *Store) ListSnapshots(ctx context.Context, projectID string, metadata map[string]string) ([]pandastack.Snapshot, error) {
	var where []string
	var args []any
	if projectID != "" {
		where = append(where, `project_id = ?`)
		args = append(args, projectID)
	}
	mdWhere, mdArgs := metadataWhere("snapshots", metadata)
	where = append(where, mdWhere...)
	args = append(args, mdArgs...)
	q := `SELECT ` + snapshotColumns + ` FROM snapshots`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, ` AND `)
	}
	q += ` ORDER BY created_at, rowid`
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	defer rows.Close()
	var out []pandastack.Snapshot
	for rows.Next() {
		sn, err := scanSnapshot(rows)
		if err != nil {
			return nil, fmt.Errorf("list snapshots: %w", err)
		}
		out = append(out, sn)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	return out, nil
}

// DeleteSnapshot implements pandastack.Store.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	return rowsAffectedOrNotFound(res, "snapshot", id)
}

// ClassifyError implements pandastack.StoreErrors: SQLite's "database or
// disk is full" is EStorage, a database another process holds locked past
// the busy timeout is EUnavailable; anything else is returned unchanged.
func (s *Store) ClassifyError(err error) error {
	var e *sqlite.Error
	if !errors.As(err, &e) {
		return err
	}
	switch e.Code() & 0xff {
	case sqlite3.SQLITE_FULL:
		return fmt.Errorf("%w (%v)", pandastack.Errorf(pandastack.EStorage, "the server's disk is full: the change was not saved"), err)
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED:
		return fmt.Errorf("%w (%v)", pandastack.Errorf(pandastack.EUnavailable, "the server's database is busy; retry"), err)
	}
	return err
}
