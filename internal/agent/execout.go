package agent

import (
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

const (
	// outputBatch bounds one event of a streamed exec: output read while
	// the previous events were being written is merged into events of up
	// to this size, so a fast writer (yes, cat of a big file) costs one
	// frame and one flush per batch instead of one per pipe read.
	outputBatch = 256 << 10
	// outputQueued bounds what waits for the writer; past it the readers
	// stop reading, and the command blocks on its full pipe.
	outputQueued = 1 << 20
	// outputPipe is the room asked for in the command's stdout and stderr
	// pipes (64 KiB by default). A command that writes in small pieces
	// (8 KiB at a time, as head and cat do) fills it while the agent is
	// busy writing the previous events, and the readers then take it in a
	// few large reads: in gVisor every read, every wakeup and every time
	// the command blocks on a full pipe is a trip through the sentry.
	outputPipe = 1 << 20
	// outputRead is the readers' buffer: a pipe read returns at most what
	// the pipe holds.
	outputRead = 256 << 10
)

// outputQueue carries a command's output from its readers (one per pipe)
// to the one goroutine that writes the answer. It never waits to gather
// more: the writer takes whatever arrived while it was busy writing, so
// output that trickles in (a prompt, a progress line) goes out at once,
// and output that floods in goes out in few large events. Events keep the
// order in which their reads returned; only consecutive reads of the same
// stream merge.
type outputQueue struct {
	ready chan struct{} // holds a token while events wait
	last  atomic.Int64  // when output last came, in Unix nanoseconds

	mu     sync.Mutex
	space  *sync.Cond // signalled when the writer took events
	events []agentproto.ExecEvent
	size   int
}

func newOutputQueue() *outputQueue {
	q := &outputQueue{ready: make(chan struct{}, 1)}
	q.space = sync.NewCond(&q.mu)
	return q
}

// push appends a copy of p as output of stream typ. It waits while
// outputQueued bytes are already waiting, until the writer takes them.
func (q *outputQueue) push(typ string, p []byte) {
	q.last.Store(time.Now().UnixNano())
	q.mu.Lock()
	for q.size >= outputQueued {
		q.space.Wait()
	}
	for len(p) > 0 {
		last := len(q.events) - 1
		if last >= 0 && q.events[last].Type == typ && len(q.events[last].Data) < outputBatch {
			ev := &q.events[last]
			n := min(len(p), outputBatch-len(ev.Data))
			if cap(ev.Data)-len(ev.Data) < n {
				// A second read merges: more is likely on its way, so
				// make room for a whole batch at once, not by doublings.
				ev.Data = slices.Grow(ev.Data, outputBatch-len(ev.Data))
			}
			ev.Data = append(ev.Data, p[:n]...)
			q.size += n
			p = p[n:]
			continue
		}
		n := min(len(p), outputBatch)
		data := append([]byte(nil), p[:n]...)
		q.events = append(q.events, agentproto.ExecEvent{Type: typ, Data: data})
		q.size += n
		p = p[n:]
	}
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default: // a token is already there
	}
}

// lastRead says when output last came; the zero time if none did.
func (q *outputQueue) lastRead() time.Time {
	if n := q.last.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// take returns every waiting event, oldest first, and frees their room.
func (q *outputQueue) take() []agentproto.ExecEvent {
	q.mu.Lock()
	evs := q.events
	q.events, q.size = nil, 0
	q.space.Broadcast()
	q.mu.Unlock()
	return evs
}

// read pushes what r yields as output of stream typ, until r ends or fails.
func (q *outputQueue) read(r io.Reader, typ string) {
	buf := make([]byte, outputRead)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			q.push(typ, buf[:n])
		}
		if err != nil {
			return
		}
	}
}
