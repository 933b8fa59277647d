package api

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestStalledUploadIsCut: an upload whose client sent part of its body and
// went quiet is abandoned once no bytes moved for fileIdle, with 504
// timeout: the handler's read of the body is cut, not only its context (it
// stayed blocked, and the sandbox busy, for as long as the client waited).
func TestStalledUploadIsCut(t *testing.T) {
	defer func(d time.Duration) { fileIdle = d }(fileIdle)
	fileIdle = 300 * time.Millisecond
	read := make(chan int, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, idle := newUploadGuard(w, r)
		defer idle.stop()
		n, err := io.Copy(io.Discard, idle.reader(r.Body))
		read <- int(n)
		writeError(w, fileError(ctx, err, "the upload (no data moved for a while)", fileIdle))
	}))
	defer srv.Close()

	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("PUT /files HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc"))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled upload: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(body), `"timeout"`) {
		t.Fatalf("stalled upload: %d %s, want 504 timeout", resp.StatusCode, body)
	}
	if n := <-read; n != 3 {
		t.Errorf("the handler read %d bytes, want the 3 sent", n)
	}
}
