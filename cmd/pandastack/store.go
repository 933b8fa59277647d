package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/store/postgres"
	"github.com/pandastack/pandastack/internal/store/sqlite"
)

// openStore opens the store cfg.Store names and applies its pending schema
// migrations. It also returns a description for the log, with no password.
//
//	""                         SQLite at <data dir>/pandastack.db (the default)
//	sqlite:///abs/path.db      SQLite at that path (sqlite://rel/path.db: relative)
//	postgres://… postgresql:// PostgreSQL; the database must exist
func openStore(ctx context.Context, cfg *Config) (pandastack.Store, string, error) {
	ref := cfg.Store
	switch {
	case ref == "":
		s, err := sqlite.Open(cfg.dbPath())
		return s, "sqlite " + cfg.dbPath(), err
	case strings.HasPrefix(ref, "sqlite://"):
		path := strings.TrimPrefix(ref, "sqlite://")
		if path == "" {
			return nil, "", fmt.Errorf("--store %s: give a file path, e.g. sqlite:///var/lib/pandastack/pandastack.db", ref)
		}
		s, err := sqlite.Open(path)
		return s, "sqlite " + path, err
	case strings.HasPrefix(ref, "postgres://"), strings.HasPrefix(ref, "postgresql://"):
		desc := "postgres " + redact(ref)
		s, err := postgres.Open(ctx, ref)
		if err != nil {
			return nil, "", fmt.Errorf("store %s: %w", desc, err)
		}
		return s, desc, nil
	default:
		scheme, _, _ := strings.Cut(ref, ":")
		return nil, "", fmt.Errorf("--store: unknown kind %q; want empty (SQLite in the data dir), sqlite:///path or postgres://user:pass@host/db", scheme)
	}
}

// redact returns a PostgreSQL URL without its password, for logs and
// errors; "(unparsable URL)" when it cannot be read.
func redact(ref string) string {
	u, err := url.Parse(ref)
	if err != nil {
		return "(unparsable URL)"
	}
	q := u.Query()
	if q.Has("password") {
		q.Set("password", "xxxxx")
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
