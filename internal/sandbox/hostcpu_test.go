package sandbox

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestParseCPULine(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	idle, total, err := parseCPULine(strings.Fields("10 2 8 70 5 1 1 3 7 0"))
	if err != nil || idle != 75 || total != 100 {
		t.Fatalf("got idle %d total %d err %v, want 75 100 nil (guest time is in user already)", idle, total, err)
	}
	for _, bad := range []string{"1 2 x 4 5", "1 2 3"} {
		if _, _, err := parseCPULine(strings.Fields(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// On this host: a share of its CPUs, and ctx's error when ctx ends first.
func TestIdleCPUs(t *testing.T) {
	_, _, n, err := cpuTicks()
	if err != nil {
		t.Fatal(err)
	}
	idle, err := idleCPUs(context.Background(), 50*time.Millisecond)
	if err != nil || idle < 0 || idle > float64(n) {
		t.Fatalf("idle CPUs %v, err %v; want 0 to %d", idle, err, n)
	}
	// The exported form says how many CPUs that is of: /proc/stat's.
	if idle, cpus, err := IdleCPUs(context.Background(), 50*time.Millisecond); err != nil || cpus != n || idle < 0 || idle > float64(cpus) {
		t.Fatalf("IdleCPUs: %v of %d, err %v; want 0 to %d of %d", idle, cpus, err, n, n)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := idleCPUs(ctx, time.Hour); err != context.Canceled {
		t.Fatalf("cancelled: %v", err)
	}
}
