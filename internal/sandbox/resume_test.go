package sandbox

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
	"github.com/pandastack/pandastack/internal/imagestore"
)

func (r *fakeRuntime) setups(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.envSets[id]
}

// A sandbox this process paused resumes without being set up again (its
// image holds the CA bundle and variables its setup left); after a server
// restart the same image is set up again, and checked in full.
func TestResumeOwnAndForeignImages(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.m.UseSandboxCA([]byte("-----BEGIN CERTIFICATE-----\n"))
	sb := h.create()
	h.exec(sb.ID, "set v=kept")
	if n := h.rt.setups(sb.ID); n != 1 {
		t.Fatalf("create set the sandbox up %d times, want 1", n)
	}
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	// resume resumes sb, checks its state, and that it was set up setups
	// times in all.
	resume := func(what string, setups int) {
		t.Helper()
		if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
			t.Fatal(err)
		}
		if out, err := h.exec(sb.ID, "get v"); err != nil || out != "kept" {
			t.Fatalf("after %s: %q %v", what, out, err)
		}
		if n := h.rt.setups(sb.ID); n != setups {
			t.Fatalf("set up %d times in all after %s, want %d", n, what, setups)
		}
	}
	resume("resuming its own image", 1)
	if _, ok := h.m.ownPaused.Load(sb.ID); ok {
		t.Fatal("the record of the paused image outlived the resume")
	}
	if _, err := os.Stat(h.m.pausedPath(sb.ID)); !os.IsNotExist(err) {
		t.Fatalf("the image is still in place after the resume: %v", err)
	}

	// Paused, then the server restarts: the image is not this process's.
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	// Close waited for the delete of the resumed image: only the new
	// pause's image is left.
	if ents, err := os.ReadDir(h.m.cfg.PausedDir); err != nil || len(ents) != 1 || ents[0].Name() != sb.ID {
		t.Fatalf("paused dir after close: %v %v, want only %s", ents, err, sb.ID)
	}
	h.m = h.newManager()
	// The restarted server trusts other certificates: the image's are
	// replaced (with the same ones, caMarker would spare the setup).
	h.m.UseSandboxCA([]byte("-----BEGIN CERTIFICATE-----\nnew\n"))
	resume("a resume across a restart", 2)
}

// An image altered while its server was down fails its checksum on resume
// and the sandbox stays paused; so does one this process paused whose
// manifest was rewritten since.
func TestResumeVerifiesImagesItDidNotJustWrite(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	alter := func(id string) {
		t.Helper()
		p := filepath.Join(h.m.pausedPath(id), imagestore.FilesDir, "state.json")
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)-2] ^= 1 // same size, other bytes
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	a, b := h.create(), h.create()
	for _, sb := range []pandastack.Sandbox{a, b} {
		if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	// b: the manifest is rewritten (as a new image in the same place would
	// be), so the record of this process no longer vouches for it.
	alter(b.ID)
	mf := filepath.Join(h.m.pausedPath(b.ID), imagestore.ManifestName)
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(mf, later, later); err != nil {
		t.Fatal(err)
	}
	_, err := h.m.Resume(ctx, project, b.ID)
	wantCode(t, err, pandastack.ESnapshotCorrupt)

	// a: altered across a restart.
	h.m.Close()
	alter(a.ID)
	h.m = h.newManager()
	_, err = h.m.Resume(ctx, project, a.ID)
	wantCode(t, err, pandastack.ESnapshotCorrupt)
	for _, sb := range []pandastack.Sandbox{a, b} {
		if rec := h.record(sb.ID); rec.State != pandastack.StatePaused {
			t.Fatalf("%s after a refused resume: %s, want paused", sb.ID, rec.State)
		}
		if h.rt.Alive(sb.ID) {
			t.Fatalf("%s runs after a refused resume", sb.ID)
		}
	}
}

