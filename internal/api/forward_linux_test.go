//go:build linux

package api

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A connection to another node, kept alive or not, gives up on a node
// that stops acknowledging what was sent, or answering keep-alive probes,
// within forwardUserTimeout: a request written to a kept-alive connection
// to a node cut off waited for TCP's retransmissions, about 15 minutes,
// before its 503. Checked on the sockets both transports dial.
func TestForwardConnectionsGiveUpOnASilentNode(t *testing.T) {
	// Its answer goes on until the caller hangs up: the connection is open
	// while it is looked at.
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer node.Close()
	for name, tr := range map[string]*http.Transport{"forwardTransport": forwardTransport, "placeTransport": placeTransport} {
		var conn net.Conn
		req, _ := http.NewRequest("GET", node.URL, nil)
		req = req.WithContext(httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(info httptrace.GotConnInfo) { conn = info.Conn },
		}))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		tcp, ok := conn.(*net.TCPConn)
		if !ok {
			t.Fatalf("%s: a %T", name, conn)
		}
		raw, err := tcp.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		opt := map[string]int{}
		err = raw.Control(func(fd uintptr) {
			for k, o := range map[string][2]int{
				"user timeout (ms)": {syscall.IPPROTO_TCP, unix.TCP_USER_TIMEOUT},
				"keep-alive":        {syscall.SOL_SOCKET, syscall.SO_KEEPALIVE},
				"keep-alive idle":   {syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE},
			} {
				v, err := syscall.GetsockoptInt(int(fd), o[0], o[1])
				if err != nil {
					t.Errorf("%s: %s: %v", name, k, err)
				}
				opt[k] = v
			}
		})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if want := int(forwardUserTimeout / time.Millisecond); opt["user timeout (ms)"] != want || opt["keep-alive"] != 1 || opt["keep-alive idle"] <= 0 || opt["keep-alive idle"] >= int(forwardUserTimeout/time.Second) {
			t.Errorf("%s dials sockets with %v; want a user timeout of %d ms and keep-alive probes well within it", name, opt, want)
		}
		tr.CloseIdleConnections()
	}
}
