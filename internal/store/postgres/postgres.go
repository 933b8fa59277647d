// Package postgres is the pandastack.Store on PostgreSQL (pure Go,
// github.com/jackc/pgx/v5), for several serve processes sharing one
// database. Only cmd/ and tests import it.
//
// Every method is one statement, or one transaction where it reads before it
// writes, so that several processes on one database see the same answers
// SQLite's single writer gives one process. Schema migrations run at Open
// under an advisory lock, so processes starting together apply each once.
package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/store/metajson"
)

var _ pandastack.Store = (*Store)(nil)

// Store is a pandastack.Store backed by a pool of connections to one
// PostgreSQL database.
type Store struct {
	pool *pgxpool.Pool
}

// defaultConnectTimeout bounds each new connection when the URL sets no
// connect_timeout.
const defaultConnectTimeout = 15 * time.Second

// Open connects to the database at url (postgres://user:pass@host:port/db?…,
// or a key=value string; pool_max_conns and the libpq settings apply),
// checks that it answers, and applies any pending migrations. The
// database must exist; Open creates only tables.
func Open(ctx context.Context, url string) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		// pgx's message may quote the URL, password included.
		return nil, pandastack.Errorf(pandastack.EInvalid, "store: not a PostgreSQL connection URL")
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		// An unreachable host fails the start instead of hanging it.
		cfg.ConnConfig.ConnectTimeout = defaultConnectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open store: %w", err)
	}
	s := &Store{pool: pool}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open store: %w", err)
	}
	if err := s.migrate(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("open store: %w", err)
	}
	return s, nil
}

// Close releases the pool's connections.
func (s *Store) Close() error {
	s.pool.Close()
	return nil
}

