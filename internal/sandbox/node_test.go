package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// nodeHarness is a manager that is node id, on its own fake runtime and
// directories, sharing shared's store (nil: a new store). Heartbeats are
// left to the test (the loop's interval is an hour).
func nodeHarness(t *testing.T, id string, shared *harness, opts ...func(*NodeConfig)) *harness {
	t.Helper()
	var h *harness
	if shared == nil {
		h = newHarness(t)
		h.m.Close()
	} else {
		dir := t.TempDir()
		rootfs := filepath.Join(dir, "rootfs")
		os.MkdirAll(rootfs, 0o700)
		h = &harness{t: t, dir: dir, rt: newFakeRuntime(), store: shared.store, tpls: &fakeTemplates{tpl: Template{Name: "base", RootFS: rootfs, CPU: 1, MemoryMB: 256}}}
	}
	h.node = NodeConfig{ID: id, URL: "http://" + id + ".test", Heartbeat: time.Hour, Grace: 10 * time.Second}
	for _, o := range opts {
		o(&h.node) // before the manager's heartbeat starts reading it
	}
	h.m = h.newManager()
	return h
}

// Two nodes on one store: the reaper, KillAll and recovery of one leave
// the other's sandboxes alone, and each record names its node.
func TestNodesActOnOwnSandboxes(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	b := nodeHarness(t, "node-b", a)
	sa, sb := a.create(), b.create()
	b.exec(sb.ID, "set v=still")
	if sa.NodeID != "node-a" || a.record(sa.ID).NodeID != "node-a" || b.record(sb.ID).NodeID != "node-b" {
		t.Fatalf("records name nodes %q and %q", a.record(sa.ID).NodeID, b.record(sb.ID).NodeID)
	}
	for _, id := range []string{sa.ID, sb.ID} {
		a.store.SetSandboxExpiry(ctx, id, time.Now().Add(-time.Second))
	}
	a.m.reapOnce()
	if rec := a.record(sa.ID); rec.State != pandastack.StateStopped || rec.StopReason != pandastack.StopExpired {
		t.Errorf("A's expired sandbox: %s %s", rec.State, rec.StopReason)
	}
	if rec := a.record(sb.ID); rec.State != pandastack.StateRunning {
		t.Errorf("A's reaper touched B's sandbox: %s %s", rec.State, rec.StopReason)
	}
	b.store.SetSandboxExpiry(ctx, sb.ID, time.Now().Add(time.Hour))

	// A restarts: B's running sandbox is not A's to adopt or call lost.
	a.m.Close()
	a.m = a.newManager()
	if rec := a.record(sb.ID); rec.State != pandastack.StateRunning {
		t.Errorf("A's recovery touched B's sandbox: %s %s", rec.State, rec.StopReason)
	}
	if out, err := b.exec(sb.ID, "get v"); err != nil || out != "still" {
		t.Errorf("B's sandbox after A restarted: %q %v", out, err)
	}

	a2 := a.create()
	a.m.KillAll(ctx)
	if _, err := a.store.GetSandbox(ctx, "", a2.ID); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Errorf("A's KillAll left its sandbox: %v", err)
	}
	if rec := a.record(sb.ID); rec.State != pandastack.StateRunning {
		t.Errorf("A's KillAll touched B's sandbox: %s %s", rec.State, rec.StopReason)
	}
	if ids := b.rt.ids(); !slices.Equal(ids, []string{sb.ID}) {
		t.Errorf("B's runtime holds %v, want %s", ids, sb.ID)
	}
	// Requests about B's sandbox go to B; about A's own, A answers.
	if url, err := a.m.Remote(ctx, project, sb.ID); err != nil || url != "http://node-b.test" {
		t.Errorf("Remote of B's sandbox from A = %q, %v", url, err)
	}
	if url, err := b.m.Remote(ctx, project, sb.ID); err != nil || url != "" {
		t.Errorf("Remote of B's sandbox from B = %q, %v", url, err)
	}
}

