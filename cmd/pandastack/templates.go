package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/api"
	"github.com/pandastack/pandastack/internal/sandbox"
	"github.com/pandastack/pandastack/internal/template"
)

// templateSource adapts the template registry and cache to the sandbox
// manager and the API.
type templateSource struct {
	mu  sync.Mutex
	reg *template.Registry
	// load reads the specs again, for those added to dir while serve runs;
	// nil: none are. stamp is dir's as last read (dirStamp).
	load      func() (*template.Registry, error)
	dir       string
	stamp     time.Time
	cacheDir  string
	warmDir   string // where warm images live (sandbox.Config.WarmDir)
	agentHash string
	diskMB    int // serve's --disk-mb, for templates without their own
	// buildFlags are the flags `template build` needs to build where this
	// server looks (its --data-dir, --templates-dir, --cache-dir when not
	// the defaults), for the not-built error's advice.
	buildFlags string
	log        *slog.Logger     // where the not-built error's whole command goes; nil: nowhere
	mgr        *sandbox.Manager // for pool stats; set once the manager exists

	// warmLater warms a template built after serve started (the manager's
	// WarmLater); nil: serve does not warm. warming holds the warm images
	// asked for already, at the start or since.
	warmLater func(sandbox.WarmSpec)
	warming   map[string]bool

	// held are the builds this server has resolved, by directory: held
	// (template.Hold) until it exits, so that template gc keeps them after
	// their spec changed on disk (serve keeps the spec it read).
	held map[string]heldBuild
}

type heldBuild struct {
	id      string // the build's template.Built.ID
	release func()
}

// hold has template gc keep b while this server runs (see held). A build
// that is being removed right then is not held: the create that resolved
// it fails as it would have anyway.
func (t *templateSource) hold(b template.Built) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if h, ok := t.held[b.Dir]; ok && h.id == b.ID() {
		return
	}
	release, err := template.Hold(b)
	if err != nil {
		if t.log != nil {
			t.log.Warn("marking a template build in use; template gc may remove it", "template", b.Name, "err", err)
		}
		return
	}
	if t.held == nil {
		t.held = map[string]heldBuild{}
	}
	if h, ok := t.held[b.Dir]; ok {
		h.release() // the build a --force rebuild replaced
	}
	t.held[b.Dir] = heldBuild{id: b.ID(), release: release}
}

// warmImage is the warm image directory of b, a build of spec.
func (t *templateSource) warmImage(spec template.Spec, b template.Built) string {
	return sandbox.WarmImageDirOfBuild(t.warmDir, spec.Name, spec.Hash(), b.ID(), t.agentHash)
}

// warmSpecs lists the built templates that have warm-up code, for the
// manager to keep warm.
func (t *templateSource) warmSpecs() []sandbox.WarmSpec {
	var out []sandbox.WarmSpec
	for _, spec := range t.specs() {
		b, ok := template.Lookup(t.cacheDir, spec)
		if ok {
			t.hold(b) // at serve's start: every build it may use
		}
		if spec.Warmup == "" || !ok {
			continue
		}
		ws := t.warmSpec(spec, b)
		t.mu.Lock()
		if t.warming == nil {
			t.warming = map[string]bool{}
		}
		t.warming[ws.Template.WarmImage] = true
		t.mu.Unlock()
		out = append(out, ws)
	}
	return out
}

func (t *templateSource) warmSpec(spec template.Spec, b template.Built) sandbox.WarmSpec {
	return sandbox.WarmSpec{
		Template: sandbox.Template{Name: spec.Name, RootFS: b.RootFS, CPU: spec.CPU, MemoryMB: spec.MemoryMB, DiskMB: spec.DiskMB, WarmImage: t.warmImage(spec, b)},
		Warmup:   spec.Warmup,
		Built:    b.BuiltAt,
	}
}

// warmIfNew has a template with warm-up code that was built after serve
// started warmed now, once: without it, such a template ran its sandboxes'
// first cells without its warm-up (and without a pool) until a restart.
func (t *templateSource) warmIfNew(spec template.Spec, b template.Built) {
	if spec.Warmup == "" {
		return
	}
	ws := t.warmSpec(spec, b)
	t.mu.Lock()
	later := t.warmLater
	if t.warming == nil {
		t.warming = map[string]bool{}
	}
	fresh := later != nil && !t.warming[ws.Template.WarmImage]
	if fresh {
		t.warming[ws.Template.WarmImage] = true
	}
	t.mu.Unlock()
	if fresh {
		later(ws)
	}
}

// startWarmingLater has templates built from now on warmed (see warmIfNew).
func (t *templateSource) startWarmingLater(warm func(sandbox.WarmSpec)) {
	t.mu.Lock()
	t.warmLater = warm
	t.mu.Unlock()
}

// specs lists the templates known.
func (t *templateSource) specs() []template.Spec {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reg.List()
}

