package sandbox

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// pressureHarness is an idle harness whose host has base MiB available,
// less perBox MiB for every sandbox alive in the runtime (the pools'
// included), with a reserve of reserve MiB.
func pressureHarness(t *testing.T, base, perBox, reserve int) (*harness, *clock) {
	h, c := idleHarness(t)
	h.m.cfg.MemoryReserveMB = reserve
	h.m.memAvailable = func() int { return base - perBox*len(h.rt.ids()) }
	return h, c
}

// Under the reserve, the quietest sandboxes are suspended for the host's
// memory (the longest unused first, none asked never to be, none busy in
// the background, none used a moment ago), as many as cover the shortfall;
// a boot that cannot be made room for is refused with insufficient_memory
// and leaves nothing behind; a suspended one resumes with its state on
// its next request once there is room.
func TestMemoryPressureSuspendsTheQuietest(t *testing.T) {
	h, c := pressureHarness(t, 1300, 100, 1000) // room for 3
	ctx := context.Background()
	// Unused longest: never (asked never to be suspended), then busy
	// (working in the background), then oldest.
	never := h.createIdle(0)
	c.advance(time.Second)
	busy := h.createIdle(300)
	h.exec(busy.ID, "set w=1")
	c.advance(time.Second)
	oldest := h.createIdle(300)
	if _, err := h.exec(oldest.ID, "set v=kept"); err != nil {
		t.Fatal(err)
	}
	c.advance(time.Second)
	h.m.suspend(h.m.idleNow(), pandastack.PauseIdle) // the reaper opens their quiet spells
	c.advance(pressureQuiet)
	h.rt.mu.Lock()
	h.rt.boxes[busy.ID].cpu += int64(pressureQuiet / 2)
	h.rt.mu.Unlock()
	recent := h.createIdle(300) // 4 alive: 900 MiB, short by 100

	avail, err := h.m.relieveMemory(ctx, false)
	if err != nil || avail != 1000 {
		t.Fatalf("relief: %d MiB, %v; want 1000 (one sandbox suspended)", avail, err)
	}
	if rec := h.record(oldest.ID); rec.State != pandastack.StatePaused || rec.PauseReason != pandastack.PauseMemory {
		t.Fatalf("the longest unused: %s %q, want paused for memory", rec.State, rec.PauseReason)
	}
	if text := scrape(t, h); !strings.Contains(text, `pandastack_sandbox_operations_total{operation="suspend_memory",outcome="ok"} 1`+"\n") {
		t.Errorf("the suspend is not counted as suspend_memory:\n%s", text)
	}
	for _, sb := range []pandastack.Sandbox{busy, never, recent} {
		if rec := h.record(sb.ID); rec.State != pandastack.StateRunning {
			t.Errorf("%s was suspended too: %s %q", sb.ID, rec.State, rec.PauseReason)
		}
	}

	// Room for a fourth once more, but not a fifth: nothing quiet is left
	// (busy still works, never may not be, the new ones were just used).
	fourth := h.createIdle(300)
	before := len(h.rt.ids())
	_, err = h.m.Create(ctx, project, CreateRequest{Template: "base"})
	if !pandastack.IsCode(err, pandastack.EMemory) || !strings.Contains(err.Error(), "900 MiB of memory available, under the 1000 MiB") {
		t.Fatalf("a create with no room: %v, want insufficient_memory with the figures", err)
	}
	if n := len(h.rt.ids()); n != before {
		t.Fatalf("the refused create left %d sandboxes in the runtime, want %d", n, before)
	}
	list, err := h.m.List(ctx, project, pandastack.SandboxFilter{})
	if err != nil || len(list) != 5 {
		t.Fatalf("records after the refused create: %d %v, want 5", len(list), err)
	}
	// The suspended one's next request needs room too: refused, it stays
	// paused with its image.
	if _, err := h.exec(oldest.ID, "get v"); !pandastack.IsCode(err, pandastack.EMemory) {
		t.Fatalf("a request to it with no room: %v, want insufficient_memory", err)
	}
	if rec := h.record(oldest.ID); rec.State != pandastack.StatePaused || rec.PauseReason != pandastack.PauseMemory {
		t.Fatalf("after the refused resume: %s %q", rec.State, rec.PauseReason)
	}
	if err := h.m.Kill(ctx, project, fourth.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := h.exec(oldest.ID, "get v"); err != nil || out != "kept" {
		t.Fatalf("after room was made: %q %v", out, err)
	}
	if rec := h.record(oldest.ID); rec.State != pandastack.StateRunning || rec.PauseReason != "" {
		t.Fatalf("resumed: %s %q", rec.State, rec.PauseReason)
	}
}

// Under the reserve the pools' ready sandboxes go first, and pools refill
// only with headroom over it.
func TestMemoryPressureEmptiesPoolsFirst(t *testing.T) {
	var avail atomic.Int64
	avail.Store(4000)
	h, c := idleHarness(t)
	ctx := context.Background()
	tpl := h.warmBase()
	h.tpls.tpl = tpl
	h.m.cfg.MemoryReserveMB = 1000
	h.m.memAvailable = func() int { return int(avail.Load()) - 100*len(h.rt.ids()) }
	quiet := h.createIdle(300)
	h.m.suspend(h.m.idleNow(), pandastack.PauseIdle)
	c.advance(2 * pressureQuiet)
	h.m.EnablePool(tpl, 2)
	waitFor(t, func() bool { return h.m.Pools(ctx)["base"].Ready == 2 })

	avail.Store(1250) // with the pool's two and quiet: 950
	if got, err := h.m.relieveMemory(ctx, false); err != nil || got != 1150 {
		t.Fatalf("relief: %d MiB, %v; want 1150 (the pool emptied)", got, err)
	}
	if rec := h.record(quiet.ID); rec.State != pandastack.StateRunning {
		t.Fatalf("a sandbox was suspended though emptying the pool made room: %s %q", rec.State, rec.PauseReason)
	}
	if ids := h.rt.ids(); len(ids) != 1 || ids[0] != quiet.ID {
		t.Fatalf("the runtime holds %v, want only %s", ids, quiet.ID)
	}
	// 1150 is under reserve + poolHeadroomMiB: the pool stays empty.
	h.m.kickPools()
	time.Sleep(100 * time.Millisecond)
	if n := h.m.Pools(ctx)["base"].Ready; n != 0 || len(h.rt.ids()) != 1 {
		t.Fatalf("the pool refilled into the reserve's headroom: %d ready", n)
	}
	avail.Store(4000)
	h.m.kickPools()
	waitFor(t, func() bool { return h.m.Pools(ctx)["base"].Ready == 2 })
}

// Without a reserve nothing is measured, suspended or refused.
func TestNoMemoryReserve(t *testing.T) {
	h, _ := idleHarness(t)
	h.m.cfg.MemoryReserveMB = 0
	h.m.memAvailable = func() int { t.Error("memory read without a reserve"); return 0 }
	h.createIdle(300)
	h.m.relievePressure()
	if err := h.m.roomFor(context.Background(), "a test"); err != nil {
		t.Fatal(err)
	}
}

// Under the reserve the prepared resumes go too (each holds its image in
// memory), and an idle suspend prepares none.
func TestMemoryPressureDropsPreparedResumes(t *testing.T) {
	h, _, rt := preparingHarness(t, 2)
	var ids []string
	for range 3 {
		ids = append(ids, h.createIdle(10).ID)
	}
	h.m.suspend(ids[:2], pandastack.PauseIdle)
	if got := rt.preparedIDs(); len(got) != 2 {
		t.Fatalf("prepared %v, want both suspended", got)
	}
	h.m.cfg.MemoryReserveMB = 1000
	h.m.memAvailable = func() int { return 1000 - 20*len(rt.preparedIDs()) }
	if got, err := h.m.relieveMemory(context.Background(), false); err != nil || got != 1000 {
		t.Fatalf("relief: %d MiB, %v; want 1000", got, err)
	}
	if got := rt.preparedIDs(); len(got) != 0 || h.m.prepared.pinnedBytes() != 0 {
		t.Fatalf("still prepared under the reserve: %v, %d bytes held", got, h.m.prepared.pinnedBytes())
	}
	h.m.memAvailable = func() int { return 900 }
	h.m.suspend(ids[2:], pandastack.PauseIdle)
	if rec := h.record(ids[2]); rec.State != pandastack.StatePaused {
		t.Fatalf("not suspended: %s", rec.State)
	}
	if got := rt.preparedIDs(); len(got) != 0 {
		t.Fatalf("an idle suspend under the reserve prepared %v", got)
	}
	// They all resume on their next request (once there is room).
	h.m.memAvailable = func() int { return 4000 }
	for _, id := range ids {
		if _, err := h.exec(id, "get v"); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
}
