package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/paths"
	"github.com/pandastack/pandastack/internal/store/sqlite"
	"github.com/pandastack/pandastack/internal/template"
	"github.com/pandastack/pandastack/internal/testutil"
	"github.com/pandastack/pandastack/templates"
)

// TestTemplateGC: `pandastack template gc` keeps a superseded build while a
// sandbox runs on it or a snapshot was taken on it, and removes it once
// nothing refers to it; the current build always stays. The server runs on
// a cache of its own, holding copies of the base build under the hashes of
// two versions of a base spec in the data dir's templates directory.
func TestTemplateGC(t *testing.T) {
	sharedServer(t) // builds the base template if this machine has none
	real, ok := builtBase(t)
	if !ok {
		t.Fatal("no build of the base template after a server start")
	}
	cache := t.TempDir()
	dataDir := t.TempDir()
	specDir := filepath.Join(dataDir, "templates")
	os.MkdirAll(specDir, 0o700)
	baseYAML, err := templates.FS.ReadFile("base.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Versions differ in their description: drop the built-in one.
	var lines []string
	for _, l := range strings.Split(string(baseYAML), "\n") {
		if !strings.HasPrefix(l, "description:") {
			lines = append(lines, l)
		}
	}
	baseYAML = []byte(strings.Join(lines, "\n"))
	// writeSpec writes a version of the base spec and a copy of the real
	// build under its hash, and returns that build's directory.
	writeSpec := func(version string) string {
		t.Helper()
		spec := append([]byte(nil), baseYAML...)
		spec = append(spec, []byte("\n# version "+version+"\ndescription: base, version "+version+"\n")...)
		if err := os.WriteFile(filepath.Join(specDir, "base.yaml"), spec, 0o600); err != nil {
			t.Fatal(err)
		}
		reg, err := template.Load(specDir)
		if err != nil {
			t.Fatal(err)
		}
		s, _ := reg.Get("base")
		dir := template.Dir(cache, s)
		os.MkdirAll(dir, 0o755)
		if out, err := exec.Command("cp", "-a", real.RootFS, filepath.Join(dir, "rootfs")).CombinedOutput(); err != nil {
			t.Fatalf("copy the base rootfs: %v %s", err, out)
		}
		b := real
		b.Hash, b.Spec = s.Hash(), s
		data, _ := json.Marshal(b)
		if err := os.WriteFile(filepath.Join(dir, "template.json"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	v1 := writeSpec("1")
	// What a --force rebuild set aside and a killed build left: serve's
	// start removes them (the build's message says so; nothing did).
	leftover := func(name string) string {
		dir := filepath.Join(cache, "templates", name)
		if err := os.MkdirAll(filepath.Join(dir, "rootfs", "etc"), 0o755); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	aside, killed := leftover(".old.base.7"), leftover(".build.base.9")
	s := startServer(t, dataDir, "PANDASTACK_CACHE_DIR="+cache, "PANDASTACK_RUNSC="+testutil.Runsc(t), "PANDASTACK_WARM=0")
	defer s.stop()
	for _, dir := range []string{aside, killed} {
		deadline := time.Now().Add(20 * time.Second)
		for _, err := os.Stat(dir); err == nil; _, err = os.Stat(dir) {
			if time.Now().After(deadline) {
				t.Fatalf("serve's start left %s", dir)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	c := s.client()
	ctx := context.Background()
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	defer c.KillSandbox(ctx, sb.ID)
	snap, err := c.CreateSnapshot(ctx, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The spec changes: version 2 is current from now on.
	v2 := writeSpec("2")

	gcIn := func(dataDir string, args ...string) string {
		t.Helper()
		cmd := exec.Command(filepath.Join(s.bin, "pandastack"), append([]string{"template", "gc", "--min-age", "0s"}, args...)...)
		cmd.Env = append(os.Environ(), "PANDASTACK_DATA_DIR="+dataDir, "PANDASTACK_CACHE_DIR="+cache, "PANDASTACK_TEMPLATES_DIR="+specDir)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			t.Fatalf("template gc: %v\n%s", err, out.String())
		}
		return out.String()
	}
	gc := func(args ...string) string { t.Helper(); return gcIn(dataDir, args...) }
	exists := func(dir string) bool { _, err := os.Stat(dir); return err == nil }
	keptFor := func(out, dir, why string) {
		t.Helper()
		if !strings.Contains(out, "kept "+dir+": ") || !strings.Contains(out, why) || !exists(dir) {
			t.Fatalf("want %s kept for %q:\n%s", dir, why, out)
		}
	}

	out := gc()
	keptFor(out, v1, "sandbox "+sb.ID)
	keptFor(out, v2, "current build of base")
	// Seen from another data directory (another server sharing the cache
	// and the specs), nothing in the store refers to v1: the server that
	// resolved it holds it (it keeps the spec it read, and creates from v1
	// until it restarts).
	other := t.TempDir() // with a store of its own, empty (gc refuses a dir without one)
	st, err := sqlite.Open(filepath.Join(other, "pandastack.db"))
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	keptFor(gcIn(other), v1, "in use by a running server")

	if err := c.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	out = gc()
	keptFor(out, v1, "snapshot "+snap.ID)

	if err := c.DeleteSnapshot(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	keptFor(gc(), v1, "in use by a running server")
	s.stop() // which lets go of v1
	aside = leftover(".old.base.8")
	out = gc("--dry-run")
	if !strings.Contains(out, "would remove "+v1) || !exists(v1) {
		t.Fatalf("a dry run should name %s and keep it:\n%s", v1, out)
	}
	if !strings.Contains(out, "would remove leftover "+aside) || !exists(aside) {
		t.Fatalf("a dry run should name the leftover %s and keep it:\n%s", aside, out)
	}
	out = gc()
	if !strings.Contains(out, "removed "+v1) || exists(v1) {
		t.Fatalf("the unreferenced build %s should be gone:\n%s", v1, out)
	}
	if !strings.Contains(out, "removed leftover "+aside) || exists(aside) {
		t.Fatalf("the leftover %s should be gone:\n%s", aside, out)
	}
	keptFor(out, v2, "current build of base")
}

// builtBase is the machine's current build of the built-in base template.
func builtBase(t *testing.T) (template.Built, bool) {
	t.Helper()
	reg, err := template.Load()
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := reg.Get("base")
	return template.Lookup(paths.CacheDir(), spec)
}

// A spec put in the templates directory while serve runs is known at its
// first use (to be built); one that does not load says so.
func TestTemplateAddedWhileServing(t *testing.T) {
	s := sharedServer(t)
	dir := filepath.Join(s.dataDir, "templates")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(dir, "late-comer.yaml")
	if err := os.WriteFile(spec, []byte("description: added while serving\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(spec) })
	code, ecode, msg := api(t, s, s.key, "POST", "/v1/sandboxes", `{"template": "late-comer"}`)
	if code != 409 || ecode != "template_not_built" || !strings.Contains(msg, "template build late-comer") {
		t.Errorf("create from a spec added while serving: %d %s %s, want 409 template_not_built", code, ecode, msg)
	}
	broken := filepath.Join(dir, "broken.yaml")
	if err := os.WriteFile(broken, []byte("cpu: lots\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(broken)
	code, ecode, msg = api(t, s, s.key, "POST", "/v1/sandboxes", `{"template": "broken"}`)
	if code != 404 || ecode != "not_found" || !strings.Contains(msg, "broken.yaml") || strings.Contains(msg, dir) {
		t.Errorf("create from a spec that does not load: %d %s %s, want 404 naming the file, not its path on the host", code, ecode, msg)
	}
}
