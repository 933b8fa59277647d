package sandbox

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// A sandbox restored from an image that holds the server's certificates
// (a warm image, a snapshot) is not set up again; one taken with other
// certificates, or a cold boot, is.
func TestSetupSkipsInstalledCA(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	h.m.UseSandboxCA([]byte("-----BEGIN CERTIFICATE-----\nA\n"))
	sb := h.create()
	if n := h.rt.setups(sb.ID); n != 1 || h.rt.installs != 1 {
		t.Fatalf("a cold boot was set up %d times (%d installs), want 1", n, h.rt.installs)
	}
	snap, err := h.m.Snapshot(ctx, project, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	same, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if n := h.rt.setups(same.ID); n != 0 || h.rt.installs != 1 {
		t.Fatalf("a restore with the certificates in place was set up %d times (%d installs in all), want 0", n, h.rt.installs)
	}
	h.m.UseSandboxCA([]byte("-----BEGIN CERTIFICATE-----\nB\n"))
	other, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if n := h.rt.setups(other.ID); n != 1 || h.rt.installs != 2 {
		t.Fatalf("a restore with other certificates was set up %d times (%d installs in all), want 1", n, h.rt.installs)
	}
	if got, _ := h.exec(other.ID, "get file:"+caMarker); got != h.m.caDigest+"\n" {
		t.Fatalf("marker after the new install: %q, want the new digest", got)
	}
}

// TestSetupInTheHello: with an agent whose hello reports the CA marker, a
// restore whose certificates are in place costs no round trip after the
// hello, one with other certificates is set up as before; an older agent's
// setup reads the marker itself.
func TestSetupInTheHello(t *testing.T) {
	for _, newer := range []bool{true, false} {
		h := newHarness(t)
		h.rt.helloSetup = newer
		ctx := context.Background()
		h.m.UseSandboxCA([]byte("-----BEGIN CERTIFICATE-----\nA\n"))
		sb := h.create()
		snap, err := h.m.Snapshot(ctx, project, sb.ID, nil)
		if err != nil {
			t.Fatal(err)
		}
		reads := h.rt.markerReads
		same, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
		if err != nil {
			t.Fatal(err)
		}
		if n := h.rt.setups(same.ID); n != 0 || h.rt.installs != 1 {
			t.Fatalf("newer %v: a restore with the certificates in place was set up %d times (%d installs in all), want 0", newer, n, h.rt.installs)
		}
		if got, want := h.rt.markerReads-reads, map[bool]int{true: 0, false: 1}[newer]; got != want {
			t.Fatalf("newer %v: the restore's setup read the marker %d times, want %d", newer, got, want)
		}
		h.m.UseSandboxCA([]byte("-----BEGIN CERTIFICATE-----\nB\n"))
		other, err := h.m.Create(ctx, project, CreateRequest{SnapshotID: snap.ID})
		if err != nil {
			t.Fatal(err)
		}
		if n := h.rt.setups(other.ID); n != 1 || h.rt.installs != 2 {
			t.Fatalf("newer %v: a restore with other certificates was set up %d times (%d installs in all), want 1", newer, n, h.rt.installs)
		}
	}
}

// TestSetupTimeoutIsTimeout: a setup that runs past its own bound (an
// overloaded host) is reported as a timeout, not as an internal error; one
// whose caller gave up is not relabelled.
func TestSetupTimeoutIsTimeout(t *testing.T) {
	old := setupTimeout
	setupTimeout = 200 * time.Millisecond
	t.Cleanup(func() { setupTimeout = old })
	c := fakeAgent(t, func(mux *http.ServeMux) {
		mux.HandleFunc("POST /v1/exec", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	})
	m := &Manager{}
	m.UseSandboxCA([]byte("-----BEGIN CERTIFICATE-----\nA\n"))
	err := m.setupSandbox(context.Background(), c)
	wantCode(t, err, pandastack.ETimeout)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := m.setupSandbox(ctx, c); pandastack.IsCode(err, pandastack.ETimeout) || err == nil {
		t.Fatalf("setup whose caller's deadline passed: %v, want the caller's own error", err)
	}
}
