package main

import (
	"maps"
	"testing"
)

// forkSteps reads the figures of a "sandbox forked" line (times, the
// image's size, the counts of prepared children and of spares shut down)
// and nothing else.
func TestForkSteps(t *testing.T) {
	line := `time=2026-12-05T03:55:12.937Z level=INFO msg="sandbox forked" sandbox=sbx_a count=1 spares_ms=31.56 spares_released=1 checkpoint_ms=124.417 image_mb=115.5 children_prepared=1 child_restore_ms=118.96`
	want := map[string]float64{"spares_ms": 31.56, "spares_released": 1, "checkpoint_ms": 124.417, "image_mb": 115.5, "children_prepared": 1, "child_restore_ms": 118.96}
	if got := forkSteps(line); !maps.Equal(got, want) {
		t.Fatalf("forkSteps = %v, want %v", got, want)
	}
}
