package sandbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/metrics"
)

// The manager counts its operations by outcome, its creates by source and
// its stops by reason, and its gauges say how many sandboxes are in each
// state.
func TestMetrics(t *testing.T) {
	setFor(t, &sandboxCountEvery, 0)
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create()
	snap := h.snapshot(sb.ID)
	restored, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	kids, err := h.m.Fork(ctx, project, sb.ID, 2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = h.m.Fork(ctx, project, "sbx_nothere", 1, nil, nil)
	wantCode(t, err, pandastack.ENotFound)
	if _, err := h.m.Pause(ctx, project, restored.ID); err != nil {
		t.Fatal(err)
	}
	if text := scrape(t, h); !strings.Contains(text, `pandastack_sandboxes{state="running"} 3`+"\n") || !strings.Contains(text, `pandastack_sandboxes{state="paused"} 1`+"\n") {
		t.Errorf("gauges with 3 running and 1 paused:\n%s", text)
	}
	if _, err := h.m.Resume(ctx, project, restored.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.m.Kill(ctx, project, kids[0].ID); err != nil {
		t.Fatal(err)
	}
	h.store.SetSandboxExpiry(ctx, kids[1].ID, time.Now().Add(-time.Second))
	h.m.reapOnce()
	if err := h.m.Kill(ctx, project, kids[1].ID); err != nil { // its record: a stop counted once
		t.Fatal(err)
	}
	h.rt.startErr = func(pandastack.RuntimeSpec) error { return errInjected }
	_, err = h.m.Create(ctx, project, CreateRequest{Template: "base"})
	if err == nil {
		t.Fatal("create succeeded")
	}
	failedCode := pandastack.ErrorCode(err)
	// The server's own warm-up sandboxes are no user's: not counted.
	if _, err := h.m.Create(ctx, warmProject, CreateRequest{Template: "base"}); err == nil {
		t.Fatal("the warm-up's create succeeded")
	}
	h.rt.startErr = nil

	mm := h.m.metrics
	for _, c := range []struct {
		op, outcome string
		want        float64
	}{
		{opCreate, "ok", 1}, {opCreate, failedCode, 1}, {opRestore, "ok", 1}, {opSnap, "ok", 1},
		{opFork, "ok", 1}, {opFork, pandastack.ENotFound, 1}, {opPause, "ok", 1}, {opResume, "ok", 1},
		{opKill, "ok", 2},
	} {
		if got := mm.ops.Value(c.op, c.outcome); got != c.want {
			t.Errorf("operations %s %s: %v, want %v", c.op, c.outcome, got, c.want)
		}
	}
	if n := mm.seconds.Count(opCreate); n != 1 {
		t.Errorf("create durations: %d, want the successful one", n)
	}
	// The fake runtime boots the template cold and restores the snapshot;
	// the fork's children are the fork's, not creates.
	if boot, restore := mm.creates.Value(sourceBoot), mm.creates.Value(sourceRestore); boot != 1 || restore != 1 {
		t.Errorf("creates: boot %v restore %v, want 1 and 1", boot, restore)
	}
	for reason, want := range map[string]float64{pandastack.StopKilled: 1, pandastack.StopExpired: 1, pandastack.StopFailed: 1} {
		if got := mm.stops.Value(reason); got != want {
			t.Errorf("stops %s: %v, want %v", reason, got, want)
		}
	}
	text := scrape(t, h)
	for _, want := range []string{
		`pandastack_sandboxes{state="running"} 2`, `pandastack_sandboxes{state="paused"} 0`,
		`pandastack_sandbox_operations_total{operation="fork",outcome="not_found"} 1`,
		`pandastack_sandbox_stops_total{reason="expired"} 1`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("no %s in\n%s", want, text)
		}
	}
}

func scrape(t *testing.T, h *harness) string {
	t.Helper()
	var b strings.Builder
	if _, err := h.metrics.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// classifyingStore classifies errInjected as a full disk, as a store that
// knows its database's failures does.
type classifyingStore struct{ pandastack.Store }

func (classifyingStore) ClassifyError(err error) error {
	if errors.Is(err, errInjected) {
		return pandastack.Errorf(pandastack.EStorage, "the database's disk is full")
	}
	return err
}

// An operation's outcome is the code the caller got: a store failure the
// API answers as insufficient_storage counts so, not as internal.
func TestMetricsOutcomeIsTheCallersCode(t *testing.T) {
	reg := metrics.New()
	m := &Manager{store: classifyingStore{}}
	m.useMetrics(reg)
	for _, err := range []error{fmt.Errorf("record: %w", errInjected), pandastack.Errorf(pandastack.EConflict, "busy")} {
		m.observe(opCreate, time.Now(), &err)
	}
	if got := m.metrics.ops.Value(opCreate, pandastack.EStorage); got != 1 {
		t.Errorf("a store failure counted as %s: %v", pandastack.EStorage, got)
	}
	if got := m.metrics.ops.Value(opCreate, pandastack.EConflict); got != 1 {
		t.Errorf("a coded failure: %v", got)
	}
}
