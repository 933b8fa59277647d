package agent

import (
	"context"
	"errors"
	"io"
	"os"
	"testing"
	"time"
)

// stdinPipe is a process's input as a pipe: its read end, and the process
// writing to the other, both closed when the test ends.
func stdinPipe(t *testing.T) (*os.File, *bgProc) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, &bgProc{stdin: w, stdinTurn: make(chan struct{}, 1)}
}

// Writes to the input of a process that does not read it each answer
// within their bounds, however many come at once, and one whose request
// ends stops; once the process reads, writes go through again.
func TestWriteStdinOneAtATime(t *testing.T) {
	defer func(w time.Duration) { stdinWait = w }(stdinWait)
	stdinWait = 200 * time.Millisecond
	r, p := stdinPipe(t)
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
	if err := p.writeStdin(ctx, []byte("x")); err == nil || time.Since(t0) > time.Second {
		t.Errorf("a write whose request ended: %v after %s", err, time.Since(t0))
	}
	// The process reads: the next write goes through (in its time: the
	// reader may start late on a loaded host).
	stdinWait = 5 * time.Second
	go io.Copy(io.Discard, r)
	if err := p.writeStdin(context.Background(), []byte("ok")); err != nil {
		t.Errorf("a write once the process reads: %v", err)
	}
}

// An EOF waits for the write under way (the start's stdin, its turn taken
// before the start answered): the process reads all of it, then the end.
func TestStdinEOFAfterTheStartsInput(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p := &bgProc{stdin: w, stdinTurn: make(chan struct{}, 1)}
	p.stdinTurn <- struct{}{} // as startProcess takes it
	go p.writeStdinTaken(context.Background(), make([]byte, 1<<20))
	got := make(chan int64, 1)
	go func() {
		time.Sleep(100 * time.Millisecond) // the pipe full, the write waiting
		n, _ := io.Copy(io.Discard, r)
		got <- n
	}()
	if err := p.takeStdinTurn(context.Background()); err != nil {
		t.Fatal(err)
	}
	w.Close()
	<-p.stdinTurn
	if n := <-got; n != 1<<20 {
		t.Fatalf("the process read %d bytes before its input ended, want all %d", n, 1<<20)
	}
}

// A process that reads its input slowly, but reads it, gets all of it: the
// bound is on a chunk taking stdinWait, not on the whole write. One that
// stops reading fails the write, which says how much went.
func TestStdinSlowReaderGetsItAll(t *testing.T) {
	defer func(w time.Duration) { stdinWait = w }(stdinWait)
	stdinWait = time.Second // a reader late by most of it still passes
	r, p := stdinPipe(t)
	const size = 1 << 20
	got := make(chan int, 1)
	go func() {
		n := 0
		buf := make([]byte, stdinChunk)
		for n < size {
			k, err := r.Read(buf)
			n += k
			if err != nil {
				break
			}
			time.Sleep(100 * time.Millisecond) // 640 KiB/s: the whole, 1.6 s, takes longer than stdinWait
		}
		got <- n
	}()
	if err := p.writeStdin(context.Background(), make([]byte, size)); err != nil {
		t.Fatalf("a write to a slow reader: %v", err)
	}
	if n := <-got; n != size {
		t.Fatalf("the reader got %d of %d bytes", n, size)
	}
	// Nobody reads now: the write stops once the pipe is full, and says
	// how much of it went.
	err := p.writeStdin(context.Background(), make([]byte, size))
	var se *stdinError
	if !errors.As(err, &se) || !errors.Is(err, os.ErrDeadlineExceeded) || se.written <= 0 || se.written >= size {
		t.Fatalf("a write nobody reads: %v, want a deadline after part of it", err)
	}
}
