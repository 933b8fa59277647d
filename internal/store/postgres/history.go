package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pandastack/pandastack"
)

// historyMigration keeps what was run in sandboxes and where sandboxes came
// from (pandastack.HistoryStore). An entry is kept whole as JSON text (not
// jsonb, which refuses \u0000): it is written and read as one and never
// searched by its fields. seq orders entries by insertion; an entry replaced
// by PutHistory keeps its seq.
const historyMigration = `CREATE TABLE history (
		seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		id         text NOT NULL UNIQUE,
		project_id text NOT NULL,
		sandbox_id text NOT NULL,
		size       bigint NOT NULL,
		entry      text NOT NULL
	);
	CREATE INDEX history_sandbox ON history (sandbox_id, seq);
	CREATE TABLE origins (
		seq        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		sandbox_id text NOT NULL UNIQUE,
		project_id text NOT NULL,
		kind       text NOT NULL,
		from_id    text NOT NULL,
		at         timestamptz NOT NULL
	);
	CREATE INDEX origins_project ON origins (project_id, seq);`

// historyTotalsMigration keeps each project's history bytes in a row of
// their own, up to date through statement-level triggers (one update of a
// project's row per statement, however many entries it adds or removes),
// so that a trim (TrimHistory) reads the projects' holdings without a pass
// over every entry, and walks only the oldest entries of those over their
// share (history_project). The table is locked while the totals are first
// summed: another node's history writes meanwhile wait, rather than go
// uncounted.
const historyTotalsMigration = `LOCK TABLE history IN SHARE ROW EXCLUSIVE MODE;
	CREATE TABLE history_totals (
		project_id text PRIMARY KEY,
		bytes      bigint NOT NULL
	);
	INSERT INTO history_totals (project_id, bytes) SELECT project_id, SUM(size) FROM history GROUP BY project_id;
	CREATE INDEX history_project ON history (project_id, seq);
	CREATE FUNCTION history_totals_add() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		INSERT INTO history_totals AS t (project_id, bytes)
			SELECT project_id, SUM(size) FROM added GROUP BY project_id
			ON CONFLICT (project_id) DO UPDATE SET bytes = t.bytes + excluded.bytes;
		RETURN NULL;
	END $$;
	CREATE FUNCTION history_totals_remove() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN
		UPDATE history_totals t SET bytes = t.bytes - r.bytes
			FROM (SELECT project_id, SUM(size) AS bytes FROM removed GROUP BY project_id) r
			WHERE t.project_id = r.project_id;
		RETURN NULL;
	END $$;
	CREATE TRIGGER history_totals_insert AFTER INSERT ON history
		REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION history_totals_add();
	CREATE TRIGGER history_totals_update_in AFTER UPDATE ON history
		REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION history_totals_add();
	CREATE TRIGGER history_totals_update_out AFTER UPDATE ON history
		REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION history_totals_remove();
	CREATE TRIGGER history_totals_delete AFTER DELETE ON history
		REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION history_totals_remove();`

