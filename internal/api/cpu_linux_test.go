//go:build linux

package api

import (
	"os"
	"testing"
	"time"
)

func TestCPUSecondsCountsThisProcess(t *testing.T) {
	before := cpuSeconds([]int{os.Getpid()})
	for start := time.Now(); cpuSeconds([]int{os.Getpid()}) < before+0.05; {
		if time.Since(start) > time.Minute {
			t.Fatal("a busy loop of a minute added under 0.05 s of CPU time")
		}
	}
	if got := cpuSeconds([]int{-1, 0}); got != 0 {
		t.Errorf("processes that do not exist used %v s", got)
	}
}
