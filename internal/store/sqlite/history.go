package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/pandastack/pandastack"
)

// historyMigration keeps what was run in sandboxes and where sandboxes came
// from (pandastack.HistoryStore). An entry is kept whole as JSON: it is
// written and read as one and never searched by its fields. seq orders
// entries by insertion; an entry replaced by PutHistory keeps its seq.
const historyMigration = `CREATE TABLE history (
		seq        INTEGER PRIMARY KEY AUTOINCREMENT,
		id         TEXT NOT NULL UNIQUE,
		project_id TEXT NOT NULL,
		sandbox_id TEXT NOT NULL,
		size       INTEGER NOT NULL,
		entry      TEXT NOT NULL CHECK (json_valid(entry))
	) STRICT;
	CREATE INDEX history_sandbox ON history(sandbox_id, seq);
	CREATE TABLE origins (
		seq        INTEGER PRIMARY KEY AUTOINCREMENT,
		sandbox_id TEXT NOT NULL UNIQUE,
		project_id TEXT NOT NULL,
		kind       TEXT NOT NULL,
		from_id    TEXT NOT NULL,
		at         INTEGER NOT NULL
	) STRICT;
	CREATE INDEX origins_project ON origins(project_id, seq);`

// historyTotalsMigration keeps each project's history bytes in a row of
// their own, up to date through triggers, so that a trim (TrimHistory)
// reads the projects' holdings without a pass over every entry, and walks
// only the oldest entries of those over their share (history_project).
const historyTotalsMigration = `CREATE TABLE history_totals (
		project_id TEXT PRIMARY KEY,
		bytes      INTEGER NOT NULL
	) STRICT;
	INSERT INTO history_totals (project_id, bytes) SELECT project_id, SUM(size) FROM history GROUP BY project_id;
	CREATE INDEX history_project ON history(project_id, seq);
	CREATE TRIGGER history_total_insert AFTER INSERT ON history BEGIN
		INSERT INTO history_totals (project_id, bytes) VALUES (NEW.project_id, NEW.size)
		ON CONFLICT (project_id) DO UPDATE SET bytes = bytes + excluded.bytes;
	END;
	CREATE TRIGGER history_total_update AFTER UPDATE OF size ON history BEGIN
		UPDATE history_totals SET bytes = bytes - OLD.size + NEW.size WHERE project_id = NEW.project_id;
	END;
	CREATE TRIGGER history_total_delete AFTER DELETE ON history BEGIN
		UPDATE history_totals SET bytes = bytes - OLD.size WHERE project_id = OLD.project_id;
	END;`