// The contexts a session knew before a pause are known to the session
// after the resume of that image, so the default context's first run after
// a resume need not ask the agent; after a server restart none is known.
func TestResumeKnowsThePausedContexts(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create()
	c, done, err := h.m.Acquire(ctx, project, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.CreateContext(ctx, agentproto.ContextRequest{ID: DefaultContextID("python"), Language: "python"})
	done()
	if err != nil {
		t.Fatal(err)
	}
	known := func(what string, want bool) {
		t.Helper()
		c, done, err := h.m.Acquire(ctx, project, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		defer done()
		if got := c.HasContext(DefaultContextID("python")); got != want {
			t.Fatalf("%s: the default context known %v, want %v", what, got, want)
		}
	}
	for range 2 { // twice: the second pause records what the resume knew
		if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
			t.Fatal(err)
		}
		known("after resuming its own image", true)
	}
	// A restore that failed and was tried again (its image checked in
	// between, which forgets what this process knew of it) knows them too.
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	calls := h.rt.failRestoreOnce(errInjected)
	if _, err := h.m.Resume(ctx, project, sb.ID); err != nil || *calls != 2 {
		t.Fatalf("resume tried again: %v, %d restores", err, *calls)
	}
	h.rt.restoreErr = nil
	known("after a resume tried again", true)

	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	h.m = h.newManager()
	if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	known("after a resume across a restart", false)
}

// A restore that fails on a disk with less room than its image takes says
// the disk is full (runsc says nothing); with room, the error stays.
func TestRoomError(t *testing.T) {
	image := t.TempDir()
	cause := errors.New("runsc restore: exit status 128: ")
	if err := roomError(cause, image, "", "the sandbox stays paused"); err != cause {
		t.Errorf("an empty image: %v", err)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(image, &st); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(image, "pages.img"))
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(int64(st.Bavail)*int64(st.Bsize) + 1<<30) // sparse: takes no room
	f.Close()
	err = roomError(cause, image, "", "the sandbox stays paused")
	if !pandastack.IsCode(err, pandastack.EStorage) || !strings.Contains(pandastack.ErrorMessage(err), "the sandbox stays paused") {
		t.Errorf("an image larger than the room left: %v", err)
	}
}

// The room looked at is that of the filesystem the sandbox's disk is
// written to (the runtime's state directory), not the image's: a warm
// template's image is in the cache directory, which may be another
// filesystem.
func TestRoomErrorLooksWhereTheDiskGoes(t *testing.T) {
	image, disks := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(image, "pages.img"), make([]byte, 3<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	free := map[string]int64{image: 1 << 40, disks: 1 << 20} // the image's roomy, the disks' 1 MiB
	defer func(f func(string) (int64, error)) { freeBytes = f }(freeBytes)
	var asked []string
	freeBytes = func(dir string) (int64, error) {
		asked = append(asked, dir)
		return free[dir], nil
	}
	cause := errors.New("runsc restore: exit status 128: ")
	err := roomError(cause, image, disks, "the sandbox was not created")
	if !pandastack.IsCode(err, pandastack.EStorage) || !strings.Contains(pandastack.ErrorMessage(err), "1 MiB free") {
		t.Errorf("disks' filesystem short of room: %v", err)
	}
	free[image], free[disks] = 1<<20, 1<<40
	if err := roomError(cause, image, disks, "the sandbox was not created"); err != cause {
		t.Errorf("the image's filesystem short, the disks' roomy: %v, want the error as it was", err)
	}
	if !slices.Equal(asked, []string{disks, disks}) {
		t.Errorf("asked the room of %q, want the disks' directory's twice", asked)
	}
}

// A paused image this process wrote, damaged in place (its manifest
// untouched), fails its resume; the failure looks at its files and says
// it is damaged (it said the host may be overloaded, every time), and the
// next resume checks it first.
func TestResumeOfADamagedOwnImageSaysSo(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create()
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(h.m.pausedPath(sb.ID), imagestore.FilesDir, "state.json")
	if err := os.Truncate(p, 3); err != nil {
		t.Fatal(err)
	}
	_, err := h.m.Resume(ctx, project, sb.ID)
	wantCode(t, err, pandastack.ESnapshotCorrupt)
	_, err = h.m.Resume(ctx, project, sb.ID)
	wantCode(t, err, pandastack.ESnapshotCorrupt)
	if rec := h.record(sb.ID); rec.State != pandastack.StatePaused {
		t.Fatalf("after the refused resumes: %s, want paused", rec.State)
	}
}

// A paused image a restart found is checked in full once, and then trusted
// while its manifest stays the same file: each fork or snapshot of a
// sandbox paused before the restart read all of it again. Forgotten (the
// image went, or a resume of it failed) or rewritten, it is checked again.
func TestVerifyPausedOncePerManifest(t *testing.T) {
	// damaged makes a sound image and has this process check it, then
	// damages it behind its back, same size.
	damaged := func(t *testing.T) (*Manager, string) {
		dir := sealedWarm(t)
		m := &Manager{}
		if _, err := m.verifyPaused("sb", dir, "paused"); err != nil {
			t.Fatalf("a sound image: %v", err)
		}
		if err := os.WriteFile(filepath.Join(dir, "image", "checkpoint.img"), []byte("PAGES AND STATE"), 0o600); err != nil {
			t.Fatal(err)
		}
		return m, dir
	}
	t.Run("trusted once checked", func(t *testing.T) {
		m, dir := damaged(t)
		if man, err := m.verifyPaused("sb", dir, "paused"); err != nil || man.Template != "t" {
			t.Fatalf("a second look read the image again: %+v %v", man, err)
		}
		if _, err := (&Manager{}).verifyPaused("sb", dir, "paused"); !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
			t.Fatalf("a new process took a damaged image: %v", err)
		}
	})
	t.Run("forgotten", func(t *testing.T) {
		m, dir := damaged(t)
		m.forgetPaused("sb")
		if _, err := m.verifyPaused("sb", dir, "paused"); !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
			t.Fatalf("a forgotten image was not checked again: %v", err)
		}
	})
	t.Run("rewritten", func(t *testing.T) {
		m, dir := damaged(t)
		later := time.Now().Add(time.Minute)
		if err := os.Chtimes(filepath.Join(dir, imagestore.ManifestName), later, later); err != nil {
			t.Fatal(err)
		}
		if _, err := m.verifyPaused("sb", dir, "paused"); !pandastack.IsCode(err, pandastack.ESnapshotCorrupt) {
			t.Fatalf("a rewritten manifest was not checked again: %v", err)
		}
	})
}

