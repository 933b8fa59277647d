package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/testutil"
)

// roundTrip writes a project through s and reads it back.
func roundTrip(t *testing.T, s pandastack.Store) {
	t.Helper()
	if err := s.CreateProject(t.Context(), pandastack.Project{ID: "prj_1", Name: "default"}); err != nil {
		t.Fatal(err)
	}
	if p, err := s.ProjectByName(t.Context(), "default"); err != nil || p.ID != "prj_1" {
		t.Fatalf("ProjectByName = %+v, %v", p, err)
	}
}

func TestOpenStoreSQLite(t *testing.T) {
	dir := t.TempDir()
	cfg := Config{DataDir: dir}
	s, desc, err := openStore(t.Context(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, s)
	s.Close()
	if _, err := os.Stat(filepath.Join(dir, "pandastack.db")); err != nil || !strings.Contains(desc, "sqlite") {
		t.Errorf("default store: desc %q, file: %v", desc, err)
	}

	path := filepath.Join(t.TempDir(), "elsewhere.db")
	cfg.Store = "sqlite://" + path
	s, _, err = openStore(t.Context(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, s)
	s.Close()
	if _, err := os.Stat(path); err != nil {
		t.Errorf("sqlite:// store not at its path: %v", err)
	}
}

func TestOpenStorePostgres(t *testing.T) {
	url := testutil.StartPostgres(t).NewDatabase(t)
	cfg := Config{DataDir: t.TempDir(), Store: url}
	s, desc, err := openStore(t.Context(), &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	roundTrip(t, s)
	if !strings.HasPrefix(desc, "postgres ") {
		t.Errorf("desc = %q", desc)
	}
	if ents, _ := os.ReadDir(cfg.DataDir); len(ents) != 0 {
		t.Errorf("a PostgreSQL store wrote to the data dir: %v", ents)
	}
}

func TestOpenStoreBadInput(t *testing.T) {
	for _, ref := range []string{"mysql://u:s3cret@h/db", "sqlite://", "/var/lib/x.db", "postgres://u:s3cret@%zz/db"} {
		cfg := Config{DataDir: t.TempDir(), Store: ref}
		s, _, err := openStore(t.Context(), &cfg)
		if err == nil {
			s.Close()
			t.Errorf("--store %q accepted", ref)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("--store %q: error shows the password: %v", ref, err)
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://u:s3cret@h:5432/db?sslmode=require": "postgres://u:xxxxx@h:5432/db?sslmode=require",
		"postgres:///db?host=/run/pg&password=s3cret":   "postgres:///db?host=%2Frun%2Fpg&password=xxxxx",
		"postgres://h/db": "postgres://h/db",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
}
