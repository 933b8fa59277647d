package network

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// peekHost decides on a head with a bare LF at once, as soon as it shows:
// such a client never sends the CRLF CRLF it waited for until its read
// deadline (10 s). A head still coming is waited for.
func TestPeekHostBareLF(t *testing.T) {
	for _, c := range []struct {
		sent      string
		host      string
		malformed bool
	}{
		{"GET / HTTP/1.1\nHost: a.test\n\n", "", true},
		{"GET / HTTP/1.1\r\nHost: a.test\nX: y\r\n", "", true},
		{"\r\n\nGET / HTTP/1.1\r\nHost: a.test\r\n\r\n", "a.test", false},
		{"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", "a.test", false},
	} {
		client, server := net.Pipe()
		go client.Write([]byte(c.sent)) // and never more, never closed
		done := make(chan struct{})
		var host string
		var malformed bool
		go func() {
			host, malformed = peekHost(bufio.NewReader(server))
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatalf("%q: peekHost still waiting after 5 s", c.sent)
		}
		client.Close()
		server.Close()
		if host != c.host || malformed != c.malformed {
			t.Errorf("%q: host %q malformed %v, want %q %v", c.sent, host, malformed, c.host, c.malformed)
		}
	}
}