// PutHistory implements pandastack.HistoryStore.
func (s *Store) PutHistory(ctx context.Context, projectID, sandboxID string, e pandastack.HistoryEntry, keep int) error {
	if !pandastack.StorableText(projectID, sandboxID, e.ID) {
		return pandastack.ErrUnstorableText("history entry", e.ID)
	}
	e.StartedAt = millis(e.StartedAt)
	body, err := json.Marshal(e) // invalid UTF-8 becomes U+FFFD, NUL \u0000: always storable
	if err != nil {
		return fmt.Errorf("put history %s: %w", e.ID, err)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("put history %s: %w", e.ID, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// The project's total first, as TrimHistory locks it first: the
	// triggers change it only after the entries, which a trim of the
	// project locks after its total (the other order deadlocked).
	if _, err := tx.Exec(ctx, `INSERT INTO history_totals AS t (project_id, bytes) VALUES ($1, 0)
		ON CONFLICT (project_id) DO UPDATE SET bytes = t.bytes`, projectID); err != nil {
		return fmt.Errorf("put history %s: %w", e.ID, err)
	}
	tag, err := tx.Exec(ctx, `INSERT INTO history (id, project_id, sandbox_id, size, entry) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET size = $4, entry = $5
		WHERE history.project_id = $2 AND history.sandbox_id = $3`,
		e.ID, projectID, sandboxID, len(body), string(body))
	if err != nil {
		return fmt.Errorf("put history %s: %w", e.ID, err)
	}
	if tag.RowsAffected() == 0 {
		return pandastack.Errorf(pandastack.EConflict, "history entry %q belongs to another sandbox", e.ID)
	}
	// The sandbox's entries of this project alone: a delete of another
	// project's (a sandbox id stored under two) would change that
	// project's total, not locked first, and deadlocked with a put there.
	if err := keepNewestOfSandbox(ctx, tx, projectID, sandboxID, keep); err != nil {
		return fmt.Errorf("put history %s: %w", e.ID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("put history %s: %w", e.ID, err)
	}
	return nil
}

// keepNewest deletes the rows of table whose column is value but for the
// newest keep (by seq); keep <= 0 keeps all. table and column are our own
// names, never user input.
func keepNewest(ctx context.Context, tx pgx.Tx, table, column, value string, keep int) error {
	if keep <= 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `DELETE FROM `+table+` WHERE `+column+` = $1 AND seq <=
		(SELECT seq FROM `+table+` WHERE `+column+` = $1 ORDER BY seq DESC LIMIT 1 OFFSET $2)`, value, keep)
	if err != nil {
		return fmt.Errorf("keep the newest %d of %s: %w", keep, table, err)
	}
	return nil
}

// keepNewestOfSandbox deletes the history of the project's sandbox but for
// its newest keep entries (by seq); keep <= 0 keeps all.
func keepNewestOfSandbox(ctx context.Context, tx pgx.Tx, projectID, sandboxID string, keep int) error {
	if keep <= 0 {
		return nil
	}
	_, err := tx.Exec(ctx, `DELETE FROM history WHERE project_id = $1 AND sandbox_id = $2 AND seq <=
		(SELECT seq FROM history WHERE project_id = $1 AND sandbox_id = $2 ORDER BY seq DESC LIMIT 1 OFFSET $3)`, projectID, sandboxID, keep)
	if err != nil {
		return fmt.Errorf("keep the newest %d of the history: %w", keep, err)
	}
	return nil
}

// ListHistory implements pandastack.HistoryStore.
func (s *Store) ListHistory(ctx context.Context, projectID, sandboxID string) ([]pandastack.HistoryEntry, error) {
	if !pandastack.StorableText(projectID, sandboxID) {
		return []pandastack.HistoryEntry{}, ctx.Err() // nothing stored can match
	}
	rows, err := s.pool.Query(ctx, `SELECT id, entry FROM history
		WHERE project_id = $1 AND sandbox_id = $2 ORDER BY seq DESC`, projectID, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("list history of %s: %w", sandboxID, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pandastack.HistoryEntry, error) {
		var id, body string
		var e pandastack.HistoryEntry
		if err := r.Scan(&id, &body); err != nil {
			return e, err
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			return e, fmt.Errorf("entry %s: %w", id, err)
		}
		e.ID = id
		return e, nil
	})
	if err != nil {
		return nil, fmt.Errorf("list history of %s: %w", sandboxID, err)
	}
	if out == nil {
		out = []pandastack.HistoryEntry{}
	}
	return out, nil
}

// TrimHistory implements pandastack.HistoryStore: each project holding
// more than the share (pandastack.HistoryShare) loses its oldest entries
// until the rest fit in it, which are those whose running total (its own,
// newest first) passes the share. The holdings come from history_totals,
// locked in the order of their keys (PutHistory locks its project's first
// too, so neither waits on the other in the opposite order), and each
// trim reads the project's entries from its oldest on, only as far as the
// excess. A total that says more than the entries hold (it cannot, but
// if) is summed again rather than trimmed by.
func (s *Store) TrimHistory(ctx context.Context, maxBytes int64) (int, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("trim history: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, `SELECT project_id, bytes FROM history_totals WHERE bytes > 0 ORDER BY project_id FOR UPDATE`)
	if err != nil {
		return 0, fmt.Errorf("trim history: %w", err)
	}
	var projects []string
	var held []int64
	for rows.Next() {
		var p string
		var h int64
		if err := rows.Scan(&p, &h); err != nil {
			rows.Close()
			return 0, fmt.Errorf("trim history: %w", err)
		}
		projects, held = append(projects, p), append(held, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("trim history: %w", err)
	}
	share := pandastack.HistoryShare(held, maxBytes)
	if share < 0 {
		return 0, nil
	}
	gone := 0
	for i, p := range projects {
		if held[i] <= share {
			continue
		}
		// The oldest entries that hold the excess: a running total,
		// oldest first, that stops at the first to reach it; both scans
		// start at the project's oldest entry (history_project), or the
		// planner walks the whole table for a project with only new ones.
		tag, err := tx.Exec(ctx, `WITH first AS (SELECT min(seq) AS seq FROM history WHERE project_id = $1)
			DELETE FROM history WHERE project_id = $1 AND seq >= (SELECT seq FROM first) AND seq <= (
				SELECT seq FROM (SELECT seq, SUM(size) OVER (ORDER BY seq) AS total FROM history
					WHERE project_id = $1 AND seq >= (SELECT seq FROM first) ORDER BY seq) t
				WHERE total >= $2 ORDER BY seq LIMIT 1)`, p, held[i]-share)
		if err != nil {
			return 0, fmt.Errorf("trim history: %w", err)
		}
		if tag.RowsAffected() == 0 {
			if _, err := tx.Exec(ctx, `UPDATE history_totals SET bytes = (SELECT COALESCE(SUM(size), 0) FROM history WHERE project_id = $1) WHERE project_id = $1`, p); err != nil {
				return 0, fmt.Errorf("trim history: %w", err)
			}
		}
		gone += int(tag.RowsAffected())
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("trim history: %w", err)
	}
	return gone, nil
}

// AddOrigin implements pandastack.HistoryStore.
func (s *Store) AddOrigin(ctx context.Context, projectID string, o pandastack.Origin, keep int) error {
	if !pandastack.StorableText(projectID, o.SandboxID, o.Kind, o.From) {
		return pandastack.ErrUnstorableText("origin of sandbox", o.SandboxID)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("add origin of %s: %w", o.SandboxID, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	_, err = tx.Exec(ctx, `INSERT INTO origins (sandbox_id, project_id, kind, from_id, at) VALUES ($1, $2, $3, $4, $5)`,
		o.SandboxID, projectID, o.Kind, o.From, millis(o.At))
	if pgCode(err) == uniqueViolation {
		return pandastack.Errorf(pandastack.EConflict, "sandbox %q already has an origin", o.SandboxID)
	}
	if err != nil {
		return fmt.Errorf("add origin of %s: %w", o.SandboxID, err)
	}
	if err := keepNewest(ctx, tx, "origins", "project_id", projectID, keep); err != nil {
		return fmt.Errorf("add origin of %s: %w", o.SandboxID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("add origin of %s: %w", o.SandboxID, err)
	}
	return nil
}

// ListOrigins implements pandastack.HistoryStore.
func (s *Store) ListOrigins(ctx context.Context, projectID string) ([]pandastack.Origin, error) {
	if !pandastack.StorableText(projectID) {
		return []pandastack.Origin{}, ctx.Err()
	}
	rows, err := s.pool.Query(ctx, `SELECT sandbox_id, kind, from_id, at FROM origins
		WHERE project_id = $1 ORDER BY seq`, projectID)
	if err != nil {
		return nil, fmt.Errorf("list origins: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pandastack.Origin, error) {
		var o pandastack.Origin
		var at time.Time
		err := r.Scan(&o.SandboxID, &o.Kind, &o.From, &at)
		o.At = at.UTC()
		return o, err
	})
	if err != nil {
		return nil, fmt.Errorf("list origins: %w", err)
	}
	if out == nil {
		out = []pandastack.Origin{}
	}
	return out, nil
}
