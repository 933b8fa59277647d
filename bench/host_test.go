package main

import "testing"

func TestParseCPUTimes(t *testing.T) {
	got := parseCPUTimes("cpu  2533211 1890320 3965590 5586132 67725 0 42878 562542 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
	if want := (cpuTimes{steal: 562542, idle: 5586132 + 67725, total: 2533211 + 1890320 + 3965590 + 5586132 + 67725 + 42878 + 562542}); got != want {
		t.Fatalf("parseCPUTimes: %+v, want %+v", got, want)
	}
	for _, bad := range []string{"", "intr 1 2 3", "cpu 1 2 3", "cpu 1 2 3 4 5 6 7 x 0 0"} {
		if got := parseCPUTimes(bad); got != (cpuTimes{}) {
			t.Errorf("parseCPUTimes(%q) = %+v, want zero", bad, got)
		}
	}
	if got := stealPercent(cpuTimes{steal: 10, total: 1000}, cpuTimes{steal: 60, total: 2000}); got != "5.0" {
		t.Errorf("stealPercent: %q, want 5.0", got)
	}
	if got := busyMS(cpuTimes{idle: 100, steal: 10, total: 1000}, cpuTimes{idle: 150, steal: 20, total: 1200}); got != 1400 {
		t.Errorf("busyMS: %v, want 1400 (140 ticks)", got)
	}
	if got := stealPercent(cpuTimes{}, cpuTimes{}); got != "" {
		t.Errorf("stealPercent without times: %q, want empty", got)
	}
}

// versionList names the host kernel's pieces in a stable order.
func TestVersionList(t *testing.T) {
	got := versionList(map[string]string{"pyzmq": "26.2.0", "python": "3.11.2", "ipykernel": "6.29.5"})
	if want := "ipykernel 6.29.5, python 3.11.2, pyzmq 26.2.0"; got != want {
		t.Fatalf("versionList = %q, want %q", got, want)
	}
	if got := versionList(nil); got != "" {
		t.Fatalf("versionList(nil) = %q", got)
	}
}
