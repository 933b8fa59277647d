package network

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
	"golang.org/x/sys/unix"
)

// Ports of the domain proxy on each sandbox's gateway. While domain rules
// are in force the firewall redirects the sandbox's TCP to ports 80 and 443
// here; the proxy reads the Host header or the TLS SNI, resolves the name
// itself and connects only to what the name resolves to, so a forged SNI
// or Host or a rebinding DNS answer cannot reach a denied address.
const (
	proxyHTTPPort = 10080
	proxyTLSPort  = 10443
)

// maxProxyConns bounds a sandbox's connections through the domain proxy at
// once: each holds two sockets and buffers on the host. More are reset.
const maxProxyConns = 256

type proxy struct {
	view  sandboxView
	peer  netip.Addr // the sandbox's address: the only one the proxy serves
	lns   []net.Listener
	wg    sync.WaitGroup
	slots chan struct{} // one per connection being proxied
}

func startProxy(gw, peer netip.Addr, view sandboxView) (*proxy, error) {
	p := &proxy{view: view, peer: peer, slots: make(chan struct{}, maxProxyConns)}
	for _, port := range []uint16{proxyHTTPPort, proxyTLSPort} {
		ln, err := net.Listen("tcp4", netip.AddrPortFrom(gw, port).String())
		if err != nil {
			p.Close()
			return nil, err
		}
		p.lns = append(p.lns, ln)
		p.wg.Add(1)
		go p.serve(ln, port == proxyTLSPort)
	}
	return p, nil
}

// Close stops accepting; connections in flight end with their peers.
func (p *proxy) Close() {
	for _, ln := range p.lns {
		ln.Close()
	}
	p.wg.Wait()
}

func (p *proxy) serve(ln net.Listener, tls bool) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		select {
		case p.slots <- struct{}{}:
			go func() {
				defer func() { <-p.slots }()
				p.handle(c.(*net.TCPConn), tls)
			}()
		default:
			reset(c.(*net.TCPConn)) // too many at once: fail at once, not hang
		}
	}
}

// reset closes c with a TCP reset, so the sandbox's socket fails at once.
func reset(c *net.TCPConn) {
	c.SetLinger(0)
	c.Close()
}

func (p *proxy) handle(c *net.TCPConn, tls bool) {
	orig, err := originalDst(c)
	if err != nil {
		reset(c)
		return
	}
	// Only this sandbox's own connections to port 80 or 443, which the
	// firewall sent here: not another sandbox's (it would get this one's
	// policy), nor one made to the proxy's port itself (it would reach an
	// allowed name on that port).
	want := uint16(80)
	if tls {
		want = 443
	}
	from, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	if from.Addr() != p.peer || orig.Port() != want {
		reset(c)
		return
	}
	entry := pandastack.EgressEntry{Time: time.Now().UTC(), Kind: "tcp", Address: orig.Addr().String(), Port: int(orig.Port())}
	br := bufio.NewReaderSize(c, 16<<10)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if tls {
		entry.Domain = peekSNI(br)
	} else {
		entry.Domain = peekHost(br)
	}
	c.SetReadDeadline(time.Time{})

	pol := p.view.policy()
	target := orig
	ok, rule := false, ""
	if entry.Domain != "" {
		ok, rule = pol.decideName(entry.Domain)
	}
	byName := ok
	if ok {
		// Connect only to what the name resolves to, never to the address
		// the sandbox picked: that is what defeats a forged SNI or Host.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		addrs, err := p.view.resolve(ctx, entry.Domain)
		cancel()
		target = netip.AddrPort{}
		for _, a := range addrs {
			if a.Is4() && !p.view.denied(a) {
				target = netip.AddrPortFrom(a, orig.Port())
				break
			}
		}
		if !target.IsValid() {
			ok, rule = false, "platform"
			if err != nil || len(addrs) == 0 {
				rule = "unresolvable"
			}
		}
		if target.IsValid() {
			entry.Address = target.Addr().String()
		} // else: the address the sandbox asked for stays in the log
	} else if p.view.denied(orig.Addr()) {
		rule = "platform"
	} else {
		ok, rule = pol.decideAddr(orig.Addr(), nil, nil)
	}
	entry.Allowed, entry.Rule = ok, rule
	if !ok {
		p.view.log(entry)
		reset(c)
		return
	}
	up, err := net.DialTimeout("tcp4", target.String(), 10*time.Second)
	if err != nil {
		entry.Allowed, entry.Rule = false, "unreachable"
		p.view.log(entry)
		reset(c)
		return
	}
	if byName && !tls {
		entry.BytesOut, entry.BytesIn = oneRequest(c, br, up.(*net.TCPConn), entry.Domain)
	} else {
		entry.BytesOut, entry.BytesIn = pipe(c, br, up.(*net.TCPConn))
	}
	up.Close()
	c.Close()
	p.view.log(entry)
}

// pipe copies both ways until both sides are done (what br holds goes
// first); it returns the bytes sent up and down.
func pipe(c *net.TCPConn, br *bufio.Reader, up *net.TCPConn) (out, in int64) {
	done := make(chan int64, 1)
	go func() {
		n, _ := io.Copy(up, br) // the peeked bytes first, then the rest
		up.CloseWrite()
		done <- n
	}()
	in, _ = io.Copy(c, up)
	c.CloseWrite()
	return <-done, in
}

