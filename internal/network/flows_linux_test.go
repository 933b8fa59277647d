package network

import (
	"net/netip"
	"testing"
	"time"
)

// A flow the poll found gone and logged is not logged again when its end
// event comes after the poll; one seen only by its event is logged once;
// a flow anew on the same addresses and ports is a flow of its own.
func TestFlowLoggedOnce(t *testing.T) {
	s := &sandboxNet{ID: "sbx_f", Slot: 0, up: true}
	n := &Network{cidr: netip.MustParsePrefix("10.99.0.0/24"), sbx: map[string]*sandboxNet{"sbx_f": s}, slots: map[int]string{0: "sbx_f"}}
	src := netip.MustParseAddr("10.99.0.2") // slot 0's sandbox
	key := func(port uint16) flowKey {
		return flowKey{6, netip.AddrPortFrom(src, port), netip.AddrPortFrom(netip.MustParseAddr("198.51.100.9"), 80)}
	}
	logged := func() int { return len(n.Log("sbx_f")) }
	seen := map[flowKey]*flowSeen{}
	now := time.Now()

	// Seen by the poll, then gone: logged by the poll, and the late event
	// finds it logged.
	seen[key(1000)] = &flowSeen{first: now, sbx: s, rule: "internet", out: 10, in: 20}
	n.flowsGone(seen, map[flowKey]bool{}, true, now)
	n.flowEnded(seen, endedFlow{key: key(1000), out: 10, in: 20})
	if got := logged(); got != 1 {
		t.Fatalf("a flow the poll logged, then its event: %d entries, want 1", got)
	}
	// Seen only by its event (a connect refused by the remote).
	n.flowEnded(seen, endedFlow{key: key(1001)})
	if got := logged(); got != 2 {
		t.Fatalf("a flow only its event told of: %d entries, want 2", got)
	}
	// Without events the poll forgets what it logged at once.
	seen[key(1002)] = &flowSeen{first: now, sbx: s, rule: "internet"}
	n.flowsGone(seen, map[flowKey]bool{}, false, now)
	if _, kept := seen[key(1002)]; kept || logged() != 3 {
		t.Fatalf("without events: kept %v, %d entries", kept, logged())
	}
	// With events, one whose event never comes is forgotten after goneKeep.
	seen[key(1003)] = &flowSeen{first: now, sbx: s, rule: "internet"}
	n.flowsGone(seen, map[flowKey]bool{}, true, now)
	n.flowsGone(seen, map[flowKey]bool{}, true, now.Add(goneKeep))
	if _, kept := seen[key(1003)]; kept || logged() != 4 {
		t.Fatalf("an event that never came: kept %v, %d entries", kept, logged())
	}
	// Not a sandbox's: nothing.
	n.flowEnded(seen, endedFlow{key: flowKey{6, netip.MustParseAddrPort("192.0.2.7:1000"), netip.MustParseAddrPort("198.51.100.9:80")}})
	if got := logged(); got != 4 {
		t.Fatalf("a flow of another host's: %d entries, want 4", got)
	}
}
