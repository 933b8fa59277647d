package jupyter

import (
	"bytes"
	"io"
	"net"
	"path/filepath"
	"testing"
)

func TestDialEndpoint(t *testing.T) {
	for in, want := range map[string]string{
		"ipc:///tmp/kernel-1/k-5": "pandastack-ipc:///tmp/kernel-1/k-5",
		"tcp://127.0.0.1:5555":    "pandastack-tcp://127.0.0.1:5555",
		"inproc://elsewhere":      "inproc://elsewhere",
	} {
		if got := dialEndpoint(in); got != want {
			t.Errorf("dialEndpoint(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestBufferedKeepsWritev: a unix connection is wrapped by embedding it,
// which keeps its writev for the frames zmq4 writes as net.Buffers (a
// wrapper of the net.Conn interface would write them one call each), and
// what is written arrives whole.
func TestBufferedKeepsWritev(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan []byte, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	raw, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	c := buffered(raw)
	if _, ok := c.(*bufferedUnix); !ok {
		t.Fatalf("a unix connection is wrapped as %T, which loses writev", c)
	}
	bufs := net.Buffers{[]byte("ab"), []byte("cd"), []byte("ef")}
	if _, err := bufs.WriteTo(c); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if b := <-got; !bytes.Equal(b, []byte("abcdef")) {
		t.Fatalf("the peer read %q", b)
	}
}
