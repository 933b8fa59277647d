package network

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"strconv"
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
	hook := &flushBeforeRead{r: c}
	br := bufio.NewReaderSize(hook, 16<<10)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	malformed := false
	if tls {
		entry.Domain = peekSNI(br)
	} else {
		entry.Domain, malformed = peekHost(br)
	}
	c.SetReadDeadline(time.Time{})

	pol := p.view.policy()
	target := orig
	ok, rule := false, ""
	if entry.Domain != "" && !malformed {
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
		ok, rule = pol.decideAddr(orig.Addr(), nil, p.view.open)
		if !ok && malformed {
			rule = "malformed_request" // a head no server should be trusted to read as we do
		}
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
		entry.BytesOut, entry.BytesIn = p.requestsFor(c, br, hook, up.(*net.TCPConn), entry.Domain, entry)
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

// requestsFor passes on the HTTP requests of the connection as the client
// sent them, head and body byte for byte, while each names host, the name
// the connection was let through for: a request naming another (keep-alive
// serves any site on the same address) is not passed on and is logged
// refused; the connection ends after the answers to the requests before
// it, as when a server closes a keep-alive connection, and the client
// sends it again on a new connection, which is decided afresh. Bodies are framed as HTTP/1.1 says (Content-Length
// or chunked; a request with both, or with a conflicting length, is
// refused, as a smuggling attempt). An upgrade (a WebSocket) may only be
// the connection's first request: when the server accepts it (101), both
// ways are copied from then on; when it refuses, requests go on as before.
// h2c upgrades are refused: HTTP/2 on the connection could name any site.
func (p *proxy) requestsFor(c *net.TCPConn, br *bufio.Reader, hook *flushBeforeRead, up *net.TCPConn, host string, entry pandastack.EgressEntry) (out, in int64) {
	first := make(chan bool, 1)    // the first request is an upgrade
	switched := make(chan bool, 1) // the server accepted that upgrade
	w := &countingWriter{w: up}
	// Small writes (chunked bodies) go up together, once what the client
	// sent so far is through: before each read from the client.
	bw := bufio.NewWriterSize(w, 64<<10)
	hook.set(bw.Flush)
	done := make(chan struct{})
	go func() {
		defer close(done)
		refused, rule, err := forwardRequests(br, bw, host, first, switched)
		if ferr := bw.Flush(); err == nil {
			err = ferr
		}
		if rule != "" {
			e := entry
			e.Time, e.Domain, e.Allowed, e.Rule, e.BytesIn, e.BytesOut = time.Now().UTC(), refused, false, rule, 0, 0
			p.view.log(e)
		}
		if err != nil && !errors.Is(err, errRefusedRequest) && !errors.Is(err, errUpstreamWrite) {
			reset(c) // broken framing: nothing more is sure
			up.Close()
			return
		}
		// Done, a request refused, or the server stopped reading (it may
		// have answered early, a 413 say): its answer still goes back.
		up.CloseWrite()
	}()
	ubr := bufio.NewReader(up)
	if upgrade, ok := <-first; ok && upgrade {
		status, err := ubr.Peek(12)
		switched <- err == nil && bytes.HasPrefix(status, []byte("HTTP/1.")) && string(status[9:12]) == "101"
	}
	in, _ = io.Copy(c, ubr)
	c.CloseWrite()
	<-done
	return w.n, in
}

var (
	errRefusedRequest = errors.New("request refused")
	errUpstreamWrite  = errors.New("the server stopped reading")
)

// forwardRequests copies the requests of br to w (see requestsFor); it
// returns the name a request it refused gave and the rule that refused it
// (for the egress log), and an error when the connection must end. first
// gets whether the first request is an upgrade (closed if there was none),
// and switched then says whether the server took it.
func forwardRequests(br *bufio.Reader, bw *bufio.Writer, host string, first chan<- bool, switched <-chan bool) (refused, rule string, err error) {
	// Writes only: io.Copy into bw itself would use its ReadFrom, inside
	// which the flush before a read from the client (flushBeforeRead)
	// would find it half-way.
	w := writeOnly{bw}
	firstDone := false
	tell := func(upgrade bool) {
		if !firstDone {
			firstDone = true
			if upgrade {
				first <- true
			}
			close(first)
		}
	}
	defer tell(false)
	for {
		head, err := readHead(br)
		if err != nil {
			if errors.Is(err, io.EOF) && len(head) == 0 {
				return "", "", nil // the client is done
			}
			return "", "", err
		}
		h, ok := parseHead(head)
		switch {
		case !ok:
			return h.host, "malformed_request", errRefusedRequest
		case !strings.EqualFold(h.host, host):
			return h.host, "no_domain_rule", errRefusedRequest
		case h.upgrade != "" && (firstDone || strings.Contains(strings.ToLower(h.upgrade), "h2c")):
			return h.host, "upgrade_refused", errRefusedRequest
		}
		upgrade := h.upgrade != ""
		if upgrade && (h.length > 0 || h.chunked) {
			return h.host, "malformed_request", errRefusedRequest // an upgrade carries no body
		}
		if !firstDone && upgrade {
			if _, err := w.Write(head); err != nil {
				return "", "", err
			}
			if err := bw.Flush(); err != nil { // the server answers it before anything else goes
				return "", "", err
			}
			tell(true)
			if <-switched {
				_, err := io.Copy(w, br) // another protocol from here on
				return "", "", err
			}
			continue
		}
		tell(false)
		if _, err := w.Write(head); err != nil {
			return "", "", err
		}
		switch {
		case h.chunked:
			err = copyChunked(w, br)
		case h.length > 0:
			_, err = io.CopyN(w, br, h.length)
		}
		if err != nil {
			return "", "", err
		}
	}
}

// writeOnly hides everything of a writer but Write.
type writeOnly struct{ w io.Writer }

func (o writeOnly) Write(b []byte) (int, error) { return o.w.Write(b) }

// flushBeforeRead is the client's side of the domain proxy's reader: it
// runs flush (the upstream writer's) before each read from the client, so
// that what was read so far goes up before the proxy waits for more.
type flushBeforeRead struct {
	r     io.Reader
	mu    sync.Mutex
	flush func() error
}

func (f *flushBeforeRead) set(flush func() error) {
	f.mu.Lock()
	f.flush = flush
	f.mu.Unlock()
}

func (f *flushBeforeRead) Read(b []byte) (int, error) {
	f.mu.Lock()
	flush := f.flush
	f.mu.Unlock()
	if flush != nil {
		if err := flush(); err != nil {
			return 0, err
		}
	}
	return f.r.Read(b)
}

// maxHead bounds a request's head.
const maxHead = 64 << 10

// readHead reads a request's head, through its empty line, as sent (empty
// lines before it, which HTTP allows between requests, are passed on too).
func readHead(br *bufio.Reader) ([]byte, error) {
	var head []byte
	started := false
	for {
		line, err := br.ReadSlice('\n')
		head = append(head, line...)
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) && len(head) <= maxHead {
				continue
			}
			if errors.Is(err, io.EOF) && !started && strings.TrimSpace(string(head)) == "" {
				return nil, io.EOF
			}
			return head, fmt.Errorf("request head: %w", err)
		}
		if len(head) > maxHead {
			return head, errors.New("request head too long")
		}
		blank := len(bytes.TrimRight(line, "\r\n")) == 0
		switch {
		case blank && started:
			return head, nil
		case !blank:
			started = true
		}
	}
}

