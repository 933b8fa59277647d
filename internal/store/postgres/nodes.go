package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pandastack/pandastack"
)

const nodeColumns = `id, url, state, started_at, heartbeat_at, cpus, memory_mb, free_memory_mb, pool`

func scanNode(row pgx.Row) (pandastack.Node, error) {
	var n pandastack.Node
	var pool []byte
	if err := row.Scan(&n.ID, &n.URL, &n.State, &n.StartedAt, &n.HeartbeatAt, &n.CPUs, &n.MemoryMB, &n.FreeMemoryMB, &pool); err != nil {
		return pandastack.Node{}, err
	}
	if err := json.Unmarshal(pool, &n.Pool); err != nil {
		return pandastack.Node{}, fmt.Errorf("node %s pool: %w", n.ID, err)
	}
	n.StartedAt, n.HeartbeatAt = n.StartedAt.UTC(), n.HeartbeatAt.UTC()
	return n, nil
}

// Heartbeat implements pandastack.NodeStore: the state it replaces is read
// FOR UPDATE in the upsert's transaction. A LoseNodes holding the row
// makes it wait, and then read "lost"; a ForgetNode, read no row.
func (s *Store) Heartbeat(ctx context.Context, n pandastack.Node) (pandastack.NodeState, error) {
	if !pandastack.StorableText(n.ID, n.URL) {
		return "", pandastack.ErrUnstorableText("node", n.ID)
	}
	pool, err := json.Marshal(n.Pool)
	if err != nil || n.Pool == nil {
		pool = []byte("{}")
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("heartbeat of node %s: %w", n.ID, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var was pandastack.NodeState
	err = tx.QueryRow(ctx, `SELECT state FROM nodes WHERE id = $1 FOR UPDATE`, n.ID).Scan(&was)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return "", fmt.Errorf("heartbeat of node %s: %w", n.ID, err)
	}
	_, err = tx.Exec(ctx,
		`INSERT INTO nodes (`+nodeColumns+`) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9::jsonb)
		 ON CONFLICT (id) DO UPDATE SET url = excluded.url, state = excluded.state,
		   started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at, cpus = excluded.cpus,
		   memory_mb = excluded.memory_mb, free_memory_mb = excluded.free_memory_mb, pool = excluded.pool`,
		n.ID, n.URL, string(pandastack.NodeUp), millis(n.StartedAt), millis(n.HeartbeatAt), n.CPUs, n.MemoryMB, n.FreeMemoryMB, string(pool))
	if err != nil {
		return "", fmt.Errorf("heartbeat of node %s: %w", n.ID, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("heartbeat of node %s: %w", n.ID, err)
	}
	return was, nil
}

// ListNodes implements pandastack.NodeStore.
func (s *Store) ListNodes(ctx context.Context) ([]pandastack.Node, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+nodeColumns+` FROM nodes ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (pandastack.Node, error) { return scanNode(r) })
	if err != nil {
		return nil, fmt.Errorf("list nodes: %w", err)
	}
	return out, nil
}

// committed sums a column of a node's starting and running sandboxes:
// what placement counts as taken (a paused sandbox holds neither).
func committed(col string) string {
	return `(SELECT coalesce(sum(s.` + col + `), 0) FROM sandboxes s
		WHERE s.node_id = n.id AND s.state IN ('` + string(pandastack.StateStarting) + `', '` + string(pandastack.StateRunning) + `'))`
}

// PlaceSandbox implements pandastack.NodeStore: the candidate row is locked
// FOR UPDATE SKIP LOCKED, so a concurrent placement takes the next best
// node rather than wait, and its placed_at moves so that ties rotate.
func (s *Store) PlaceSandbox(ctx context.Context, p pandastack.Placement) (pandastack.Node, error) {
	if !pandastack.StorableText(p.Template) {
		return pandastack.Node{}, pandastack.ErrUnstorableText("template", p.Template)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return pandastack.Node{}, fmt.Errorf("place sandbox: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// First the best node nobody is placing on right now; when every
	// candidate is locked, wait for the best one instead.
	var id string
	for _, lock := range []string{"FOR UPDATE OF n SKIP LOCKED", "FOR UPDATE OF n"} {
		err = tx.QueryRow(ctx,
			`SELECT n.id FROM nodes n
			 WHERE n.state = $1 AND n.heartbeat_at >= $2 AND n.free_memory_mb >= $3
			 ORDER BY coalesce((n.pool ->> $4::text)::bigint, 0) > 0 DESC,
			   n.memory_mb - `+committed("memory_mb")+` DESC,
			   n.cpus - `+committed("cpu")+` DESC,
			   n.placed_at, n.id
			 LIMIT 1 `+lock,
			string(pandastack.NodeUp), millis(p.Since), p.MemoryMB, p.Template).Scan(&id)
		if !errors.Is(err, pgx.ErrNoRows) {
			break
		}
	}
	if errors.Is(err, pgx.ErrNoRows) {
		return pandastack.Node{}, pandastack.Errorf(pandastack.EUnavailable, "no node has room for a sandbox of %d MiB", p.MemoryMB)
	}
	if err != nil {
		return pandastack.Node{}, fmt.Errorf("place sandbox: %w", err)
	}
	n, err := scanNode(tx.QueryRow(ctx, `UPDATE nodes SET placed_at = $1 WHERE id = $2 RETURNING `+nodeColumns, millis(p.At), id))
	if err != nil {
		return pandastack.Node{}, fmt.Errorf("place sandbox: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return pandastack.Node{}, fmt.Errorf("place sandbox: %w", err)
	}
	return n, nil
}

// ClaimSandboxesOfNoNode implements pandastack.NodeStore: the rows are
// locked in id order, so a second claim at once waits on the first row
// and then finds it, like the rest, claimed.
func (s *Store) ClaimSandboxesOfNoNode(ctx context.Context, node string) (int, error) {
	if node == "" {
		return 0, pandastack.Errorf(pandastack.EInvalid, "claim the sandboxes of no node: no node named")
	}
	if !pandastack.StorableText(node) {
		return 0, pandastack.ErrUnstorableText("node", node)
	}
	tag, err := s.pool.Exec(ctx,
		`UPDATE sandboxes SET node_id = $1
		 WHERE id IN (SELECT id FROM sandboxes WHERE node_id = '' ORDER BY id COLLATE "C" FOR UPDATE)`, node)
	if err != nil {
		return 0, fmt.Errorf("claim the sandboxes of no node for %s: %w", node, err)
	}
	return int(tag.RowsAffected()), nil
}

// ForgetNode implements pandastack.NodeStore.
func (s *Store) ForgetNode(ctx context.Context, id string, at time.Time) (int, error) {
	if !pandastack.StorableText(id) {
		return 0, pandastack.Errorf(pandastack.ENotFound, "no node %q", id)
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("forget node %s: %w", id, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var state string
	switch err := tx.QueryRow(ctx, `SELECT state FROM nodes WHERE id = $1 FOR UPDATE`, id).Scan(&state); {
	case errors.Is(err, pgx.ErrNoRows):
		return 0, pandastack.Errorf(pandastack.ENotFound, "no node %q", id)
	case err != nil:
		return 0, fmt.Errorf("forget node %s: %w", id, err)
	case state != string(pandastack.NodeLost):
		return 0, pandastack.Errorf(pandastack.EConflict, "node %s is %s: only a lost node (one whose heartbeats stopped) is forgotten", id, state)
	}
	tag, err := tx.Exec(ctx,
		`UPDATE sandboxes SET state = $1, stop_reason = $2, stopped_at = $3, pause_reason = '' WHERE node_id = $4 AND state = $5`,
		string(pandastack.StateStopped), pandastack.StopLost, millis(at), id, string(pandastack.StatePaused))
	if err != nil {
		return 0, fmt.Errorf("forget node %s: %w", id, err)
	}
	if _, err := tx.Exec(ctx, `DELETE FROM nodes WHERE id = $1`, id); err != nil {
		return 0, fmt.Errorf("forget node %s: %w", id, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("forget node %s: %w", id, err)
	}
	return int(tag.RowsAffected()), nil
}

// LoseNodes implements pandastack.NodeStore. Nodes another survivor is
// marking right now are skipped (SKIP LOCKED): it does the same work.
func (s *Store) LoseNodes(ctx context.Context, before, at time.Time) ([]string, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("lose nodes: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	rows, err := tx.Query(ctx, `SELECT id FROM nodes WHERE state = $1 AND heartbeat_at < $2 ORDER BY id FOR UPDATE SKIP LOCKED`,
		string(pandastack.NodeUp), millis(before))
	if err != nil {
		return nil, fmt.Errorf("lose nodes: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("lose nodes: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	if _, err := tx.Exec(ctx, `UPDATE nodes SET state = $1 WHERE id = ANY($2::text[])`, string(pandastack.NodeLost), ids); err != nil {
		return nil, fmt.Errorf("lose nodes: %w", err)
	}
	if _, err := tx.Exec(ctx,
		`UPDATE sandboxes SET state = $1, stop_reason = $2, stopped_at = $3, pause_reason = ''
		 WHERE node_id = ANY($4::text[]) AND state != $1 AND state != $5`,
		string(pandastack.StateStopped), pandastack.StopLost, millis(at), ids, string(pandastack.StatePaused)); err != nil {
		return nil, fmt.Errorf("lose nodes: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("lose nodes: %w", err)
	}
	return ids, nil
}
