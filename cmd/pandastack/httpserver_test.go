package main

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestIdleConnectionsAreClosed: serve's HTTP server closes a keep-alive
// connection that went quiet after a request (they were kept forever), and
// waits only so long for a client's headers. The server is serve's own,
// with its idle deadline shortened so the test does not wait two minutes.
func TestIdleConnectionsAreClosed(t *testing.T) {
	hs := newHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	if hs.IdleTimeout <= 0 || hs.IdleTimeout > 5*time.Minute || hs.ReadHeaderTimeout <= 0 {
		t.Fatalf("idle timeout %v, header timeout %v: want both set, the idle one at most a few minutes", hs.IdleTimeout, hs.ReadHeaderTimeout)
	}
	hs.IdleTimeout = 200 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go hs.Serve(ln)
	defer hs.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var ne net.Error
	if _, err := br.ReadByte(); err == nil || errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("an idle connection stayed open: %v", err)
	}
}
