package sandbox

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/metrics"
)

// preparingRuntime is the fake runtime with pandastack.RuntimePreparer: a
// prepared id is remembered with its spec, a Restore of it with the same
// spec counts as a prepared one, and Stop or any Restore of the id drops it.
type preparingRuntime struct {
	*fakeRuntime
	mu         sync.Mutex
	prepared   map[string]pandastack.RuntimeSpec
	prepareErr error
	calls      []string // "prepare ID", "restore ID prepared|cold", "stop ID", in order
}

var _ pandastack.RuntimePreparer = (*preparingRuntime)(nil)

func (r *preparingRuntime) log(s string) {
	r.mu.Lock()
	r.calls = append(r.calls, s)
	r.mu.Unlock()
}

func (r *preparingRuntime) Prepare(ctx context.Context, spec pandastack.RuntimeSpec, imageDir string) error {
	r.log("prepare " + spec.ID)
	if r.prepareErr != nil {
		return r.prepareErr
	}
	if !r.Alive(spec.ID) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if _, ok := r.prepared[spec.ID]; ok {
			return pandastack.Errorf(pandastack.EConflict, "prepared already")
		}
		r.prepared[spec.ID] = spec
		return nil
	}
	return pandastack.Errorf(pandastack.EConflict, "sandbox %s runs", spec.ID)
}

func (r *preparingRuntime) Restore(ctx context.Context, spec pandastack.RuntimeSpec, imageDir string) (io.ReadWriteCloser, error) {
	r.mu.Lock()
	p, ok := r.prepared[spec.ID]
	delete(r.prepared, spec.ID)
	r.mu.Unlock()
	how := "cold"
	if ok && p.RootFS == spec.RootFS && p.CPU == spec.CPU && p.MemoryMB == spec.MemoryMB && p.PIDs == spec.PIDs {
		how = "prepared"
	}
	r.log("restore " + spec.ID + " " + how)
	return r.fakeRuntime.Restore(ctx, spec, imageDir)
}

func (r *preparingRuntime) Rename(ctx context.Context, from, to string) error {
	r.log("rename " + from + " " + to)
	r.mu.Lock()
	defer r.mu.Unlock()
	spec, ok := r.prepared[from]
	if !ok {
		return pandastack.Errorf(pandastack.ENotFound, "not prepared")
	}
	if _, busy := r.prepared[to]; busy || r.fakeRuntime.Alive(to) {
		return pandastack.Errorf(pandastack.EConflict, "%s is held", to)
	}
	delete(r.prepared, from)
	spec.ID = to
	r.prepared[to] = spec
	return nil
}

func (r *preparingRuntime) Stop(ctx context.Context, id string) error {
	r.mu.Lock()
	_, ok := r.prepared[id]
	delete(r.prepared, id)
	r.mu.Unlock()
	if ok {
		r.log("stop " + id)
	}
	return r.fakeRuntime.Stop(ctx, id)
}

func (r *preparingRuntime) preparedIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids []string
	for id := range r.prepared {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

func (r *preparingRuntime) takeCalls() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.calls
	r.calls = nil
	return c
}

