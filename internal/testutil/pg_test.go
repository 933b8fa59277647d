//go:build unix

package testutil

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
)

// A cluster answers on its socket, keeps databases apart, and leaves
// neither a process nor a file behind when stopped.
func TestPostgresLeavesNothing(t *testing.T) {
	p, err := startPostgres(t)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	pid := p.postmasterPID()
	if !p.running(pid) {
		t.Fatalf("postmaster %d of %s is not running", pid, p.dir)
	}
	ctx := context.Background()
	a, b := p.NewDatabase(t), p.NewDatabase(t)
	if a == b {
		t.Fatalf("two databases share the URL %s", a)
	}
	conn, err := pgx.Connect(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	var db string
	if err := conn.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil || db != "t1" {
		t.Errorf("current_database() = %q, %v; want t1", db, err)
	}
	// An open session does not keep the server up: Stop is a fast shutdown.
	defer conn.Close(ctx)

	if err := p.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if p.running(pid) {
		t.Errorf("postmaster %d still running after Stop", pid)
	}
	if _, err := os.Stat(p.dir); !os.IsNotExist(err) {
		t.Errorf("cluster dir %s left after Stop (stat: %v)", p.dir, err)
	}
	if err := p.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}
