package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/imagestore"
	"github.com/pandastack/pandastack/internal/sandbox"
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

// fakeBuilt writes a finished build of spec into cache, built at, as
// template build would (the marker written last), with the fields given.
func fakeBuilt(t *testing.T, cache string, spec template.Spec, at time.Time, fields map[string]any) template.Built {
	t.Helper()
	dir := template.Dir(cache, spec)
	if err := os.MkdirAll(filepath.Join(dir, "rootfs", "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	m := map[string]any{"name": spec.Name, "hash": spec.Hash(), "built_at": at, "spec": spec}
	for k, v := range fields {
		m[k] = v
	}
	data, _ := json.Marshal(m)
	marker := filepath.Join(dir, "template.json")
	if err := os.WriteFile(marker, data, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(marker, at, at)
	b, ok := template.Lookup(cache, spec)
	if !ok {
		t.Fatalf("the fake build of %s does not look built", spec.Name)
	}
	return b
}

// fakeWarmImage seals a warm image made on rootfs at dir, last marked at.
func fakeWarmImage(t *testing.T, dir, rootfs string, at time.Time) {
	t.Helper()
	tmp := filepath.Join(filepath.Dir(dir), ".tmp-"+filepath.Base(dir))
	os.MkdirAll(filepath.Join(tmp, imagestore.FilesDir), 0o700)
	os.WriteFile(filepath.Join(tmp, imagestore.FilesDir, "pages"), []byte("x"), 0o600)
	if _, err := imagestore.Seal(tmp, dir, imagestore.Manifest{Template: "base", RootFS: rootfs, CreatedAt: at}); err != nil {
		t.Fatal(err)
	}
	os.Chtimes(dir, at, at)
}

// gcConfig is the configuration of a template gc of a server that ran on
// a data directory of its own, with its store made.
func gcConfig(t *testing.T, cacheDir string) *Config {
	t.Helper()
	cfg := &Config{DataDir: t.TempDir(), CacheDir: cacheDir, Agent: filepath.Join(t.TempDir(), "no-agent")}
	store, _, err := openStore(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	store.Close()
	return cfg
}

// A gc given the cache directory through a symlink (the server was given
// the real path) still sees that the server's warm image is of the current
// build, and keeps it.
func TestTemplateGCSeesTheCacheThroughASymlink(t *testing.T) {
	real := t.TempDir()
	link := filepath.Join(t.TempDir(), "cache")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	reg, err := template.Load()
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := reg.Get("base")
	old := time.Now().Add(-48 * time.Hour)
	b := fakeBuilt(t, real, spec, old, nil)
	cfg := gcConfig(t, link)
	warm := sandbox.WarmImageDirOfBuild(filepath.Join(real, "warm"), spec.Name, spec.Hash(), b.ID(), "agent")
	fakeWarmImage(t, warm, b.RootFS, old)
	var out strings.Builder
	if err := templateGC(t.Context(), cfg, reg, time.Hour, false, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(warm); err != nil {
		t.Errorf("the warm image of the current build was removed:\n%s", out.String())
	}
	if _, ok := template.Lookup(real, spec); !ok {
		t.Errorf("the current build was removed:\n%s", out.String())
	}
}
