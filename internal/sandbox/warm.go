package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// warmProject owns the short-lived sandboxes that warm templates.
const warmProject = "_warmup"

// WarmSpares is how many warmed-up spare Python kernels a warm image holds
// for the contexts to come (each costs a kernel's memory: a sandbox holds
// ~50 MiB more PSS once its first context took one and a replacement is warm).
const WarmSpares = 1

// DefaultContextID is the id of a sandbox's default context of a language.
func DefaultContextID(language string) string { return "ctx_default_" + language }

// Warm boots tpl cold, has its agent start WarmSpares spare Python kernels
// with warmup run in each (silently), and checkpoints the whole sandbox into
// the image directory dir, which must not exist. Sandboxes created from the
// template afterwards restore that image: their first code context, the
// default one or any other, is a kernel with warmup's imports done. If dir appears meanwhile (another server warmed it), Warm succeeds.
func (m *Manager) Warm(ctx context.Context, tpl Template, warmup, dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	sb, err := m.launch(ctx, warmProject, plan{template: tpl.Name, rootfs: tpl.RootFS, cpu: tpl.CPU, mem: tpl.MemoryMB, ttl: 15 * time.Minute})
	if err != nil {
		return fmt.Errorf("warm %s: %w", tpl.Name, err)
	}
	defer m.Kill(context.Background(), warmProject, sb.ID)
	m.mu.Lock()
	agent := m.live[sb.ID]
	m.mu.Unlock()
	if agent == nil {
		return fmt.Errorf("warm %s: the sandbox stopped during warm-up", tpl.Name)
	}
	// No context yet: the image holds WarmSpares spare kernels with the
	// warm-up done, and the first context created in a sandbox restored
	// from it, the default one (run_code without a context) or any other,
	// takes one. An idle sandbox holds one kernel, not one per use to come.
	spares, err := agent.PrepareSpares(ctx, agentproto.SparesRequest{Language: "python", Count: WarmSpares, Warmup: warmup})
	if err != nil {
		return fmt.Errorf("warm %s: start the warmed-up python kernels: %w", tpl.Name, err)
	}
	if spares.Ready != WarmSpares {
		return fmt.Errorf("warm %s: %d of %d python kernels ready", tpl.Name, spares.Ready, WarmSpares)
	}
	if _, err := m.checkpoint(ctx, sb, dir, false); err != nil {
		if _, statErr := os.Stat(dir); statErr == nil {
			return nil
		}
		return fmt.Errorf("warm %s: %w", tpl.Name, err)
	}
	m.log.Info("template warmed", "template", tpl.Name, "image", dir)
	return nil
}

// verifyWarm checks a warm image like verifyImage, once per process and
// version of its manifest: Warm writes a warm image once and nothing
// changes it, and checksumming its ~100 MB on every create cost 20-50 ms of
// CPU per create here. A rewritten manifest (a new image in the same place)
// is checked again.
func (m *Manager) verifyWarm(dir, what string) error {
	fi, err := os.Stat(filepath.Join(dir, "manifest.json"))
	if err != nil {
		_, err = verifyImage(dir, what) // the error that says why
		return err
	}
	key := fmt.Sprintf("%s|%d|%d", dir, fi.ModTime().UnixNano(), fi.Size())
	if _, ok := m.warmVerified.Load(key); ok {
		return nil
	}
	if _, err := verifyImage(dir, what); err != nil {
		return err
	}
	m.warmVerified.Store(key, true)
	return nil
}
