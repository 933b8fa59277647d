package sandbox

import (
	"context"
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
