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

// An exec reads on past drainMax after its command's exit while its own
// output still empties out of the pipe (a slow client) and no process of
// its tree is left to write more; not when one is, nor once the pipe stops
// emptying.
func TestKeepDrainingExec(t *testing.T) {
	now := time.Now()
	long := now.Add(-2 * drainMax)
	alive, gone := func() bool { return true }, func() bool { return false }
	for _, c := range []struct {
		name          string
		left          int
		exited, moved time.Time
		tree          func() bool
		want          bool
	}{
		{"nothing left", 0, now, now, gone, false},
		{"within drainMax of the exit", 10, now, now, alive, true},
		{"a slow client: the pipe empties, the tree is gone", 10, long, now, gone, true},
		{"a stray writer holds the pipe", 10, long, now, alive, false},
		{"the pipe stopped emptying", 10, long, long, gone, false},
	} {
		if got := keepDrainingExec(c.left, c.exited, c.moved, c.tree); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