// reqHead is what forwardRequests needs of a request's head.
type reqHead struct {
	host    string // the Host header, or an absolute-form target's host; no port, lower case
	length  int64
	chunked bool
	upgrade string
}

// parseHead reads a request head strictly: anything a server could frame
// differently from the proxy (a folded line, a space before a colon, a
// bare LF, a length that is not plain digits, two lengths, a length and
// chunked, an encoding other than chunked, a control character) makes it
// malformed (false), since the bytes after it would reach the server
// unchecked. CONNECT and HTTP/2's preface are refused too: both open a
// tunnel. h.host is what it named, when it got that far.
func parseHead(head []byte) (reqHead, bool) {
	var h reqHead
	text := strings.TrimLeft(string(head), "\r\n")
	body, ok := strings.CutSuffix(text, "\r\n\r\n")
	if !ok {
		return h, false
	}
	lines := strings.Split(body, "\r\n")
	parts := strings.Split(lines[0], " ")
	if len(parts) != 3 || (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") || !isToken(parts[0]) ||
		parts[0] == "CONNECT" || parts[0] == "PRI" || parts[1] == "" || hasCtl(parts[1]) {
		return h, false
	}
	target := ""
	if !strings.HasPrefix(parts[1], "/") && parts[1] != "*" {
		u, err := url.Parse(parts[1])
		if err != nil || u.Host == "" {
			return h, false
		}
		target = strings.ToLower(hostOnly(u.Host)) // absolute form: the server may go by it
	}
	lengths, hosts := 0, 0
	upgradeConn := false
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if !ok || !isToken(k) || hasCtl(v) {
			return h, false // also a folded line: it starts with a space
		}
		v = strings.Trim(v, " \t")
		switch strings.ToLower(k) {
		case "host":
			hosts++
			h.host = strings.ToLower(hostOnly(v))
		case "content-length":
			if len(v) == 0 || len(v) > 18 || strings.Trim(v, "0123456789") != "" {
				return h, false
			}
			n, _ := strconv.ParseInt(v, 10, 64)
			if lengths > 0 && n != h.length {
				return h, false
			}
			lengths++
			h.length = n
		case "transfer-encoding":
			if !strings.EqualFold(v, "chunked") || h.chunked {
				return h, false // only one plain "chunked" is passed on
			}
			h.chunked = true
		case "upgrade":
			h.upgrade = v
		case "connection":
			for _, t := range strings.Split(v, ",") {
				upgradeConn = upgradeConn || strings.EqualFold(strings.Trim(t, " \t"), "upgrade")
			}
		}
	}
	if hosts > 1 || (h.chunked && lengths > 0) || (target != "" && h.host != "" && target != h.host) {
		return h, false
	}
	if h.host == "" {
		h.host = target
	}
	if !upgradeConn {
		h.upgrade = ""
	}
	return h, true
}

