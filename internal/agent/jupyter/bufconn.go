package jupyter

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// zmq4 reads every frame of a message straight from its connection, in
// two reads (its header, then its body): an execute_reply of seven frames
// took fourteen read calls, and in gVisor each costs 10-30 µs (the agent
// made about 75 reads per run_code("1+1")). Our sockets dial through these
// transports instead, which are zmq4's own with the reads buffered: a
// message that has arrived whole is read in one call.
const (
	bufferedIPC = "pandastack-ipc"
	bufferedTCP = "pandastack-tcp"
)

func init() {
	for name, network := range map[string]string{bufferedIPC: "unix", bufferedTCP: "tcp"} {
		if err := zmq4.RegisterTransport(name, bufferedTransport{network}); err != nil {
			panic(err)
		}
	}
}

// bufferedTransport dials like zmq4's transport for network, and buffers
// the connection's reads. It does not listen: we only dial kernels.
type bufferedTransport struct{ network string }

func (t bufferedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := d.DialContext(ctx, t.network, addr)
	if err != nil {
		return nil, err
	}
	return buffered(c), nil
}

func (t bufferedTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, errors.New("jupyter: the buffered transports only dial")
}

func (t bufferedTransport) Addr(ep string) (string, error) {
	return transport.New(t.network).Addr(ep)
}

// buffered wraps c so that its reads go through a buffer. Unix and TCP
// connections are embedded as themselves, which keeps their writev: zmq4
// writes a message's frames as one net.Buffers, one call on a connection
// of the net package, one call per frame on anything else.
func buffered(c net.Conn) net.Conn {
	r := bufio.NewReaderSize(c, 64<<10)
	switch c := c.(type) {
	case *net.UnixConn:
		return &bufferedUnix{c, r}
	case *net.TCPConn:
		return &bufferedTCPConn{c, r}
	}
	return &bufferedConn{c, r}
}

type bufferedUnix struct {
	*net.UnixConn
	r *bufio.Reader
}

func (c *bufferedUnix) Read(p []byte) (int, error) { return c.r.Read(p) }

type bufferedTCPConn struct {
	*net.TCPConn
	r *bufio.Reader
}

func (c *bufferedTCPConn) Read(p []byte) (int, error)         { return c.r.Read(p) }
func (c *bufferedTCPConn) WriteTo(w io.Writer) (int64, error) { return c.r.WriteTo(w) }

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// dialEndpoint is endpoint (an ipc:// or tcp:// address) for dialing
// through the buffered transports.
func dialEndpoint(endpoint string) string {
	for scheme, name := range map[string]string{"ipc://": bufferedIPC, "tcp://": bufferedTCP} {
		if rest, ok := strings.CutPrefix(endpoint, scheme); ok {
			return name + "://" + rest
		}
	}
	return endpoint
}
