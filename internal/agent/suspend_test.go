package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agent/jupyter"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// TestReleaseWithoutSpares: an agent that never kept spares (or has no
// kernel) answers a release with nothing shut down, and a refill is a
// no-op; neither fails, so the host can always ask.
func TestReleaseWithoutSpares(t *testing.T) {
	h := NewServer(Config{Home: t.TempDir()}, 1).Handler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/contexts/spares/release", nil))
	var out agentproto.Released
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &out) != nil || out != (agentproto.Released{}) {
		t.Fatalf("release: %d %s, want 200 with nothing released", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/v1/contexts/spares/refill", nil))
	if rec.Code != http.StatusNoContent {
		t.Fatalf("refill: %d %s, want 204", rec.Code, rec.Body)
	}
}

// TestReleaseStopsTheRefiller: once released, nothing wakes the refiller
// (a hand-out finding no spare neither); unrelease (a resume's hello, or a
// refill) wakes it once.
func TestReleaseStopsTheRefiller(t *testing.T) {
	sp := &spareSet{kick: make(chan struct{}, 1), want: map[string]int{"python": 1}, ready: map[string][]*jupyter.Kernel{},
		starting: map[string]int{}, added: make(chan struct{})}
	if ks := sp.release(); len(ks) != 0 || !sp.released {
		t.Fatalf("release: %d kernels, released %v", len(ks), sp.released)
	}
	sp.mu.Lock()
	sp.wake()
	sp.mu.Unlock()
	if len(sp.kick) != 0 {
		t.Fatal("a released spare set woke its refiller")
	}
	sp.unrelease()
	if sp.released || len(sp.kick) != 1 {
		t.Fatalf("after unrelease: released %v, %d wake-ups queued, want false and 1", sp.released, len(sp.kick))
	}
	sp.unrelease() // not released: nothing more
	if len(sp.kick) != 1 {
		t.Fatal("unrelease of a set that was not released woke the refiller again")
	}
}

// TestTakeSpareWaitsForAStart: with no spare ready but one being started,
// a hand-out waits for that start rather than starting a kernel of its
// own, and gives up (nil) when the start ends without a spare.
func TestTakeSpareWaitsForAStart(t *testing.T) {
	cs := NewContexts()
	sp := &cs.spares
	sp.kick, sp.want, sp.ready = make(chan struct{}, 1), map[string]int{"python": 1}, map[string][]*jupyter.Kernel{}
	sp.starting, sp.added = map[string]int{"python": 1}, make(chan struct{})
	got := make(chan bool, 1)
	go func() { got <- cs.takeSpare(context.Background(), "python", true) == nil }()
	select {
	case <-got:
		t.Fatal("the hand-out did not wait for the spare being started")
	case <-time.After(100 * time.Millisecond):
	}
	sp.mu.Lock()
	sp.starting["python"]-- // the start failed
	sp.signal()
	sp.mu.Unlock()
	if isNil := <-got; !isNil {
		t.Fatal("a spare out of a failed start")
	}
	ctx, cancel := context.WithCancel(context.Background())
	sp.starting["python"] = 1
	go func() { got <- cs.takeSpare(ctx, "python", true) == nil }()
	cancel()
	if isNil := <-got; !isNil {
		t.Fatal("a spare after the hand-out's context ended")
	}
	// A start that takes too long: the hand-out stops waiting for it.
	defer func(d time.Duration) { maxSpareWait = d }(maxSpareWait)
	maxSpareWait = 50 * time.Millisecond
	if k := cs.takeSpare(context.Background(), "python", true); k != nil {
		t.Fatal("a spare out of a start that never ended")
	}
}
