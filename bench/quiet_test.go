package main

import "testing"

func TestQuietEnough(t *testing.T) {
	for _, tc := range []struct {
		idle float64
		cpus int
		want bool
	}{
		{2, 2, true},    // all idle
		{1.6, 2, true},  // 20% busy: the limit
		{1.5, 2, false}, // a quarter busy
		{0, 2, false},   // all busy
		{7.9, 8, true},  // a little busy
		{1, 0, false},   // no CPU count: never quiet
	} {
		if got := quietEnough(tc.idle, tc.cpus); got != tc.want {
			t.Errorf("quietEnough(%v, %d) = %v, want %v", tc.idle, tc.cpus, got, tc.want)
		}
	}
}