// migrations are applied in order, each once, and each recorded in
// schema_migrations. Append new ones; never edit or reorder a released one.
//
// Times are timestamptz (microseconds; we store milliseconds, as SQLite
// does). seq orders records created (or expiring) in the same millisecond
// by insertion, as SQLite's rowid does; lists of sandboxes go by id then.
var migrations = []string{
	`CREATE TABLE projects (
		id         text PRIMARY KEY,
		name       text NOT NULL UNIQUE,
		created_at timestamptz NOT NULL
	);
	CREATE TABLE api_keys (
		id         text PRIMARY KEY,
		seq        bigint GENERATED ALWAYS AS IDENTITY,
		project_id text NOT NULL REFERENCES projects(id),
		name       text NOT NULL,
		prefix     text NOT NULL,
		hash       text NOT NULL UNIQUE,
		created_at timestamptz NOT NULL,
		revoked_at timestamptz
	);
	CREATE INDEX api_keys_project ON api_keys (project_id);
	CREATE INDEX api_keys_prefix ON api_keys (prefix text_pattern_ops);
	CREATE TABLE sandboxes (
		id          text PRIMARY KEY,
		seq         bigint GENERATED ALWAYS AS IDENTITY,
		project_id  text NOT NULL,
		template    text NOT NULL,
		state       text NOT NULL,
		metadata    jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
		cpu         bigint NOT NULL,
		memory_mb   bigint NOT NULL,
		created_at  timestamptz NOT NULL,
		expires_at  timestamptz NOT NULL,
		stopped_at  timestamptz,
		stop_reason text NOT NULL DEFAULT '',
		auto_resume boolean NOT NULL DEFAULT false
	);
	CREATE INDEX sandboxes_project ON sandboxes (project_id, created_at);
	CREATE INDEX sandboxes_expires ON sandboxes (expires_at);
	CREATE INDEX sandboxes_stopped ON sandboxes (stopped_at);
	CREATE INDEX sandboxes_metadata ON sandboxes USING gin (metadata jsonb_path_ops);
	CREATE TABLE snapshots (
		id         text PRIMARY KEY,
		seq        bigint GENERATED ALWAYS AS IDENTITY,
		project_id text NOT NULL,
		sandbox_id text NOT NULL, -- no foreign key: snapshots outlive their sandbox's record
		template   text NOT NULL,
		size_bytes bigint NOT NULL,
		metadata   jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(metadata) = 'object'),
		cpu        bigint NOT NULL,
		memory_mb  bigint NOT NULL,
		created_at timestamptz NOT NULL
	);
	CREATE INDEX snapshots_project ON snapshots (project_id, created_at);
	CREATE INDEX snapshots_metadata ON snapshots USING gin (metadata jsonb_path_ops);`,
	`ALTER TABLE sandboxes ADD COLUMN idle_timeout_seconds bigint NOT NULL DEFAULT 0;
	ALTER TABLE sandboxes ADD COLUMN pause_reason text NOT NULL DEFAULT '';
	ALTER TABLE sandboxes ADD COLUMN rootfs text NOT NULL DEFAULT '';`,
	// Several hosts (nodes.go): each sandbox belongs to a node.
	`ALTER TABLE sandboxes ADD COLUMN node_id text NOT NULL DEFAULT '';
	CREATE INDEX sandboxes_node ON sandboxes (node_id, state);
	CREATE TABLE nodes (
		id             text PRIMARY KEY,
		url            text NOT NULL,
		state          text NOT NULL,
		started_at     timestamptz NOT NULL,
		heartbeat_at   timestamptz NOT NULL,
		cpus           bigint NOT NULL,
		memory_mb      bigint NOT NULL,
		free_memory_mb bigint NOT NULL,
		pool           jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(pool) = 'object'),
		placed_at      timestamptz NOT NULL DEFAULT 'epoch'
	);`,
	historyMigration,
	// API key scopes: the keys made before them may do everything.
	`ALTER TABLE api_keys ADD COLUMN scope text NOT NULL DEFAULT 'all';`,
	// A snapshot's egress policy; NULL for none (those taken before).
	`ALTER TABLE snapshots ADD COLUMN network jsonb CHECK (network IS NULL OR jsonb_typeof(network) = 'object');`,
	// Stopped records stay a day (the purge): the reaper, which looks
	// every second, and the lists of live sandboxes go past them.
	`CREATE INDEX sandboxes_live_expires ON sandboxes (expires_at) WHERE state != 'stopped';
	DROP INDEX sandboxes_expires;
	DROP INDEX sandboxes_project;
	CREATE INDEX sandboxes_project_state ON sandboxes (project_id, state, created_at);`,
	historyTotalsMigration,
	// Pages of a list: a project's records in the list's order (creation,
	// then id in byte order), for pages of every state; and of one state
	// (stopped ones, newest first, in the console), without a sort.
	`CREATE INDEX sandboxes_project_order ON sandboxes (project_id, created_at, id COLLATE "C");
	DROP INDEX sandboxes_project_state;
	CREATE INDEX sandboxes_project_state ON sandboxes (project_id, state, created_at, id COLLATE "C");`,
}

// keyScope is the scope stored for s: ScopeAll when empty.
func keyScope(s string) string {
	if s == "" {
		return pandastack.ScopeAll
	}
	return s
}

// migrateLock is the advisory lock key every pandastack process takes while
// it migrates: "pandasta" in ASCII.
const migrateLock int64 = 0x70616e6461737461

func (s *Store) migrate(ctx context.Context) error {
	return s.applyMigrations(ctx, migrations)
}