// refresh adds the specs put in the templates directory since they were
// read. Specs already known stay as read at start: a pool, a warm image
// may be made of them (a change needs a restart of serve).
func (t *templateSource) refresh() error {
	if t.load == nil {
		return nil
	}
	// Read again only when a file there changed: a listing or an unknown
	// name costs a stat of each spec, not a parse of every one.
	stamp := dirStamp(t.dir)
	t.mu.Lock()
	same := stamp.IsZero() || stamp.Equal(t.stamp) // no directory: nothing to add
	t.mu.Unlock()
	if same {
		return nil
	}
	fresh, err := t.load()
	if err != nil {
		return err // read again next time: the fix may not change stamp
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.reg.AddNew(fresh)
	t.stamp = stamp
	return nil
}

// dirStamp is the latest modification time of dir and the files in it;
// zero when it cannot be read.
func dirStamp(dir string) time.Time {
	fi, err := os.Stat(dir)
	if err != nil {
		return time.Time{}
	}
	latest := fi.ModTime()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if info, err := e.Info(); err == nil && info.ModTime().After(latest) {
			latest = info.ModTime()
		}
	}
	return latest
}

// spec is the template called name, read again from the templates
// directory when it is not known yet.
func (t *templateSource) spec(name string) (template.Spec, error) {
	t.mu.Lock()
	spec, err := t.reg.Get(name)
	t.mu.Unlock()
	if !pandastack.IsCode(err, pandastack.ENotFound) {
		return spec, err
	}
	if rerr := t.refresh(); rerr != nil {
		// The file's name, not the host's path to it: any project reads this.
		why := strings.ReplaceAll(rerr.Error(), strings.TrimSuffix(t.dir, "/")+"/", "")
		return spec, pandastack.Errorf(pandastack.ENotFound, "%s (the templates directory does not load: %s)", pandastack.ErrorMessage(err), why)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.reg.Get(name)
}

func (t *templateSource) Resolve(ctx context.Context, name string) (sandbox.Template, error) {
	spec, err := t.spec(name)
	if err != nil {
		return sandbox.Template{}, err
	}
	b, ok := template.Lookup(t.cacheDir, spec)
	if !ok {
		return sandbox.Template{}, t.notBuilt(name, spec)
	}
	t.hold(b)
	t.warmIfNew(spec, b)
	tpl := sandbox.Template{Name: spec.Name, RootFS: b.RootFS, CPU: spec.CPU, MemoryMB: spec.MemoryMB, DiskMB: spec.DiskMB}
	if dir := t.warmImage(spec, b); spec.Warmup != "" {
		if _, err := os.Stat(dir); err == nil {
			tpl.WarmImage = dir
		}
	}
	return tpl, nil
}

// notBuilt is the error of a create of a template not built here. Any
// project reads it, so it leaves out the server's directories, which
// `template build` needs when they are not the defaults: the command
// with them goes to the server's log.
func (t *templateSource) notBuilt(name string, spec template.Spec) error {
	how := fmt.Sprintf("run `pandastack template build %s` where the server runs", name)
	if t.buildFlags != "" {
		how += ", with its directories (the server's log gives the whole command)"
		if t.log != nil {
			t.log.Warn("a create asked for a template that is not built", "template", name, "build_with", "pandastack template build "+name+t.buildFlags)
		}
	}
	return pandastack.Errorf(pandastack.ETemplateMissing, "template %q is not built on this server; %s%s", name, how, t.specChanged(spec))
}

// specChanged says, for the not-built error, when spec's file changed
// since serve read it: serve keeps the spec it read, so a build of the
// new one is not what it looks for.
func (t *templateSource) specChanged(spec template.Spec) string {
	if t.load == nil {
		return ""
	}
	reg, err := t.load()
	if err != nil {
		return ""
	}
	now, err := reg.Get(spec.Name)
	if err != nil || now.Hash() == spec.Hash() {
		return ""
	}
	return "; its spec changed since serve started, and serve keeps the spec it read: restart serve to use the new one"
}

func (t *templateSource) Built(ctx context.Context) ([]api.TemplateInfo, error) {
	var out []api.TemplateInfo
	var pools map[string]sandbox.PoolStats
	if t.mgr != nil {
		pools = t.mgr.Pools(ctx)
	}
	_ = t.refresh() // a spec that does not load shows when it is used
	for _, spec := range t.specs() {
		b, ok := template.Lookup(t.cacheDir, spec)
		if !ok {
			continue
		}
		t.hold(b)
		t.warmIfNew(spec, b)
		out = append(out, api.TemplateInfo{
			Name: spec.Name, Description: spec.Description, Hash: b.Hash, SizeBytes: b.SizeBytes,
			BuildSeconds: b.BuildSeconds, BuiltAt: b.BuiltAt, CPU: spec.CPU, MemoryMB: spec.MemoryMB,
			DiskMB: spec.DiskMB,
		})
		info := &out[len(out)-1]
		if info.DiskMB == 0 {
			info.DiskMB = max(t.diskMB, 0)
		}
		if _, err := os.Stat(t.warmImage(spec, b)); err == nil && spec.Warmup != "" {
			info.Warm = true
		} else if t.mgr != nil && spec.Warmup != "" {
			info.WarmError = t.mgr.WarmError(t.warmImage(spec, b))
		}
		if ps, ok := pools[spec.Name]; ok {
			info.Pool = &api.PoolInfo{Ready: ps.Ready, Size: ps.Size, PSSBytes: ps.PSSBytes}
		}
	}
	return out, nil
}
