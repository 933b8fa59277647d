package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agent/jupyter"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// TestHoldGivesUpAStartAndStopsTheRefiller: a hold gives up the start in
// flight and waits until it has ended; while held nothing wakes the
// refiller; the hold's end wakes it once.
func TestHoldGivesUpAStartAndStopsTheRefiller(t *testing.T) {
	aborted := make(chan struct{})
	sp := &spareSet{kick: make(chan struct{}, 1), want: map[string]int{"python": 1}, ready: map[string][]*jupyter.Kernel{},
		starting: map[string]int{"python": 1}, added: make(chan struct{}), abort: func() { close(aborted) }}
	got := make(chan agentproto.Held, 1)
	go func() { h, _ := sp.hold(context.Background(), false); got <- h }()
	<-aborted
	select {
	case h := <-got:
		t.Fatalf("the hold did not wait for the start it gave up to end: %+v", h)
	case <-time.After(100 * time.Millisecond):
	}
	sp.mu.Lock()
	sp.starting["python"]-- // the start ends, without a spare
	sp.abort = nil
	sp.signal()
	sp.mu.Unlock()
	if h := <-got; h != (agentproto.Held{}) {
		t.Fatalf("hold = %+v, want nothing ready or starting", h)
	}
	sp.mu.Lock()
	sp.wake() // a hand-out while held
	sp.mu.Unlock()
	if len(sp.kick) != 0 {
		t.Fatal("a held spare set woke its refiller")
	}
	sp.unhold()
	if sp.held != 0 || len(sp.kick) != 1 {
		t.Fatalf("after unhold: held %d, %d wake-ups queued, want 0 and 1", sp.held, len(sp.kick))
	}
	sp.unhold() // not held: nothing more
	if sp.held != 0 || len(sp.kick) != 1 {
		t.Fatalf("an unhold of a set not held: held %d, %d wake-ups queued", sp.held, len(sp.kick))
	}
}

// TestHoldsAreCounted: of two forks' holds, the first to end leaves the
// other in force; a hello (unrelease: a fork's child, or a resume) ends
// every hold.
func TestHoldsAreCounted(t *testing.T) {
	sp := &spareSet{kick: make(chan struct{}, 1), want: map[string]int{"python": 1}, ready: map[string][]*jupyter.Kernel{},
		starting: map[string]int{}, added: make(chan struct{})}
	sp.hold(context.Background(), false)
	sp.hold(context.Background(), false)
	sp.unhold()
	if sp.held != 1 || len(sp.kick) != 0 {
		t.Fatalf("after one of two unholds: held %d, %d wake-ups queued, want 1 and 0", sp.held, len(sp.kick))
	}
	sp.hold(context.Background(), false)
	sp.unrelease()
	if sp.held != 0 || len(sp.kick) != 1 {
		t.Fatalf("after a hello: held %d, %d wake-ups queued, want 0 and 1", sp.held, len(sp.kick))
	}
}

// TestHoldGivesUpWithItsContext: a start that does not end within the
// wait is reported as still starting, and the spares stay held.
func TestHoldGivesUpWithItsContext(t *testing.T) {
	sp := &spareSet{kick: make(chan struct{}, 1), want: map[string]int{"python": 1}, ready: map[string][]*jupyter.Kernel{},
		starting: map[string]int{"python": 1}, added: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if h, _ := sp.hold(ctx, false); h != (agentproto.Held{Starting: 1}) || sp.held != 1 {
		t.Fatalf("hold = %+v, held %d; want one starting, held once", h, sp.held)
	}
}

// TestHoldReleasesTheReadySpares: a hold with release takes the ready
// spares out (counted, handed back to be shut down, their ids forgotten),
// one without keeps them; either way nothing starts until the holds end,
// and then the refiller is woken to start the missing ones again.
func TestHoldReleasesTheReadySpares(t *testing.T) {
	a, b := &jupyter.Kernel{}, &jupyter.Kernel{}
	cs := NewContexts()
	sp := &cs.spares
	sp.kick, sp.want = make(chan struct{}, 1), map[string]int{"python": 1, "r": 1}
	sp.ready, sp.ids = map[string][]*jupyter.Kernel{"python": {a}, "r": {b}}, map[*jupyter.Kernel]string{a: "sbx_a", b: "sbx_a"}
	sp.starting, sp.added = map[string]int{}, make(chan struct{})
	if h, shut := sp.hold(context.Background(), false); h != (agentproto.Held{Ready: 2}) || len(shut) != 0 {
		t.Fatalf("hold without release = %+v and %d kernels to shut, want 2 ready kept", h, len(shut))
	}
	h, shut := sp.hold(context.Background(), true)
	if h != (agentproto.Held{Released: 2}) || len(shut) != 2 || !slices.Contains(shut, a) || !slices.Contains(shut, b) {
		t.Fatalf("hold with release = %+v and %v, want both spares released", h, shut)
	}
	if n := len(sp.ready["python"]) + len(sp.ready["r"]); n != 0 || len(sp.ids) != 0 {
		t.Fatalf("after the release: %d spares ready, %d ids kept", n, len(sp.ids))
	}
	if k := cs.takeSpare(context.Background(), "python", true); k != nil {
		t.Fatal("a released spare was handed out")
	}
	sp.unhold()
	if len(sp.kick) != 0 {
		t.Fatal("the refiller was woken while a hold was left")
	}
	sp.unhold()
	if sp.held != 0 || len(sp.kick) != 1 {
		t.Fatalf("after both unholds: held %d, %d wake-ups queued, want 0 and 1", sp.held, len(sp.kick))
	}
}

// TestHoldRequests: an agent that never kept spares answers a hold at once
// with nothing, and its end with 204; a wait_ms that is not a number of ms up to a minute is
// refused with the stable code invalid_request.
func TestHoldRequests(t *testing.T) {
	h := NewServer(Config{Home: t.TempDir()}, 1).Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/contexts/spares/hold?wait_ms=5000", nil))
	var out agentproto.Held
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &out) != nil || out != (agentproto.Held{}) {
		t.Fatalf("hold: %d %s, want 200 with nothing ready or starting", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("DELETE", "/v1/contexts/spares/hold", nil))
	if rec.Code != http.StatusNoContent {
		t.Fatalf("unhold: %d %s, want 204", rec.Code, rec.Body)
	}
	for _, bad := range []string{"-1", "x", "60001"} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/contexts/spares/hold?wait_ms="+bad, nil))
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), `"invalid_request"`) {
			t.Errorf("hold?wait_ms=%s: %d %s, want 400 invalid_request", bad, rec.Code, rec.Body)
		}
	}
}
