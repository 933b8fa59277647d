package agent

import (
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"
)

// Writes to the input of a process that does not read it each answer
// within their bounds, however many come at once, and one whose request
// ends stops; once the process reads, writes go through again.
func TestWriteStdinOneAtATime(t *testing.T) {
	defer func(w time.Duration) { stdinWait = w }(stdinWait)
	stdinWait = 200 * time.Millisecond
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	p := &bgProc{stdin: w, stdinTurn: make(chan struct{}, 1)}
	errs := make(chan error, 3)
	start := time.Now()
	go func() { errs <- p.writeStdin(context.Background(), make([]byte, 3<<20)) }()
	time.Sleep(50 * time.Millisecond)
	go func() { errs <- p.writeStdin(context.Background(), []byte("z")) }()
	go func() { errs <- p.writeStdin(context.Background(), []byte("q")) }()
	for range 3 {
		select {
		case err := <-errs:
			if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, errStdinBusy) {
				t.Errorf("a write to a full pipe: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a write to a full pipe did not answer")
		}
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("three writes took %s", d)
	}
	// One whose request ends gives up at once.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	if err := p.writeStdin(ctx, []byte("x")); err == nil || time.Since(t0) > 150*time.Millisecond {
		t.Errorf("a write whose request ended: %v after %s", err, time.Since(t0))
	}
	// The process reads: the next write goes through.
	go io.Copy(io.Discard, r)
	if err := p.writeStdin(context.Background(), []byte("ok")); err != nil {
		t.Errorf("a write once the process reads: %v", err)
	}
}
