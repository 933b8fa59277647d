//go:build linux

package api

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// Connections to other nodes, kept alive or not, probe a quiet peer:
// one cut off (a partition) is dropped within about 30 s, and the next
// request dials afresh and fails in 10 s, rather than being written to a
// dead connection and waiting for TCP's retransmissions, about 15
// minutes. No TCP_USER_TIMEOUT: it would also cut a request whose node
// stops reading its body for that long. Checked on the sockets both
// transports dial.
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
		if opt["user timeout (ms)"] != 0 || opt["keep-alive"] != 1 || opt["keep-alive idle"] != 15 {
			t.Errorf("%s dials sockets with %v; want keep-alive probes after 15 s quiet and no user timeout", name, opt)
		}
		tr.CloseIdleConnections()
	}
}