// preparingHarness is an idle harness whose manager runs on a
// preparingRuntime and prepares the resumes of the last keep suspends.
func preparingHarness(t *testing.T, keep int) (*harness, *clock, *preparingRuntime) {
	h, c := idleHarness(t)
	h.m.Close()
	rt := &preparingRuntime{fakeRuntime: h.rt, prepared: map[string]pandastack.RuntimeSpec{}}
	cfg := h.m.cfg
	cfg.Metrics = metrics.New() // a new manager's series
	h.metrics = cfg.Metrics
	cfg.PreparedResumes = keep
	m := New(cfg, h.store, rt, h.tpls, slog.New(slog.NewTextHandler(testWriter{t, &h.logs}, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	m.sbx.now = c.now
	h.m = m
	return h, c, rt
}

func TestIdleSuspendPreparesResume(t *testing.T) {
	h, c, rt := preparingHarness(t, 2)
	var ids []string
	for i := range 3 {
		sb := h.createIdle(10)
		if _, err := h.exec(sb.ID, "set v=kept"+string(rune('0'+i))); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	rt.takeCalls()
	// One at a time, so the order of the suspends is known.
	for _, id := range ids {
		h.m.suspend([]string{id}, pandastack.PauseIdle)
		if rec := h.record(id); rec.State != pandastack.StatePaused {
			t.Fatalf("%s not suspended: %s", id, rec.State)
		}
	}
	// Each suspend prepared its resume; the third took the place of the
	// first, which stays paused with its image.
	want := []string{"prepare " + ids[0], "prepare " + ids[1], "stop " + ids[0], "prepare " + ids[2]}
	if got := rt.takeCalls(); !slices.Equal(got, want) {
		t.Fatalf("runtime calls %q, want %q", got, want)
	}
	if got := rt.preparedIDs(); !slices.Equal(got, slices.Sorted(slices.Values(ids[1:]))) {
		t.Fatalf("prepared %v, want %v", got, ids[1:])
	}
	// The two prepared ones hold their images in memory, the dropped one not.
	if got := h.m.prepared.pinnedBytes(); got != 2*fakePagesSize {
		t.Fatalf("images held: %d bytes, want %d", got, 2*fakePagesSize)
	}
	if rec := h.record(ids[0]); rec.State != pandastack.StatePaused {
		t.Fatalf("the sandbox whose prepared resume was dropped: %s", rec.State)
	}
	// A request resumes each with its state: into its prepared container,
	// or, for the first, afresh.
	for i, id := range ids {
		if out, err := h.exec(id, "get v"); err != nil || out != "kept"+string(rune('0'+i)) {
			t.Fatalf("sandbox %d after its resume: %q %v", i, out, err)
		}
	}
	want = []string{"restore " + ids[0] + " cold", "restore " + ids[1] + " prepared", "restore " + ids[2] + " prepared"}
	if got := rt.takeCalls(); !slices.Equal(got, want) {
		t.Fatalf("runtime calls %q, want %q", got, want)
	}
	// Suspended again and killed: the prepared resume goes with it.
	c.advance(11 * time.Second)
	h.passIdle(c, 11*time.Second)
	if rec := h.record(ids[2]); rec.State != pandastack.StatePaused {
		t.Fatalf("not suspended again: %s", rec.State)
	}
	if len(rt.preparedIDs()) != 2 {
		t.Fatalf("prepared after the second suspends: %v", rt.preparedIDs())
	}
	for _, id := range ids {
		if err := h.m.Kill(context.Background(), project, id); err != nil {
			t.Fatal(err)
		}
	}
	if got := rt.preparedIDs(); len(got) != 0 {
		t.Fatalf("prepared resumes left after the kills: %v", got)
	}
	if len(h.m.prepared.ids) != 0 || h.m.prepared.pinnedBytes() != 0 {
		t.Fatalf("the manager still counts prepared resumes: %v, %d bytes held", h.m.prepared.ids, h.m.prepared.pinnedBytes())
	}
}

func TestPrepareFailureKeepsSuspend(t *testing.T) {
	h, _, rt := preparingHarness(t, 2)
	rt.prepareErr = errors.New("no room")
	sb := h.createIdle(10)
	h.exec(sb.ID, "set v=kept")
	locked := lockedKB(t)
	h.m.suspend([]string{sb.ID}, pandastack.PauseIdle)
	if got := lockedKB(t) - locked; got != 0 {
		t.Fatalf("a failed prepare left %d kB of its image locked", got)
	}
	if rec := h.record(sb.ID); rec.State != pandastack.StatePaused || rec.PauseReason != pandastack.PauseIdle {
		t.Fatalf("after a failed prepare: %s %q", rec.State, rec.PauseReason)
	}
	if out, err := h.exec(sb.ID, "get v"); err != nil || out != "kept" {
		t.Fatalf("resume after a failed prepare: %q %v", out, err)
	}
	if got := rt.takeCalls(); !slices.Equal(got, []string{"prepare " + sb.ID, "restore " + sb.ID + " cold"}) {
		t.Fatalf("runtime calls %q", got)
	}
}

func TestPauseOnRequestPreparesNothing(t *testing.T) {
	h, _, rt := preparingHarness(t, 2)
	sb := h.createIdle(0)
	if _, err := h.m.Pause(context.Background(), project, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := rt.takeCalls(); len(got) != 0 {
		t.Fatalf("a pause asked for prepared its resume: %q", got)
	}
}

// A prepared resume due to go while its sandbox is claimed (a fork or a
// snapshot reading its image) stays listed and goes with a later
// suspend's drop: taken off the list before the claim was asked, it was
// left standing, counted nowhere, for the sandbox's whole TTL.
func TestPreparedResumeOfAClaimedSandboxStaysListed(t *testing.T) {
	h, _, rt := preparingHarness(t, 1)
	var ids []string
	for range 3 {
		sb := h.createIdle(10)
		ids = append(ids, sb.ID)
	}
	h.m.suspend([]string{ids[0]}, pandastack.PauseIdle)
	if err := h.m.sbx.begin(ids[0], phaseReadingImage); err != nil {
		t.Fatal(err)
	}
	h.m.suspend([]string{ids[1]}, pandastack.PauseIdle)
	if got, want := h.m.prepared.list(), ids[:2]; !slices.Equal(got, want) {
		t.Fatalf("prepared resumes listed %v, want %v (the claimed one kept)", got, want)
	}
	h.m.sbx.end(ids[0])
	rt.takeCalls()
	h.m.suspend([]string{ids[2]}, pandastack.PauseIdle)
	want := []string{"stop " + ids[0], "stop " + ids[1], "prepare " + ids[2]}
	if got := rt.takeCalls(); !slices.Equal(got, want) {
		t.Fatalf("runtime calls %q, want %q", got, want)
	}
	if got := rt.preparedIDs(); !slices.Equal(got, ids[2:]) {
		t.Fatalf("prepared containers %v, want %v", got, ids[2:])
	}
	for i, id := range ids {
		if rec := h.record(id); rec.State != pandastack.StatePaused {
			t.Fatalf("sandbox %d: %s, want paused", i, rec.State)
		}
	}
}

func TestPreparedResumesList(t *testing.T) {
	var p preparedResumes
	for _, id := range []string{"a", "b", "c", "b"} {
		p.add(id, nil)
	}
	if !slices.Equal(p.ids, []string{"a", "c", "b"}) {
		t.Fatalf("ids %v", p.ids)
	}
	if got := p.over(1); !slices.Equal(got, []string{"a", "c"}) || !slices.Equal(p.ids, []string{"a", "c", "b"}) {
		t.Fatalf("over(1) = %v, left %v, want them still listed", got, p.ids)
	}
	if !p.forget("b") || p.forget("b") || len(p.over(2)) != 0 || !slices.Equal(p.over(0), []string{"a", "c"}) {
		t.Fatal("forget")
	}
}

// Containers prepared for creates: a plain create of the warm template
// takes one (its id becomes the sandbox's) and another is prepared after
// it; a create with its own env restores afresh; Close removes the
// prepared ones that are left.
func TestPreparedCreates(t *testing.T) {
	h, rt := standbyHarness(t)
	ctx := context.Background()
	m := h.m
	first := rt.preparedIDs()[0]
	rt.takeCalls()
	sb := h.create()
	if sb.ID != first {
		t.Fatalf("create got %s, not the prepared %s", sb.ID, first)
	}
	if _, err := h.exec(sb.ID, "set a=1"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(rt.preparedIDs()) == 1 })
	second := rt.preparedIDs()[0]
	if got := rt.takeCalls(); len(got) != 2 || got[0] != "restore "+first+" prepared" || got[1] != "prepare "+second {
		t.Fatalf("runtime calls %q", got)
	}
	// With env of its own the spec differs: no prepared container.
	own, err := m.Create(ctx, project, CreateRequest{Template: "base", Env: map[string]string{"K": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	if own.ID == second || !slices.Equal(rt.preparedIDs(), []string{second}) {
		t.Fatalf("a create with env took the prepared container: %s, left %v", own.ID, rt.preparedIDs())
	}
	m.Close()
	if got := rt.preparedIDs(); len(got) != 0 {
		t.Fatalf("prepared containers left after Close: %v", got)
	}
	for _, id := range rt.ids() {
		if id == second {
			t.Fatalf("the runtime still holds %s after Close", id)
		}
	}
}

// standbyHarness is a preparing harness whose base template is warm and
// keeps one container prepared for its creates; it returns once that one
// is ready.
func standbyHarness(t *testing.T) (*harness, *preparingRuntime) {
	h, _, rt := preparingHarness(t, 0)
	ctx := context.Background()
	h.m.Close()
	cfg := h.m.cfg
	cfg.Metrics = metrics.New() // a new manager's series
	h.metrics = cfg.Metrics
	cfg.PreparedCreates = 1
	tpl := h.tpls.tpl
	tpl.WarmImage = WarmImageDir(cfg.WarmDir, tpl.Name, "0123456789abcdef0123", "fedcba9876543210ffff")
	m := New(cfg, h.store, rt, h.tpls, slog.New(slog.NewTextHandler(testWriter{t, &h.logs}, nil)))
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	h.m = m
	if err := m.Warm(ctx, tpl, "import x", tpl.WarmImage); err != nil {
		t.Fatal(err)
	}
	h.tpls.tpl = tpl
	m.enableStandby(tpl)
	waitFor(t, func() bool { return len(rt.preparedIDs()) == 1 })
	return h, rt
}

// A suspended sandbox whose own resume was not prepared resumes into a
// container prepared for its template's creates, renamed to its id, with
// its state; the next such container is prepared after it. One with
// resources of its own resumes afresh and leaves the prepared one be.
func TestResumeTakesAContainerPreparedForCreates(t *testing.T) {
	h, rt := standbyHarness(t)
	ctx := context.Background()
	sb := h.createIdle(10)
	if _, err := h.exec(sb.ID, "set v=kept"); err != nil {
		t.Fatal(err)
	}
	own, err := h.m.Create(ctx, project, CreateRequest{Template: "base", MemoryMB: h.tpls.tpl.MemoryMB * 2})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(rt.preparedIDs()) == 1 })
	ready := rt.preparedIDs()[0]
	h.m.suspend([]string{sb.ID}, pandastack.PauseIdle)
	if _, err := h.m.Pause(ctx, project, own.ID); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{sb.ID, own.ID} {
		if rec := h.record(id); rec.State != pandastack.StatePaused {
			t.Fatalf("%s not paused: %s", id, rec.State)
		}
	}
	rt.takeCalls()
	if out, err := h.exec(sb.ID, "get v"); err != nil || out != "kept" {
		t.Fatalf("after the resume: %q %v", out, err)
	}
	waitFor(t, func() bool { p := rt.preparedIDs(); return len(p) == 1 && p[0] != ready })
	next := rt.preparedIDs()[0]
	want := []string{"rename " + ready + " " + sb.ID, "restore " + sb.ID + " prepared", "prepare " + next}
	if got := rt.takeCalls(); !slices.Equal(got, want) {
		t.Fatalf("runtime calls %q, want %q", got, want)
	}
	if got := h.logs.with("standby=" + ready); len(got) != 1 || !strings.Contains(got[0], `msg="sandbox resumed"`) || !strings.Contains(got[0], "sandbox="+sb.ID) {
		t.Fatalf("the resume's log line naming the container it took: %q", got)
	}
	if _, err := h.m.Resume(ctx, project, own.ID); err != nil {
		t.Fatal(err)
	}
	if got := rt.takeCalls(); !slices.Equal(got, []string{"restore " + own.ID + " cold"}) || !slices.Equal(rt.preparedIDs(), []string{next}) {
		t.Fatalf("a resume with memory of its own: calls %q, prepared %v", got, rt.preparedIDs())
	}

	// An agent that does not set the sandbox's hostname would keep the
	// container's: such a sandbox resumes afresh.
	rt.fakeRuntime.mu.Lock()
	rt.unnamed = true
	rt.fakeRuntime.mu.Unlock()
	old := h.createIdle(10)
	waitFor(t, func() bool { return len(rt.preparedIDs()) == 1 })
	h.m.suspend([]string{old.ID}, pandastack.PauseIdle)
	rt.takeCalls()
	if _, err := h.exec(old.ID, "get v"); err != nil {
		t.Fatal(err)
	}
	if got := rt.takeCalls(); !slices.Equal(got, []string{"restore " + old.ID + " cold"}) || len(rt.preparedIDs()) != 1 {
		t.Fatalf("the resume of a sandbox whose agent does not name it: calls %q, prepared %v", got, rt.preparedIDs())
	}
}

// A fork's child and a sandbox made from a snapshot restore into a
// container prepared for the template's creates when their resources are
// the template's; the child has the parent's state. A sandbox with
// resources of its own forks into fresh containers.
func TestForksAndSnapshotsTakePreparedContainers(t *testing.T) {
	h, rt := standbyHarness(t)
	ctx := context.Background()
	parent := h.create()
	if _, err := h.exec(parent.ID, "set a=forked"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return len(rt.preparedIDs()) == 1 })
	ready := rt.preparedIDs()[0]
	rt.takeCalls()
	kids, err := h.m.Fork(ctx, project, parent.ID, 2, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	took := slices.IndexFunc(kids, func(k pandastack.Sandbox) bool { return k.ID == ready })
	if took < 0 {
		t.Fatalf("no child took the prepared %s: %s, %s", ready, kids[0].ID, kids[1].ID)
	}
	other := kids[1-took].ID
	calls := rt.takeCalls()
	if !slices.Contains(calls, "restore "+ready+" prepared") || !slices.Contains(calls, "restore "+other+" cold") {
		t.Fatalf("runtime calls %q", calls)
	}
	for _, k := range kids {
		if out, err := h.exec(k.ID, "get a"); err != nil || out != "forked" {
			t.Fatalf("child %s: %q, %v", k.ID, out, err)
		}
	}

	waitFor(t, func() bool { return len(rt.preparedIDs()) == 1 })
	ready = rt.preparedIDs()[0]
	snap := h.snapshot(parent.ID)
	restored, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if restored.ID != ready {
		t.Fatalf("the restore of a snapshot got %s, not the prepared %s", restored.ID, ready)
	}

	waitFor(t, func() bool { return len(rt.preparedIDs()) == 1 })
	ready = rt.preparedIDs()[0]
	own, err := h.m.Create(ctx, project, CreateRequest{Template: "base", MemoryMB: h.tpls.tpl.MemoryMB * 2})
	if err != nil {
		t.Fatal(err)
	}
	kids, err = h.m.Fork(ctx, project, own.ID, 1, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if kids[0].ID == ready || !slices.Equal(rt.preparedIDs(), []string{ready}) {
		t.Fatalf("a child with memory of its own took the prepared container: %s, left %v", kids[0].ID, rt.preparedIDs())
	}
}

// A create that finds no prepared container while one is being prepared
// waits for that one; a failed prepare or the create's own deadline ends
// the wait with none, and with nothing under way there is no wait.
func TestStandbyTakeWaitsForAPrepareUnderWay(t *testing.T) {
	s := newStandby(Template{Name: "t"})
	if _, ok := s.take(context.Background()); ok {
		t.Fatal("took a container from an empty standby")
	}
	got := make(chan string, 1)
	take := func(ctx context.Context) {
		id, ok := s.take(ctx)
		if !ok {
			id = "none"
		}
		got <- id
	}
	s.begin()
	go take(context.Background())
	select {
	case id := <-got:
		t.Fatalf("take returned %q before the prepare under way ended", id)
	case <-time.After(50 * time.Millisecond):
	}
	s.end("sbx_prepared")
	if id := <-got; id != "sbx_prepared" {
		t.Fatalf("took %q, want the container whose prepare it waited for", id)
	}
	s.begin()
	go take(context.Background())
	s.end("") // the prepare failed
	if id := <-got; id != "none" {
		t.Fatalf("after a failed prepare: %q", id)
	}
	s.begin()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	go take(ctx)
	if id := <-got; id != "none" {
		t.Fatalf("past its deadline: %q", id)
	}
	s.end("sbx_later")
	if id, ok := s.take(context.Background()); !ok || id != "sbx_later" {
		t.Fatalf("the container prepared after a create gave up: %q %v", id, ok)
	}
}

// lockedKB is this process's locked memory (VmLck).
func lockedKB(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmLck:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	t.Fatal("no VmLck in /proc/self/status")
	return 0
}

// A pinned image is locked in memory until its prepared resume goes, by
// forget or by over.
func TestPinnedImages(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "checkpoint.img"), []byte("state"), 0o600)
	os.WriteFile(filepath.Join(dir, "pages.img"), make([]byte, 1<<20), 0o600)
	before := lockedKB(t)
	var p preparedResumes
	for _, id := range []string{"a", "b"} {
		pin, err := pinImage(dir)
		if err != nil {
			t.Fatalf("pinImage: %v", err)
		}
		if pin.bytes != 1<<20+5 {
			t.Fatalf("pinned %d bytes, want %d", pin.bytes, 1<<20+5)
		}
		p.add(id, pin)
	}
	if got := lockedKB(t) - before; got < 2<<10 {
		t.Fatalf("%d kB locked with two images of 1 MiB held", got)
	}
	p.forget("a")
	if got := lockedKB(t) - before; got < 1<<10 || got >= 2<<10 {
		t.Fatalf("%d kB locked with one image held", got)
	}
	// A resume takes the held image out and releases it itself, later.
	ok, pin := p.take("b")
	if !ok || pin == nil || p.pinnedBytes() != 0 {
		t.Fatalf("take: %v %v, %d bytes still counted", ok, pin, p.pinnedBytes())
	}
	if got := lockedKB(t) - before; got < 1<<10 {
		t.Fatalf("%d kB locked once taken: released before its taker did", got)
	}
	pin.release()
	p.releaseAll()
	if got := lockedKB(t) - before; got != 0 || p.pinnedBytes() != 0 {
		t.Fatalf("%d kB locked, %d bytes counted with none held", got, p.pinnedBytes())
	}
	if _, err := pinImage(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("pinImage of a dir without image files: %v, want nothing pinned", err)
	}
}

// A pause asked of a sandbox suspended for idleness keeps it paused as
// asked: its prepared resume goes, and a request no longer wakes it. One
// asked during the suspend waits for it.
func TestPauseOfAnIdleSuspend(t *testing.T) {
	h, _, rt := preparingHarness(t, 2)
	ctx := context.Background()
	sb := h.createIdle(10)
	if _, err := h.exec(sb.ID, "set v=kept"); err != nil {
		t.Fatal(err)
	}
	release, suspended := h.suspendHeld(sb.ID)
	paused := make(chan error, 1)
	var got pandastack.Sandbox
	go func() {
		var err error
		got, err = h.m.Pause(ctx, project, sb.ID)
		paused <- err
	}()
	time.Sleep(50 * time.Millisecond) // the pause finds the suspend under way
	close(release)
	if err := <-suspended; err != nil {
		t.Fatal(err)
	}
	if err := <-paused; err != nil {
		t.Fatalf("a pause during the idle suspend: %v", err)
	}
	if got.State != pandastack.StatePaused || got.PauseReason != pandastack.PauseRequested {
		t.Fatalf("the pause answered %s %q, want paused requested", got.State, got.PauseReason)
	}
	if calls := rt.takeCalls(); !slices.Contains(calls, "stop "+sb.ID) {
		t.Fatalf("runtime calls %q: the prepared resume was not removed", calls)
	}
	if _, err := h.exec(sb.ID, "get v"); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("a request to the paused sandbox: %v, want conflict (it stays paused)", err)
	}
	// A request that saw the idle suspend before the pause does not wake
	// it either: its resume looks at the record again under its claim.
	if _, err := h.m.resumeWaiting(ctx, project, sb.ID, true); !errors.Is(err, errNotOnDemand) {
		t.Fatalf("an on-demand resume after the pause: %v", err)
	}
	if rec := h.record(sb.ID); rec.State != pandastack.StatePaused {
		t.Fatalf("after the on-demand resume: %s", rec.State)
	}
	if _, err := h.m.Pause(ctx, project, sb.ID); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("a second pause: %v, want conflict", err)
	}
	if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	if out, err := h.exec(sb.ID, "get v"); err != nil || out != "kept" {
		t.Fatalf("after the resume: %q %v", out, err)
	}
}

// A request that comes while the server removes a suspended sandbox's
// prepared resume waits and resumes it, rather than answering 503; so do
// an explicit resume and a pause, rather than 409 (the drop held the
// sandbox as stopping: "it will not run again").
func TestRequestDuringTheDropOfAPreparedResume(t *testing.T) {
	for _, c := range []struct {
		name string
		call func(h *harness, id string) error
	}{
		{"a request", func(h *harness, id string) error {
			out, err := h.exec(id, "get v")
			if err == nil && out != "kept" {
				err = errors.New("got " + out)
			}
			return err
		}},
		{"a resume", func(h *harness, id string) error {
			sb, err := h.m.Resume(context.Background(), project, id)
			if err == nil && sb.State != pandastack.StateRunning {
				err = errors.New("answered " + string(sb.State))
			}
			return err
		}},
		{"a pause", func(h *harness, id string) error {
			sb, err := h.m.Pause(context.Background(), project, id)
			if err == nil && (sb.State != pandastack.StatePaused || sb.PauseReason != pandastack.PauseRequested) {
				err = errors.New("answered " + string(sb.State) + " " + sb.PauseReason)
			}
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, _, rt := preparingHarness(t, 1)
			sb := h.createIdle(10)
			if _, err := h.exec(sb.ID, "set v=kept"); err != nil {
				t.Fatal(err)
			}
			h.m.suspend([]string{sb.ID}, pandastack.PauseIdle)
			if got := rt.preparedIDs(); !slices.Equal(got, []string{sb.ID}) {
				t.Fatalf("prepared containers %v, want %s's", got, sb.ID)
			}
			// The drop, held in the stop of the prepared container.
			entered, release := make(chan struct{}), make(chan struct{})
			var first sync.Once
			h.rt.stopHook = func(id string) {
				if id == sb.ID {
					first.Do(func() {
						close(entered)
						<-release
					})
				}
			}
			dropped := make(chan struct{})
			go func() { h.m.dropPrepared(0); close(dropped) }()
			<-entered
			done := make(chan error, 1)
			go func() { done <- c.call(h, sb.ID) }()
			waitParkedIn(t, ".(*table).waitOutThen(", 1)
			close(release)
			<-dropped
			if err := <-done; err != nil {
				t.Fatalf("%s during the drop: %v", c.name, err)
			}
		})
	}
}