// A sandbox that dies during its resume, before its hello, is found gone
// while the hello waits, logged, and restored once more from its image:
// the resume succeeds with the sandbox's state. Two deaths in a row fail
// the resume long before its timeout, and the sandbox stays paused, its
// image there for the next resume.
func TestResumeRestoresAgainAfterADeadStart(t *testing.T) {
	h := watchingHarness(t)
	ctx := context.Background()
	sb := h.create()
	h.exec(sb.ID, "set v=kept")
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.rt.deadBoots = 1
	if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
		t.Fatalf("resume after one dead restore: %v", err)
	}
	if got, err := h.exec(sb.ID, "get v"); got != "kept" || err != nil {
		t.Errorf("the sandbox restored again holds %q %v, want kept", got, err)
	}
	joined := strings.Join(h.logs.with("sandbox="+sb.ID), "\n")
	if !strings.Contains(joined, "the sandbox died during its start") || !strings.Contains(joined, "restoring the sandbox again") || !strings.Contains(joined, "dead_agent_ms") {
		t.Errorf("log of the resume:\n%s", joined)
	}

	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.rt.deadBoots = 2
	start := time.Now()
	_, err := h.m.Resume(ctx, project, sb.ID)
	wantCode(t, err, pandastack.EInternal)
	if msg := pandastack.ErrorMessage(err); !strings.Contains(msg, "died during its resume") || !strings.Contains(msg, "stays paused") {
		t.Errorf("the user is told %q", msg)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("two dead restores took %s to fail", took)
	}
	if rec := h.record(sb.ID); rec.State != pandastack.StatePaused {
		t.Fatalf("after two dead restores: %s, want paused", rec.State)
	}
	if ids := h.rt.ids(); len(ids) != 0 {
		t.Errorf("runtime holds %v after the failed resume, want nothing", ids)
	}
	if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
		t.Fatalf("the next resume: %v", err)
	}
	if got, err := h.exec(sb.ID, "get v"); got != "kept" || err != nil {
		t.Errorf("after the next resume: %q %v, want kept", got, err)
	}
}

// A resume whose restore the runtime fails with no cause the server can
// name is restored once more.
func TestResumeRestoresAgainAfterAnUnexplainedRuntimeFailure(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	sb := h.create()
	h.exec(sb.ID, "set v=kept")
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	calls := h.rt.failRestoreOnce(errInjected)
	if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
		t.Fatalf("resume after one failed restore: %v", err)
	}
	if got, err := h.exec(sb.ID, "get v"); got != "kept" || err != nil || *calls != 2 {
		t.Errorf("after the resume: %q %v, %d restores", got, err, *calls)
	}
}

