package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// sealedWarm seals a small warm image in a temp dir and returns its
// directory.
func sealedWarm(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	tmp := filepath.Join(root, ".tmp")
	final := filepath.Join(root, "warm")
	if err := os.MkdirAll(filepath.Join(tmp, "image"), 0o700); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(tmp, "image", "checkpoint.img")
	if err := os.WriteFile(img, []byte("pages and state"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := sealImage(tmp, final, manifest{Template: "t", RootFS: root}); err != nil {
		t.Fatal(err)
	}
	return final
}

// TestVerifyWarm: a warm image is checksummed once per manifest; a damaged
// image is refused by a new process (a new Manager), and by this one as
// soon as its manifest is rewritten.
func TestVerifyWarm(t *testing.T) {
	final := sealedWarm(t)
	m := &Manager{}
	if err := m.verifyWarm(final, "warm"); err != nil {
		t.Fatalf("a sound image: %v", err)
	}
	// Damaged behind our back, same size: this process trusts its check.
	if err := os.WriteFile(filepath.Join(final, "image", "checkpoint.img"), []byte("PAGES AND STATE"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := m.verifyWarm(final, "warm"); err != nil {
		t.Fatalf("a second check read the image again: %v", err)
	}
	if err := (&Manager{}).verifyWarm(final, "warm"); !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
		t.Fatalf("a new process took a damaged image: %v", err)
	}
	later := time.Now().Add(time.Second)
	if err := os.Chtimes(filepath.Join(final, "manifest.json"), later, later); err != nil {
		t.Fatal(err)
	}
	if err := m.verifyWarm(final, "warm"); !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
		t.Fatalf("a rewritten manifest was not checked again: %v", err)
	}
	if err := m.verifyWarm(filepath.Join(filepath.Dir(final), "none"), "warm"); !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
		t.Fatalf("a missing image: %v", err)
	}
}

// Creates that verify a warm image at once share one check; a check that
// failed is made again next time.
func TestVerifyWarmOnceForMany(t *testing.T) {
	final := sealedWarm(t)
	var mu sync.Mutex
	checks := 0
	broken := true
	checkWarm = func(dir, what string) (manifest, error) {
		mu.Lock()
		checks++
		fail := broken
		mu.Unlock()
		time.Sleep(50 * time.Millisecond) // long enough for the others to come
		if fail {
			return manifest{}, pandastack.Errorf(pandastack.ESnapshotCorrupt, "damaged")
		}
		return verifyImage(dir, what)
	}
	defer func() { checkWarm = verifyImage }()
	m := &Manager{}
	verifyAll := func() []error {
		errs := make([]error, 20)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = m.verifyWarm(final, "warm") }()
		}
		wg.Wait()
		return errs
	}
	for _, err := range verifyAll() {
		if !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
			t.Fatalf("a damaged image: %v", err)
		}
	}
	mu.Lock()
	broken, first := false, checks
	mu.Unlock()
	if first < 1 || first > 2 { // (a late one may start a second check after the first failed)
		t.Fatalf("20 creates at once made %d checks of the damaged image, want 1", first)
	}
	for _, err := range verifyAll() {
		if err != nil {
			t.Fatalf("after the damage went: %v", err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if checks != first+1 {
		t.Fatalf("%d checks of the sound image, want 1 (and the failed check made again)", checks-first)
	}
}

// A warm-up cut short by a shutdown leaves no sandbox running: the kill at
// its end cannot claim the sandbox once the manager is closing, so it must
// stop it some other way.
func TestWarmCutShortByCloseLeavesNothing(t *testing.T) {
	h := newHarness(t)
	h.rt.sparesHold, h.rt.sparesAsked = true, make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- h.m.Warm(ctx, h.tpls.tpl, "import x", filepath.Join(h.dir, "warm", "base")) }()
	<-h.rt.sparesAsked
	closed := make(chan struct{})
	go func() { h.m.Close(); close(closed) }()
	for !h.m.stopped() {
		time.Sleep(time.Millisecond)
	}
	cancel() // what a shutdown does to the warm-up's context
	if err := <-done; err == nil {
		t.Fatal("a warm-up cut short reported success")
	}
	<-closed
	h.rt.mu.Lock()
	defer h.rt.mu.Unlock()
	for id, b := range h.rt.boxes {
		if b.alive {
			t.Errorf("warm-up sandbox %s still running after the shutdown", id)
		}
	}
}

// TestKeepWarmFresh: the warm images a server uses are marked recent, so
// that no server sharing the cache removes them as stale; a spec whose
// image is not made yet is skipped.
func TestKeepWarmFresh(t *testing.T) {
	h := newHarness(t)
	used := filepath.Join(h.m.cfg.WarmDir, "base-made-two-days-ago")
	os.MkdirAll(used, 0o700)
	old := time.Now().Add(-48 * time.Hour)
	os.Chtimes(used, old, old)
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // one round, then return
	h.m.keepWarmFresh(ctx, []WarmSpec{
		{Template: Template{Name: "base", WarmImage: used}},
		{Template: Template{Name: "other", WarmImage: filepath.Join(h.m.cfg.WarmDir, "not-made-yet")}},
	})
	if fi, err := os.Stat(used); err != nil || time.Since(fi.ModTime()) > time.Hour {
		t.Fatalf("a warm image in use was not marked recent: %v", err)
	}
	h.m.removeStaleWarm(map[string]bool{})
	if _, err := os.Stat(used); err != nil {
		t.Fatalf("a warm image in use was removed as stale: %v", err)
	}
	if _, err := os.Stat(filepath.Join(h.m.cfg.WarmDir, "not-made-yet")); !os.IsNotExist(err) {
		t.Fatalf("marking made an image directory: %v", err)
	}
}

// TestWarmImagesStayMarkedAfterWarming: a server goes on marking its warm
// images in use after its warming is done, for as long as it runs (the
// marks stopped with the warming, so a day later another server or
// template gc could remove an image in use).
func TestWarmImagesStayMarkedAfterWarming(t *testing.T) {
	setFor(t, &warmTouchEvery, 20*time.Millisecond)
	h := newHarness(t)
	img := filepath.Join(h.m.cfg.WarmDir, "base-made-earlier")
	os.MkdirAll(img, 0o700) // made by an earlier start: nothing to warm
	tpl := h.tpls.tpl
	tpl.WarmImage = img
	h.m.StartWarming([]WarmSpec{{Template: tpl, Warmup: "x = 1"}})
	time.Sleep(300 * time.Millisecond) // the warming is long done
	old := time.Now().Add(-48 * time.Hour)
	os.Chtimes(img, old, old)
	time.Sleep(200 * time.Millisecond)
	if fi, err := os.Stat(img); err != nil || time.Since(fi.ModTime()) > time.Hour {
		t.Fatalf("the warm image was not marked again after the warming: %v", err)
	}
}

// A warm-up that fails says why (WarmError, shown by the template list),
// until a warming of that image succeeds; a template never warmed says
// nothing.
func TestWarmErrorSaysWhy(t *testing.T) {
	h := newHarness(t)
	tpl := h.tpls.tpl
	tpl.WarmImage = filepath.Join(h.m.cfg.WarmDir, "base-warm-error")
	if why := h.m.WarmError(tpl.WarmImage); why != "" {
		t.Fatalf("before any warming: %q", why)
	}
	h.m.warmOne(context.Background(), WarmSpec{Template: tpl, Warmup: "raise boom"})
	if why := h.m.WarmError(tpl.WarmImage); !strings.Contains(why, "the warm-up failed: raise boom") {
		t.Fatalf("after a failed warm-up: %q, want why", why)
	}
	if _, err := os.Stat(tpl.WarmImage); !os.IsNotExist(err) {
		t.Fatalf("a failed warm-up left an image: %v", err)
	}
	h.m.warmOne(context.Background(), WarmSpec{Template: tpl, Warmup: "import x"})
	if why := h.m.WarmError(tpl.WarmImage); why != "" {
		t.Fatalf("after a warm-up that worked: %q", why)
	}
}

// A template whose default is over the server's limits is not warmed and
// gets no pool or prepared container (a plain create of it is refused,
// and nothing else could use them); the template list says why.
func TestTemplateOverLimitsNotWarmed(t *testing.T) {
	h := newHarness(t)
	h.m.cfg.PoolSize = 1
	tpl := h.tpls.tpl
	tpl.MemoryMB = h.m.cfg.MaxMemoryMB + 1
	tpl.WarmImage = filepath.Join(h.m.cfg.WarmDir, "base-over")
	h.m.warmOne(context.Background(), WarmSpec{Template: tpl, Warmup: "import x"})
	if why := h.m.WarmError(tpl.WarmImage); !strings.Contains(why, "memory_mb") || !strings.Contains(why, "--max-memory-mb") {
		t.Errorf("WarmError = %q, want the limit named", why)
	}
	if _, err := os.Stat(tpl.WarmImage); !os.IsNotExist(err) {
		t.Errorf("a warm image was made: %v", err)
	}
	h.m.mu.Lock()
	pools := len(h.m.pools)
	h.m.mu.Unlock()
	if pools != 0 {
		t.Errorf("%d pools kept for a template no plain create may use", pools)
	}
}

// A template rebuilt while the server runs (template build --force) gets a
// new warm image. Warming it retires the pool of the build before, whose
// sandboxes restored the old image onto the new build's files and which
// no create took from any more; the old image is let go (no longer held
// in memory, nor marked in use, so gc removes it); and the new image has
// a pool, which creates take from.
func TestRebuiltTemplateRetiresItsPool(t *testing.T) {
	setFor(t, &warmTouchEvery, 20*time.Millisecond)
	h := newHarness(t)
	ctx := context.Background()
	h.m.cfg.PoolSize = 1
	tpl := h.tpls.tpl
	tpl.WarmImage = WarmImageDir(h.m.cfg.WarmDir, "base", "aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb")
	built := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	h.m.StartWarming([]WarmSpec{{Template: tpl, Warmup: "import x", Built: built}})
	waitFor(t, func() bool { return h.m.Pools(ctx)["base"].Ready == 1 })
	before := h.m.poolsNow()["base"].ids

	rebuilt := tpl
	rebuilt.WarmImage = filepath.Join(h.m.cfg.WarmDir, "base-rebuilt")
	h.m.WarmLater(WarmSpec{Template: rebuilt, Warmup: "import x", Built: built.Add(time.Hour)})
	poolOf := func() string {
		h.m.mu.Lock()
		defer h.m.mu.Unlock()
		if p := h.m.pools["base"]; p != nil {
			return p.tpl.WarmImage
		}
		return ""
	}
	waitFor(t, func() bool { return poolOf() == rebuilt.WarmImage && h.m.Pools(ctx)["base"].Ready == 1 })
	waitFor(t, func() bool {
		ids := h.rt.ids()
		return !slices.ContainsFunc(before, func(id string) bool { return slices.Contains(ids, id) })
	})
	if got := h.m.warmHeld.bytes(); got != fakePagesSize {
		t.Errorf("warm images held: %d bytes, want one image's %d", got, fakePagesSize)
	}
	old := time.Now().Add(-48 * time.Hour)
	os.Chtimes(tpl.WarmImage, old, old)
	time.Sleep(200 * time.Millisecond) // ten rounds of marks
	if fi, err := os.Stat(tpl.WarmImage); err != nil || time.Since(fi.ModTime()) < time.Hour {
		t.Errorf("the replaced warm image is still marked in use: %v", err)
	}

	h.tpls.tpl = rebuilt
	ready := h.m.poolsNow()["base"].ids
	sb := h.create()
	if !slices.Contains(ready, sb.ID) {
		t.Fatalf("create got %s, not the new pool's %v", sb.ID, ready)
	}
	h.m.Close()
	if ids := h.rt.ids(); !slices.Equal(ids, []string{sb.ID}) {
		t.Fatalf("after close the runtime holds %v, want only the created %s", ids, sb.ID)
	}
}

// Of two warm images of one template, the newer build's is kept whichever
// is warmed last: the server's start may reach a template after the
// warming of its rebuild began. An older build's warming is not started
// once a newer one is the template's, and one that was under way when the
// newer came gets no pool and no prepared container.
func TestRebuiltTemplateKeepsTheNewerBuild(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.m.cfg.PoolSize = 1
	built := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	older, newer := h.tpls.tpl, h.tpls.tpl
	older.WarmImage = filepath.Join(h.m.cfg.WarmDir, "base-older")
	newer.WarmImage = filepath.Join(h.m.cfg.WarmDir, "base-newer")

	h.m.WarmLater(WarmSpec{Template: newer, Warmup: "import x", Built: built.Add(time.Hour)})
	waitFor(t, func() bool { return h.m.Pools(ctx)["base"].Ready == 1 })
	h.m.StartWarming([]WarmSpec{{Template: older, Warmup: "import x", Built: built}})
	time.Sleep(200 * time.Millisecond) // its warming would be long done
	if _, err := os.Stat(older.WarmImage); !os.IsNotExist(err) {
		t.Errorf("the older build was warmed after the newer: %v", err)
	}
	h.m.mu.Lock()
	img := h.m.pools["base"].tpl.WarmImage
	h.m.mu.Unlock()
	if img != newer.WarmImage {
		t.Errorf("the template's pool restores %s, want the newer build's %s", img, newer.WarmImage)
	}

	// One whose warming was under way when the newer build came: the
	// newer retired it before it was done.
	h2 := newHarness(t)
	if !h2.m.retireWarm(WarmSpec{Template: older, Built: built}) || !h2.m.retireWarm(WarmSpec{Template: newer, Built: built.Add(time.Hour)}) {
		t.Fatal("a warming refused")
	}
	h2.m.EnablePool(older, 1)
	h2.m.enableStandby(older)
	if len(h2.m.Pools(ctx)) != 0 || len(h2.m.standbys) != 0 {
		t.Errorf("the older build got a pool (%v) or prepared containers (%d)", h2.m.Pools(ctx), len(h2.m.standbys))
	}
}