// isToken reports whether s is an HTTP token (a method or a header name).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r > 126 || r <= 32 || strings.ContainsRune(`"(),/:;<=>?@[\]{}`, r) {
			return false
		}
	}
	return true
}

// hasCtl reports whether s holds a control character other than a tab.
func hasCtl(s string) bool {
	for _, r := range s {
		if (r < 32 && r != '\t') || r == 127 {
			return true
		}
	}
	return false
}

// copyChunked copies a chunked body, through its trailer, as sent.
func copyChunked(w io.Writer, br *bufio.Reader) error {
	line := func() ([]byte, error) {
		l, err := br.ReadSlice('\n')
		if err != nil {
			return nil, fmt.Errorf("chunked body: %w", err)
		}
		_, werr := w.Write(l)
		return l, werr
	}
	for {
		l, err := line()
		if err != nil {
			return err
		}
		sz, _, _ := strings.Cut(strings.TrimSpace(string(l)), ";")
		sz = strings.TrimRight(sz, " \t") // "5 ;ext" has a space before its extension
		n, err := strconv.ParseInt(sz, 16, 64)
		if err != nil || n < 0 || len(sz) > 15 || strings.Trim(sz, "0123456789abcdefABCDEF") != "" {
			return errors.New("chunked body: bad chunk size")
		}
		if n == 0 {
			for { // the trailer, through its empty line
				l, err := line()
				if err != nil {
					return err
				}
				if len(bytes.TrimRight(l, "\r\n")) == 0 {
					return nil
				}
			}
		}
		if _, err := io.CopyN(w, br, n); err != nil {
			return err
		}
		if _, err := line(); err != nil { // the chunk's CRLF
			return err
		}
	}
}

// hostOnly is a Host header's name, without a port or a final dot, as
// peekHost gives it.
func hostOnly(h string) string {
	if n, _, err := net.SplitHostPort(h); err == nil {
		h = n
	}
	return strings.TrimSuffix(h, ".")
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (cw *countingWriter) Write(b []byte) (int, error) {
	n, err := cw.w.Write(b)
	cw.n += int64(n)
	if err != nil {
		err = fmt.Errorf("%w: %w", errUpstreamWrite, err)
	}
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
// consuming it, or ""; malformed says the head was one parseHead refuses.
func peekHost(br *bufio.Reader) (host string, malformed bool) {
	if _, err := br.Peek(1); err != nil { // wait for the first bytes
		return "", false
	}
	for {
		// Everything that came so far (a body or a next request may have
		// come with the head): the head ends at its first empty line.
		b, _ := br.Peek(br.Buffered())
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			h, ok := parseHead(b[:i+4])
			return h.host, !ok
		}
		// A bare LF before the head's end: malformed now, rather than
		// once the read deadline gives up waiting for a CRLF CRLF that
		// such a client never sends.
		start := len(b) - len(bytes.TrimLeft(b, "\r\n")) // empty lines before the request line are fine
		for i := start; i < len(b); i++ {
			if b[i] == '\n' && b[i-1] != '\r' {
				return "", true
			}
		}
		if len(b) >= br.Size() {
			return "", true // a head longer than the buffer
		}
		if _, err := br.Peek(len(b) + 1); err != nil { // wait for more
			return "", false
		}
	}
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
