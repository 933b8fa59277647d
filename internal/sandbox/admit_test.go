package sandbox

import (
	"context"
	"errors"
	"testing"
	"time"
)

// granted reports whether ch delivers within a short while: for checks
// that a slot is not given, where a wrong grant shows up at once.
func granted(ch <-chan func()) (func(), bool) {
	return grantedWithin(ch, 50*time.Millisecond)
}

// grants waits for a slot that must come: a loaded host may take a
// while to run the goroutine that gets it.
func grants(ch <-chan func()) (func(), bool) {
	return grantedWithin(ch, 10*time.Second)
}

func grantedWithin(ch <-chan func(), d time.Duration) (func(), bool) {
	select {
	case r := <-ch:
		return r, true
	case <-time.After(d):
		return nil, false
	}
}

// acquireAsync asks for a slot in the background and returns once the
// request is in line (or through), so requests queue in call order.
func acquireAsync(t *testing.T, a *admission, ctx context.Context, background bool) <-chan func() {
	t.Helper()
	count := func() int { // grants keep it; only a new request adds one
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.fg) + len(a.bg) + a.running
	}
	before := count()
	ch := make(chan func(), 1)
	go func() {
		if r, err := a.acquire(ctx, background); err == nil {
			ch <- r
		}
	}()
	waitFor(t, func() bool { return count() > before })
	return ch
}

// next checks that want gets a slot and none of others does, and returns
// want's release.
func next(t *testing.T, what string, want <-chan func(), others ...<-chan func()) func() {
	t.Helper()
	rel, ok := grants(want)
	if !ok {
		t.Fatalf("%s did not get the slot", what)
	}
	for _, o := range others {
		if _, ok := granted(o); ok {
			t.Fatalf("another went along with %s", what)
		}
	}
	return rel
}

// Creates beyond the limit wait and go in arrival order; a refill waits
// while any create restores or waits.
func TestAdmissionOrder(t *testing.T) {
	ctx := context.Background()
	a := newAdmission(1)
	first, err := a.acquire(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	refill := acquireAsync(t, a, ctx, true)
	second := acquireAsync(t, a, ctx, false)
	third := acquireAsync(t, a, ctx, false)
	if _, ok := granted(second); ok {
		t.Fatal("a create went past the limit")
	}
	if a.waiting() != 2 {
		t.Fatalf("waiting %d, want 2", a.waiting())
	}
	first()
	first() // a second release changes nothing
	next(t, "the oldest create", second, third)()
	next(t, "the next create", third, refill)()
	relR := next(t, "the refill, once no create restores or waits", refill)
	// A create while a refill runs waits for the slot, and goes first.
	create := acquireAsync(t, a, ctx, false)
	refill2 := acquireAsync(t, a, ctx, true)
	relR()
	next(t, "the create after the refill", create, refill2)
}

// With no limit creates never wait, but refills still wait for them.
func TestAdmissionNoLimit(t *testing.T) {
	ctx := context.Background()
	a := newAdmission(0)
	var rels []func()
	for range 5 {
		r, err := a.acquire(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		rels = append(rels, r)
	}
	refill := acquireAsync(t, a, ctx, true)
	if _, ok := granted(refill); ok {
		t.Fatal("a refill went while creates restore")
	}
	for _, r := range rels {
		r()
	}
	if _, ok := grants(refill); !ok {
		t.Fatal("the refill did not go")
	}
}

// A caller that gives up leaves the line and holds nothing.
func TestAdmissionCancel(t *testing.T) {
	a := newAdmission(1)
	first, _ := a.acquire(context.Background(), false)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := a.acquire(ctx, false)
		errc <- err
	}()
	waitFor(t, func() bool { return a.waiting() == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if a.waiting() != 0 {
		t.Fatal("the caller that gave up is still in line")
	}
	first()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.running != 0 || a.fgRunning != 0 {
		t.Fatalf("slots held after everyone left: %d (%d creates)", a.running, a.fgRunning)
	}
}
