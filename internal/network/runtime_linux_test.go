package network

import (
	"context"
	"errors"
	"io"
	"os"
	"slices"
	"syscall"
	"testing"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/network/nettest"
)

// failingRuntime is a pandastack.Runtime whose boots fail and whose other
// calls record what they were asked: enough to see the wrapper clean up.
type failingRuntime struct {
	pandastack.Runtime
	sawNetNS string
	stopped  []string
}

func (f *failingRuntime) Start(_ context.Context, spec pandastack.RuntimeSpec) (io.ReadWriteCloser, error) {
	f.sawNetNS = spec.NetNS
	return nil, errors.New("boot failed")
}

func (f *failingRuntime) Stop(_ context.Context, id string) error {
	f.stopped = append(f.stopped, id)
	return nil
}

func TestRuntimeFailedStartLeavesNoNetwork(t *testing.T) {
	up := nettest.StartUpstream(t, "r", 30, 30)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	inner := &failingRuntime{}
	rt := Wrap(inner, n)
	if _, err := rt.Start(context.Background(), pandastack.RuntimeSpec{ID: "sbx_fail"}); err == nil {
		t.Fatal("Start succeeded")
	}
	if inner.sawNetNS != n.NSPath("sbx_fail") {
		t.Errorf("runtime saw namespace %q, want %q", inner.sawNetNS, n.NSPath("sbx_fail"))
	}
	if _, err := os.Stat(n.NSPath("sbx_fail")); err == nil {
		t.Error("namespace left after a failed start")
	}
	if _, ok := n.Policy("sbx_fail"); ok {
		t.Error("policy state left after a failed start")
	}

	// A bad policy fails before anything is made.
	bad := pandastack.NetworkPolicy{AllowOut: []string{"10.0.0.1"}}
	if _, err := rt.Start(context.Background(), pandastack.RuntimeSpec{ID: "sbx_bad", Network: &bad}); !pandastack.IsCode(err, pandastack.ENetworkDenied) {
		t.Errorf("start with a denied policy: %v", err)
	}

	// Stop of a sandbox releases its network, and a second Stop is fine.
	if _, err := n.Prepare("sbx_stop", nil); err != nil {
		t.Fatal(err)
	}
	rt.Stop(context.Background(), "sbx_stop")
	rt.Stop(context.Background(), "sbx_stop")
	if _, err := os.Stat(n.NSPath("sbx_stop")); err == nil {
		t.Error("namespace left after Stop")
	}
}

func TestCloseLeavesNoNamespace(t *testing.T) {
	up := nettest.StartUpstream(t, "c", 38, 38)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	if _, err := n.Prepare("sbx_gone", nil); err != nil {
		t.Fatal(err)
	}
	// The runtime no longer has the sandbox (a boot cut short by shutdown).
	rt := Wrap(&failingRuntime{Runtime: notFoundRuntime{}}, n)
	if err := rt.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(n.NSPath("sbx_gone")); err == nil {
		t.Error("namespace of a sandbox the runtime does not have left after Close")
	}
	if _, err := n.Prepare("sbx_late", nil); !pandastack.IsCode(err, pandastack.EUnavailable) {
		t.Errorf("Prepare after Close: %v, want %s", err, pandastack.EUnavailable)
	}
}

// notFoundRuntime knows no sandbox.
type notFoundRuntime struct{ pandastack.Runtime }

func (notFoundRuntime) State(context.Context, string) (pandastack.RuntimeState, error) {
	return "", pandastack.Errorf(pandastack.ENotFound, "no such sandbox")
}

// A paused sandbox's runtime is stopped: after Hold that keeps its policy
// and egress log for the resume's Prepare; a policy set on a sandbox with
// no network is kept for its next Prepare too.
func TestPolicyOfStoppedSandboxKeptForPrepare(t *testing.T) {
	up := nettest.StartUpstream(t, "k", 46, 46)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	rt := Wrap(&failingRuntime{}, n)
	none := pandastack.NoNetworkPolicy()
	ns, err := n.Prepare("sbx_paus", &none)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(t, ns, up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("no internet: %v, want refused", err)
	}
	waitRefused(t, n, "sbx_paus", up.PublicIP, 80, "no_internet")
	n.Hold("sbx_paus")
	rt.Stop(context.Background(), "sbx_paus")
	if _, err := os.Stat(ns); err == nil {
		t.Error("namespace left after Stop")
	}
	if p, ok := n.Policy("sbx_paus"); !ok || p.AllowInternetAccess {
		t.Errorf("policy after Hold and Stop: %+v %v", p, ok)
	}
	if len(n.Log("sbx_paus")) == 0 {
		t.Error("egress log lost by Hold and Stop")
	}
	if ns, err = n.Prepare("sbx_paus", nil); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(t, ns, up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after the resume's Prepare: %v, want refused (the kept policy)", err)
	}
	rt.Stop(context.Background(), "sbx_paus") // no Hold: a kill
	if _, ok := n.Policy("sbx_paus"); ok {
		t.Error("policy left after a Stop without Hold")
	}

	// A policy set while the sandbox has no network is its next one.
	if err := n.SetPolicy("sbx_paus", none); err != nil {
		t.Fatal(err)
	}
	if ns, err = n.Prepare("sbx_paus", nil); err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_paus")
	if _, _, err := get(t, ns, up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after Prepare with the policy set while down: %v, want refused", err)
	}
	if err := n.SetPolicy("sbx_paus", pandastack.NetworkPolicy{AllowOut: []string{"10.0.0.1"}}); !pandastack.IsCode(err, pandastack.ENetworkDenied) {
		t.Errorf("a denied policy: %v", err)
	}
}

