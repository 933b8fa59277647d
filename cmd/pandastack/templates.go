package main

import (
	"context"
	"os"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/api"
	"github.com/pandastack/pandastack/internal/sandbox"
	"github.com/pandastack/pandastack/internal/template"
)

// templateSource adapts the template registry and cache to the sandbox
// manager and the API.
type templateSource struct {
	reg       *template.Registry
	cacheDir  string
	warmDir   string // where warm images live (sandbox.Config.WarmDir)
	agentHash string
	mgr       *sandbox.Manager // for pool stats; set once the manager exists
}

// warmImage is the warm image directory of a template build.
func (t *templateSource) warmImage(spec template.Spec) string {
	return sandbox.WarmImageDir(t.warmDir, spec.Name, spec.Hash(), t.agentHash)
}

// warmSpecs lists the built templates that have warm-up code, for the
// manager to keep warm.
func (t *templateSource) warmSpecs() []sandbox.WarmSpec {
	var out []sandbox.WarmSpec
	for _, spec := range t.reg.List() {
		b, ok := template.Lookup(t.cacheDir, spec)
		if spec.Warmup == "" || !ok {
			continue
		}
		out = append(out, sandbox.WarmSpec{
			Template: sandbox.Template{Name: spec.Name, RootFS: b.RootFS, CPU: spec.CPU, MemoryMB: spec.MemoryMB, DiskMB: spec.DiskMB, WarmImage: t.warmImage(spec)},
			Warmup:   spec.Warmup,
		})
	}
	return out
}

func (t *templateSource) Resolve(ctx context.Context, name string) (sandbox.Template, error) {
	spec, err := t.reg.Get(name)
	if err != nil {
		return sandbox.Template{}, err
	}
	b, ok := template.Lookup(t.cacheDir, spec)
	if !ok {
		return sandbox.Template{}, pandastack.Errorf(pandastack.ETemplateMissing, "template %q is not built on this server; run `pandastack template build %s`", name, name)
	}
	tpl := sandbox.Template{Name: spec.Name, RootFS: b.RootFS, CPU: spec.CPU, MemoryMB: spec.MemoryMB, DiskMB: spec.DiskMB}
	if dir := t.warmImage(spec); spec.Warmup != "" {
		if _, err := os.Stat(dir); err == nil {
			tpl.WarmImage = dir
		}
	}
	return tpl, nil
}

func (t *templateSource) Built(ctx context.Context) ([]api.TemplateInfo, error) {
	var out []api.TemplateInfo
	var pools map[string]sandbox.PoolStats
	if t.mgr != nil {
		pools = t.mgr.Pools(ctx)
	}
	for _, spec := range t.reg.List() {
		b, ok := template.Lookup(t.cacheDir, spec)
		if !ok {
			continue
		}
		out = append(out, api.TemplateInfo{
			Name: spec.Name, Description: spec.Description, Hash: b.Hash, SizeBytes: b.SizeBytes,
			BuildSeconds: b.BuildSeconds, BuiltAt: b.BuiltAt, CPU: spec.CPU, MemoryMB: spec.MemoryMB,
		})
		info := &out[len(out)-1]
		if _, err := os.Stat(t.warmImage(spec)); err == nil && spec.Warmup != "" {
			info.Warm = true
		}
		if ps, ok := pools[spec.Name]; ok {
			info.Pool = &api.PoolInfo{Ready: ps.Ready, Size: ps.Size, PSSBytes: ps.PSSBytes}
		}
	}
	return out, nil
}
