package agent

import (
	"bytes"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/internal/agentproto"
)

// TestBackgroundOutputMemory checks that a process writing a line at a
// time is kept in few events whose memory stays within keptOutput, and
// that an event a reader took no longer grows.
func TestBackgroundOutputMemory(t *testing.T) {
	p := &bgProc{changed: make(chan struct{})}
	line := []byte("hello\n")
	buf := make([]byte, outputChunk) // a reader's buffer, reused
	written := 0
	for range 2_000_000 { // 12 MB of 6-byte reads
		n := copy(buf, line)
		p.append(agentproto.ExecEvent{Type: "stdout", Data: buf[:n]})
		buf[0] = 'X' // the next read overwrites it
		written += n
	}
	mem, kept := 0, 0
	for _, ev := range p.events {
		mem += cap(ev.Data) + eventCost
		kept += len(ev.Data)
		if !bytes.HasPrefix(ev.Data, line) {
			t.Fatalf("an event holds %q: the reader's buffer, not a copy", ev.Data[:6])
		}
	}
	if mem != p.size || mem > keptOutput {
		t.Fatalf("events hold %d bytes, counted %d; want at most %d", mem, p.size, keptOutput)
	}
	if kept < keptOutput*3/4 || int64(kept)+p.info.OutputDropped != int64(written) {
		t.Fatalf("kept %d bytes, dropped %d, of %d", kept, p.info.OutputDropped, written)
	}
	if len(p.events) > 2*keptOutput/outputChunk {
		t.Fatalf("%d events for %d bytes", len(p.events), kept)
	}

	// A reader took the last event: what follows starts a new one, even of
	// the same stream, so the reader's next read finds it.
	q := &bgProc{changed: make(chan struct{})}
	q.append(agentproto.ExecEvent{Type: "stdout", Data: []byte("a")})
	q.append(agentproto.ExecEvent{Type: "stdout", Data: []byte("b")})
	q.sealed = q.first + len(q.events) // what processOutput does once it took them
	q.append(agentproto.ExecEvent{Type: "stdout", Data: []byte("c")})
	q.append(agentproto.ExecEvent{Type: "stderr", Data: []byte("d")})
	q.append(agentproto.ExecEvent{Type: "stderr", Data: []byte("e")})
	var got []string
	for _, ev := range q.events {
		got = append(got, ev.Type+":"+string(ev.Data))
	}
	if want := "stdout:ab stdout:c stderr:de"; strings.Join(got, " ") != want {
		t.Fatalf("events %q, want %q", strings.Join(got, " "), want)
	}
}
