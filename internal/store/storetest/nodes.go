package storetest

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// node returns an up node heartbeating at base+second, offering 4 CPUs and
// 8 GiB with 6 GiB free.
func node(id string, second int) pandastack.Node {
	return pandastack.Node{
		ID: id, URL: "http://" + id + ":8080", StartedAt: base,
		HeartbeatAt: base.Add(time.Duration(second) * time.Second),
		CPUs:        4, MemoryMB: 8192, FreeMemoryMB: 6144,
	}
}

// mustHeartbeat heartbeats n and returns the state it replaced.
func mustHeartbeat(t *testing.T, s pandastack.Store, n pandastack.Node) pandastack.NodeState {
	t.Helper()
	was, err := s.Heartbeat(t.Context(), n)
	if err != nil {
		t.Fatalf("Heartbeat(%s): %v", n.ID, err)
	}
	return was
}

func nodesByID(t *testing.T, s pandastack.Store) map[string]pandastack.Node {
	t.Helper()
	ns, err := s.ListNodes(t.Context())
	if err != nil {
		t.Fatalf("ListNodes: %v", err)
	}
	out := map[string]pandastack.Node{}
	for _, n := range ns {
		out[n.ID] = n
	}
	return out
}

func place(t *testing.T, s pandastack.Store, p pandastack.Placement) string {
	t.Helper()
	n, err := s.PlaceSandbox(t.Context(), p)
	if err != nil {
		t.Fatalf("PlaceSandbox(%+v): %v", p, err)
	}
	return n.ID
}

// A heartbeat inserts the node, a later one replaces what it reports; a
// lost node that heartbeats again is up.
func testNodes(t *testing.T, s pandastack.Store) {
	if ns, err := s.ListNodes(t.Context()); err != nil || len(ns) != 0 {
		t.Fatalf("ListNodes of an empty store = %v, %v", ns, err)
	}
	a := node("node-a", 0)
	a.Pool = map[string]int{"python": 2}
	mustHeartbeat(t, s, a)
	mustHeartbeat(t, s, node("node-b", 0))
	got := nodesByID(t, s)
	if len(got) != 2 {
		t.Fatalf("nodes = %v", got)
	}
	g := got["node-a"]
	if g.URL != a.URL || g.State != pandastack.NodeUp || g.CPUs != 4 || g.MemoryMB != 8192 || g.FreeMemoryMB != 6144 || !maps.Equal(g.Pool, a.Pool) {
		t.Errorf("node-a = %+v, want %+v", g, a)
	}
	checkTime(t, "StartedAt", g.StartedAt, base)
	checkTime(t, "HeartbeatAt", g.HeartbeatAt, base)

	a = node("node-a", 30)
	a.URL, a.FreeMemoryMB = "http://elsewhere:9090", 100
	mustHeartbeat(t, s, a)
	g = nodesByID(t, s)["node-a"]
	if g.URL != a.URL || g.FreeMemoryMB != 100 || len(g.Pool) != 0 {
		t.Errorf("node-a after its second heartbeat = %+v", g)
	}
	checkTime(t, "HeartbeatAt", g.HeartbeatAt, a.HeartbeatAt)

	if lost, err := s.LoseNodes(t.Context(), base.Add(10*time.Second), base.Add(10*time.Second)); err != nil || fmt.Sprint(lost) != "[node-b]" {
		t.Fatalf("LoseNodes = %v, %v; want [node-b]", lost, err)
	}
	if st := nodesByID(t, s)["node-b"].State; st != pandastack.NodeLost {
		t.Errorf("node-b after LoseNodes is %q", st)
	}
	mustHeartbeat(t, s, node("node-b", 40))
	if st := nodesByID(t, s)["node-b"].State; st != pandastack.NodeUp {
		t.Errorf("node-b after a new heartbeat is %q", st)
	}
	bad := node("node-\x00", 0)
	_, err := s.Heartbeat(t.Context(), bad)
	checkCode(t, "Heartbeat of a NUL id", err, pandastack.EInvalid)
}

