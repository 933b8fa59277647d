package sandbox

import (
	"context"
	"strings"
	"testing"

	"github.com/pandastack/pandastack"
)

// disk_mb reaches the runtime: the template's default, the request's own
// value, and a clear refusal out of range or with a snapshot.
func TestCreateDiskSize(t *testing.T) {
	h := newHarness(t)
	h.tpls.tpl.DiskMB = 300
	spec := func(id string) pandastack.RuntimeSpec {
		h.rt.mu.Lock()
		defer h.rt.mu.Unlock()
		return h.rt.boxes[id].spec
	}
	sb := h.create()
	if got := spec(sb.ID).DiskMB; got != 300 {
		t.Errorf("template default: runtime got disk %d MiB, want 300", got)
	}
	sb, err := h.m.Create(context.Background(), project, CreateRequest{Template: "base", DiskMB: 1024})
	if err != nil {
		t.Fatal(err)
	}
	if got := spec(sb.ID).DiskMB; got != 1024 {
		t.Errorf("disk_mb 1024: runtime got %d", got)
	}
	for _, req := range []CreateRequest{
		{Template: "base", DiskMB: 10},
		{Template: "base", DiskMB: 1 << 30},
		{Template: "base", DiskMB: -1},
		{SnapshotID: "snp_x", DiskMB: 512},
	} {
		_, err := h.m.Create(context.Background(), project, req)
		wantCode(t, err, pandastack.EInvalid)
	}
}

// TestTemplateDefaultsOverTheLimits: a template whose default cpu, memory or
// disk is over this server's limits is refused with a message that names
// the template's default and the flag (it quoted a value the caller never
// sent, and a disk default was not checked at all); a create that gives a
// value in range uses it.
func TestTemplateDefaultsOverTheLimits(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.tpls.tpl.CPU, h.tpls.tpl.MemoryMB, h.tpls.tpl.DiskMB = 8, 16384, 100000
	_, err := h.m.Create(ctx, project, CreateRequest{Template: "base"})
	wantCode(t, err, pandastack.EInvalid)
	if msg := pandastack.ErrorMessage(err); !strings.Contains(msg, "template base asks for cpu 8 by default") || !strings.Contains(msg, "--max-cpu 2") {
		t.Errorf("cpu default over the limit: %q", msg)
	}
	_, err = h.m.Create(ctx, project, CreateRequest{Template: "base", CPU: 1})
	if msg := pandastack.ErrorMessage(err); !strings.Contains(msg, "memory_mb 16384 by default") || !strings.Contains(msg, "--max-memory-mb 8192") {
		t.Errorf("memory default over the limit: %v", err)
	}
	_, err = h.m.Create(ctx, project, CreateRequest{Template: "base", CPU: 1, MemoryMB: 512})
	if msg := pandastack.ErrorMessage(err); !strings.Contains(msg, "disk_mb 100000 by default") || !strings.Contains(msg, "--max-disk-mb 65536") {
		t.Errorf("disk default over the limit: %v", err)
	}
	_, err = h.m.Create(ctx, project, CreateRequest{Template: "base", CPU: 3})
	if msg := pandastack.ErrorMessage(err); msg != "cpu must be between 1 and 2, got 3" {
		t.Errorf("the caller's own cpu out of range: %q", msg)
	}
	sb, err := h.m.Create(ctx, project, CreateRequest{Template: "base", CPU: 2, MemoryMB: 512, DiskMB: 1024})
	if err != nil {
		t.Fatalf("a create within the limits: %v", err)
	}
	h.rt.mu.Lock()
	spec := h.rt.boxes[sb.ID].spec
	h.rt.mu.Unlock()
	if spec.CPU != 2 || spec.MemoryMB != 512 || spec.DiskMB != 1024 {
		t.Errorf("runtime got cpu %d memory %d disk %d, want 2 512 1024", spec.CPU, spec.MemoryMB, spec.DiskMB)
	}
}
