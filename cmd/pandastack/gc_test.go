package main

import (
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/template"
)

// template gc with an S3 snapshot store leaves the snapshot cache alone:
// its temp directories are a running server's downloads under way. It
// needs no endpoint either: the store is not opened.
func TestTemplateGCLeavesTheSnapshotCacheAlone(t *testing.T) {
	t.Setenv("PANDASTACK_S3_ENDPOINT", "")
	cfg := &Config{DataDir: t.TempDir(), CacheDir: t.TempDir(), SnapshotStore: "s3://bucket/snaps"}
	store, _, err := openStore(t.Context(), cfg) // the server's, as serve made it
	if err != nil {
		t.Fatal(err)
	}
	store.Close()
	download := filepath.Join(cfg.snapshotCacheDir(), ".tmp-snap_x-1")
	if err := os.MkdirAll(download, 0o700); err != nil {
		t.Fatal(err)
	}
	reg, err := template.Load()
	if err != nil {
		t.Fatal(err)
	}
	if err := templateGC(t.Context(), cfg, reg, time.Hour, true, io.Discard); err != nil {
		t.Fatalf("template gc: %v", err)
	}
	if _, err := os.Stat(download); err != nil {
		t.Fatalf("a download under way in the snapshot cache: %v", err)
	}
}
