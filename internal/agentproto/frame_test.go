package agentproto

import (
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
