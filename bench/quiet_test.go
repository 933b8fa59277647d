package main

import (
	"math"
	"testing"
)

func TestParseCPUTimes(t *testing.T) {
	stat := "cpu  100 5 50 800 40 3 2 0 7 0\ncpu0 50 2 25 400 20 1 1 0 0 0\n"
	got, err := parseCPUTimes(stat)
	if err != nil {
		t.Fatal(err)
	}
	// busy: user+nice+system+irq+softirq+steal; guest is in user already.
	if want := (cpuTimes{busy: 160, total: 1000}); got != want {
		t.Fatalf("parseCPUTimes = %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "cpu0 1 2 3 4 5\n", "cpu 1 2 x 4 5\n", "cpu 1 2\n"} {
		if _, err := parseCPUTimes(bad); err == nil {
			t.Errorf("parseCPUTimes(%q): no error", bad)
		}
	}
}

func TestBusyShare(t *testing.T) {
	a := cpuTimes{busy: 100, total: 1000}
	if got := busyShare(a, cpuTimes{busy: 150, total: 1200}); math.Abs(got-0.25) > 1e-9 {
		t.Errorf("busyShare = %v, want 0.25", got)
	}
	if got := busyShare(a, a); got != 0 {
		t.Errorf("busyShare over no time = %v, want 0", got)
	}
}
