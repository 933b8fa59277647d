package sandbox

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// warmProject owns the short-lived sandboxes that warm templates.
const warmProject = "_warmup"

// WarmSpares is how many spare Python kernels, warmed up like the default
// context, a warm image holds for new contexts (each about a kernel's memory).
const WarmSpares = 1

// DefaultContextID is the id of a sandbox's default context of a language.
func DefaultContextID(language string) string { return "ctx_default_" + language }

// Warm boots tpl cold, starts its default Python context, runs warmup in
// it, has the agent start WarmSpares spare kernels warmed up the same way,
// and checkpoints the whole sandbox into the image directory dir, which
// must not exist. Sandboxes created from the template afterwards restore
// that image: their default context is already up, with warmup's imports
// done. If dir appears meanwhile (another server warmed it), Warm succeeds.
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
	if _, err := agent.CreateContext(ctx, agentproto.ContextRequest{ID: DefaultContextID("python"), Language: "python"}); err != nil {
		return fmt.Errorf("warm %s: start the python context: %w", tpl.Name, err)
	}
	if warmup != "" {
		ex, err := agent.RunCode(ctx, DefaultContextID("python"), agentproto.RunRequest{Code: warmup, TimeoutMS: 300_000}, nil)
		if err != nil {
			return fmt.Errorf("warm %s: %w", tpl.Name, err)
		}
		if ex.Error != nil {
			return fmt.Errorf("warm %s: the warm-up code failed: %s: %s", tpl.Name, ex.Error.Name, ex.Error.Value)
		}
	}
	// Spare kernels with the warm-up done, in the image too: a new context
	// in a sandbox restored from it is as warm as the default one.
	if _, err := agent.PrepareSpares(ctx, agentproto.SparesRequest{Language: "python", Count: WarmSpares, Warmup: warmup}); err != nil {
		return fmt.Errorf("warm %s: spare kernels: %w", tpl.Name, err)
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