// oneRequest passes on the HTTP request at the head of br, which names
// host, and its answer, and nothing after it: the name decided for the
// connection holds for one request, and a second one on the same
// connection could name any other site on that address. The request goes
// with "Connection: close", so the server answers it and closes; a client
// opens a new connection for its next request, which is decided afresh.
// An upgrade (a WebSocket) that the server accepts (101) is one request
// followed by another protocol: both ways are copied from then on.
func oneRequest(c *net.TCPConn, br *bufio.Reader, up *net.TCPConn, host string) (out, in int64) {
	req, err := http.ReadRequest(br)
	if err != nil || !strings.EqualFold(hostOnly(req.Host), host) {
		reset(c)
		return 0, 0
	}
	upgrade := false
	for _, v := range req.Header.Values("Connection") {
		for _, t := range strings.Split(v, ",") {
			upgrade = upgrade || strings.EqualFold(strings.TrimSpace(t), "upgrade")
		}
	}
	if !upgrade {
		req.Close = true
		req.Header.Del("Connection")
		req.Header.Del("Keep-Alive")
	}
	if _, ok := req.Header["User-Agent"]; !ok {
		req.Header["User-Agent"] = []string{""} // req.Write would add Go's
	}
	if strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		// Answered here: Write sends the body right after the head.
		req.Header.Del("Expect")
		io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\n")
	}
	cw := &countingWriter{w: up}
	if err := req.Write(cw); err != nil {
		reset(c)
		return cw.n, 0
	}
	ubr := bufio.NewReader(up)
	if status, err := ubr.Peek(12); upgrade && err == nil && bytes.HasPrefix(status, []byte("HTTP/1.")) && string(status[9:12]) == "101" {
		done := make(chan int64, 1)
		go func() {
			n, _ := io.Copy(up, br)
			up.CloseWrite()
			done <- n
		}()
		in, _ = io.Copy(c, ubr)
		c.CloseWrite()
		return cw.n + <-done, in
	}
	in, _ = io.Copy(c, ubr)
	c.CloseWrite()
	return cw.n, in
}

// hostOnly is a Host header's name, without a port, as peekHost gives it.
func hostOnly(h string) string {
	if n, _, err := net.SplitHostPort(h); err == nil {
		return n
	}
	return h
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (cw *countingWriter) Write(b []byte) (int, error) {
	n, err := cw.w.Write(b)
	cw.n += int64(n)
	return n, err
}

// originalDst is where the sandbox meant to connect before the redirect.
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var mreq *unix.IPv6Mreq
	var serr error
	if err := raw.Control(func(fd uintptr) {
		mreq, serr = unix.GetsockoptIPv6Mreq(int(fd), unix.SOL_IP, unix.SO_ORIGINAL_DST)
	}); err != nil {
		return netip.AddrPort{}, err
	}
	if serr != nil {
		return netip.AddrPort{}, serr
	}
	b := mreq.Multiaddr // a sockaddr_in: family, port (big endian), address
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{b[4], b[5], b[6], b[7]}), binary.BigEndian.Uint16(b[2:4])), nil
}

// peekHost returns the Host of the HTTP request at the head of br without
// consuming it, or "".
func peekHost(br *bufio.Reader) string {
	if _, err := br.Peek(1); err != nil { // wait for the first bytes
		return ""
	}
	for n := br.Buffered(); n <= 8<<10; {
		b, err := br.Peek(n) // blocks only when the headers are incomplete
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			for _, l := range strings.Split(string(b[:i]), "\r\n")[1:] {
				if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(strings.TrimSpace(k), "host") {
					host := strings.TrimSpace(v)
					if h, _, err := net.SplitHostPort(host); err == nil {
						host = h
					}
					return strings.ToLower(host)
				}
			}
			return ""
		}
		if err != nil {
			return ""
		}
		n = br.Buffered() + 1
	}
	return ""
}

// peekSNI returns the server name of the TLS ClientHello at the head of br
// without consuming it, or "".
func peekSNI(br *bufio.Reader) string {
	h, err := br.Peek(5)
	if err != nil || h[0] != 22 {
		return ""
	}
	rec, err := br.Peek(5 + int(binary.BigEndian.Uint16(h[3:5])))
	if err != nil {
		return ""
	}
	name, _ := parseSNI(rec[5:])
	return strings.ToLower(name)
}

var errShort = errors.New("short ClientHello")

// parseSNI reads the server_name extension of a ClientHello handshake.
func parseSNI(b []byte) (string, error) {
	take := func(n int) ([]byte, error) {
		if len(b) < n {
			return nil, errShort
		}
		v := b[:n]
		b = b[n:]
		return v, nil
	}
	u16 := func() (int, error) {
		v, err := take(2)
		if err != nil {
			return 0, err
		}
		return int(binary.BigEndian.Uint16(v)), nil
	}
	skip8 := func() error {
		v, err := take(1)
		if err == nil {
			_, err = take(int(v[0]))
		}
		return err
	}
	if t, err := take(4); err != nil || t[0] != 1 { // handshake type client_hello, length
		return "", errShort
	}
	if _, err := take(2 + 32); err != nil { // version, random
		return "", err
	}
	if err := skip8(); err != nil { // session id
		return "", err
	}
	n, err := u16() // cipher suites
	if err != nil {
		return "", err
	}
	if _, err := take(n); err != nil {
		return "", err
	}
	if err := skip8(); err != nil { // compression methods
		return "", err
	}
	if _, err := u16(); err != nil { // extensions length
		return "", err
	}
	for len(b) >= 4 {
		typ, _ := u16()
		n, _ := u16()
		ext, err := take(n)
		if err != nil {
			return "", err
		}
		if typ != 0 || len(ext) < 5 {
			continue
		}
		// server_name_list: length, then entries of type (0: host_name), length, name.
		if ext[2] == 0 {
			l := int(binary.BigEndian.Uint16(ext[3:5]))
			if 5+l <= len(ext) {
				return string(ext[5 : 5+l]), nil
			}
		}
	}
	return "", nil
}
