package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/testutil"
)

// nodes measures what several hosts cost (issue 12): two serves as nodes
// on one throwaway PostgreSQL and one S3-compatible bucket (versitygw), on
// this machine's loopback. Node A keeps its creates (--placement local);
// node B places them (--placement spread), so with nothing else running
// they alternate between B and A and half of B's creates are forwarded to
// A. Both series compared run their sandboxes on A:
//   - create through B, placed on and forwarded to A, vs a create asked of
//     A directly (the forwarding hop and the placement transaction);
//   - a restore on A of a snapshot another node took (its image comes from
//     the bucket, checked) vs one A took itself (from A's own cache).
func (b *bench) nodes(ctx context.Context) (err error) {
	binDir := filepath.Dir(b.pool.cmd.Path)
	pg, err := testutil.NewPostgres()
	if err != nil {
		return err
	}
	defer pg.Stop()
	db, err := pg.CreateDatabase()
	if err != nil {
		return err
	}
	s3, err := testutil.NewS3()
	if err != nil {
		return err
	}
	defer s3.Stop()
	bucket, err := s3.CreateBucket()
	if err != nil {
		return err
	}
	// The endpoint and credentials reach serve only through its
	// environment; the nodes inherit the benchmark's.
	for _, kv := range s3.Env() {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
		defer os.Unsetenv(k)
	}
	shared := []string{"--store", db, "--snapshot-store", "s3://" + bucket + "/bench", "--node-heartbeat", "1s", "--node-grace", "10s"}
	fmt.Fprintln(os.Stderr, "  starting node A (--placement local) and node B (--placement spread) on one PostgreSQL and one bucket")
	a, err := startServer(ctx, "node-a", binDir, b.pool.runsc, 0, append(shared, "--placement", "local")...)
	if err != nil {
		return err
	}
	defer a.stop()
	// B shares A's key (the database holds it) and makes none of its own.
	bNode, err := startServer(ctx, "node-b", binDir, b.pool.runsc, 0, append(shared, "--placement", "spread")...)
	if err != nil {
		return err
	}
	defer bNode.stop()
	bNode.key = a.key
	bNode.c = client.New(bNode.url, a.key)
	bNode.c.HTTP = a.c.HTTP
	for _, s := range []*server{a, bNode} {
		if err := s.waitWarm(ctx, ciTemplate, 20*time.Minute); err != nil {
			return err
		}
	}
	aID, err := readNodeID(a)
	if err != nil {
		return err
	}
	time.Sleep(2 * time.Second) // each has seen the other heartbeat

	// Creates: alternate A direct and B, until N of B's were forwarded.
	var direct, forwarded, placedHere []float64
	for i := 0; len(forwarded) < b.set.N || len(direct) < b.set.N; i++ {
		if i > 4*b.set.N {
			return fmt.Errorf("node B forwarded %d of %d creates; placement does not alternate", len(forwarded), i)
		}
		for _, via := range []*server{a, bNode} {
			if via == a && len(direct) >= b.set.N {
				continue
			}
			t0 := time.Now()
			sb, err := via.c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: ciTemplate, TTLSeconds: sandboxTTL})
			d := ms(time.Since(t0))
			if err != nil {
				return fmt.Errorf("create through %s: %w", via.name, err)
			}
			via.track(sb.ID)
			switch {
			case via == a:
				direct = append(direct, d)
			case sb.NodeID == aID:
				forwarded = append(forwarded, d)
			default:
				placedHere = append(placedHere, d)
			}
			if err := via.kill(sb.ID); err != nil {
				return err
			}
		}
	}
	b.add(summarize("nodes", "create through node B, placed on and forwarded to A", "ms", forwarded, "POST /v1/sandboxes on B; the sandbox runs on A; code-interpreter, no pool"))
	b.add(summarize("nodes", "create asked of node A directly", "ms", direct, "same template and node; --placement local on A"))
	b.add(summarize("nodes", "create through node B, placed on B itself", "ms", placedHere, "the placement transaction, no forwarding"))

	// Restores on A: of a snapshot B took (from the bucket) vs of one A
	// took (from A's cache). A source sandbox on each node.
	src := map[*server]*client.Sandbox{}
	for _, s := range []*server{a, bNode} {
		for range 4 {
			sb, err := s.c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: ciTemplate, TTLSeconds: sandboxTTL})
			if err != nil {
				return err
			}
			s.track(sb.ID)
			if (s == a) == (sb.NodeID == aID) {
				src[s] = sb
				break
			}
			s.kill(sb.ID)
		}
		if src[s] == nil {
			return errors.New("no sandbox placed on node B")
		}
		if err := expectText(ctx, s.c, src[s].ID, "x = 42\nx", "42"); err != nil {
			return err
		}
	}
	var fromCache, fromBucket []float64
	for r := range b.set.Rounds {
		order := []*server{a, bNode}
		if r%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, taker := range order {
			snap, err := taker.c.CreateSnapshot(ctx, src[taker].ID, map[string]string{"bench": "nodes"})
			if err != nil {
				return fmt.Errorf("snapshot on %s: %w", taker.name, err)
			}
			t0 := time.Now()
			rs, err := a.restore(ctx, snap.ID) // A keeps its creates: it runs on A
			if err == nil {
				err = expectText(ctx, a.c, rs.ID, "x", "42")
			}
			d := ms(time.Since(t0))
			if rs != nil {
				if rs.NodeID != aID && err == nil {
					err = fmt.Errorf("restore through A ran on %s", rs.NodeID)
				}
				a.kill(rs.ID)
			}
			if derr := a.c.DeleteSnapshot(context.WithoutCancel(ctx), snap.ID); derr != nil && err == nil {
				err = derr
			}
			if err != nil {
				return fmt.Errorf("restore on A of %s's snapshot: %w", taker.name, err)
			}
			if taker == a {
				fromCache = append(fromCache, d)
			} else {
				fromBucket = append(fromBucket, d)
			}
		}
	}
	b.add(summarize("nodes", "restore on A of B's snapshot (from the bucket) → run_code", "ms", fromBucket, "warm code-interpreter image downloaded from versitygw on loopback and checked"))
	b.add(summarize("nodes", "restore on A of A's own snapshot (its cache) → run_code", "ms", fromCache, "same image size; alternating with the one above"))
	for _, s := range []*server{a, bNode} {
		s.kill(src[s].ID)
	}
	return nil
}

func readNodeID(s *server) (string, error) {
	b, err := os.ReadFile(filepath.Join(s.dataDir, "node-id"))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
