package gvisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// Which agent binary a sandbox runs, and which one a restore must mount.
//
// A restored process keeps its memory, code included, and maps the rest of
// its binary from the file at agentproto.AgentPath again: a restore must
// mount the very build the image was taken with. Restored with another
// build (a server upgraded since), the agent crashed at once ("fatal error:
// runtime: uninitialized listHead") and every resume, snapshot restore and
// fork of what the old server checkpointed timed out. serve keeps each
// agent build it ran at <cache>/agent/<hash>/pandastack-agent (never
// removed), and an image records the path of the one its processes run.

// imageAgentFile, in an image's dir, holds the host path of the agent
// binary its processes run.
const imageAgentFile = "agent-path"

// sandboxAgent reads the agent binary a sandbox was started with from its
// bundle's spec ("" if the spec cannot be read).
func sandboxAgent(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return ""
	}
	var spec struct {
		Mounts []ociMount `json:"mounts"`
	}
	if json.Unmarshal(b, &spec) != nil {
		return ""
	}
	for _, m := range spec.Mounts {
		if m.Destination == agentproto.AgentPath {
			return m.Source
		}
	}
	return ""
}

func markImageAgent(imageDir, agent string) error {
	if agent == "" {
		return nil
	}
	return os.WriteFile(filepath.Join(imageDir, imageAgentFile), []byte(agent+"\n"), 0o644)
}

// agentFor returns the agent binary to mount for a restore of imageDir (a
// boot, imageDir "", mounts the runtime's own).
func (r *Runtime) agentFor(imageDir string) (string, error) {
	if imageDir == "" {
		return r.cfg.AgentPath, nil
	}
	b, err := os.ReadFile(filepath.Join(imageDir, imageAgentFile))
	if errors.Is(err, fs.ErrNotExist) {
		return r.agentOfOldImage(imageDir), nil
	}
	if err != nil {
		return "", fmt.Errorf("restore: %w", err)
	}
	want := strings.TrimSpace(string(b))
	if want == r.cfg.AgentPath {
		return want, nil
	}
	// Another build: only ever one of this server's cache, found by its
	// hash (taken here, on another node, or with another cache dir). The
	// record names a host file mounted into the sandbox: never any other.
	if filepath.Base(want) == "pandastack-agent" && filepath.Base(filepath.Dir(filepath.Dir(want))) == "agent" {
		if mine := r.cachedAgent(filepath.Base(filepath.Dir(want))); mine != "" {
			return mine, nil
		}
	}
	// Internal, not a conflict: no wait or retry brings the build here.
	return "", pandastack.Errorf(pandastack.EInternal, "the image was taken with the agent build %s, which this server does not have (it restores only with that build): copy that file here, or restore it with the server that took it", want)
}

// agentsDir is where serve keeps its agent builds, when the runtime's
// agent is one of them (<cache>/agent/<hash>/pandastack-agent); "" when it
// was named otherwise (--agent, tests).
func (r *Runtime) agentsDir() string {
	dir := filepath.Dir(filepath.Dir(r.cfg.AgentPath))
	if filepath.Base(dir) != "agent" || filepath.Base(r.cfg.AgentPath) != "pandastack-agent" {
		return ""
	}
	return dir
}

// cachedAgent is the build of that hash directory in this server's cache,
// or "".
func (r *Runtime) cachedAgent(hash string) string {
	dir := r.agentsDir()
	if dir == "" || hash == "" || strings.ContainsAny(hash, `/\`) || hash == "." || hash == ".." {
		return ""
	}
	if p := filepath.Join(dir, hash, "pandastack-agent"); isFile(p) {
		return p
	}
	return ""
}

// agentOfOldImage guesses the agent of an image taken before images
// recorded theirs: the newest build in the cache that was there when the
// image was written (serve copies its build there at its first start), or
// the runtime's own. Right for a server upgraded in place; images of a
// build run again after a newer one (a downgrade) may be misread.
func (r *Runtime) agentOfOldImage(imageDir string) string {
	dir := r.agentsDir()
	img, err := os.Stat(filepath.Join(imageDir, "checkpoint.img"))
	if dir == "" || err != nil {
		return r.cfg.AgentPath
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return r.cfg.AgentPath
	}
	best, bestTime := r.cfg.AgentPath, time.Time{}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name(), "pandastack-agent")
		st, err := os.Stat(p)
		if err != nil || !st.Mode().IsRegular() || st.ModTime().After(img.ModTime()) {
			continue
		}
		if st.ModTime().After(bestTime) {
			best, bestTime = p, st.ModTime()
		}
	}
	if best != r.cfg.AgentPath {
		r.log.Info("an image older than its agent record: restoring with the agent build of its time", "image", imageDir, "agent", best)
	}
	return best
}

func isFile(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