// preparingRuntime records Prepare and Restore; restores fail when fail
// is set.
type preparingRuntime struct {
	failingRuntime
	prepared, restored []string // the namespace each saw
	renamed            []string // "from to"
	prepareErr         error
	restoreErr         error
	renameErr          error
}

func (p *preparingRuntime) Prepare(_ context.Context, spec pandastack.RuntimeSpec, _ string) error {
	p.prepared = append(p.prepared, spec.NetNS)
	return p.prepareErr
}

func (p *preparingRuntime) Restore(_ context.Context, spec pandastack.RuntimeSpec, _ string) (io.ReadWriteCloser, error) {
	p.restored = append(p.restored, spec.NetNS)
	if p.restoreErr != nil {
		return nil, p.restoreErr
	}
	return nopRWC{}, nil
}

type nopRWC struct{}

func (nopRWC) Read([]byte) (int, error)    { return 0, io.EOF }
func (nopRWC) Write(b []byte) (int, error) { return len(b), nil }
func (nopRWC) Close() error                { return nil }

// A prepared sandbox gets its network at Prepare and keeps that namespace
// for its restore (a second Prepare of the network would give runsc's
// waiting sandbox a namespace it is not in); a policy given at the
// restore applies; a failed Prepare of a sandbox that had a policy (a
// paused one) keeps the policy; a failed restore takes the network down,
// and the policy too unless the sandbox is a paused one.
func TestRuntimePrepareKeepsNetwork(t *testing.T) {
	up := nettest.StartUpstream(t, "r", 30, 30)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	inner := &preparingRuntime{}
	rt := Wrap(inner, n)
	ctx := context.Background()
	if err := rt.Prepare(ctx, pandastack.RuntimeSpec{ID: "sbx_prep"}, "img"); err != nil {
		t.Fatal(err)
	}
	ns := n.NSPath("sbx_prep")
	if len(inner.prepared) != 1 || inner.prepared[0] != ns {
		t.Fatalf("prepare saw %q, want %q", inner.prepared, ns)
	}
	fi, err := os.Stat(ns)
	if err != nil {
		t.Fatalf("no namespace after Prepare: %v", err)
	}
	if _, _, err := get(t, ns, up.PublicIP); err != nil {
		t.Fatalf("the prepared namespace with internet access: %v", err)
	}
	none := pandastack.NetworkPolicy{}
	if _, err := rt.Restore(ctx, pandastack.RuntimeSpec{ID: "sbx_prep", Network: &none}, "img"); err != nil {
		t.Fatal(err)
	}
	// The restore's own policy is the firewall's (a fork's child given
	// another than the one prepared).
	if _, _, err := get(t, ns, up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after a restore with no internet: %v, want refused", err)
	}
	fi2, err := os.Stat(ns)
	if err != nil || !os.SameFile(fi, fi2) {
		t.Fatalf("the restore did not keep the prepared namespace: %v", err)
	}
	if p, _ := n.Policy("sbx_prep"); p.AllowInternetAccess {
		t.Errorf("the restore's policy was not applied: %+v", p)
	}
	rt.Stop(ctx, "sbx_prep")
	if _, err := os.Stat(ns); err == nil {
		t.Error("namespace left after Stop")
	}

	// A paused sandbox's policy survives a failed Prepare.
	deny := pandastack.NetworkPolicy{AllowInternetAccess: true, DenyOut: []string{"8.8.8.8"}}
	if _, err := n.Prepare("sbx_paused", &deny); err != nil {
		t.Fatal(err)
	}
	n.Hold("sbx_paused")
	n.Release("sbx_paused") // the pause's stop
	inner.prepareErr = errors.New("no room")
	if err := rt.Prepare(ctx, pandastack.RuntimeSpec{ID: "sbx_paused"}, "img"); err == nil {
		t.Fatal("Prepare succeeded")
	}
	if p, ok := n.Policy("sbx_paused"); !ok || len(p.DenyOut) != 1 {
		t.Errorf("a failed Prepare lost the paused sandbox's policy: %+v %v", p, ok)
	}
	if _, err := os.Stat(n.NSPath("sbx_paused")); err == nil {
		t.Error("namespace left after a failed Prepare")
	}
	inner.prepareErr = nil

	// A failed restore into a prepared sandbox releases its network.
	if err := rt.Prepare(ctx, pandastack.RuntimeSpec{ID: "sbx_rfail"}, "img"); err != nil {
		t.Fatal(err)
	}
	inner.restoreErr = errors.New("restore failed")
	if _, err := rt.Restore(ctx, pandastack.RuntimeSpec{ID: "sbx_rfail"}, "img"); err == nil {
		t.Fatal("Restore succeeded")
	}
	if _, err := os.Stat(n.NSPath("sbx_rfail")); err == nil {
		t.Error("namespace left after a failed restore")
	}
	rt.Stop(ctx, "sbx_rfail") // the caller's clean-up of a create takes the rest
	if _, ok := n.Policy("sbx_rfail"); ok {
		t.Error("policy left after the failed restore's stop")
	}

	// A paused sandbox whose resume fails in the restore keeps its policy
	// (a resume that failed applied the policy of pause time next: one shut
	// while paused was open again); a new sandbox's failed restore leaves
	// nothing.
	if _, err := rt.Restore(ctx, pandastack.RuntimeSpec{ID: "sbx_paused"}, "img"); err == nil {
		t.Fatal("Restore succeeded")
	}
	if p, ok := n.Policy("sbx_paused"); !ok || len(p.DenyOut) != 1 {
		t.Errorf("a failed resume lost the paused sandbox's policy: %+v %v", p, ok)
	}
	if _, err := os.Stat(n.NSPath("sbx_paused")); err == nil {
		t.Error("namespace left after a failed resume")
	}
	if _, err := rt.Restore(ctx, pandastack.RuntimeSpec{ID: "sbx_new"}, "img"); err == nil {
		t.Fatal("Restore succeeded")
	}
	if _, ok := n.Policy("sbx_new"); ok {
		t.Error("policy left after a new sandbox's failed restore")
	}
	rt.Stop(ctx, "sbx_paused")
}