// PutHistory implements pandastack.HistoryStore.
func (s *Store) PutHistory(ctx context.Context, projectID, sandboxID string, e pandastack.HistoryEntry, keep int) error {
	if !pandastack.StorableText(projectID, sandboxID, e.ID) {
		return pandastack.ErrUnstorableText("history entry", e.ID)
	}
	e.StartedAt = fromMillis(millis(e.StartedAt))
	body, err := json.Marshal(e) // invalid UTF-8 becomes U+FFFD, NUL \u0000: always storable
	if err != nil {
		return fmt.Errorf("put history %s: %w", e.ID, err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("put history %s: %w", e.ID, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `INSERT INTO history (id, project_id, sandbox_id, size, entry) VALUES (?1, ?2, ?3, ?4, ?5)
		ON CONFLICT (id) DO UPDATE SET size = ?4, entry = ?5
		WHERE history.project_id = ?2 AND history.sandbox_id = ?3`,
		e.ID, projectID, sandboxID, len(body), string(body))
	if err != nil {
		return fmt.Errorf("put history %s: %w", e.ID, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return pandastack.Errorf(pandastack.EConflict, "history entry %q belongs to another sandbox", e.ID)
	}
	if err := keepNewestOfSandbox(ctx, tx, projectID, sandboxID, keep); err != nil {
		return fmt.Errorf("put history %s: %w", e.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("put history %s: %w", e.ID, err)
	}
	return nil
}

// keepNewestOfSandbox deletes the history of the project's sandbox but for
// its newest keep entries (by seq); keep <= 0 keeps all.
func keepNewestOfSandbox(ctx context.Context, tx *sql.Tx, projectID, sandboxID string, keep int) error {
	if keep <= 0 {
		return nil
	}
	_, err := tx.ExecContext(ctx, `DELETE FROM history WHERE project_id = ?1 AND sandbox_id = ?2 AND seq <=
		(SELECT seq FROM history WHERE project_id = ?1 AND sandbox_id = ?2 ORDER BY seq DESC LIMIT 1 OFFSET ?3)`, projectID, sandboxID, keep)
	if err != nil {
		return fmt.Errorf("keep the newest %d of the history: %w", keep, err)
	}
	return nil
}

// keepNewest deletes the rows of table whose column is value but for the
// newest keep (by seq); keep <= 0 keeps all. table and column are our own
// names, never user input.
func keepNewest(ctx context.Context, tx *sql.Tx, table, column, value string, keep int) error {
	if keep <= 0 {
		return nil
	}
	_, err := tx.ExecContext(ctx, `DELETE FROM `+table+` WHERE `+column+` = ?1 AND seq <=
		(SELECT seq FROM `+table+` WHERE `+column+` = ?1 ORDER BY seq DESC LIMIT 1 OFFSET ?2)`, value, keep)
	if err != nil {
		return fmt.Errorf("keep the newest %d of %s: %w", keep, table, err)
	}
	return nil
}

// ListHistory implements pandastack.HistoryStore.
func (s *Store) ListHistory(ctx context.Context, projectID, sandboxID string) ([]pandastack.HistoryEntry, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, entry FROM history
		WHERE project_id = ? AND sandbox_id = ? ORDER BY seq DESC`, projectID, sandboxID)
	if err != nil {
		return nil, fmt.Errorf("list history of %s: %w", sandboxID, err)
	}
	defer rows.Close()
	out := []pandastack.HistoryEntry{}
	for rows.Next() {
		var id, body string
		if err := rows.Scan(&id, &body); err != nil {
			return nil, fmt.Errorf("list history of %s: %w", sandboxID, err)
		}
		var e pandastack.HistoryEntry
		if err := json.Unmarshal([]byte(body), &e); err != nil {
			return nil, fmt.Errorf("list history of %s: entry %s: %w", sandboxID, id, err)
		}
		e.ID = id
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list history of %s: %w", sandboxID, err)
	}
	return out, nil
}

// TrimHistory implements pandastack.HistoryStore: each project holding
// more than the share (pandastack.HistoryShare) loses its oldest entries
// until the rest fit in it, which are those whose running total (its own,
// newest first) passes the share. The holdings come from history_totals,
// and each trim walks only the entries it removes and one more: a trim
// of a history at its cap costs what it removes, not a pass over it all.
func (s *Store) TrimHistory(ctx context.Context, maxBytes int64) (int, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("trim history: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT project_id, bytes FROM history_totals WHERE bytes > 0 ORDER BY project_id`)
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
		cut, ok, err := oldestPast(ctx, tx, p, held[i]-share)
		if err != nil {
			return 0, fmt.Errorf("trim history: %w", err)
		}
		if !ok {
			// The total says more than the entries hold (it cannot, but
			// if): summed again, rather than trimmed by (which would
			// take the project's whole history).
			if _, err := tx.ExecContext(ctx, `UPDATE history_totals SET bytes = (SELECT COALESCE(SUM(size), 0) FROM history WHERE project_id = ?1) WHERE project_id = ?1`, p); err != nil {
				return 0, fmt.Errorf("trim history: %w", err)
			}
			continue
		}
		res, err := tx.ExecContext(ctx, `DELETE FROM history WHERE project_id = ? AND seq <= ?`, p, cut)
		if err != nil {
			return 0, fmt.Errorf("trim history: %w", err)
		}
		n, _ := res.RowsAffected()
		gone += int(n)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("trim history: %w", err)
	}
	return gone, nil
}

// oldestPast returns the seq of the newest of project's oldest entries
// that together hold at least excess bytes; ok is false when all of them
// hold less.
func oldestPast(ctx context.Context, tx *sql.Tx, project string, excess int64) (seq int64, ok bool, err error) {
	rows, err := tx.QueryContext(ctx, `SELECT seq, size FROM history WHERE project_id = ? ORDER BY seq`, project)
	if err != nil {
		return 0, false, err
	}
	defer rows.Close()
	var size, sum int64
	for sum < excess && rows.Next() {
		if err := rows.Scan(&seq, &size); err != nil {
			return 0, false, err
		}
		sum += size
	}
	return seq, sum >= excess, rows.Err()
}

// AddOrigin implements pandastack.HistoryStore.
func (s *Store) AddOrigin(ctx context.Context, projectID string, o pandastack.Origin, keep int) error {
	if !pandastack.StorableText(projectID, o.SandboxID, o.Kind, o.From) {
		return pandastack.ErrUnstorableText("origin of sandbox", o.SandboxID)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("add origin of %s: %w", o.SandboxID, err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `INSERT INTO origins (sandbox_id, project_id, kind, from_id, at) VALUES (?, ?, ?, ?, ?)`,
		o.SandboxID, projectID, o.Kind, o.From, millis(o.At))
	if isUnique(err) {
		return pandastack.Errorf(pandastack.EConflict, "sandbox %q already has an origin", o.SandboxID)
	}
	if err != nil {
		return fmt.Errorf("add origin of %s: %w", o.SandboxID, err)
	}
	if err := keepNewest(ctx, tx, "origins", "project_id", projectID, keep); err != nil {
		return fmt.Errorf("add origin of %s: %w", o.SandboxID, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("add origin of %s: %w", o.SandboxID, err)
	}
	return nil
}

// ListOrigins implements pandastack.HistoryStore.
func (s *Store) ListOrigins(ctx context.Context, projectID string) ([]pandastack.Origin, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT sandbox_id, kind, from_id, at FROM origins
		WHERE project_id = ? ORDER BY seq`, projectID)
	if err != nil {
		return nil, fmt.Errorf("list origins: %w", err)
	}
	defer rows.Close()
	out := []pandastack.Origin{}
	for rows.Next() {
		var o pandastack.Origin
		var at int64
		if err := rows.Scan(&o.SandboxID, &o.Kind, &o.From, &at); err != nil {
			return nil, fmt.Errorf("list origins: %w", err)
		}
		o.At = fromMillis(at)
		out = append(out, o)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list origins: %w", err)
	}
	return out, nil
}