// A node silent for the grace period is lost: a survivor stops its
// sandboxes as lost. The lost node, coming back, drops what it still runs.
func TestLostNode(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	b := nodeHarness(t, "node-b", a)
	sa, sb := a.create(), b.create()

	c := &clock{t: time.Now().Add(time.Minute)} // A's clock: B last heartbeat a minute ago
	a.m.now = c.now
	if err := a.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := a.record(sb.ID); rec.State != pandastack.StateStopped || rec.StopReason != pandastack.StopLost {
		t.Errorf("B's sandbox after B went silent: %s %s, want stopped lost", rec.State, rec.StopReason)
	}
	if rec := a.record(sa.ID); rec.State != pandastack.StateRunning {
		t.Errorf("A's own sandbox: %s %s", rec.State, rec.StopReason)
	}
	// Counted where operators alert on users' sandboxes ending.
	if got := a.m.metrics.stops.Value(pandastack.StopLost); got != 1 {
		t.Errorf("stops lost on A, which found B lost: %v, want 1", got)
	}
	if url, err := a.m.Remote(ctx, project, sb.ID); err != nil || url != "" {
		t.Errorf("Remote of a lost sandbox = %q, %v; A answers it from the store", url, err)
	}
	nodes, _ := a.store.ListNodes(ctx)
	for _, n := range nodes {
		if want := map[string]pandastack.NodeState{"node-a": pandastack.NodeUp, "node-b": pandastack.NodeLost}[n.ID]; n.State != want {
			t.Errorf("node %s is %s, want %s", n.ID, n.State, want)
		}
	}

	// A sandbox of B deleted through A meanwhile (a kill of a lost
	// sandbox removes its record).
	deleted := b.create()
	if err := a.store.DeleteSandbox(ctx, deleted.ID); err != nil {
		t.Fatal(err)
	}

	// B was only stalled: its next heartbeat finds it lost, drops the
	// sandboxes it still runs, and it is up again.
	if err := b.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := b.rt.ids(); len(ids) != 0 {
		t.Errorf("B still runs %v after it learnt they were lost", ids)
	}
	if got := b.m.entryIDs(); len(got) != 0 {
		t.Errorf("B still holds entries %v", got)
	}
	if _, err := b.m.Agent(ctx, project, sb.ID); !pandastack.IsCode(err, pandastack.EStopped) {
		t.Errorf("a lost sandbox answers %v, want %s", err, pandastack.EStopped)
	}
	again := b.create()
	b.exec(again.ID, "set v=ok")
	if out, err := b.exec(again.ID, "get v"); err != nil || out != "ok" {
		t.Errorf("B after it came back: %q %v", out, err)
	}
}