// applyMigrations brings the database to len(ms) applied migrations in one
// transaction (PostgreSQL's DDL is transactional: a failed migration leaves
// nothing half done). The transaction-scoped advisory lock makes processes
// that start at once on one database take turns; the later ones find the
// work done. Tests pass a prefix of migrations to build an older database.
func (s *Store) applyMigrations(ctx context.Context, ms []string) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, migrateLock); err != nil {
		return fmt.Errorf("migrate: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    integer PRIMARY KEY,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	var version int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&version); err != nil {
		return fmt.Errorf("migrate: read version: %w", err)
	}
	if version > len(ms) {
		return fmt.Errorf("migrate: database schema version %d is newer than this binary's %d", version, len(ms))
	}
	if version == len(ms) {
		return nil
	}
	for i := version; i < len(ms); i++ {
		if _, err := tx.Exec(ctx, ms[i]); err != nil {
			return fmt.Errorf("migrate: migration %d: %w", i+1, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, i+1); err != nil {
			return fmt.Errorf("migrate: record migration %d: %w", i+1, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("migrate: commit: %w", err)
	}
	return nil
}

// --- encoding ---

// millis truncates t as SQLite's store does (Unix milliseconds, toward
// zero), so both stores return the same instant.
func millis(t time.Time) time.Time { return time.UnixMilli(t.UnixMilli()).UTC() }

func millisPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	m := millis(*t)
	return &m
}

func utcPtr(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// PostgreSQL error codes (Appendix A of its manual).
const (
	uniqueViolation     = "23505"
	foreignKeyViolation = "23503"
)

func pgCode(err error) string {
	var e *pgconn.PgError
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

func notFound(what, name string) error {
	return pandastack.Errorf(pandastack.ENotFound, "%s %.64q not found", what, name) // an id of 100 kB is not echoed whole
}

// affectedOrNotFound turns an UPDATE or DELETE that matched nothing into
// ENotFound.
func affectedOrNotFound(tag pgconn.CommandTag, what, name string) error {
	if tag.RowsAffected() == 0 {
		return notFound(what, name)
	}
	return nil
}

// where collects a query's conditions and their positional arguments.
type where struct {
	conds []string
	args  []any
}

// arg adds an argument and returns its placeholder.
func (w *where) arg(v any) string {
	w.args = append(w.args, v)
	return fmt.Sprintf("$%d", len(w.args))
}

func (w *where) add(cond string) { w.conds = append(w.conds, cond) }

func (w *where) sql() string {
	if len(w.conds) == 0 {
		return ""
	}
	return ` WHERE ` + strings.Join(w.conds, ` AND `)
}

// metadata requires the metadata column to hold every entry of md, each
// key with exactly that string value. Containment (@>) compares whole keys,
// so a key is never parsed as a path, and the GIN index serves it. It
// reports false when no stored record can match (a NUL in the filter).
func (w *where) metadata(md map[string]string) bool {
	if len(md) == 0 {
		return true
	}
	enc, err := metajson.Encode(md)
	if err != nil {
		return false
	}
	w.add(`metadata @> ` + w.arg(enc) + `::jsonb`)
	return true
}

// --- projects ---

// CreateProject implements pandastack.Store.
func (s *Store) CreateProject(ctx context.Context, p pandastack.Project) error {
	if !pandastack.StorableText(p.ID, p.Name) {
		return pandastack.ErrUnstorableText("project", p.Name)
	}
	_, err := s.pool.Exec(ctx,
		`INSERT INTO projects (id, name, created_at) VALUES ($1, $2, $3)`,
		p.ID, p.Name, millis(p.CreatedAt))
	if pgCode(err) == uniqueViolation {
		return pandastack.Errorf(pandastack.EConflict, "project %q or its name %q already exists", p.ID, p.Name)
	}
	if err != nil {
		return fmt.Errorf("create project %s: %w", p.ID, err)
	}
	return nil
}

// ListProjects implements pandastack.Store.
func (s *Store) ListProjects(ctx context.Context) ([]pandastack.Project, error) {
	rows, err := s.pool.Query(ctx, `SELECT id, name, created_at FROM projects ORDER BY created_at, id`)
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	defer rows.Close()
	var out []pandastack.Project
	for rows.Next() {
		var p pandastack.Project
		if err := rows.Scan(&p.ID, &p.Name, &p.CreatedAt); err != nil {
			return nil, fmt.Errorf("list projects: %w", err)
		}
		p.CreatedAt = p.CreatedAt.UTC()
		out = append(out, p)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	return out, nil
}

// ProjectByName implements pandastack.Store.
func (s *Store) ProjectByName(ctx context.Context, name string) (pandastack.Project, error) {
	if !pandastack.StorableText(name) {
		return pandastack.Project{}, notFound("project", name)
	}
	var p pandastack.Project
	err := s.pool.QueryRow(ctx,
		`SELECT id, name, created_at FROM projects WHERE name = $1`, name).
		Scan(&p.ID, &p.Name, &p.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return pandastack.Project{}, notFound("project", name)
	}
	if err != nil {
		return pandastack.Project{}, fmt.Errorf("project %s: %w", name, err)
	}
	p.CreatedAt = p.CreatedAt.UTC()
	return p, nil
}

// --- API keys ---

const keyColumns = `id, project_id, name, prefix, hash, created_at, revoked_at, scope`

func scanKey(row pgx.Row) (pandastack.APIKey, error) {
	var k pandastack.APIKey
	if err := row.Scan(&k.ID, &k.ProjectID, &k.Name, &k.Prefix, &k.Hash, &k.CreatedAt, &k.RevokedAt, &k.Scope); err != nil {
		return pandastack.APIKey{}, err
	}
	k.CreatedAt = k.CreatedAt.UTC()
	k.RevokedAt = utcPtr(k.RevokedAt)
	return k, nil
}

// CreateAPIKey implements pandastack.Store. An unknown project is ENotFound.
func (s *Store) CreateAPIKey(ctx context.Context, k pandastack.APIKey) error {
	if !pandastack.StorableText(k.ID, k.ProjectID, k.Name, k.Prefix, k.Hash, k.Scope) {
		return pandastack.ErrUnstorableText("API key", k.ID)
	}
	_, err := s.pool.Exec(ctx,
		`INSERT INTO api_keys (`+keyColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
		k.ID, k.ProjectID, k.Name, k.Prefix, k.Hash, millis(k.CreatedAt), millisPtr(k.RevokedAt), keyScope(k.Scope))
	switch {
	case pgCode(err) == uniqueViolation:
		return pandastack.Errorf(pandastack.EConflict, "API key %q or its hash already exists", k.ID)
	case pgCode(err) == foreignKeyViolation:
		return notFound("project", k.ProjectID)
	case err != nil:
		return fmt.Errorf("create API key %s: %w", k.ID, err)
	}
	return nil
}

// APIKeyByHash implements pandastack.Store.
func (s *Store) APIKeyByHash(ctx context.Context, hash string) (pandastack.APIKey, error) {
	// The hash is a credential's digest; keep it out of messages.
	if !pandastack.StorableText(hash) {
		return pandastack.APIKey{}, pandastack.Errorf(pandastack.ENotFound, "API key not found")
	}
	k, err := scanKey(s.pool.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE hash = $1`, hash))
	if errors.Is(err, pgx.ErrNoRows) {
		return pandastack.APIKey{}, pandastack.Errorf(pandastack.ENotFound, "API key not found")
	}
	if err != nil {
		return pandastack.APIKey{}, fmt.Errorf("API key by hash: %w", err)
	}
	return k, nil
}

// ListAPIKeys implements pandastack.Store.
func (s *Store) ListAPIKeys(ctx context.Context) ([]pandastack.APIKey, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+keyColumns+` FROM api_keys ORDER BY created_at, seq`)
	if err != nil {
		return nil, fmt.Errorf("list API keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pandastack.APIKey, error) { return scanKey(r) })
	if err != nil {
		return nil, fmt.Errorf("list API keys: %w", err)
	}
	return keys, nil
}

// RevokeAPIKey implements pandastack.Store. An ambiguous or empty prefix is
// EInvalid and revokes nothing; revoking a revoked key keeps its first time.
//
// The lookup and the update share a transaction and the update keeps any
// time a concurrent revoke committed first (coalesce is evaluated after the
// row lock is taken), so concurrent revokes of one key agree on its time.
func (s *Store) RevokeAPIKey(ctx context.Context, idOrPrefix string, t time.Time) error {
	if idOrPrefix == "" {
		return pandastack.Errorf(pandastack.EInvalid, "an API key id or prefix is required")
	}
	if !pandastack.StorableText(idOrPrefix) {
		return notFound("API key", idOrPrefix)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("revoke API key %s: %w", idOrPrefix, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))

	tag, err := tx.Exec(ctx,
		`UPDATE api_keys SET revoked_at = coalesce(revoked_at, $1) WHERE id = $2`, millis(t), idOrPrefix)
	if err != nil {
		return fmt.Errorf("revoke API key %s: %w", idOrPrefix, err)
	}
	if tag.RowsAffected() == 0 {
		// starts_with, not LIKE, so '%' and '_' in the prefix are literal.
		rows, err := tx.Query(ctx,
			`SELECT id FROM api_keys WHERE revoked_at IS NULL AND starts_with(prefix, $1) LIMIT 2 FOR UPDATE`,
			idOrPrefix)
		if err != nil {
			return fmt.Errorf("revoke API key %s: %w", idOrPrefix, err)
		}
		matches, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("revoke API key %s: %w", idOrPrefix, err)
		}
		switch len(matches) {
		case 0:
			return notFound("API key", idOrPrefix)
		case 1:
		default:
			return pandastack.Errorf(pandastack.EInvalid, "prefix %q matches more than one API key; give more characters or the key id", idOrPrefix)
		}
		if _, err := tx.Exec(ctx,
			`UPDATE api_keys SET revoked_at = coalesce(revoked_at, $1) WHERE id = $2`, millis(t), matches[0]); err != nil {
			return fmt.Errorf("revoke API key %s: %w", matches[0], err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("revoke API key %s: %w", idOrPrefix, err)
	}
	return nil
}

// --- sandboxes ---

const sandboxColumns = `id, project_id, template, state, metadata, cpu, memory_mb,
	created_at, expires_at, stopped_at, stop_reason, auto_resume, idle_timeout_seconds, pause_reason, rootfs, node_id`

func scanSandbox(row pgx.Row) (pandastack.Sandbox, error) {
	var sb pandastack.Sandbox
	var md []byte
	if err := row.Scan(&sb.ID, &sb.ProjectID, &sb.Template, &sb.State, &md, &sb.CPU, &sb.MemoryMB,
		&sb.CreatedAt, &sb.ExpiresAt, &sb.StoppedAt, &sb.StopReason, &sb.AutoResume,
		&sb.IdleTimeoutSeconds, &sb.PauseReason, &sb.RootFS, &sb.NodeID); err != nil {
		return pandastack.Sandbox{}, err
	}
	var err error
	if sb.Metadata, err = metajson.Decode(md); err != nil {
		return pandastack.Sandbox{}, fmt.Errorf("sandbox %s metadata: %w", sb.ID, err)
	}
	sb.CreatedAt = sb.CreatedAt.UTC()
	sb.ExpiresAt = sb.ExpiresAt.UTC()
	sb.StoppedAt = utcPtr(sb.StoppedAt)
	return sb, nil
}

func (s *Store) querySandboxes(ctx context.Context, query string, args ...any) ([]pandastack.Sandbox, error) {
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (pandastack.Sandbox, error) { return scanSandbox(r) })
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
	_, err = s.pool.Exec(ctx,
		`INSERT INTO sandboxes (`+sandboxColumns+`)
		 VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)`,
		sb.ID, sb.ProjectID, sb.Template, string(sb.State), md, sb.CPU, sb.MemoryMB,
		millis(sb.CreatedAt), millis(sb.ExpiresAt), millisPtr(sb.StoppedAt), sb.StopReason, sb.AutoResume,
		sb.IdleTimeoutSeconds, sb.PauseReason, sb.RootFS, sb.NodeID)
	if pgCode(err) == uniqueViolation {
		return pandastack.Errorf(pandastack.EConflict, "sandbox %q already exists", sb.ID)
	}
	if err != nil {
		return fmt.Errorf("create sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// GetSandbox implements pandastack.Store.
func (s *Store) GetSandbox(ctx context.Context, projectID, id string) (pandastack.Sandbox, error) {
	if !pandastack.StorableText(projectID, id) {
		return pandastack.Sandbox{}, notFound("sandbox", id)
	}
	sb, err := scanSandbox(s.pool.QueryRow(ctx,
		`SELECT `+sandboxColumns+` FROM sandboxes WHERE id = $1 AND ($2 = '' OR project_id = $2)`,
		id, projectID))
	if errors.Is(err, pgx.ErrNoRows) {
		return pandastack.Sandbox{}, notFound("sandbox", id)
	}
	if err != nil {
		return pandastack.Sandbox{}, fmt.Errorf("get sandbox %s: %w", id, err)
	}
	return sb, nil
}

// ListSandboxes implements pandastack.Store.
func (s *Store) ListSandboxes(ctx context.Context, f pandastack.SandboxFilter) ([]pandastack.Sandbox, error) {
	var w where
	if f.ProjectID != "" {
		w.add(`project_id = ` + w.arg(f.ProjectID))
	}
	if len(f.States) > 0 {
		var states []string
		for _, st := range f.States {
			if pandastack.StorableText(string(st)) { // no stored state is anything else
				states = append(states, string(st))
			}
		}
		w.add(`state = ANY(` + w.arg(states) + `::text[])`)
	}
	if f.Node != "" {
		w.add(`node_id IN ('', ` + w.arg(f.Node) + `)`)
	}
	// Pages: oldest (or newest) first, those of the same millisecond by
	// id (in byte order, as SQLite's), so that the last of a page is a
	// place in the list (a cursor).
	cmp, order := `>`, ` ORDER BY created_at, id COLLATE "C"`
	if f.Newest {
		cmp, order = `<`, ` ORDER BY created_at DESC, id COLLATE "C" DESC`
	}
	if f.After != nil {
		if !pandastack.StorableText(f.After.ID) {
			return nil, pandastack.Errorf(pandastack.EInvalid, "the list's cursor holds an id no sandbox has")
		}
		// A row value, so that the index in the list's order starts there.
		w.add(`(created_at, id COLLATE "C") ` + cmp + ` (` + w.arg(millis(f.After.CreatedAt)) + `, ` + w.arg(f.After.ID) + `)`)
	}
	if !pandastack.StorableText(f.ProjectID, f.Node) || !w.metadata(f.Metadata) {
		return nil, ctx.Err() // nothing stored can match
	}
	q := `SELECT ` + sandboxColumns + ` FROM sandboxes` + w.sql() + order
	if f.Limit > 0 {
		q += ` LIMIT ` + w.arg(f.Limit)
	}
	out, err := s.querySandboxes(ctx, q, w.args...)
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	return out, nil
}

// SetSandboxState implements pandastack.Store.
func (s *Store) SetSandboxState(ctx context.Context, id string, state pandastack.SandboxState, reason string, at time.Time) error {
	var stoppedAt *time.Time
	var stopReason, pauseReason string
	switch state {
	case pandastack.StateStopped:
		m := millis(at)
		stoppedAt, stopReason = &m, reason
	case pandastack.StatePaused:
		pauseReason = reason
	}
	if !pandastack.StorableText(string(state), stopReason, pauseReason) {
		return pandastack.ErrUnstorableText("sandbox", id)
	}
	if !pandastack.StorableText(id) {
		return notFound("sandbox", id)
	}
	tag, err := s.pool.Exec(ctx,
		`UPDATE sandboxes SET state = $1, stop_reason = $2, stopped_at = $3, pause_reason = $4 WHERE id = $5`,
		string(state), stopReason, stoppedAt, pauseReason, id)
	if err != nil {
		return fmt.Errorf("set sandbox %s state: %w", id, err)
	}
	return affectedOrNotFound(tag, "sandbox", id)
}

// SetSandboxIdleTimeout implements pandastack.Store.
func (s *Store) SetSandboxIdleTimeout(ctx context.Context, id string, seconds int64) error {
	if !pandastack.StorableText(id) {
		return notFound("sandbox", id)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE sandboxes SET idle_timeout_seconds = $1 WHERE id = $2`, seconds, id)
	if err != nil {
		return fmt.Errorf("set sandbox %s idle timeout: %w", id, err)
	}
	return affectedOrNotFound(tag, "sandbox", id)
}

// SetSandboxExpiry implements pandastack.Store.
func (s *Store) SetSandboxExpiry(ctx context.Context, id string, expiresAt time.Time) error {
	if !pandastack.StorableText(id) {
		return notFound("sandbox", id)
	}
	tag, err := s.pool.Exec(ctx, `UPDATE sandboxes SET expires_at = $1 WHERE id = $2`, millis(expiresAt), id)
	if err != nil {
		return fmt.Errorf("set sandbox %s expiry: %w", id, err)
	}
	return affectedOrNotFound(tag, "sandbox", id)
}

// DeleteSandbox implements pandastack.Store.
func (s *Store) DeleteSandbox(ctx context.Context, id string) error {
	if !pandastack.StorableText(id) {
		return notFound("sandbox", id)
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM sandboxes WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return affectedOrNotFound(tag, "sandbox", id)
}

// ExpiredSandboxes implements pandastack.Store. The oldest expiry comes first;
// paused sandboxes count as not stopped.
func (s *Store) ExpiredSandboxes(ctx context.Context, now time.Time) ([]pandastack.Sandbox, error) {
	out, err := s.querySandboxes(ctx,
		// 'stopped' written out: a generic plan of a prepared statement
		// can use the partial index sandboxes_live_expires only then.
		`SELECT `+sandboxColumns+` FROM sandboxes WHERE expires_at <= $1 AND state != 'stopped' ORDER BY expires_at, seq`,
		millis(now))
	if err != nil {
		return nil, fmt.Errorf("expired sandboxes: %w", err)
	}
	return out, nil
}

// PurgeStoppedSandboxes implements pandastack.Store.
func (s *Store) PurgeStoppedSandboxes(ctx context.Context, before time.Time) (int, error) {
	tag, err := s.pool.Exec(ctx,
		`DELETE FROM sandboxes WHERE state = $1 AND stopped_at < $2`,
		string(pandastack.StateStopped), millis(before))
	if err != nil {
		return 0, fmt.Errorf("purge stopped sandboxes: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// --- snapshots ---

const snapshotColumns = `id, project_id, sandbox_id, template, size_bytes, metadata, cpu, memory_mb, created_at, network`

func scanSnapshot(row pgx.Row) (pandastack.Snapshot, error) {
	var sn pandastack.Snapshot
	var md, network []byte
	if err := row.Scan(&sn.ID, &sn.ProjectID, &sn.SandboxID, &sn.Template, &sn.SizeBytes, &md,
		&sn.CPU, &sn.MemoryMB, &sn.CreatedAt, &network); err != nil {
		return pandastack.Snapshot{}, err
	}
	var err error
	if sn.Metadata, err = metajson.Decode(md); err != nil {
		return pandastack.Snapshot{}, fmt.Errorf("snapshot %s metadata: %w", sn.ID, err)
	}
	if network != nil {
		sn.Network = new(pandastack.NetworkPolicy)
		if err := json.Unmarshal(network, sn.Network); err != nil {
			return pandastack.Snapshot{}, fmt.Errorf("snapshot %s network: %w", sn.ID, err)
		}
	}
	sn.CreatedAt = sn.CreatedAt.UTC()
	return sn, nil
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
	var network []byte // NULL for none
	if sn.Network != nil {
		if network, err = json.Marshal(sn.Network); err != nil {
			return fmt.Errorf("create snapshot %s: %w", sn.ID, err)
		}
	}
	_, err = s.pool.Exec(ctx,
		`INSERT INTO snapshots (`+snapshotColumns+`) VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $8, $9, $10::jsonb)`,
		sn.ID, sn.ProjectID, sn.SandboxID, sn.Template, sn.SizeBytes, md, sn.CPU, sn.MemoryMB, millis(sn.CreatedAt), network)
	if pgCode(err) == uniqueViolation {
		return pandastack.Errorf(pandastack.EConflict, "snapshot %q already exists", sn.ID)
	}
	if err != nil {
		return fmt.Errorf("create snapshot %s: %w", sn.ID, err)
	}
	return nil
}

// GetSnapshot implements pandastack.Store.
func (s *Store) GetSnapshot(ctx context.Context, projectID, id string) (pandastack.Snapshot, error) {
	if !pandastack.StorableText(projectID, id) {
		return pandastack.Snapshot{}, notFound("snapshot", id)
	}
	sn, err := scanSnapshot(s.pool.QueryRow(ctx,
		`SELECT `+snapshotColumns+` FROM snapshots WHERE id = $1 AND ($2 = '' OR project_id = $2)`,
		id, projectID))
	if errors.Is(err, pgx.ErrNoRows) {
		return pandastack.Snapshot{}, notFound("snapshot", id)
	}
	if err != nil {
		return pandastack.Snapshot{}, fmt.Errorf("get snapshot %s: %w", id, err)
	}
	return sn, nil
}

// ListSnapshots implements pandastack.Store.
func (s *Store) ListSnapshots(ctx context.Context, projectID string, metadata map[string]string) ([]pandastack.Snapshot, error) {
	var w where
	if projectID != "" {
		w.add(`project_id = ` + w.arg(projectID))
	}
	if !pandastack.StorableText(projectID) || !w.metadata(metadata) {
		return nil, ctx.Err() // nothing stored can match
	}
	rows, err := s.pool.Query(ctx, `SELECT `+snapshotColumns+` FROM snapshots`+w.sql()+` ORDER BY created_at, seq`, w.args...)
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pandastack.Snapshot, error) { return scanSnapshot(r) })
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	return out, nil
}

// DeleteSnapshot implements pandastack.Store.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	if !pandastack.StorableText(id) {
		return notFound("snapshot", id)
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM snapshots WHERE id = $1`, id)
	if err != nil {
		return fmt.Errorf("delete snapshot %s: %w", id, err)
	}
	return affectedOrNotFound(tag, "snapshot", id)
}

// ClassifyError implements pandastack.StoreErrors: a database that cannot
// be reached (no connection, a connection lost, the server shutting down
// or refusing connections) is EUnavailable, one out of disk space
// EStorage; anything else is returned unchanged. Only pgx's own errors
// count: the API asks about every error without a code, and a network
// error of another part (an agent, an object store) is no database's.
func (s *Store) ClassifyError(err error) error {
	unavailable := func() error {
		return fmt.Errorf("%w (%v)", pandastack.Errorf(pandastack.EUnavailable, "the server's database cannot be reached; retry"), err)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case pe.Code == "53100": // disk_full
			return fmt.Errorf("%w (%v)", pandastack.Errorf(pandastack.EStorage, "the database server's disk is full: the change was not saved"), err)
		case strings.HasPrefix(pe.Code, "08"), // connection exception
			pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03", // shutting down, cannot connect now
			pe.Code == "53300": // too many connections
			return unavailable()
		}
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err // the caller's own deadline (a context error is a net.Error too)
	}
	var ce *pgconn.ConnectError
	var retry interface{ SafeToRetry() bool } // pgconn's errors of a connection that broke
	if errors.As(err, &ce) || errors.Is(err, pgconn.ErrConnClosed) || errors.As(err, &retry) {
		return unavailable()
	}
	return err
}
