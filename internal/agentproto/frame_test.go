package agentproto

import (
	"bytes"
	"encoding/binary"
	"io"
	"testing"
	"time"
)

type pipeRWC struct {
	io.Reader
	io.Writer
}

func (pipeRWC) Close() error { return nil }

// A writer that died mid-frame, in either direction, must not swallow the
// next session's first bytes.
func TestTornFramesDoNotWedgeTheNextSession(t *testing.T) {
	toAgentR, toAgentW := io.Pipe()
	toHostR, toHostW := io.Pipe()
	torn := make([]byte, headerSize+10)
	binary.BigEndian.PutUint32(torn[0:4], frameMagic)
	binary.BigEndian.PutUint32(torn[4:8], 3)
	binary.BigEndian.PutUint32(torn[8:12], 5000) // promises 5000 bytes, delivers 10

	sessions := make(chan io.ReadWriteCloser, 2)
	go Serve(toAgentR, toHostW, func(epoch uint32, c io.ReadWriteCloser) {
		if epoch == 7 {
			sessions <- c
			return
		}
		io.Copy(io.Discard, c) // a session reads all along, as yamux does

	})
	// The dead host's half frame, then the agent's own half frame of the old session.
	go func() { toAgentW.Write(torn) }()
	time.Sleep(50 * time.Millisecond)

	host := HostConn(pipeRWC{toHostR, toAgentW}, 7)
	// The host reads all along, as yamux does.
	hostBuf := make([]byte, 10)
	done := make(chan error, 1)
	go func() { _, err := io.ReadFull(host, hostBuf); done <- err }()
	go func() {
		if _, err := host.Write([]byte("hello agent")); err != nil {
			t.Error(err)
		}
	}()
	var agent io.ReadWriteCloser
	select {
	case agent = <-sessions:
	case <-time.After(5 * time.Second):
		t.Fatal("the new epoch never reached the agent: the torn frame swallowed it")
	}
	buf := make([]byte, 11)
	if _, err := io.ReadFull(agent, buf); err != nil || string(buf) != "hello agent" {
		t.Fatalf("agent read %q, %v", buf, err)
	}
	go agent.Write([]byte("hello host"))
	select {
	case err := <-done:
		if err != nil || string(hostBuf) != "hello host" {
			t.Fatalf("host read %q, %v", hostBuf, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the host never got the agent's answer")
	}
}

// The agent sends a yamux data message (a header write, then a body write)
// as one frame, and any other message at once, on its own.
func TestAgentSendsDataHeaderWithItsBody(t *testing.T) {
	toAgentR, toAgentW := io.Pipe()
	toHostR, toHostW := io.Pipe()
	sessions := make(chan io.ReadWriteCloser, 1)
	go Serve(toAgentR, toHostW, func(_ uint32, c io.ReadWriteCloser) { sessions <- c })
	go (&frameWriter{w: toAgentW}).write(5, []byte("x")) // opens epoch 5
	frames := make(chan []byte, 10)
	go func() {
		fr := newFrameReader(toHostR) // skips the agent's padding
		for {
			f, err := fr.next()
			if err != nil {
				close(frames)
				return
			}
			frames <- bytes.Clone(f.payload) // valid until the next call
		}
	}()
	agent := <-sessions
	if _, err := io.ReadFull(agent, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	header := func(typ byte, length uint32) []byte {
		h := make([]byte, 12)
		h[1] = typ
		binary.BigEndian.PutUint32(h[4:8], 3) // stream id
		binary.BigEndian.PutUint32(h[8:12], length)
		return h
	}
	next := func() []byte {
		select {
		case f := <-frames:
			return f
		case <-time.After(5 * time.Second):
			t.Fatal("no frame reached the host")
			return nil
		}
	}

	data := header(0, 5)
	if n, err := agent.Write(data); n != 12 || err != nil {
		t.Fatalf("header write: %d, %v", n, err)
	}
	data[11] = 0xff // yamux reuses its header buffer: the held copy must not change
	if n, err := agent.Write([]byte("hello")); n != 5 || err != nil {
		t.Fatalf("body write: %d, %v", n, err)
	}
	if got, want := next(), append(header(0, 5), "hello"...); string(got) != string(want) {
		t.Fatalf("frame %q, want the header and its body in one: %q", got, want)
	}

	// A window update has no body: it goes out alone, at once; so does a
	// data header without a body (a bare flag).
	for _, h := range [][]byte{header(1, 1<<20), header(0, 0)} {
		if _, err := agent.Write(h); err != nil {
			t.Fatal(err)
		}
		if got := next(); string(got) != string(h) {
			t.Fatalf("frame %q, want the header %q alone", got, h)
		}
	}

	// A body longer than a frame: the header rides in the first one.
	body := make([]byte, maxFramePayload+100)
	for i := range body {
		body[i] = byte(i)
	}
	go func() {
		agent.Write(header(0, uint32(len(body))))
		agent.Write(body)
	}()
	got := append(next(), next()...)
	if want := append(header(0, uint32(len(body))), body...); string(got) != string(want) {
		t.Fatalf("a long message arrived as %d bytes, not its %d", len(got), len(want))
	}
}

// An agent asked for large frames sends a big write as one frame, which
// the host reads whole; without the request its frames stay at 64 KiB.
func TestLargeFrames(t *testing.T) {
	for _, large := range []bool{false, true} {
		toAgentR, toAgentW := io.Pipe()
		toHostR, toHostW := io.Pipe()
		sessions := make(chan io.ReadWriteCloser, 1)
		go Serve(toAgentR, toHostW, func(_ uint32, c io.ReadWriteCloser) { sessions <- c })
		body := make([]byte, 700<<10)
		for i := range body {
			body[i] = byte(i * 7)
		}
		// A spy on the pipe sees the frames as the host's reader meets them.
		spyR, spyW := io.Pipe()
		host := HostConn(pipeRWC{io.TeeReader(toHostR, spyW), toAgentW}, 5)
		sizes := make(chan []int, 1)
		go func() {
			fr := newFrameReader(spyR)
			fr.max = maxLargeFrame
			var got []int
			for total := 0; total < 2+len(body); {
				f, err := fr.next()
				if err != nil {
					break
				}
				if f.epoch == 5 {
					got = append(got, len(f.payload))
					total += len(f.payload)
				}
			}
			sizes <- got
			io.Copy(io.Discard, spyR)
		}()
		read := make(chan []byte, 1)
		go func() {
			got := make([]byte, 2+len(body))
			io.ReadFull(host, got)
			read <- got
		}()
		go host.Write([]byte("x")) // opens epoch 5
		agent := <-sessions
		if _, err := io.ReadFull(agent, make([]byte, 1)); err != nil {
			t.Fatal(err)
		}
		if large && !AllowLargeFrames(agent) {
			t.Fatal("AllowLargeFrames: not a session stream")
		}
		go func() {
			agent.Write([]byte("hi"))
			agent.Write(body)
		}()
		got := <-read
		if string(got[:2]) != "hi" || !bytes.Equal(got[2:], body) {
			t.Fatalf("large=%v: the host read other bytes than were written", large)
		}
		frames := <-sizes
		biggest := 0
		for _, n := range frames {
			biggest = max(biggest, n)
		}
		if want := map[bool]int{false: maxFramePayload, true: len(body)}[large]; biggest != want {
			t.Fatalf("large=%v: frames of %v bytes, want the largest %d", large, frames, want)
		}
		toHostW.Close()
		toAgentW.Close()
		spyW.Close()
	}
}

// Before a host reader has met a frame of its own session, a header that
// promises more than 64 KiB is garbage: a torn large frame of an old
// session cannot swallow the padding and the new session's first frame.
func TestTornLargeFrameBeforeSync(t *testing.T) {
	var pipe bytes.Buffer
	torn := make([]byte, headerSize+100)
	binary.BigEndian.PutUint32(torn[0:4], frameMagic)
	binary.BigEndian.PutUint32(torn[4:8], 3)
	binary.BigEndian.PutUint32(torn[8:12], maxLargeFrame) // promises 1 MiB, delivers 100 bytes
	pipe.Write(torn)
	fw := &frameWriter{w: &pipe}
	if err := fw.pad(); err != nil {
		t.Fatal(err)
	}
	fw.write(9, []byte("first"))
	fw.write2(9, nil, bytes.Repeat([]byte("L"), 200<<10), maxLargeFrame)
	c := HostConn(pipeRWC{&pipe, io.Discard}, 9)
	got := make([]byte, 5+200<<10)
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("the new session's frames were lost: %v", err)
	}
	if string(got[:5]) != "first" || !bytes.Equal(got[5:], bytes.Repeat([]byte("L"), 200<<10)) {
		t.Fatalf("read %q…, want the new session's frames", got[:16])
	}
}
