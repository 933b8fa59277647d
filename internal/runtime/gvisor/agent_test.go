package gvisor

import (
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// A restore mounts the agent build its image was taken with: the one the
// image records, found by its hash in this server's cache when taken
// elsewhere, refused clearly when missing; an image without a record gets
// the build that was newest when it was written.
func TestAgentForImage(t *testing.T) {
	cache := t.TempDir()
	build := func(hash string, at time.Time) string {
		p := filepath.Join(cache, "agent", hash, "pandastack-agent")
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(hash), 0o755); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(p, at, at)
		return p
	}
	now := time.Now()
	old := build("00000000000000aa", now.Add(-2*time.Hour))
	mid := build("00000000000000bb", now.Add(-time.Hour))
	cur := build("00000000000000cc", now.Add(-time.Minute))
	r := &Runtime{cfg: Config{AgentPath: cur}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	image := func(agent string, at time.Time) string {
		d := t.TempDir()
		os.WriteFile(filepath.Join(d, "checkpoint.img"), []byte("x"), 0o644)
		os.Chtimes(filepath.Join(d, "checkpoint.img"), at, at)
		if agent != "" {
			if err := markImageAgent(d, agent); err != nil {
				t.Fatal(err)
			}
		}
		return d
	}
	for _, c := range []struct {
		name, imageDir, want, code string
	}{
		{"a boot", "", cur, ""},
		{"recorded", image(old, now), old, ""},
		{"recorded, the current build", image(cur, now), cur, ""},
		{"taken on another node: the same build here", image("/elsewhere/agent/00000000000000bb/pandastack-agent", now), mid, ""},
		{"a build this server never had", image("/elsewhere/agent/00000000000000dd/pandastack-agent", now), "", pandastack.EInternal},
		{"a host file that is no agent build", image("/etc/passwd", now), "", pandastack.EInternal},
		{"a path that climbs out of the cache", image(filepath.Join(cache, "agent", "..", "agent", "..", "x", "pandastack-agent"), now), "", pandastack.EInternal},
		{"no record, written in the middle build's time", image("", now.Add(-30*time.Minute)), mid, ""},
		{"no record, written in the oldest build's time", image("", now.Add(-90*time.Minute)), old, ""},
		{"no record, written now", image("", now), cur, ""},
		{"no record, older than every build", image("", now.Add(-3*time.Hour)), cur, ""},
	} {
		got, err := r.agentFor(c.imageDir)
		switch {
		case c.code != "" && !pandastack.IsCode(err, c.code):
			t.Errorf("%s: %q, %v; want an error with code %s", c.name, got, err, c.code)
		case c.code == "" && (err != nil || got != c.want):
			t.Errorf("%s: %q, %v; want %q", c.name, got, err, c.want)
		}
	}

	// An agent named outside the cache (--agent): images without a record
	// get it.
	own := &Runtime{cfg: Config{AgentPath: "/opt/pandastack-agent"}, log: r.log}
	if got, err := own.agentFor(image("", now)); err != nil || got != "/opt/pandastack-agent" {
		t.Errorf("--agent outside the cache: %q, %v", got, err)
	}
}

// A checkpoint records the agent the sandbox was started with, read from
// its bundle: an adopted sandbox of an older server keeps its build.
func TestSandboxAgentFromBundle(t *testing.T) {
	dir := t.TempDir()
	r := &Runtime{cfg: Config{AgentPath: "/cache/agent/new/pandastack-agent"}}
	b, _ := json.Marshal(r.ociSpec(pandastack.RuntimeSpec{ID: "sbx_a", RootFS: "/"}, false, capsRevision, "/cache/agent/old/pandastack-agent"))
	os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
	if got := sandboxAgent(dir); got != "/cache/agent/old/pandastack-agent" {
		t.Fatalf("sandboxAgent: %q", got)
	}
	b, _ = json.Marshal(r.ociSpec(pandastack.RuntimeSpec{ID: "sbx_a", RootFS: "/"}, false, capsRevision, ""))
	os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600)
	if got := sandboxAgent(dir); got != r.cfg.AgentPath {
		t.Fatalf("sandboxAgent of a spec with the runtime's agent: %q", got)
	}
	if got := sandboxAgent(t.TempDir()); got != "" {
		t.Fatalf("no bundle: %q", got)
	}
}
