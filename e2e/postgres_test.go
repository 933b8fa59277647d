package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/paths"
	"github.com/pandastack/pandastack/internal/testutil"
)

// serve on a PostgreSQL store (a real throwaway cluster): create, exec,
// list and kill through it, with the records in PostgreSQL and none in a
// SQLite file; a restart of serve on the same database re-adopts the
// sandbox; the CLI's key commands use the same store.
func TestPostgresStore(t *testing.T) {
	testutil.Runsc(t)
	url := testutil.StartPostgres(t).NewDatabase(t)
	ctx := context.Background()
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)

	// Sandboxes outlive serve here, as they do for an operator.
	s := startServer(t, "", "PANDASTACK_STORE="+url, "PANDASTACK_KILL_ON_EXIT=0", "PANDASTACK_POOL_SIZE=0")
	var id string
	defer func() {
		if id != "" && s.cmd != nil { // a failure part way: leave nothing running
			s.client().KillSandbox(ctx, id)
		}
		s.stop()
		os.RemoveAll(s.dataDir)
	}()
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{TTLSeconds: 600, Metadata: map[string]string{"store": "postgres"}})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, tail(s.out.String(), 30))
	}
	id = sb.ID
	res, err := c.Exec(ctx, id, client.ExecRequest{Cmd: "echo kept > state.txt && cat state.txt"})
	if err != nil || res.Stdout != "kept\n" || res.ExitCode != 0 {
		t.Fatalf("exec: %+v %v", res, err)
	}
	list, err := c.ListSandboxes(ctx, map[string]string{"store": "postgres"}, "")
	if err != nil || len(list) != 1 || list[0].ID != id {
		t.Fatalf("list by metadata = %+v, %v; want just %s", list, err, id)
	}

	var state, md string
	if err := db.QueryRow(ctx, `SELECT state, metadata::text FROM sandboxes WHERE id = $1`, id).Scan(&state, &md); err != nil {
		t.Fatalf("the sandbox's record is not in PostgreSQL: %v", err)
	}
	if state != "running" || !strings.Contains(md, `"store": "postgres"`) {
		t.Errorf("record in PostgreSQL: state %q metadata %s", state, md)
	}
	if _, err := os.Stat(filepath.Join(s.dataDir, "pandastack.db")); !os.IsNotExist(err) {
		t.Errorf("serve --store postgres://… made a SQLite file in the data dir (stat: %v)", err)
	}

	// The CLI reads keys from the same store.
	cmd := exec.Command(filepath.Join(s.bin, "pandastack"), "keys", "list")
	cmd.Env = append(os.Environ(), "PANDASTACK_STORE="+url, "PANDASTACK_DATA_DIR="+t.TempDir(), "PANDASTACK_CACHE_DIR="+paths.CacheDir())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), s.key[:10]) {
		t.Errorf("keys list on the store: %v\n%s\nwant the first key's prefix %s", err, out, s.key[:10])
	}

	s.stop()
	s.start()
	c = s.client()
	res, err = c.Exec(ctx, id, client.ExecRequest{Cmd: "cat state.txt"})
	if err != nil || res.Stdout != "kept\n" {
		t.Fatalf("after restart on the same database: %+v %v\n%s", res, err, tail(s.out.String(), 30))
	}
	got, err := c.GetSandbox(ctx, id)
	if err != nil || got.State != "running" {
		t.Fatalf("after restart: %+v %v", got, err)
	}

	if err := c.KillSandbox(ctx, id); err != nil {
		t.Fatal(err)
	}
	s.assertGone(t, id)
	if _, err := c.GetSandbox(ctx, id); !client.IsCode(err, "not_found") {
		t.Errorf("GET after kill: %v", err)
	}
	var n int
	if err := db.QueryRow(ctx, `SELECT count(*) FROM sandboxes WHERE id = $1`, id).Scan(&n); err != nil || n != 0 {
		t.Errorf("record left in PostgreSQL after kill: %d, %v", n, err)
	}
	id = ""
}