func (p *preparingRuntime) Rename(_ context.Context, from, to string) error {
	p.renamed = append(p.renamed, from+" "+to)
	return p.renameErr
}

// A sandbox prepared under one id and renamed to a suspended sandbox's
// (RuntimePreparer.Rename) hands that sandbox its namespace, pinned under
// the new name, with the suspended sandbox's own policy and egress log;
// the old id has nothing left, and the restore of the new one keeps the
// namespace. A rename the runtime refuses changes nothing; one that fails
// past it removes the prepared sandbox and keeps the suspended one's policy.
func TestRuntimeRenameHandsOverNetwork(t *testing.T) {
	up := nettest.StartUpstream(t, "y", 94, 94)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	inner := &preparingRuntime{}
	rt := Wrap(inner, n)
	ctx := context.Background()

	// A suspended sandbox without internet, with a refusal in its log.
	none := pandastack.NoNetworkPolicy()
	ns, err := n.Prepare("sbx_susp", &none)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(t, ns, up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("no internet: %v, want refused", err)
	}
	waitRefused(t, n, "sbx_susp", up.PublicIP, 80, "no_internet")
	logged := len(n.Log("sbx_susp"))
	n.Hold("sbx_susp")
	rt.Stop(ctx, "sbx_susp")

	// A container prepared for creates, with the default policy.
	if err := rt.Prepare(ctx, pandastack.RuntimeSpec{ID: "sbx_stby"}, "img"); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(n.NSPath("sbx_stby"))
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Rename(ctx, "sbx_none", "sbx_susp"); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Fatalf("rename of an id never prepared: %v, want not_found", err)
	}
	if err := rt.Rename(ctx, "sbx_stby", "sbx_susp"); err != nil {
		t.Fatal(err)
	}
	if len(inner.renamed) != 1 || inner.renamed[0] != "sbx_stby sbx_susp" {
		t.Fatalf("the runtime saw renames %q", inner.renamed)
	}
	after, err := os.Stat(n.NSPath("sbx_susp"))
	if err != nil || !os.SameFile(before, after) {
		t.Fatalf("the renamed sandbox's namespace is not the prepared one: %v", err)
	}
	if _, err := os.Stat(n.NSPath("sbx_stby")); err == nil {
		t.Error("the old id's namespace is still pinned")
	}
	if _, ok := n.Policy("sbx_stby"); ok {
		t.Error("the old id still has a policy")
	}
	if got := n.Namespaces(); !slices.Contains(got, "sbx_susp") || slices.Contains(got, "sbx_stby") {
		t.Errorf("namespaces after the rename: %v", got)
	}
	if p, ok := n.Policy("sbx_susp"); !ok || p.AllowInternetAccess {
		t.Errorf("policy after the rename: %+v %v, want the suspended sandbox's (no internet)", p, ok)
	}
	if _, _, err := get(t, n.NSPath("sbx_susp"), up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("from the handed-over namespace: %v, want refused (the suspended sandbox's policy)", err)
	}
	// The entry from before the rename is kept; a new one is logged after it.
	waitRefusedAfter(t, n, "sbx_susp", logged, up.PublicIP, 80, "no_internet")
	if _, ok := n.Addr("sbx_susp"); !ok {
		t.Error("no address after the rename")
	}
	if _, err := rt.Restore(ctx, pandastack.RuntimeSpec{ID: "sbx_susp"}, "img"); err != nil {
		t.Fatal(err)
	}
	if last := inner.restored[len(inner.restored)-1]; last != n.NSPath("sbx_susp") {
		t.Fatalf("the restore saw namespace %q, want %q", last, n.NSPath("sbx_susp"))
	}
	rt.Stop(ctx, "sbx_susp")
	if _, err := os.Stat(n.NSPath("sbx_susp")); err == nil {
		t.Error("namespace left after Stop")
	}

	// The runtime refuses the rename (conflict): nothing changed, the
	// prepared sandbox keeps its network. It fails otherwise: the prepared
	// sandbox goes, the suspended one keeps its policy.
	if _, err := n.Prepare("sbx_sus2", &none); err != nil {
		t.Fatal(err)
	}
	n.Hold("sbx_sus2")
	rt.Stop(ctx, "sbx_sus2")
	if err := rt.Prepare(ctx, pandastack.RuntimeSpec{ID: "sbx_stb2"}, "img"); err != nil {
		t.Fatal(err)
	}
	inner.renameErr = pandastack.Errorf(pandastack.EConflict, "held")
	if err := rt.Rename(ctx, "sbx_stb2", "sbx_sus2"); !pandastack.IsCode(err, pandastack.EConflict) {
		t.Fatalf("a refused rename: %v, want conflict", err)
	}
	if _, err := os.Stat(n.NSPath("sbx_stb2")); err != nil {
		t.Errorf("a refused rename took the prepared sandbox's namespace: %v", err)
	}
	if _, err := os.Stat(n.NSPath("sbx_sus2")); err == nil {
		t.Error("a refused rename pinned the suspended sandbox's namespace")
	}
	inner.renameErr = errors.New("disk full")
	if err := rt.Rename(ctx, "sbx_stb2", "sbx_sus2"); err == nil {
		t.Fatal("Rename succeeded")
	}
	if _, err := os.Stat(n.NSPath("sbx_stb2")); err == nil {
		t.Error("the prepared sandbox's namespace was left after a failed rename")
	}
	if p, ok := n.Policy("sbx_sus2"); !ok || p.AllowInternetAccess {
		t.Errorf("a failed rename changed the suspended sandbox's policy: %+v %v", p, ok)
	}
	if _, ok := n.Policy("sbx_stb2"); ok {
		t.Error("a failed rename left the prepared sandbox's policy")
	}
	n.Release("sbx_sus2")

	// A sandbox with no policy of its own takes the prepared one's (the
	// default, internet): its chain is kept as it is, and lets it out.
	inner.renameErr = nil
	if err := rt.Prepare(ctx, pandastack.RuntimeSpec{ID: "sbx_stb3"}, "img"); err != nil {
		t.Fatal(err)
	}
	if err := rt.Rename(ctx, "sbx_stb3", "sbx_new"); err != nil {
		t.Fatal(err)
	}
	defer rt.Stop(ctx, "sbx_new")
	if p, ok := n.Policy("sbx_new"); !ok || !p.AllowInternetAccess {
		t.Errorf("policy of a sandbox that had none, renamed: %+v %v", p, ok)
	}
	if body, _, err := get(t, n.NSPath("sbx_new"), up.PublicIP); err != nil || body == "" {
		t.Errorf("from the renamed sandbox with the default policy: %q %v", body, err)
	}
}
