package sandbox

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// pressureHarness is an idle harness whose host has base MiB available,
// less perBox MiB for every sandbox alive in the runtime (the pools'
// included), with a reserve of reserve MiB. A boot's memory is booked
// only while it runs (no bootSettle). Every boot of the fake runtime is
// taken for defaultPSSMiB (its images are small).
func pressureHarness(t *testing.T, base, perBox, reserve int) (*harness, *clock, *atomic.Int64) {
	h, c := idleHarness(t)
	h.m.cfg.MemoryReserveMB = reserve
	h.m.bootSettle = 0
	var b atomic.Int64
	b.Store(int64(base))
	h.m.memAvailable = func() int { return int(b.Load()) - perBox*len(h.rt.ids()) }
	return h, c, &b
}

// Under the reserve, the quietest sandboxes are suspended for the host's
// memory (the longest unused first, none asked never to be, none busy in
// the background, none used a moment ago), as many as cover the shortfall;
// a boot that cannot be made room for is refused with insufficient_memory
// and leaves nothing behind; a suspended one resumes with its state on
// its next request once there is room.
func TestMemoryPressureSuspendsTheQuietest(t *testing.T) {
	const box = defaultPSSMiB
	h, c, _ := pressureHarness(t, 1000+box+4*box-100, box, 1000) // a fifth create is 100 MiB short
	ctx := context.Background()
	// Unused longest: never (asked never to be suspended), then busy
	// (working in the background), then older, then newer.
	never := h.createIdle(0)
	busy := h.createIdle(300)
	older := h.createIdle(300)
	newer := h.createIdle(300)
	for i, sb := range []pandastack.Sandbox{busy, older, newer} {
		c.advance(time.Second)
		if _, err := h.exec(sb.ID, "set v=kept"+string(rune('0'+i))); err != nil {
			t.Fatal(err)
		}
	}
	c.advance(time.Second)
	h.m.sampleCPU() // the reaper's readings
	c.advance(pressureQuiet)
	h.rt.mu.Lock()
	h.rt.boxes[busy.ID].cpu += int64(pressureQuiet / 2)
	h.rt.mu.Unlock()
	recent := h.createIdle(300) // needs 100 MiB: one sandbox covers it
	if rec := h.record(older.ID); rec.State != pandastack.StatePaused || rec.PauseReason != pandastack.PauseMemory {
		t.Fatalf("the longest unused quiet one: %s %q, want paused for memory", rec.State, rec.PauseReason)
	}
	for _, sb := range []pandastack.Sandbox{never, busy, newer, recent} {
		if rec := h.record(sb.ID); rec.State != pandastack.StateRunning {
			t.Errorf("%s was suspended too: %s %q", sb.ID, rec.State, rec.PauseReason)
		}
	}
	if text := scrape(t, h); !strings.Contains(text, `pandastack_sandbox_operations_total{operation="suspend_memory",outcome="ok"} 1`+"\n") {
		t.Errorf("the suspend is not counted as suspend_memory:\n%s", text)
	}

	// The next create takes newer's place.
	h.createIdle(300)
	if rec := h.record(newer.ID); rec.State != pandastack.StatePaused || rec.PauseReason != pandastack.PauseMemory {
		t.Fatalf("newer, quiet too, when a create needed room: %s %q", rec.State, rec.PauseReason)
	}
	// Nothing quiet is left: busy still works, never may not be suspended,
	// the others were used a moment ago.
	before := len(h.rt.ids())
	_, err := h.m.Create(ctx, project, CreateRequest{Template: "base"})
	if !pandastack.IsCode(err, pandastack.EMemory) || !strings.Contains(err.Error(), "no room for a new sandbox") || !strings.Contains(err.Error(), "none of its 3 running sandboxes without work in flight has been quiet") {
		t.Fatalf("a create with no room: %v, want insufficient_memory saying why", err)
	}
	if n := len(h.rt.ids()); n != before {
		t.Fatalf("the refused create left %d sandboxes in the runtime, want %d", n, before)
	}
	if list, err := h.m.List(ctx, project, pandastack.SandboxFilter{}); err != nil || len(list) != 6 {
		t.Fatalf("records after the refused create: %d %v, want 6", len(list), err)
	}
	// The suspended one's next request needs room too: refused, it stays
	// paused with its image.
	if _, err := h.exec(older.ID, "get v"); !pandastack.IsCode(err, pandastack.EMemory) || !strings.Contains(err.Error(), "the resume of sandbox "+older.ID) {
		t.Fatalf("a request to it with no room: %v, want insufficient_memory naming it", err)
	}
	if rec := h.record(older.ID); rec.State != pandastack.StatePaused || rec.PauseReason != pandastack.PauseMemory {
		t.Fatalf("after the refused resume: %s %q", rec.State, rec.PauseReason)
	}
	if err := h.m.Kill(ctx, project, recent.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := h.exec(older.ID, "get v"); err != nil || out != "kept1" {
		t.Fatalf("after room was made: %q %v", out, err)
	}
	if rec := h.record(older.ID); rec.State != pandastack.StateRunning || rec.PauseReason != "" {
		t.Fatalf("resumed: %s %q", rec.State, rec.PauseReason)
	}
}

// A sandbox's CPU is judged over the last seconds: one quiet for a minute
// that has just begun to work is not quiet, one that worked a minute ago
// and is quiet since is.
func TestMemoryPressureJudgesTheLastSeconds(t *testing.T) {
	h, c, base := pressureHarness(t, 4000, defaultPSSMiB, 1000)
	ctx := context.Background()
	worker := h.createIdle(300)
	burst := h.createIdle(300)
	cpu := func(id string, d time.Duration) {
		h.rt.mu.Lock()
		h.rt.boxes[id].cpu += int64(d)
		h.rt.mu.Unlock()
	}
	cpu(burst.ID, 8*time.Second)
	for range 12 { // a minute, read every pressureSample
		h.m.sampleCPU()
		c.advance(pressureSample)
	}
	cpu(worker.ID, 2*time.Second) // 20 % over the last 10 s, 3 % over the minute
	h.m.sampleCPU()
	base.Store(1000 + 2*defaultPSSMiB - 50) // short by 50
	if r, err := h.m.relieveMemory(ctx, false, 0); err != nil || r.suspended != 1 {
		t.Fatalf("relief: %+v %v, want one suspended", r, err)
	}
	if rec := h.record(burst.ID); rec.State != pandastack.StatePaused {
		t.Errorf("quiet for a minute after its burst, not suspended: %s", rec.State)
	}
	if rec := h.record(worker.ID); rec.State != pandastack.StateRunning {
		t.Errorf("working for the last seconds, suspended: %s %q", rec.State, rec.PauseReason)
	}
}

// Requests that come while a memory-suspended sandbox is being resumed
// wait for that resume, though the host is short meanwhile: the memory is
// the resume's own.
func TestMemoryPressureConcurrentRequestsWaitForTheResume(t *testing.T) {
	h, c, avail := pressureHarness(t, 4000, 0, 1000)
	sb := h.createIdle(300)
	if _, err := h.exec(sb.ID, "set v=kept"); err != nil {
		t.Fatal(err)
	}
	c.advance(time.Second)
	h.m.suspend([]string{sb.ID}, pandastack.PauseMemory)
	if err := h.m.sbx.begin(sb.ID, phaseResuming); err != nil { // another request resuming it
		t.Fatal(err)
	}
	avail.Store(900) // its restore made the host short
	errc := make(chan error, 1)
	go func() { _, err := h.exec(sb.ID, "get v"); errc <- err }()
	select {
	case err := <-errc:
		t.Fatalf("answered while the sandbox was being resumed by another request: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	// That resume gave up, and the host has room again: this request
	// resumes it.
	avail.Store(4000)
	h.m.sbx.end(sb.ID)
	if err := <-errc; err != nil {
		t.Fatalf("the waiting request: %v", err)
	}
}

// A fork needs room for all its children at once: refused, it leaves no
// child behind and the parent running.
func TestMemoryPressureRefusesAFork(t *testing.T) {
	h, _, _ := pressureHarness(t, 1500, 100, 1000) // room for the parent and about 2 more
	parent := h.createIdle(0)
	_, err := h.m.Fork(context.Background(), project, parent.ID, 8, nil, nil)
	if !pandastack.IsCode(err, pandastack.EMemory) || !strings.Contains(err.Error(), "a fork of sandbox "+parent.ID+" into 8") {
		t.Fatalf("a fork into 8 with room for about 2: %v, want insufficient_memory", err)
	}
	if ids := h.rt.ids(); len(ids) != 1 || ids[0] != parent.ID {
		t.Fatalf("the runtime holds %v, want only the parent", ids)
	}
	if rec := h.record(parent.ID); rec.State != pandastack.StateRunning {
		t.Fatalf("the parent: %s", rec.State)
	}
	if _, err := h.m.Fork(context.Background(), project, parent.ID, 2, nil, nil); err != nil {
		t.Fatalf("a fork into 2 (room for 256 MiB of 400): %v", err)
	}
}

// A fork's booking fades as its children's memory fills, as a create's
// does: it named none of them, and stood whole for bootSettle on top of
// the children's own memory once their pages had loaded.
func TestForkBookingFadesWithItsChildren(t *testing.T) {
	h, _, _ := pressureHarness(t, 5000, 0, 1000)
	parent := h.createIdle(0)
	h.m.bootSettle = time.Hour // a returned booking fades through the cgroups alone
	kids, err := h.m.Fork(context.Background(), project, parent.ID, 2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := h.m.bookedMiB(), 2*defaultPSSMiB; got != want {
		t.Fatalf("booked %d MiB right after the fork, want %d (nothing loaded yet)", got, want)
	}
	h.rt.mu.Lock()
	for _, k := range kids {
		h.rt.boxes[k.ID].mem = defaultPSSMiB << 20
	}
	h.rt.mu.Unlock()
	if got := h.m.bookedMiB(); got != 0 {
		t.Fatalf("booked %d MiB once the children loaded, want 0", got)
	}
}

// Under the reserve the pools' ready sandboxes go first; within the
// headroom over it a pool keeps what it holds, neither refilling nor
// shrinking; with room it fills again.
func TestMemoryPressureEmptiesPoolsFirst(t *testing.T) {
	var avail atomic.Int64
	avail.Store(4000)
	h, c := idleHarness(t)
	ctx := context.Background()
	tpl := h.warmBase()
	h.tpls.tpl = tpl
	h.m.cfg.MemoryReserveMB = 1000
	h.m.bootSettle = 0
	h.m.memAvailable = func() int { return int(avail.Load()) - 100*len(h.rt.ids()) }
	quiet := h.createIdle(300)
	h.m.suspend(h.m.idleNow(), pandastack.PauseIdle)
	c.advance(2 * pressureQuiet)
	h.m.EnablePool(tpl, 2)
	waitFor(t, func() bool { return h.m.Pools(ctx)["base"].Ready == 2 })
	h.m.mu.Lock()
	p := h.m.pools["base"]
	h.m.mu.Unlock()

	avail.Store(1250) // with the pool's two and quiet: 950
	if r, err := h.m.relieveMemory(ctx, false, 0); err != nil || r.avail != 1150 || r.suspended != 0 {
		t.Fatalf("relief: %+v, %v; want 1150 MiB with the pool emptied, nothing suspended", r, err)
	}
	if rec := h.record(quiet.ID); rec.State != pandastack.StateRunning {
		t.Fatalf("a sandbox was suspended though emptying the pool made room: %s %q", rec.State, rec.PauseReason)
	}
	if ids := h.rt.ids(); len(ids) != 1 || ids[0] != quiet.ID {
		t.Fatalf("the runtime holds %v, want only %s", ids, quiet.ID)
	}
	// 1150 is within the headroom: the pool keeps what it holds (none).
	if n := h.m.poolTarget(p); n != 0 {
		t.Fatalf("target within the headroom, pool empty: %d, want 0", n)
	}
	avail.Store(4000)
	waitFor(t, func() bool { return h.m.Pools(ctx)["base"].Ready == 2 })
	// Within the headroom with two ready: it keeps them, as it stands.
	avail.Store(1800) // 1500 with three alive
	if n := h.m.poolTarget(p); n != 2 {
		t.Fatalf("target within the headroom, two ready: %d, want 2", n)
	}
	if h.m.poolRoom(p) {
		t.Fatal("room for a refill within the headroom")
	}
	avail.Store(1250)
	if n := h.m.poolTarget(p); n != 0 {
		t.Fatalf("target under the reserve: %d, want 0", n)
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
	h.m.bootSettle = 0
	h.m.memAvailable = func() int { return 1000 - 20*len(rt.preparedIDs()) }
	if r, err := h.m.relieveMemory(context.Background(), false, 0); err != nil || r.avail != 1000 {
		t.Fatalf("relief: %+v, %v; want 1000 MiB", r, err)
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

// Without a reserve nothing is measured, suspended or refused.
func TestNoMemoryReserve(t *testing.T) {
	h, _ := idleHarness(t)
	h.m.cfg.MemoryReserveMB = 0
	h.m.memAvailable = func() int { t.Error("memory read without a reserve"); return 0 }
	h.createIdle(300)
	h.m.relievePressure()
	b, err := h.m.roomFor(context.Background(), "a test", 100)
	if err != nil || b != nil {
		t.Fatalf("a booking without a reserve: %v %v", b, err)
	}
	b.of("sbx_x")
	b.done(true)
}

// A reserve of all the host's memory is refused: no sandbox could start.
func TestMemoryReserveOverTheHost(t *testing.T) {
	h, _ := idleHarness(t)
	h.m.cfg.MemoryReserveMB = 24000
	h.m.memAvailable = func() int { return 20000 }
	if err := h.m.checkReserve(24000); !pandastack.IsCode(err, pandastack.EInvalid) || !strings.Contains(err.Error(), "--memory-reserve-mb 24000") {
		t.Fatalf("a reserve of the whole host: %v", err)
	}
	if err := h.m.checkReserve(24576); err != nil {
		t.Fatalf("a reserve under the host's memory: %v", err)
	}
}

// Boots under way count each other's memory; a returned boot's booking
// fades as its sandbox's cgroup fills, and a failed one's goes at once.
func TestMemoryBookings(t *testing.T) {
	h, _, _ := pressureHarness(t, 2000, 0, 1000)
	ctx := context.Background()
	sb := h.createIdle(300)
	h.m.bootSettle = time.Hour // a returned booking fades through the cgroup alone
	a, err := h.m.roomFor(ctx, "a", 600)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.roomFor(ctx, "b", 600); !pandastack.IsCode(err, pandastack.EMemory) || !strings.Contains(err.Error(), "no room for b (about 600 MiB): the host has 1400 MiB") {
		t.Fatalf("a second boot while the first is under way: %v, want insufficient_memory", err)
	}
	a.of(sb.ID)
	a.done(true)
	if got := h.m.bookedMiB(); got != 600 {
		t.Fatalf("booked %d MiB right after the boot returned, want 600 (nothing loaded yet)", got)
	}
	h.rt.mu.Lock()
	h.rt.boxes[sb.ID].mem = 400 << 20
	h.rt.mu.Unlock()
	if got := h.m.bookedMiB(); got != 200 {
		t.Fatalf("booked %d MiB once 400 loaded, want 200", got)
	}
	b, err := h.m.roomFor(ctx, "b", 600)
	if err != nil {
		t.Fatalf("a second boot once the first loaded: %v", err)
	}
	b.done(false)
	if got := h.m.bookedMiB(); got != 200 {
		t.Fatalf("booked %d MiB after a failed boot, want 200 (the first's)", got)
	}
	if imageMiB("") != defaultPSSMiB || imageMiB(t.TempDir()) != defaultPSSMiB {
		t.Fatal("imageMiB of no image")
	}
}

// A fork refused anyway (bad metadata, a stopped parent) is refused before
// memory is freed for its children: no other sandbox is suspended for it.
func TestRefusedForkFreesNoMemory(t *testing.T) {
	const box = defaultPSSMiB
	h, c, base := pressureHarness(t, 100_000, box, 1000)
	ctx := context.Background()
	quiet := h.createIdle(300)
	parent := h.createIdle(300)
	stopped := h.createIdle(300)
	expired := h.createIdle(300)
	h.store.SetSandboxExpiry(ctx, stopped.ID, time.Now().Add(-time.Second))
	h.m.reapOnce()
	h.store.SetSandboxExpiry(ctx, expired.ID, time.Now().Add(-time.Second))
	c.advance(time.Second)
	h.m.sampleCPU()
	c.advance(pressureQuiet)
	base.Store(int64(1000 + 3*box + box - 50)) // a child is 50 MiB short: a quiet one would go
	md := map[string]string{}
	for i := range MaxMetadataKeys + 1 {
		md[fmt.Sprintf("k%d", i)] = "v"
	}
	if _, err := h.m.ForkWith(ctx, project, parent.ID, ForkOptions{Count: 1, Metadata: md}); !pandastack.IsCode(err, pandastack.EInvalid) {
		t.Fatalf("a fork with %d metadata keys: %v, want invalid_request", len(md), err)
	}
	if _, err := h.m.ForkWith(ctx, project, stopped.ID, ForkOptions{Count: 1}); !pandastack.IsCode(err, pandastack.EStopped) {
		t.Fatalf("a fork of a stopped sandbox: %v, want sandbox_stopped", err)
	}
	// A parent past its TTL, not yet reaped.
	if _, err := h.m.ForkWith(ctx, project, expired.ID, ForkOptions{Count: 1}); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("a fork of a sandbox past its TTL: %v, want conflict", err)
	}
	// A snapshot of the parent under way: quiesce would refuse the fork.
	if err := h.m.sbx.quiesce(parent.ID, phaseCheckpointing, "snapshot it"); err != nil {
		t.Fatal(err)
	}
	_, err := h.m.ForkWith(ctx, project, parent.ID, ForkOptions{Count: 1})
	h.m.sbx.settle(parent.ID)
	if !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("a fork of a sandbox being snapshotted: %v, want conflict", err)
	}
	for _, sb := range []pandastack.Sandbox{quiet, parent} {
		if rec := h.record(sb.ID); rec.State != pandastack.StateRunning {
			t.Errorf("%s after the refused forks: %s %q, want running", sb.ID, rec.State, rec.PauseReason)
		}
	}
}
