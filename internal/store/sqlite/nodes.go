package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/pandastack/pandastack"
)

// On SQLite one process owns the file, so there is one node; the methods
// still keep the same contract as PostgreSQL's, each in one transaction
// (immediate: SQLite's write lock is the row lock).

const nodeColumns = `id, url, state, started_at, heartbeat_at, cpus, memory_mb, free_memory_mb, pool`

func scanNode(row interface{ Scan(...any) error }) (pandastack.Node, error) {
	var n pandastack.Node
	var started, beat int64
	var pool string
	if err := row.Scan(&n.ID, &n.URL, &n.State, &started, &beat, &n.CPUs, &n.MemoryMB, &n.FreeMemoryMB, &pool); err != nil {
		return pandastack.Node{}, err
	}
	if err := json.Unmarshal([]byte(pool), &n.Pool); err != nil {
		return pandastack.Node{}, fmt.Errorf("node %s pool: %w", n.ID, err)
	}
	n.StartedAt, n.HeartbeatAt = fromMillis(started), fromMillis(beat)
	return n, nil
}

// Heartbeat implements pandastack.NodeStore: the state it replaces is read
// in the upsert's (immediate) transaction.
func (s *Store) Heartbeat(ctx context.Context, n pandastack.Node) (pandastack.NodeState, error) {
	if !pandastack.StorableText(n.ID, n.URL) {
		return "", pandastack.ErrUnstorableText("node", n.ID)
	}
	pool, err := json.Marshal(n.Pool)
	if err != nil || n.Pool == nil {
		pool = []byte("{}")
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("heartbeat of node %s: %w", n.ID, err)
	}
	defer tx.Rollback()
	var was pandastack.NodeState
	err = tx.QueryRowContext(ctx, `SELECT state FROM nodes WHERE id = ?`, n.ID).Scan(&was)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("heartbeat of node %s: %w", n.ID, err)
	}
	_, err = tx.ExecContext(ctx,
		`INSERT INTO nodes (`+nodeColumns+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		 ON CONFLICT (id) DO UPDATE SET url = excluded.url, state = excluded.state,
		   started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, cpus = excluded.cpus,
		   memory_mb = excluded.memory_mb, free_memory_mb = excluded.free_memory_mb, pool = excluded.pool`,
		n.ID, n.URL, string(pandastack.NodeUp), millis(n.StartedAt), millis(n.HeartbeatAt), n.CPUs, n.MemoryMB, n.FreeMemoryMB, string(pool))
	if err != nil {
		return "", fmt.Errorf("heartbeat of node %s: %w", n.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return "", fmt.Errorf("heartbeat of node %s: %w", n.ID, err)
	}
	return was, nil
}

// ListNodes implements pandastack.NodeStore.
func (s *Store) ListNodes(ctx context.Context) ([]pandastack.Node, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+nodeColumns+` FROM nodes ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	defer rows.Close()
	var out []pandastack.Node
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, fmt.Errorf("list nodes: %w", err)
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// committed sums a column of a node's starting and running sandboxes.
func committed(col string) string {
	return `(SELECT coalesce(sum(s.` + col + `), 0) FROM sandboxes s
		WHERE s.node_id = n.id AND s.state IN ('` + string(pandastack.StateStarting) + `', '` + string(pandastack.StateRunning) + `'))`
}

// PlaceSandbox implements pandastack.NodeStore.
func (s *Store) PlaceSandbox(ctx context.Context, p pandastack.Placement) (pandastack.Node, error) {
	if !pandastack.StorableText(p.Template) {
		return pandastack.Node{}, pandastack.ErrUnstorableText("template", p.Template)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return pandastack.Node{}, fmt.Errorf("place sandbox: %w", err)
	}
	defer tx.Rollback()
	var id string
	// json_each, not a JSON path: a template name is never parsed as one.
	err = tx.QueryRowContext(ctx,
		`SELECT n.id FROM nodes n
		 WHERE n.state = ? AND n.heartbeat_at >= ? AND n.free_memory_mb >= ?
		 ORDER BY coalesce((SELECT j.value FROM json_each(n.pool) j WHERE j.key = ?), 0) > 0 DESC,
		   n.memory_mb - `+committed("memory_mb")+` DESC,
		   n.cpus - `+committed("cpu")+` DESC,
		   n.placed_at, n.id
		 LIMIT 1`,
		string(pandastack.NodeUp), millis(p.Since), p.MemoryMB, p.Template).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return pandastack.Node{}, pandastack.Errorf(pandastack.EUnavailable, "no node has room for a sandbox of %d MiB", p.MemoryMB)
	}
	if err != nil {
		return pandastack.Node{}, fmt.Errorf("place sandbox: %w", err)
	}
	n, err := scanNode(tx.QueryRowContext(ctx, `UPDATE nodes SET placed_at = ? WHERE id = ? RETURNING `+nodeColumns, millis(p.At), id))
	if err != nil {
		return pandastack.Node{}, fmt.Errorf("place sandbox: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return pandastack.Node{}, fmt.Errorf("place sandbox: %w", err)
	}
	return n, nil
}

// ClaimSandboxesOfNoNode implements pandastack.NodeStore.
func (s *Store) ClaimSandboxesOfNoNode(ctx context.Context, node string) (int, error) {
	if node == "" {
		return 0, pandastack.Errorf(pandastack.EInvalid, "claim the sandboxes of no node: no node named")
	}
	if !pandastack.StorableText(node) {
		return 0, pandastack.ErrUnstorableText("node", node)
	}
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET node_id = ? WHERE node_id = ''`, node)
	if err != nil {
		return 0, fmt.Errorf("claim the sandboxes of no node for %s: %w", node, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("claim the sandboxes of no node for %s: %w", node, err)
	}
	return int(n), nil
}

// ForgetNode implements pandastack.NodeStore.
func (s *Store) ForgetNode(ctx context.Context, id string, at time.Time) (int, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("forget node %s: %w", id, err)
	}
	defer tx.Rollback()
	var state string
	switch err := tx.QueryRowContext(ctx, `SELECT state FROM nodes WHERE id = ?`, id).Scan(&state); {
	case errors.Is(err, sql.ErrNoRows):
		return 0, pandastack.Errorf(pandastack.ENotFound, "no node %q", id)
	case err != nil:
		return 0, fmt.Errorf("forget node %s: %w", id, err)
	case state != string(pandastack.NodeLost):
		return 0, pandastack.Errorf(pandastack.EConflict, "node %s is %s: only a lost node (one whose heartbeats stopped) is forgotten", id, state)
	}
	res, err := tx.ExecContext(ctx,
		`UPDATE sandboxes SET state = ?1, stop_reason = ?2, stopped_at = ?3, pause_reason = '' WHERE node_id = ?4 AND state = ?5`,
		string(pandastack.StateStopped), pandastack.StopLost, millis(at), id, string(pandastack.StatePaused))
	if err != nil {
		return 0, fmt.Errorf("forget node %s: %w", id, err)
	}
	stopped, _ := res.RowsAffected()
	if _, err := tx.ExecContext(ctx, `DELETE FROM nodes WHERE id = ?`, id); err != nil {
		return 0, fmt.Errorf("forget node %s: %w", id, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("forget node %s: %w", id, err)
	}
	return int(stopped), nil
}

// LoseNodes implements pandastack.NodeStore.
func (s *Store) LoseNodes(ctx context.Context, before, at time.Time) ([]string, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("lose nodes: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT id FROM nodes WHERE state = ? AND heartbeat_at < ? ORDER BY id`,
		string(pandastack.NodeUp), millis(before))
	if err != nil {
		return nil, fmt.Errorf("lose nodes: %w", err)
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, fmt.Errorf("lose nodes: %w", err)
		}
		ids = append(ids, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("lose nodes: %w", err)
	}
	for _, id := range ids {
		if _, err := tx.ExecContext(ctx, `UPDATE nodes SET state = ? WHERE id = ?`, string(pandastack.NodeLost), id); err != nil {
			return nil, fmt.Errorf("lose node %s: %w", id, err)
		}
		if _, err := tx.ExecContext(ctx,
			`UPDATE sandboxes SET state = ?1, stop_reason = ?2, stopped_at = ?3, pause_reason = '' WHERE node_id = ?4 AND state != ?1 AND state != ?5`,
			string(pandastack.StateStopped), pandastack.StopLost, millis(at), id, string(pandastack.StatePaused)); err != nil {
			return nil, fmt.Errorf("lose node %s: %w", id, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("lose nodes: %w", err)
	}
	return ids, nil
}
