package agent

import (
	"io"
	"os"
	"sync/atomic"
	"testing"
	"time"
)

func TestUnread(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Write([]byte("hello"))
	if n := unread(r); n != 5 {
		t.Fatalf("unread with 5 bytes in the pipe: %d", n)
	}
	io.ReadFull(r, make([]byte, 5))
	if n := unread(r); n != 0 {
		t.Fatalf("unread of a drained pipe: %d", n)
	}
	r.Close()
	if n := unread(r); n != 0 {
		t.Fatalf("unread of a closed pipe: %d", n)
	}
}

// TestDrainedWaitsForLaggingReader: after the command exited, output still
// in the pipe is read before the readers are stopped, even when the reader
// is slower than drainAfterExit (a loaded host), though the pipe stays open
// (a child holds it).
func TestDrainedWaitsForLaggingReader(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close() // held open: the reader never meets EOF
	w.Write([]byte("the last line\n"))
	var got atomic.Int64
	readers := make(chan struct{})
	go func() {
		defer close(readers)
		time.Sleep(3 * drainAfterExit) // lagging
		buf := make([]byte, 64)
		for {
			n, err := r.Read(buf)
			got.Add(int64(n))
			if err != nil {
				return
			}
		}
	}()
	if drained(readers, time.Now(), r) {
		t.Fatal("drained reports the reader ended, but the pipe is held open")
	}
	if n := got.Load(); n != int64(len("the last line\n")) {
		t.Fatalf("the readers were to be stopped after reading %d bytes of 14", n)
	}
	r.Close()
	<-readers
}

// An exec reads on within drainMax of its command's exit while bytes wait
// or output still comes; past it, only while no writer is left on its
// pipes (a slow client: what they hold is all there is), not while one
// is (a process holding them, writing on).
func TestKeepDrainingExec(t *testing.T) {
	now := time.Now()
	long := now.Add(-2 * drainMax)
	quiet := now.Add(-2 * drainAfterExit)
	yes, no := func() bool { return true }, func() bool { return false }
	for _, c := range []struct {
		name       string
		left       int
		exited     time.Time
		lastRead   time.Time
		writerless func() bool
		want       bool
	}{
		{"nothing left, nothing coming", 0, now, quiet, yes, false},
		{"nothing left, no output at all", 0, now, time.Time{}, no, false},
		{"within drainMax of the exit", 10, now, quiet, no, true},
		{"an empty pipe while output still comes", 0, now, now, no, true},
		{"a slow client: no writer left", 10, long, quiet, yes, true},
		{"a writer holds the pipe", 10, long, now, no, false},
		{"past drainMax, output still coming", 0, long, now, no, false},
	} {
		if got := keepDrainingExec(c.left, c.exited, c.lastRead, c.writerless); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// writerless tells a pipe whose writers are all gone from one still held.
func TestWriterless(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w.Write([]byte("left"))
	if writerless(r) {
		t.Fatal("a pipe whose writer is open says writerless")
	}
	w.Close()
	if !writerless(r) {
		t.Fatal("a pipe whose writer closed, data still in it, does not say writerless")
	}
}
