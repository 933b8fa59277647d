package sandbox

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// fakeNet keeps policies as the network layer does: a stop releases the
// sandbox's policy unless it was held (a pause).
type fakeNet struct {
	mu       sync.Mutex
	policies map[string]pandastack.NetworkPolicy
	held     map[string]bool
	// beforeSet, if set, runs as SetPolicy begins.
	beforeSet func(id string)
}

// useFakeNet gives h's manager a fakeNet, released by the runtime's stops.
func useFakeNet(h *harness) *fakeNet {
	net := newFakeNet()
	h.m.UseNetwork(net)
	h.rt.stopHook = net.release
	return net
}

func newFakeNet() *fakeNet {
	return &fakeNet{policies: map[string]pandastack.NetworkPolicy{}, held: map[string]bool{}}
}

func (n *fakeNet) Validate(pandastack.NetworkPolicy) error { return nil }
func (n *fakeNet) Kept(_ string, p pandastack.NetworkPolicy) pandastack.NetworkPolicy {
	return p
}
func (n *fakeNet) SetPolicy(id string, p pandastack.NetworkPolicy) error {
	if n.beforeSet != nil {
		n.beforeSet(id)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.policies[id] = p
	return nil
}
func (n *fakeNet) Policy(id string) (pandastack.NetworkPolicy, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	p, ok := n.policies[id]
	return p, ok
}
func (n *fakeNet) Log(string) []pandastack.EgressEntry { return nil }
func (n *fakeNet) Addr(string) (netip.Addr, bool)      { return netip.Addr{}, false }
func (n *fakeNet) Hold(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.held[id] = true
}

func (n *fakeNet) Release(id string) { n.release(id) }

func (n *fakeNet) Known() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Sorted(maps.Keys(n.policies))
}

// release is the network runtime's Stop (and a failed restore's clean-up).
func (n *fakeNet) release(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.held[id] {
		delete(n.held, id)
		return
	}
	delete(n.policies, id)
}

// A resume that fails leaves the sandbox paused with the policy it had,
// one set while it was paused included: the stop of what the resume made
// released the network, and the next resume applied the policy of pause
// time (internet open again after it had been shut).
func TestFailedResumeKeepsThePolicy(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	net := useFakeNet(h)
	sb := h.create()
	open := pandastack.NetworkPolicy{AllowInternetAccess: true}
	shut := pandastack.NetworkPolicy{AllowInternetAccess: false}
	if _, err := h.m.SetNetwork(ctx, project, sb.ID, open); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.Pause(ctx, project, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := h.m.SetNetwork(ctx, project, sb.ID, shut); err != nil {
		t.Fatal(err)
	}
	h.rt.restoreErr = func(spec pandastack.RuntimeSpec) error {
		net.release(spec.ID) // as the network runtime's restore does on failure
		return errInjected
	}
	if _, err := h.m.Resume(ctx, project, sb.ID); err == nil {
		t.Fatal("resume succeeded")
	}
	if rec := h.record(sb.ID); rec.State != pandastack.StatePaused {
		t.Fatalf("after the failed resume: %s", rec.State)
	}
	if p, ok := net.Policy(sb.ID); !ok || p.AllowInternetAccess {
		t.Fatalf("policy after the failed resume: %+v %v, want the one set while paused (no internet)", p, ok)
	}
}

// A resume whose restore worked but whose agent never answered stops what
// it restored and keeps the policy the sandbox has then: one set while it
// resumed (a PUT does not wait for the resume) survives, where the policy
// of the resume's start came back before.
func TestFailedResumeKeepsAPolicySetMeanwhile(t *testing.T) {
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
	meanwhile := pandastack.NetworkPolicy{AllowInternetAccess: false, AllowOut: []string{"192.0.2.1"}}
	h.rt.restoreErr = func(spec pandastack.RuntimeSpec) error {
		net.SetPolicy(spec.ID, meanwhile) // a PUT while the resume runs
		return nil
	}
	h.m.cfg.StartTimeout = 200 * time.Millisecond
	h.rt.noAgent = true
	if _, err := h.m.Resume(ctx, project, sb.ID); err == nil {
		t.Fatal("resume succeeded")
	}
	if p, ok := net.Policy(sb.ID); !ok || p.AllowInternetAccess || len(p.AllowOut) != 1 {
		t.Fatalf("policy after the failed resume: %+v %v, want the one set while it resumed", p, ok)
	}
}

// A policy set while the sandbox is killed is not kept for the sandbox
// that is gone: the caller is told it is not found, as a GET says then,
// and the network forgets it (the record and state file stayed for good).
func TestSetNetworkRacingAKill(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	net := useFakeNet(h)
	sb := h.create()
	net.beforeSet = func(id string) {
		if err := h.m.Kill(ctx, project, id); err != nil {
			t.Error(err)
		}
	}
	_, err := h.m.SetNetwork(ctx, project, sb.ID, pandastack.NetworkPolicy{AllowInternetAccess: true})
	if !pandastack.IsCode(err, pandastack.ENotFound) { // a killed sandbox's record is gone
		t.Fatalf("a policy set as the sandbox is killed: %v, want %s", err, pandastack.ENotFound)
	}
	if p, ok := net.Policy(sb.ID); ok {
		t.Fatalf("the network keeps policy %+v of a killed sandbox", p)
	}
}

// A start drops what the network kept of sandboxes that are gone (killed
// while the server was down, or with no record at all), and keeps the
// policies of those that run or wait paused.
func TestRecoveryForgetsGoneNetworks(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	running, paused, killed := h.create(), h.create(), h.create()
	if _, err := h.m.Pause(ctx, project, paused.ID); err != nil {
		t.Fatal(err)
	}
	h.m.Close()
	// The server went down; meanwhile a kill recorded the sandbox gone
	// (another node's API, the CLI against the database).
	h.rt.Stop(ctx, killed.ID)
	h.store.DeleteSandbox(ctx, killed.ID)
	net := newFakeNet()
	for _, id := range []string{running.ID, paused.ID, killed.ID, "sbx_never_recorded"} {
		net.policies[id] = pandastack.NetworkPolicy{}
	}
	h.net = net
	h.m = h.newManager()
	want := []string{paused.ID, running.ID}
	slices.Sort(want)
	if got := net.Known(); !slices.Equal(got, want) {
		t.Fatalf("after the start the network keeps %v, want %v", got, want)
	}
}
