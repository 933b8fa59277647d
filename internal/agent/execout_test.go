package agent

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

func concat(evs []agentproto.ExecEvent, typ string) string {
	var b strings.Builder
	for _, ev := range evs {
		if ev.Type == typ {
			b.Write(ev.Data)
		}
	}
	return b.String()
}

// Reads that pile up while the writer is busy merge into one event per run
// of the same stream; stdout and stderr keep the order of their reads.
func TestOutputQueueMergesRunsInOrder(t *testing.T) {
	q := newOutputQueue()
	buf := []byte("aa")
	q.push("stdout", buf)
	buf[0] = 'x' // push copied: the reader reuses its buffer
	q.push("stdout", []byte("bb"))
	q.push("stderr", []byte("E1"))
	q.push("stdout", []byte("cc"))
	q.push("stderr", []byte("E2"))
	q.push("stderr", []byte("E3"))
	select {
	case <-q.ready:
	default:
		t.Fatal("no ready token after a push")
	}
	evs := q.take()
	var got []string
	for _, ev := range evs {
		got = append(got, ev.Type+":"+string(ev.Data))
	}
	want := []string{"stdout:aabb", "stderr:E1", "stdout:cc", "stderr:E2E3"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("events %q, want %q", got, want)
	}
	if evs := q.take(); len(evs) != 0 {
		t.Fatalf("a second take returned %d events", len(evs))
	}
}

// No event grows past outputBatch, however much arrives at once.
func TestOutputQueueSplitsAtBatch(t *testing.T) {
	q := newOutputQueue()
	big := bytes.Repeat([]byte("y\n"), outputBatch) // 2 batches
	q.push("stdout", big[:100])
	q.push("stdout", big[100:])
	evs := q.take()
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2", len(evs))
	}
	for _, ev := range evs {
		if len(ev.Data) > outputBatch {
			t.Fatalf("event of %d bytes, more than %d", len(ev.Data), outputBatch)
		}
	}
	if concat(evs, "stdout") != string(big) {
		t.Fatal("the events do not add up to what was pushed")
	}
}

// A full queue stops its reader until the writer takes what waits: a client
// that reads slowly slows the command down instead of filling memory.
func TestOutputQueueBlocksWhenFull(t *testing.T) {
	q := newOutputQueue()
	chunk := bytes.Repeat([]byte("z"), outputRead)
	for range outputQueued / outputRead {
		q.push("stdout", chunk)
	}
	pushed := make(chan struct{})
	go func() {
		q.push("stdout", []byte("late"))
		close(pushed)
	}()
	select {
	case <-pushed:
		t.Fatal("push into a full queue returned before anything was taken")
	case <-time.After(50 * time.Millisecond):
	}
	if got := len(concat(q.take(), "stdout")); got != outputQueued {
		t.Fatalf("took %d bytes, want %d", got, outputQueued)
	}
	<-pushed // the take made room
	if got := concat(q.take(), "stdout"); got != "late" {
		t.Fatalf("then took %q, want \"late\"", got)
	}
}

// read hands everything of its reader to the queue, in order.
func TestOutputQueueRead(t *testing.T) {
	q := newOutputQueue()
	src := bytes.Repeat([]byte("0123456789"), 30000) // several read buffers
	q.read(bytes.NewReader(src), "stderr")
	if got := concat(q.take(), "stderr"); got != string(src) {
		t.Fatalf("read %d bytes, want %d, or in another order", len(got), len(src))
	}
}
