package network

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// resolver answers a sandbox's DNS on its gateway address (UDP and TCP port
// 53; the firewall redirects DNS to any address there) by forwarding each
// query to the host's own resolvers.
type resolver struct {
	udp       net.PacketConn
	tcp       net.Listener
	upstreams []netip.AddrPort
	log       *slog.Logger
	sem       chan struct{}  // bounds queries in flight
	wg        sync.WaitGroup // the two accept loops; queries in flight end on their own deadlines
}

const resolverTimeout = 5 * time.Second

func startResolver(addr netip.Addr, upstreams []netip.AddrPort, log *slog.Logger) (*resolver, error) {
	ap := netip.AddrPortFrom(addr, 53).String()
	udp, err := net.ListenPacket("udp4", ap)
	if err != nil {
		return nil, err
	}
	tcp, err := net.Listen("tcp4", ap)
	if err != nil {
		udp.Close()
		return nil, err
	}
	r := &resolver{udp: udp, tcp: tcp, upstreams: upstreams, log: log, sem: make(chan struct{}, 64)}
	r.wg.Add(2)
	go r.serveUDP()
	go r.serveTCP()
	return r, nil
}

// Close stops listening; queries in flight finish within their timeouts.
func (r *resolver) Close() {
	r.udp.Close()
	r.tcp.Close()
	r.wg.Wait()
}

func (r *resolver) serveUDP() {
	defer r.wg.Done()
	buf := make([]byte, 65535)
	for {
		n, from, err := r.udp.ReadFrom(buf)
		if err != nil {
			return
		}
		q := append([]byte(nil), buf[:n]...)
		select {
		case r.sem <- struct{}{}:
		default:
			continue // overloaded: the client retries
		}
		go func() {
			defer func() { <-r.sem }()
			if a := r.forwardUDP(q); a != nil {
				r.udp.WriteTo(a, from)
			}
		}()
	}
}

// forwardUDP asks each upstream in turn; nil when none answered.
func (r *resolver) forwardUDP(q []byte) []byte {
	buf := make([]byte, 65535)
	for _, up := range r.upstreams {
		c, err := net.Dial("udp", up.String())
		if err != nil {
			continue
		}
		c.SetDeadline(time.Now().Add(resolverTimeout))
		_, err = c.Write(q)
		var n int
		if err == nil {
			n, err = c.Read(buf)
		}
		c.Close()
		if err == nil && n >= 12 && buf[0] == q[0] && buf[1] == q[1] {
			return buf[:n]
		}
	}
	r.log.Debug("dns: no upstream answered")
	return nil
}

func (r *resolver) serveTCP() {
	defer r.wg.Done()
	for {
		c, err := r.tcp.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			for _, up := range r.upstreams {
				u, err := net.DialTimeout("tcp", up.String(), resolverTimeout)
				if err != nil {
					continue
				}
				deadline := time.Now().Add(30 * time.Second)
				c.SetDeadline(deadline)
				u.SetDeadline(deadline)
				done := make(chan struct{})
				go func() { io.Copy(u, c); u.(*net.TCPConn).CloseWrite(); close(done) }()
				io.Copy(c, u)
				u.Close()
				<-done
				return
			}
		}()
	}
}
