//go:build !unix

package testutil

import "testing"

// Postgres is a throwaway PostgreSQL cluster; only Unix hosts run one.
type Postgres struct{}

// PostgresBin skips, or fails under CI=true: no cluster off Unix.
func PostgresBin(t testing.TB) string {
	t.Helper()
	missing(t, "the PostgreSQL test cluster needs a Unix host", "run the tests on Linux")
	return ""
}

// StartPostgres skips, or fails under CI=true.
func StartPostgres(t testing.TB) *Postgres { PostgresBin(t); return nil }

// SharedPostgres skips, or fails under CI=true.
func SharedPostgres(t testing.TB) *Postgres { PostgresBin(t); return nil }

// StopSharedPostgres has nothing to stop.
func StopSharedPostgres() error { return nil }

// URL is never reached: the constructors skip.
func (p *Postgres) URL(db string) string { return "" }

// NewDatabase is never reached: the constructors skip.
func (p *Postgres) NewDatabase(t testing.TB) string { return "" }

// Stop has nothing to stop.
func (p *Postgres) Stop() error { return nil }
