package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/sandbox"
	"github.com/pandastack/pandastack/internal/template"
)

// A spec written into the templates directory, or one changed there,
// changes its stamp; a directory that does not exist has none.
func TestDirStamp(t *testing.T) {
	dir := t.TempDir()
	if !dirStamp(filepath.Join(dir, "missing")).IsZero() {
		t.Error("a missing directory has a stamp")
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(dir, old, old)
	before := dirStamp(dir)
	spec := filepath.Join(dir, "late.yaml")
	os.WriteFile(spec, []byte("description: late\n"), 0o644)
	os.Chtimes(dir, old, old) // as if written in place
	after := dirStamp(dir)
	if !after.After(before) {
		t.Errorf("a new spec left the stamp at %v", after)
	}
	later := time.Now().Add(time.Hour)
	os.Chtimes(spec, later, later)
	if !dirStamp(dir).After(after) {
		t.Errorf("an edited spec left the stamp at %v", dirStamp(dir))
	}
}

// TestLateBuiltTemplateIsWarmed: a template with warm-up code that was built
// after serve started is warmed once, when a create names it or the list is
// asked for (it was never warmed, so its first cells ran without the
// warm-up until a restart); one warmed at the start, or asked for again, is
// not warmed twice, and one without warm-up code never.
func TestLateBuiltTemplateIsWarmed(t *testing.T) {
	specs, cache := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(specs, "late.yaml"), []byte("warmup: x = 1\n"), 0o644)
	os.WriteFile(filepath.Join(specs, "plain.yaml"), []byte("description: no warm-up\n"), 0o644)
	reg, err := template.Load(specs)
	if err != nil {
		t.Fatal(err)
	}
	build := func(name string) {
		spec, _ := reg.Get(name)
		dir := template.Dir(cache, spec)
		os.MkdirAll(filepath.Join(dir, "rootfs"), 0o755)
		b, _ := json.Marshal(map[string]any{"name": spec.Name, "hash": spec.Hash(), "spec": spec})
		if err := os.WriteFile(filepath.Join(dir, "template.json"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	src := &templateSource{reg: reg, cacheDir: cache, warmDir: t.TempDir(), agentHash: "agent"}
	if got := src.warmSpecs(); len(got) != 0 {
		t.Fatalf("warm specs at the start, nothing built: %+v", got)
	}
	var warmed []string
	src.startWarmingLater(func(ws sandbox.WarmSpec) { warmed = append(warmed, ws.Template.Name+": "+ws.Warmup) })
	build("late")
	build("plain")
	for range 2 {
		if _, err := src.Resolve(context.Background(), "late"); err != nil {
			t.Fatal(err)
		}
		if _, err := src.Resolve(context.Background(), "plain"); err != nil {
			t.Fatal(err)
		}
		if _, err := src.Built(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"late: x = 1"}; !slices.Equal(warmed, want) {
		t.Fatalf("warmed %q, want %q", warmed, want)
	}

	// Built before the start: warmed by StartWarming, not again later.
	src2 := &templateSource{reg: reg, cacheDir: cache, warmDir: t.TempDir(), agentHash: "agent"}
	if got := src2.warmSpecs(); len(got) != 1 || got[0].Template.Name != "late" {
		t.Fatalf("warm specs at the start: %+v", got)
	}
	warmed = nil
	src2.startWarmingLater(func(ws sandbox.WarmSpec) { warmed = append(warmed, ws.Template.Name) })
	src2.Resolve(context.Background(), "late")
	if len(warmed) != 0 {
		t.Fatalf("a template warmed at the start was warmed again: %q", warmed)
	}
}

// A create of a template serve has not found built says how to build it
// where serve looks, and, when its spec changed since serve read it, that
// serve keeps the spec it read (a build of the new one is not the one it
// looks for).
func TestNotBuiltSaysHowAndWhy(t *testing.T) {
	specs := t.TempDir()
	file := filepath.Join(specs, "mine.yaml")
	os.WriteFile(file, []byte("description: first\n"), 0o644)
	reg, err := template.Load(specs)
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	src := &templateSource{reg: reg, load: func() (*template.Registry, error) { return template.Load(specs) },
		dir: specs, cacheDir: t.TempDir(), buildFlags: " --data-dir /srv/ps", log: slog.New(slog.NewTextHandler(&logged, nil))}
	_, err = src.Resolve(context.Background(), "mine")
	// Any project reads the error: the server's directories go to its log.
	if msg := err.Error(); !strings.Contains(msg, "run `pandastack template build mine` where the server runs") || strings.Contains(msg, "/srv/ps") || strings.Contains(msg, "changed") {
		t.Fatalf("not built: %v", err)
	}
	if !strings.Contains(logged.String(), `build_with="pandastack template build mine --data-dir /srv/ps"`) {
		t.Errorf("the server's log: %q, want the whole command", logged.String())
	}
	os.WriteFile(file, []byte("description: second\n"), 0o644)
	if _, err = src.Resolve(context.Background(), "mine"); !strings.Contains(err.Error(), "its spec changed since serve started") {
		t.Fatalf("not built, spec changed: %v", err)
	}
}

func TestBuildFlags(t *testing.T) {
	cfg := defaultConfig()
	if f := cfg.buildFlags(); f != "" {
		t.Errorf("defaults: %q", f)
	}
	cfg.DataDir, cfg.CacheDir = "/srv/ps", "/srv/cache"
	if f := cfg.buildFlags(); f != " --data-dir /srv/ps --cache-dir /srv/cache" {
		t.Errorf("other dirs: %q", f)
	}
}

// A templates directory given on purpose must exist (a typo left the
// server with the built-in specs alone, without a word); the default one
// may be missing.
func TestTemplatesDirMustExistWhenGiven(t *testing.T) {
	cfg := defaultConfig()
	cfg.DataDir = t.TempDir()
	if reg, err := loadTemplates(&cfg); err != nil || !slices.Contains(reg.Names(), "base") {
		t.Fatalf("no templates dir of the default: %v", err)
	}
	cfg.TemplatesDir = filepath.Join(cfg.DataDir, "typo")
	if _, err := loadTemplates(&cfg); err == nil || !strings.Contains(err.Error(), "--templates-dir "+cfg.TemplatesDir) {
		t.Fatalf("a missing --templates-dir: %v", err)
	}
}

// A forced rebuild (same spec, same hash, other files) is warmed anew: the
// warm image of the build before it held that build's libraries in
// memory, and restoring it onto the new files mixed the two. template gc
// then removes the old warm image, as one of a build no longer current.
func TestForcedRebuildIsWarmedAnew(t *testing.T) {
	specs, cache := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(specs, "py.yaml"), []byte("warmup: import numpy\n"), 0o644)
	reg, err := template.Load(specs)
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := reg.Get("py")
	old := time.Now().Add(-48 * time.Hour)
	fakeBuilt(t, cache, spec, old, map[string]any{"build_id": "1111111111111111"})
	cfg := gcConfig(t, cache)
	src := &templateSource{reg: reg, cacheDir: cache, warmDir: cfg.warmDir(), agentHash: "agent"}
	ws := src.warmSpecs()
	if len(ws) != 1 {
		t.Fatalf("warm specs: %+v", ws)
	}
	first := ws[0].Template.WarmImage
	fakeWarmImage(t, first, ws[0].Template.RootFS, old)
	if tpl, err := src.Resolve(context.Background(), "py"); err != nil || tpl.WarmImage != first {
		t.Fatalf("before the rebuild: %+v %v, want the warm image %s", tpl, err, first)
	}
	var warmed []string
	src.startWarmingLater(func(ws sandbox.WarmSpec) { warmed = append(warmed, ws.Template.WarmImage) })

	// template build --force py: the same directory, a new marker.
	fakeBuilt(t, cache, spec, time.Now(), map[string]any{"build_id": "2222222222222222"})
	tpl, err := src.Resolve(context.Background(), "py")
	if err != nil {
		t.Fatal(err)
	}
	if tpl.WarmImage != "" {
		t.Errorf("after a forced rebuild a create restores %s, a warm image of the build before", tpl.WarmImage)
	}
	if len(warmed) != 1 || warmed[0] == first {
		t.Fatalf("after a forced rebuild, warmed %q; want one new warm image", warmed)
	}

	var out strings.Builder
	if err := templateGC(t.Context(), cfg, reg, time.Hour, false, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(first); err == nil {
		t.Errorf("template gc kept the warm image of the build before the rebuild:\n%s", out.String())
	}
}

// A build a running server resolves stays while it runs, though its spec
// changed on disk since and the new spec is built: serve keeps the spec it
// read at its start, and template gc removing that build made every create
// of the template fail until a restart.
func TestTemplateGCKeepsWhatARunningServerUses(t *testing.T) {
	specs, cache := t.TempDir(), t.TempDir()
	file := filepath.Join(specs, "plain.yaml")
	os.WriteFile(file, []byte("description: first\n"), 0o644)
	reg, err := template.Load(specs)
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := reg.Get("plain")
	old := time.Now().Add(-48 * time.Hour)
	first := fakeBuilt(t, cache, spec, old, map[string]any{"build_id": "1111111111111111"})
	cfg := gcConfig(t, cache)
	// serve starts, and (with --warm, the default) looks up every build.
	src := &templateSource{reg: reg, cacheDir: cache, warmDir: cfg.warmDir(), agentHash: "agent"}
	src.warmSpecs()

	// The spec is edited and built again, then gc runs.
	os.WriteFile(file, []byte("description: second\n"), 0o644)
	now, err := template.Load(specs)
	if err != nil {
		t.Fatal(err)
	}
	edited, _ := now.Get("plain")
	fakeBuilt(t, cache, edited, old, nil)
	var out strings.Builder
	if err := templateGC(t.Context(), cfg, now, time.Hour, false, &out); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Resolve(context.Background(), "plain"); err != nil {
		t.Fatalf("a create of the running server after gc: %v\n%s", err, out.String())
	}
	if !strings.Contains(out.String(), "kept "+first.Dir+": in use by a running server") {
		t.Errorf("gc does not say why it kept the build:\n%s", out.String())
	}
}