// A heartbeat says what it replaced: nothing the first time and after
// ForgetNode, up, or lost when another node found it silent meanwhile.
// That is how a stalled node learns it was lost, so a heartbeat that
// races LoseNodes must tell it too: either LoseNodes came first and the
// heartbeat says lost, or the heartbeat did and the node stays lost.
func testHeartbeatSaysWhatItReplaced(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	for i, want := range []pandastack.NodeState{"", pandastack.NodeUp} {
		if was := mustHeartbeat(t, s, node("node-a", i)); was != want {
			t.Errorf("heartbeat %d replaced %q, want %q", i+1, was, want)
		}
	}
	if _, err := s.LoseNodes(ctx, base.Add(time.Minute), base.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if was := mustHeartbeat(t, s, node("node-a", 90)); was != pandastack.NodeLost {
		t.Errorf("the heartbeat of a node found lost replaced %q, want %q", was, pandastack.NodeLost)
	}
	if _, err := s.LoseNodes(ctx, base.Add(2*time.Minute), base.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ForgetNode(ctx, "node-a", base.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if was := mustHeartbeat(t, s, node("node-a", 150)); was != "" {
		t.Errorf("the heartbeat of a forgotten node replaced %q, want none", was)
	}

	// Races: each round, a stalled node's heartbeat (at the stale time,
	// so LoseNodes may find it silent either way) against LoseNodes.
	for round := range 20 {
		id := fmt.Sprintf("node-r%d", round)
		mustHeartbeat(t, s, node(id, 0))
		var was pandastack.NodeState
		var lost []string
		errs := race(func(i int) error {
			var err error
			switch i {
			case 0:
				was, err = s.Heartbeat(ctx, node(id, 0))
			case 1:
				lost, err = s.LoseNodes(ctx, base.Add(time.Second), base.Add(time.Second))
			}
			return err
		})
		for i, err := range errs {
			if err != nil {
				t.Fatalf("round %d, racer %d: %v", round, i, err)
			}
		}
		state := nodesByID(t, s)[id].State
		if slices.Contains(lost, id) && was != pandastack.NodeLost && state != pandastack.NodeLost {
			t.Fatalf("round %d: LoseNodes marked %s lost, yet its heartbeat replaced %q and left it %s: the node never learns it", round, id, was, state)
		}
		if _, err := s.LoseNodes(ctx, base.Add(time.Second), base.Add(time.Second)); err != nil { // tidy: every round's node lost
			t.Fatal(err)
		}
	}
}

// The Node filter matches a node's own sandboxes and those of no node.
func testListByNode(t *testing.T, s pandastack.Store) {
	mine, theirs, legacy := sandbox("sbx_mine", 1), sandbox("sbx_theirs", 2), sandbox("sbx_legacy", 3)
	mine.NodeID, theirs.NodeID = "node-a", "node-b"
	for _, sb := range []pandastack.Sandbox{mine, theirs, legacy} {
		mustSandbox(t, s, sb)
	}
	checkSandbox(t, mustGet(t, s, "sbx_mine"), mine)
	checkIDs(t, "node-a", list(t, s, pandastack.SandboxFilter{Node: "node-a"}), "sbx_mine", "sbx_legacy")
	checkIDs(t, "node-b running", list(t, s, pandastack.SandboxFilter{Node: "node-b", States: []pandastack.SandboxState{pandastack.StateRunning}}), "sbx_theirs", "sbx_legacy")
	checkIDs(t, "every node", list(t, s, pandastack.SandboxFilter{}), "sbx_mine", "sbx_theirs", "sbx_legacy")
}

// ClaimSandboxesOfNoNode gives the sandboxes of no node, whatever their
// state, to the node named, once: a second node finds none, and the
// first's list no longer shares them with every node's.
func testClaimSandboxesOfNoNode(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	running, paused, stopped, theirs := sandbox("sbx_running", 1), sandbox("sbx_paused", 2), sandbox("sbx_stopped", 3), sandbox("sbx_theirs", 4)
	paused.State = pandastack.StatePaused
	stoppedAt := base.Add(time.Minute)
	stopped.State, stopped.StopReason, stopped.StoppedAt = pandastack.StateStopped, pandastack.StopKilled, &stoppedAt
	theirs.NodeID = "node-b"
	for _, sb := range []pandastack.Sandbox{running, paused, stopped, theirs} {
		mustSandbox(t, s, sb)
	}
	if n, err := s.ClaimSandboxesOfNoNode(ctx, "node-a"); err != nil || n != 3 {
		t.Fatalf("ClaimSandboxesOfNoNode(node-a) = %d, %v; want its 3", n, err)
	}
	for _, id := range []string{"sbx_running", "sbx_paused", "sbx_stopped"} {
		if g := mustGet(t, s, id); g.NodeID != "node-a" {
			t.Errorf("%s after the claim is node %q's, want node-a's", id, g.NodeID)
		}
	}
	if g := mustGet(t, s, "sbx_theirs"); g.NodeID != "node-b" {
		t.Errorf("another node's sandbox after the claim is node %q's", g.NodeID)
	}
	if n, err := s.ClaimSandboxesOfNoNode(ctx, "node-b"); err != nil || n != 0 {
		t.Errorf("a second claim = %d, %v; want none", n, err)
	}
	checkIDs(t, "node-b's", list(t, s, pandastack.SandboxFilter{Node: "node-b"}), "sbx_theirs")
	_, err := s.ClaimSandboxesOfNoNode(ctx, "")
	checkCode(t, "a claim for no node", err, pandastack.EInvalid)
	_, err = s.ClaimSandboxesOfNoNode(ctx, "node-\x00")
	checkCode(t, "a claim for a NUL node", err, pandastack.EInvalid)

	// Two nodes starting at once: each sandbox is one node's, and only
	// one node claims any.
	for i := range 10 {
		mustSandbox(t, s, sandbox(fmt.Sprintf("sbx_race%d", i), 10+i))
	}
	claimed := make([]int, racers)
	for i, err := range race(func(i int) error {
		var err error
		claimed[i], err = s.ClaimSandboxesOfNoNode(ctx, fmt.Sprintf("node-r%d", i))
		return err
	}) {
		if err != nil {
			t.Fatalf("racer %d: %v", i, err)
		}
	}
	slices.Sort(claimed)
	if claimed[len(claimed)-1] != 10 || claimed[len(claimed)-2] != 0 {
		t.Errorf("racing claims of 10 sandboxes took %v, want all by one node", claimed)
	}
}

// Placement takes the node with the most memory not committed to starting
// and running sandboxes; it skips nodes silent since p.Since, lost nodes,
// and nodes with less free memory than asked; ties rotate.
func testPlaceSandbox(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	p := pandastack.Placement{Template: "python", CPU: 1, MemoryMB: 512, Since: base, At: base.Add(time.Minute)}
	if _, err := s.PlaceSandbox(ctx, p); !pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Fatalf("PlaceSandbox with no nodes: %v, want %s", err, pandastack.EUnavailable)
	}
	mustHeartbeat(t, s, node("node-a", 0))
	mustHeartbeat(t, s, node("node-b", 0))
	stale := node("node-stale", -1) // heartbeat before Since
	stale.MemoryMB = 1 << 20
	mustHeartbeat(t, s, stale)
	tight := node("node-tight", 0) // room on paper, but the host is short
	tight.MemoryMB, tight.FreeMemoryMB = 1<<20, 256
	mustHeartbeat(t, s, tight)

	// node-a has 1 GiB committed, node-b a paused and a stopped sandbox
	// (neither counts): node-b wins.
	sa, sp, ss := sandbox("sbx_a", 1), sandbox("sbx_paused", 2), sandbox("sbx_stopped", 3)
	sa.NodeID, sa.MemoryMB = "node-a", 1024
	sp.NodeID, sp.State, sp.MemoryMB = "node-b", pandastack.StatePaused, 4096
	ss.NodeID, ss.State, ss.MemoryMB = "node-b", pandastack.StateStopped, 4096
	for _, sb := range []pandastack.Sandbox{sa, sp, ss} {
		mustSandbox(t, s, sb)
	}
	if got := place(t, s, p); got != "node-b" {
		t.Errorf("placed on %s, want node-b (the most uncommitted memory)", got)
	}
	// Equal memory: the most uncommitted CPUs, then the node placed on
	// longest ago.
	sb := sandbox("sbx_b", 4)
	sb.NodeID, sb.MemoryMB, sb.CPU = "node-b", 1024, 2
	mustSandbox(t, s, sb)
	if got := place(t, s, p); got != "node-a" {
		t.Errorf("placed on %s, want node-a (as much memory, more CPUs free)", got)
	}
	if err := s.SetSandboxState(ctx, "sbx_b", pandastack.StateStopped, pandastack.StopKilled, base); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSandboxState(ctx, "sbx_a", pandastack.StateStopped, pandastack.StopKilled, base); err != nil {
		t.Fatal(err)
	}
	first := place(t, s, pandastack.Placement{MemoryMB: 512, Since: base, At: base.Add(2 * time.Minute)})
	second := place(t, s, pandastack.Placement{MemoryMB: 512, Since: base, At: base.Add(3 * time.Minute)})
	if first == second {
		t.Errorf("two placements on equal nodes both went to %s", first)
	}
	// A lost node is no candidate.
	if _, err := s.LoseNodes(ctx, base.Add(time.Second), base.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PlaceSandbox(ctx, p); !pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Errorf("PlaceSandbox with every node lost: %v, want %s", err, pandastack.EUnavailable)
	}
	checkCode(t, "a NUL template", func() error { _, err := s.PlaceSandbox(ctx, pandastack.Placement{Template: "a\x00"}); return err }(), pandastack.EInvalid)
}

// A ready pool of the template outweighs free memory.
func testPlaceByPool(t *testing.T, s pandastack.Store) {
	a, b := node("node-a", 0), node("node-b", 0)
	a.MemoryMB = 1 << 20
	b.Pool = map[string]int{"python": 1, "other": 0}
	mustHeartbeat(t, s, a)
	mustHeartbeat(t, s, b)
	if got := place(t, s, pandastack.Placement{Template: "python", MemoryMB: 512, Since: base, At: base}); got != "node-b" {
		t.Errorf("python placed on %s, want node-b (its pool is ready)", got)
	}
	if got := place(t, s, pandastack.Placement{Template: "other", MemoryMB: 512, Since: base, At: base}); got != "node-a" {
		t.Errorf("other placed on %s, want node-a (node-b's pool of it is empty)", got)
	}
}

// LoseNodes stops the silent node's running sandboxes, and only those: its
// paused ones wait for it.
func testLoseNodes(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, node("node-a", 0))
	mustHeartbeat(t, s, node("node-b", 60))
	run, paused, killed, other, legacy := sandbox("sbx_run", 1), sandbox("sbx_paused", 2), sandbox("sbx_killed", 3), sandbox("sbx_other", 4), sandbox("sbx_legacy", 5)
	run.NodeID, paused.NodeID, killed.NodeID, other.NodeID = "node-a", "node-a", "node-a", "node-b"
	paused.State, paused.PauseReason = pandastack.StatePaused, pandastack.PauseIdle
	killedAt := base.Add(time.Minute)
	killed.State, killed.StopReason, killed.StoppedAt = pandastack.StateStopped, pandastack.StopKilled, &killedAt
	for _, sb := range []pandastack.Sandbox{run, paused, killed, other, legacy} {
		mustSandbox(t, s, sb)
	}
	at := base.Add(2 * time.Minute)
	lost, err := s.LoseNodes(ctx, base.Add(30*time.Second), at)
	if err != nil || fmt.Sprint(lost) != "[node-a]" {
		t.Fatalf("LoseNodes = %v, %v; want [node-a]", lost, err)
	}
	g := mustGet(t, s, "sbx_run")
	if g.State != pandastack.StateStopped || g.StopReason != pandastack.StopLost {
		t.Errorf("sbx_run of the lost node = %s/%q, want stopped/lost", g.State, g.StopReason)
	}
	checkTimePtr(t, "sbx_run StoppedAt", g.StoppedAt, &at)
	if g := mustGet(t, s, "sbx_paused"); g.State != pandastack.StatePaused || g.PauseReason != pandastack.PauseIdle || g.StoppedAt != nil {
		t.Errorf("sbx_paused of the lost node = %s/%q/%v, want paused/idle", g.State, g.PauseReason, g.StoppedAt)
	}
	if g := mustGet(t, s, "sbx_killed"); g.StopReason != pandastack.StopKilled {
		t.Errorf("an already stopped sandbox now says %q", g.StopReason)
	}
	for _, id := range []string{"sbx_other", "sbx_legacy"} {
		if g := mustGet(t, s, id); g.State != pandastack.StateRunning {
			t.Errorf("%s (not the lost node's) is %s", id, g.State)
		}
	}
	if lost, err := s.LoseNodes(ctx, base.Add(30*time.Second), at); err != nil || len(lost) != 0 {
		t.Errorf("LoseNodes again = %v, %v; want nothing", lost, err)
	}
}

// ForgetNode removes a lost node and stops its paused sandboxes (their
// images were on its disk); a node that is up, or none, is refused.
func testForgetNode(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	mustHeartbeat(t, s, node("node-a", 0))
	mustHeartbeat(t, s, node("node-b", 60))
	paused, other := sandbox("sbx_paused", 1), sandbox("sbx_other", 2)
	paused.NodeID, other.NodeID = "node-a", "node-b"
	paused.State, paused.PauseReason = pandastack.StatePaused, pandastack.PauseIdle
	other.State = pandastack.StatePaused
	for _, sb := range []pandastack.Sandbox{paused, other} {
		mustSandbox(t, s, sb)
	}
	at := base.Add(2 * time.Minute)
	_, err := s.ForgetNode(ctx, "node-a", at)
	checkCode(t, "ForgetNode of a node that is up", err, pandastack.EConflict)
	_, err = s.ForgetNode(ctx, "node-z", at)
	checkCode(t, "ForgetNode of no node", err, pandastack.ENotFound)
	if _, err := s.LoseNodes(ctx, base.Add(30*time.Second), at); err != nil {
		t.Fatal(err)
	}
	if n, err := s.ForgetNode(ctx, "node-a", at); err != nil || n != 1 {
		t.Fatalf("ForgetNode(node-a) = %d, %v; want its 1 paused sandbox stopped", n, err)
	}
	if _, ok := nodesByID(t, s)["node-a"]; ok {
		t.Error("node-a is still listed after ForgetNode")
	}
	g := mustGet(t, s, "sbx_paused")
	if g.State != pandastack.StateStopped || g.StopReason != pandastack.StopLost || g.PauseReason != "" {
		t.Errorf("sbx_paused of the forgotten node = %s/%q/%q, want stopped/lost", g.State, g.StopReason, g.PauseReason)
	}
	checkTimePtr(t, "sbx_paused StoppedAt", g.StoppedAt, &at)
	if g := mustGet(t, s, "sbx_other"); g.State != pandastack.StatePaused {
		t.Errorf("sbx_other (another node's) is %s", g.State)
	}
	_, err = s.ForgetNode(ctx, "node-a", at)
	checkCode(t, "ForgetNode again", err, pandastack.ENotFound)
	// A forgotten node that comes back is a node again.
	mustHeartbeat(t, s, node("node-a", 90))
	if st := nodesByID(t, s)["node-a"].State; st != pandastack.NodeUp {
		t.Errorf("node-a back after ForgetNode is %q", st)
	}
}

// Concurrent placements over equal nodes spread over them.
func testRacingPlacements(t *testing.T, s pandastack.Store) {
	mustHeartbeat(t, s, node("node-a", 0))
	mustHeartbeat(t, s, node("node-b", 0))
	got := make([]string, racers)
	for i, err := range race(func(i int) error {
		n, err := s.PlaceSandbox(t.Context(), pandastack.Placement{MemoryMB: 512, Since: base, At: base.Add(time.Duration(i+1) * time.Second)})
		got[i] = n.ID
		return err
	}) {
		if err != nil {
			t.Fatalf("racer %d: %v", i, err)
		}
	}
	count := map[string]int{}
	for _, id := range got {
		count[id]++
	}
	if count["node-a"] == 0 || count["node-b"] == 0 {
		t.Errorf("%d racing placements over two equal nodes went %v", racers, count)
	}
}