// A resume whose restore is refused for a cause (a coded error) is not
// tried again; and one whose own image was damaged after the pause, its
// sandbox dying during the restore, is checked before it is tried again:
// the damage is found, and the sandbox stays paused.
func TestResumeIsNotTriedAgainWhenRefusedOrDamaged(t *testing.T) {
	h := watchingHarness(t)
	ctx := context.Background()
	sb := h.create()
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	calls := 0
	h.rt.restoreErr = func(pandastack.RuntimeSpec) error {
		calls++
		return pandastack.Errorf(pandastack.ESnapshotCorrupt, "damaged")
	}
	_, err := h.m.Resume(ctx, project, sb.ID)
	wantCode(t, err, pandastack.ESnapshotCorrupt)
	if calls != 1 {
		t.Errorf("a refused restore was tried %d times, want once", calls)
	}
	// (That failure had the image checked: a new sandbox's, trusted as
	// this process wrote it.)
	h.rt.restoreErr = nil
	sb = h.create()
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	pages := filepath.Join(h.m.pausedPath(sb.ID), "image", "pages.img")
	if err := os.WriteFile(pages, make([]byte, fakePagesSize-1), 0o600); err != nil {
		t.Fatal(err)
	}
	h.rt.deadBoots = 1
	_, err = h.m.Resume(ctx, project, sb.ID)
	wantCode(t, err, pandastack.ESnapshotCorrupt)
	if rec := h.record(sb.ID); rec.State != pandastack.StatePaused {
		t.Fatalf("after the resume of a damaged image: %s, want paused", rec.State)
	}
}

// A resume tried again after a restore whose clean-up released the
// sandbox's network policy restores with the policy set while it was
// paused, not the one of pause time.
func TestResumeTriedAgainKeepsThePolicy(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	net := useFakeNet(h)
	sb := h.create()
	if _, err := h.m.SetNetwork(ctx, project, sb.ID, pandastack.NetworkPolicy{AllowInternetAccess: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.SetNetwork(ctx, project, sb.ID, pandastack.NetworkPolicy{AllowInternetAccess: false}); err != nil {
		t.Fatal(err)
	}
	calls := 0
	h.rt.restoreErr = func(spec pandastack.RuntimeSpec) error {
		if calls++; calls == 1 {
			net.release(spec.ID) // as the network runtime's restore does on failure
			return errInjected
		}
		if spec.Network != nil && spec.Network.AllowInternetAccess {
			t.Errorf("the second restore applies the policy of pause time: %+v", *spec.Network)
		}
		return nil
	}
	if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if p, ok := net.Policy(sb.ID); !ok || p.AllowInternetAccess || calls != 2 {
		t.Fatalf("policy after the resume: %+v %v (%d restores), want the one set while paused (no internet)", p, ok, calls)
	}
}

// The resume of an image a restart found sets the sandbox up again; a
// sandbox that dies during that setup, after its hello, is found gone at
// once (the setup's request does not wait for the silent agent) and is
// restored and set up once more.
func TestResumeRestoresAgainAfterADeathInItsSetup(t *testing.T) {
	h := watchingHarness(t)
	ctx := context.Background()
	sb := h.create()
	h.exec(sb.ID, "set v=kept")
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	h.m = h.newManager()
	h.m.cfg.StartTimeout = 20 * time.Second
	h.m.UseSandboxCA([]byte("-----BEGIN CERTIFICATE-----\nA\n"))
	h.rt.setupDeaths = 1
	start := time.Now()
	if _, err := h.m.Resume(ctx, project, sb.ID); err != nil {
		t.Fatalf("resume after a death in its setup: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the resume took %s", took)
	}
	if got, err := h.exec(sb.ID, "get v"); got != "kept" || err != nil {
		t.Errorf("the sandbox restored again holds %q %v, want kept", got, err)
	}
	if got, err := h.exec(sb.ID, "get file:"+caMarker); got == "" || err != nil {
		t.Errorf("the sandbox restored again has no CA marker: %q %v", got, err)
	}
	joined := strings.Join(h.logs.with("sandbox="+sb.ID), "\n")
	if !strings.Contains(joined, "restoring the sandbox again") || !strings.Contains(joined, "dead_setup_ms") {
		t.Errorf("log of the resume:\n%s", joined)
	}
}

// A pool refill whose sandbox dies on its way up is found gone while its
// hello waits (not at the hello's timeout), and the next refill fills the
// pool.
func TestPoolRefillEndsWhenItsSandboxDies(t *testing.T) {
	h := watchingHarness(t)
	first := true
	h.rt.restoreErr = func(pandastack.RuntimeSpec) error {
		if first { // called with h.rt.mu held, before the boot
			first = false
			h.rt.deadBoots = 1
		}
		return nil
	}
	tpl := h.tpls.tpl
	tpl.WarmImage = WarmImageDir(h.m.cfg.WarmDir, "base", "aaaaaaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb")
	h.m.cfg.PoolSize = 1
	start := time.Now()
	h.m.StartWarming([]WarmSpec{{Template: tpl, Warmup: "import x"}})
	waitFor(t, func() bool { return len(h.logs.with("the sandbox died during its start")) == 1 })
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("the dead refill was found after %s", took)
	}
	waitFor(t, func() bool { return h.m.Pools(context.Background())["base"].Ready == 1 })
}
