package jupyter

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// TestRunSilent: silent code changes the kernel's state but shows nothing,
// counts nothing, and reports an exception as an error.
func TestRunSilent(t *testing.T) {
	k := startKernel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := k.RunSilent(ctx, "import json\nwarm = 1\nprint('hidden')"); err != nil {
		t.Fatal(err)
	}
	e, evs := runCode(t, k, "warm + 1", ExecOptions{})
	if e.Text != "2" || e.Stdout != "" {
		t.Fatalf("after a silent run: %+v", e)
	}
	if e.ExecutionCount != 1 {
		t.Fatalf("the first visible cell has execution count %d, want 1", e.ExecutionCount)
	}
	for _, ev := range evs {
		if ev.Type == "stdout" {
			t.Fatalf("the silent run's output reached a later cell: %+v", ev)
		}
	}
	err := k.RunSilent(ctx, "raise ValueError('nope')")
	if err == nil || !strings.Contains(err.Error(), "ValueError") || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("a silent run that raises: %v", err)
	}
	mustText(t, k, "warm", "1")

	// Queued code runs before the next cell, without being waited for.
	if err := k.QueueSilent("queued = warm + 6\nprint('hidden')"); err != nil {
		t.Fatal(err)
	}
	e, _ = runCode(t, k, "queued", ExecOptions{})
	if e.Text != "7" || e.Stdout != "" {
		t.Fatalf("after QueueSilent: %+v", e)
	}

	k.Close()
	if err := k.RunSilent(ctx, "1"); !errors.Is(err, ErrClosed) {
		t.Fatalf("RunSilent after Close: %v", err)
	}
	if err := k.QueueSilent("1"); !errors.Is(err, ErrClosed) {
		t.Fatalf("QueueSilent after Close: %v", err)
	}
}