// A node lost while it stalled, then forgotten (`nodes forget`: its row
// goes), drops what it still runs of its sandboxes when it wakes, as one
// that finds itself lost does: they kept running, unreachable, until
// the server restarted.
func TestForgottenStalledNodeDropsItsLost(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	b := nodeHarness(t, "node-b", a)
	sb := b.create()
	if err := b.m.heartbeat(ctx); err != nil { // B has heartbeated
		t.Fatal(err)
	}
	c := &clock{t: time.Now().Add(time.Minute)}
	a.m.now = c.now
	if err := a.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := a.record(sb.ID); rec.State != pandastack.StateStopped || rec.StopReason != pandastack.StopLost {
		t.Fatalf("B's sandbox after B went silent: %s %s", rec.State, rec.StopReason)
	}
	if _, err := a.store.ForgetNode(ctx, "node-b", time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := b.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := b.rt.ids(); len(ids) != 0 {
		t.Errorf("B, forgotten while it stalled, still runs %v", ids)
	}
}

// Nodes each with a snapshot store of its own disk: a restore through the
// other node says where the files are, not to delete the snapshot.
func TestRestoreOfAnotherNodesLocalSnapshot(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	b := nodeHarness(t, "node-b", a)
	snap, err := a.m.Snapshot(ctx, project, a.create().ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.m.heartbeat(ctx); err != nil { // B learns of A
		t.Fatal(err)
	}
	_, err = b.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
	wantCode(t, err, pandastack.ESnapshotCorrupt)
	if msg := pandastack.ErrorMessage(err); !strings.Contains(msg, "s3://") || strings.Contains(msg, "delete it") {
		t.Errorf("a restore of a snapshot on another node's disk: %q", msg)
	}
}

// A lost node's paused sandboxes stay paused: their image is on its disk.
// Another node answers a resume of one 503, and expires it when its TTL
// ends; the node, back, resumes the other.
func TestLostNodeKeepsPaused(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	b := nodeHarness(t, "node-b", a)
	kept, expiring := b.create(), b.create()
	b.exec(kept.ID, "set v=kept")
	for _, sb := range []pandastack.Sandbox{kept, expiring} {
		if _, err := b.m.Pause(ctx, project, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	c := &clock{t: time.Now().Add(time.Minute)}
	a.m.now = c.now
	if err := a.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{kept.ID, expiring.ID} {
		if rec := a.record(id); rec.State != pandastack.StatePaused {
			t.Fatalf("B's paused sandbox after B was lost: %s %s, want paused", rec.State, rec.StopReason)
		}
	}
	if _, err := a.m.Resume(ctx, project, kept.ID); !pandastack.IsCode(err, pandastack.EUnavailable) || !strings.Contains(err.Error(), "node-b") {
		t.Errorf("a resume on A of B's paused sandbox: %v, want %s naming node-b", err, pandastack.EUnavailable)
	}
	// Other work that needs it says the same, not "resume it first".
	// Paused as asked (no auto_resume): the node's return alone does not
	// resume it, and the message says what will.
	if _, err := a.m.Agent(ctx, project, kept.ID); !pandastack.IsCode(err, pandastack.EUnavailable) || !strings.Contains(err.Error(), "node-b") || !strings.Contains(err.Error(), "/resume") {
		t.Errorf("work on A in B's paused sandbox: %v, want %s naming node-b and the resume", err, pandastack.EUnavailable)
	}
	if _, err := a.m.Snapshot(ctx, project, kept.ID, nil); !pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Errorf("a snapshot on A of B's paused sandbox: %v, want %s", err, pandastack.EUnavailable)
	}
	if _, err := a.m.Fork(ctx, project, kept.ID, 1, nil, nil); !pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Errorf("a fork on A of B's paused sandbox: %v, want %s", err, pandastack.EUnavailable)
	}
	a.store.SetSandboxExpiry(ctx, expiring.ID, time.Now().Add(-time.Second))
	var stopped []string
	a.rt.stopHook = func(id string) { stopped = append(stopped, id) }
	a.m.reapOnce()
	if slices.Contains(stopped, expiring.ID) {
		t.Errorf("A's runtime was asked to stop %s, which it never ran", expiring.ID)
	}
	if rec := a.record(expiring.ID); rec.State != pandastack.StateStopped || rec.StopReason != pandastack.StopExpired {
		t.Errorf("B's paused sandbox past its TTL, reaped by A: %s %s", rec.State, rec.StopReason)
	}
	if rec := a.record(kept.ID); rec.State != pandastack.StatePaused {
		t.Errorf("the reaper of A took B's paused sandbox within its TTL: %s", rec.State)
	}
	// B comes back: it drops the image A expired, keeps the other, and
	// resumes it with its state.
	if err := b.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.m.pausedPath(expiring.ID)); !os.IsNotExist(err) {
		t.Errorf("B kept the image of the sandbox A expired: %v", err)
	}
	if _, err := os.Stat(b.m.pausedPath(kept.ID)); err != nil {
		t.Errorf("B lost the image of its paused sandbox: %v", err)
	}
	if _, err := b.m.Resume(ctx, project, kept.ID); err != nil {
		t.Fatalf("resume on B, back: %v", err)
	}
	if out, err := b.exec(kept.ID, "get v"); err != nil || out != "kept" {
		t.Errorf("B's sandbox after its resume: %q %v", out, err)
	}
}

// An outage of the store longer than the grace period loses no node: when
// it ends every heartbeat is old because nobody could write one. A node
// judges others only once it has heartbeated for a whole grace period
// since its last failure; then a node that stays silent is lost.
func TestStoreOutageLosesNoNode(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	b := nodeHarness(t, "node-b", a)
	sb := b.create()
	start := time.Now()
	c := &clock{t: start}
	a.m.now, b.m.now = c.now, c.now
	down, cancel := context.WithCancel(ctx)
	cancel() // the store cannot be reached
	if err := a.m.heartbeat(down); err == nil {
		t.Fatal("a heartbeat through a dead connection succeeded")
	}
	c.t = start.Add(15 * time.Second) // the outage outlasts the 10 s grace
	if err := a.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := a.record(sb.ID); rec.State != pandastack.StateRunning {
		t.Fatalf("B's sandbox after the store came back: %s %s, want running", rec.State, rec.StopReason)
	}
	if err := b.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if ids := b.rt.ids(); !slices.Equal(ids, []string{sb.ID}) {
		t.Fatalf("B runs %v after the outage, want %s", ids, sb.ID)
	}
	// B goes silent; A heartbeats on, and after a grace period it judges.
	for i := 1; i <= 12; i++ {
		c.t = start.Add(15*time.Second + time.Duration(i)*time.Second)
		if err := a.m.heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if rec := a.record(sb.ID); rec.State != pandastack.StateStopped || rec.StopReason != pandastack.StopLost {
		t.Errorf("B's sandbox after B was silent for the grace period: %s %s, want stopped lost", rec.State, rec.StopReason)
	}
}

// Placement spreads creates over equal nodes, following what each has
// committed; a create asked of A may land on B.
func TestPlaceSpreads(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	b := nodeHarness(t, "node-b", a)
	if url, err := a.m.Place(ctx, project, CreateRequest{Template: "base"}); err != nil || url != "" {
		t.Fatalf("A places on %q, %v before its heartbeat saw B", url, err)
	}
	if err := a.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	on := map[string]*harness{"": a, "http://node-b.test": b}
	count := map[string]int{}
	for range 4 {
		url, err := a.m.Place(ctx, project, CreateRequest{Template: "base"})
		if err != nil {
			t.Fatal(err)
		}
		h, ok := on[url]
		if !ok {
			t.Fatalf("placed on unknown %q", url)
		}
		count[h.node.ID]++
		h.create()
	}
	if count["node-a"] != 2 || count["node-b"] != 2 {
		t.Errorf("4 creates placed %v, want 2 on each", count)
	}
	// Without nodes there is nothing to place.
	h := newHarness(t)
	if url, err := h.m.Place(ctx, project, CreateRequest{}); err != nil || url != "" {
		t.Errorf("Place without nodes = %q, %v", url, err)
	}
}

// A node says once when it first sees another up, which is when it may
// place creates there; a lost one is not announced.
func TestNodeSeenLogged(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	b := nodeHarness(t, "node-b", a)
	for range 2 {
		if err := a.m.heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.logs.with(`msg="node seen"`); len(got) != 1 || !strings.Contains(got[0], "node=node-b") || !strings.Contains(got[0], "url=http://node-b.test") {
		t.Errorf("A's log of nodes seen: %q, want node-b once", got)
	}
	if got := b.logs.with(`msg="node seen" node=node-b`); len(got) != 0 {
		t.Errorf("B announced itself: %q", got)
	}
	// C joins and goes silent before B's next heartbeat: B finds it lost.
	c := nodeHarness(t, "node-c", a)
	c.m.Close()
	clk := &clock{t: time.Now().Add(time.Minute)}
	b.m.now = clk.now
	if err := b.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.logs.with(`msg="node seen" node=node-c`); len(got) != 0 {
		t.Errorf("B announced a lost node: %q", got)
	}
}

// A pause under way while its node is found lost (a stall during the
// checkpoint) does not write paused over the record that says lost.
func TestPauseDuringLossKeepsLost(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	b := nodeHarness(t, "node-b", a)
	sb := b.create()
	c := &clock{t: time.Now().Add(time.Minute)}
	a.m.now = c.now
	b.rt.checkpointErr = func(string) error {
		if err := a.m.heartbeat(ctx); err != nil { // B is silent meanwhile
			t.Error(err)
		}
		return nil
	}
	if _, err := b.m.Pause(ctx, project, sb.ID); !pandastack.IsCode(err, pandastack.EStopped) {
		t.Errorf("a pause during the loss: %v, want %s", err, pandastack.EStopped)
	}
	if rec := a.record(sb.ID); rec.State != pandastack.StateStopped || rec.StopReason != pandastack.StopLost {
		t.Errorf("after the pause: %s %s, want stopped lost", rec.State, rec.StopReason)
	}
	if _, err := os.Stat(b.m.pausedPath(sb.ID)); !os.IsNotExist(err) {
		t.Errorf("the pause's image was kept: %v", err)
	}
}

// A second server started with a live node's id does not start, whether
// it advertises another URL or the same one (a copied configuration on
// another data directory), and the live node's sandbox stays running;
// started after that node stopped heartbeating (a restart elsewhere), it
// takes over the id; and a restart on the same data directory goes on at
// once.
func TestDuplicateNodeIDRefused(t *testing.T) {
	ctx := context.Background()
	// A heartbeats on its own, as a live server does, until it closes.
	a := nodeHarness(t, "node-a", nil, func(n *NodeConfig) { n.Heartbeat = 200 * time.Millisecond })
	sa := a.create()
	dir := t.TempDir()
	started := filepath.Join(dir, "node-started")
	start := func(url string) error {
		node := NodeConfig{ID: "node-a", URL: url, Heartbeat: a.node.Heartbeat, Grace: 10 * time.Second, StartedFile: started}
		m := New(Config{SnapshotDir: filepath.Join(dir, "s"), PausedDir: filepath.Join(dir, "p"), WarmDir: filepath.Join(dir, "w"), ReapInterval: time.Hour, Node: node},
			a.store, newFakeRuntime(), a.tpls, a.m.log)
		err := m.Start(ctx)
		m.Close()
		return err
	}
	for _, url := range []string{"http://elsewhere.test", a.node.URL} {
		if err := start(url); err == nil || !strings.Contains(err.Error(), `node id "node-a" is in use by a running server at http://node-a.test`) {
			t.Errorf("a second server of a live node's id, at %s, started: %v", url, err)
		}
	}
	if rec := a.record(sa.ID); rec.State != pandastack.StateRunning {
		t.Errorf("the live node's sandbox after the duplicates' starts: %s %s", rec.State, rec.StopReason)
	}
	a.m.Close()

	// A no longer heartbeats: a server of its id elsewhere starts (after
	// watching the record stand still), and its restart on the same data
	// directory does not wait.
	if err := start("http://elsewhere.test"); err != nil {
		t.Fatalf("the id's server moved elsewhere: %v", err)
	}
	watched := len(a.logs.with("waiting to see whether that server still runs"))
	if err := start("http://elsewhere.test"); err != nil {
		t.Fatalf("its restart: %v", err)
	}
	if len(a.logs.with("waiting to see whether that server still runs")) != watched {
		t.Errorf("the restart on its own data directory watched its own last run")
	}
}

// Placement chooses only nodes heard from within a few heartbeats: one
// silent longer, though not lost until its grace is up, takes no creates
// (a stalled node took them, and held them, for the whole grace).
func TestPlaceSkipsSilentNodes(t *testing.T) {
	ctx := context.Background()
	second := func(n *NodeConfig) { n.Heartbeat = time.Second } // placement wants heartbeats within 5 s; lost after 10
	a := nodeHarness(t, "node-a", nil, second)
	b := nodeHarness(t, "node-b", a, second)
	if err := b.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	placed := func() map[string]int {
		count := map[string]int{}
		for range 4 {
			url, err := a.m.Place(ctx, project, CreateRequest{Template: "base"})
			if err != nil {
				t.Fatal(err)
			}
			count[url]++
		}
		return count
	}
	if got := placed(); got["http://node-b.test"] == 0 {
		t.Fatalf("B, just heard from, got no creates: %v", got)
	}
	// 7 s on, by A's clock (which heartbeats on): B silent, not yet lost.
	c := &clock{t: time.Now().Add(7 * time.Second)}
	a.m.now = c.now
	if _, err := a.store.Heartbeat(ctx, pandastack.Node{ID: "node-a", URL: "http://node-a.test", StartedAt: time.Now(), HeartbeatAt: c.now(), CPUs: 1, MemoryMB: 4096, FreeMemoryMB: 4096}); err != nil {
		t.Fatal(err)
	}
	if got := placed(); got["http://node-b.test"] != 0 {
		t.Errorf("B, silent for 7 s, got creates: %v", got)
	}
	if a.m.NodeLost("node-b") {
		t.Error("B counted lost before its grace")
	}
}

// NodeLost says whether the node at a URL was found lost.
func TestNodeLost(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	nodeHarness(t, "node-b", a)
	c := &clock{t: time.Now().Add(time.Minute)}
	a.m.now = c.now
	if err := a.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if !a.m.NodeLost("node-b") || a.m.NodeLost("node-a") || a.m.NodeLost("node-x") {
		t.Errorf("lost: b %v, a %v, unknown %v; want only b", a.m.NodeLost("node-b"), a.m.NodeLost("node-a"), a.m.NodeLost("node-x"))
	}
	// A new node up at the lost one's address is that new node, not lost.
	n := nodeHarness(t, "node-c", a, func(n *NodeConfig) { n.URL = "http://node-b.test" })
	n.m.now = c.now
	if err := n.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if id := a.m.NodeAt("http://node-b.test"); id != "node-c" || a.m.NodeLost(id) {
		t.Errorf("the node at the lost one's URL: %q, lost %v; want node-c, up", id, a.m.NodeLost(id))
	}
}

// A kill through another node of a lost node's sandbox removes its record
// only: nothing of it runs there (the runtime's teardown of an id it never
// ran waited on another node's leftovers on the same host, 5 s a kill).
func TestKillOfALostNodesSandboxLeavesTheRuntime(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	b := nodeHarness(t, "node-b", a)
	lost, paused := b.create(), b.create()
	if _, err := b.m.Pause(ctx, project, paused.ID); err != nil {
		t.Fatal(err)
	}
	c := &clock{t: time.Now().Add(time.Minute)}
	a.m.now = c.now
	if err := a.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	var stopped []string
	a.rt.stopHook = func(id string) { stopped = append(stopped, id) }
	for _, sb := range []pandastack.Sandbox{lost, paused} {
		if err := a.m.Kill(ctx, project, sb.ID); err != nil {
			t.Fatalf("kill of %s through A: %v", sb.ID, err)
		}
		if _, err := a.store.GetSandbox(ctx, project, sb.ID); !pandastack.IsCode(err, pandastack.ENotFound) {
			t.Errorf("the record of %s after its kill: %v", sb.ID, err)
		}
	}
	if len(stopped) != 0 {
		t.Errorf("A's runtime was asked to stop %v, sandboxes it never ran", stopped)
	}
}

// A node that finds another advertising its own URL says so, once: the
// forwards to either reach whichever the URL leads to.
func TestSameURLLogged(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	b := nodeHarness(t, "node-b", a, func(n *NodeConfig) { n.URL = a.node.URL })
	if err := b.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := a.m.heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.logs.with("another node advertises this node's URL"); len(got) != 1 || !strings.Contains(got[0], "other=node-b") {
		t.Errorf("A's log: %q, want one error naming node-b", got)
	}
}

// listNodesHook is a store whose ListNodes runs after, once listed.
type listNodesHook struct {
	pandastack.Store
	after func()
}

func (s *listNodesHook) ListNodes(ctx context.Context) ([]pandastack.Node, error) {
	nodes, err := s.Store.ListNodes(ctx)
	if after := s.after; after != nil {
		s.after = nil
		after()
	}
	return nodes, err
}

// A node marked lost between its heartbeat's read of the nodes and its
// write (another node judged it as its stall ended) learns it all the
// same: the write that makes it up again says what it replaced. It wrote
// over "lost" unawares and ran on its sandboxes, which every node
// answered as stopped, until it restarted.
func TestLostDuringHeartbeat(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	hook := &listNodesHook{Store: a.store}
	b := nodeHarness(t, "node-b", &harness{store: &hookStore{Store: hook}})
	sb := b.create()
	c := &clock{t: time.Now().Add(time.Minute)} // A's clock: B last heartbeat a minute ago
	a.m.now = c.now
	hook.after = func() {
		if err := a.m.heartbeat(ctx); err != nil {
			t.Error(err)
		}
	}
	if err := b.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := a.record(sb.ID); rec.State != pandastack.StateStopped || rec.StopReason != pandastack.StopLost {
		t.Fatalf("B's sandbox after A found B lost: %s %s", rec.State, rec.StopReason)
	}
	if ids := b.rt.ids(); len(ids) != 0 {
		t.Errorf("B still runs %v, which every node answers as stopped (lost)", ids)
	}
	if _, err := b.m.Agent(ctx, project, sb.ID); !pandastack.IsCode(err, pandastack.EStopped) {
		t.Errorf("the lost sandbox on B answers %v, want %s", err, pandastack.EStopped)
	}
}

// A sandbox recorded before nodes existed (no node) is the first node's
// to start on the store: the server that ran it, restarted as a node,
// keeps it, and a second node that starts later leaves it alone and
// passes requests about it on. Every node took such records for its own:
// the second one's recovery, which could not attach to it, recorded it
// stopped (lost) while the first ran on with it, unreachable.
func TestSandboxOfNoNodeIsTheFirstNodes(t *testing.T) {
	ctx := context.Background()
	a := nodeHarness(t, "node-a", nil)
	sb := a.create()
	a.exec(sb.ID, "set v=from-before-nodes")
	// Its record as a server before nodes wrote it.
	rec := a.record(sb.ID)
	rec.NodeID = ""
	if err := a.store.DeleteSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := a.store.CreateSandbox(ctx, rec); err != nil {
		t.Fatal(err)
	}
	// The server is upgraded: it restarts as node A, then B joins.
	a.m.Close()
	a.m = a.newManager()
	b := nodeHarness(t, "node-b", a)
	if rec := a.record(sb.ID); rec.State != pandastack.StateRunning || rec.NodeID != "node-a" {
		t.Errorf("the sandbox after B started: %s %s on node %q, want running on node-a", rec.State, rec.StopReason, rec.NodeID)
	}
	if out, err := a.exec(sb.ID, "get v"); err != nil || out != "from-before-nodes" {
		t.Errorf("the sandbox on A: %q %v", out, err)
	}
	if err := b.m.heartbeat(ctx); err != nil {
		t.Fatal(err)
	}
	if url, err := b.m.Remote(ctx, project, sb.ID); err != nil || url != "http://node-a.test" {
		t.Errorf("Remote of the sandbox from B = %q, %v; want A's URL", url, err)
	}
}
