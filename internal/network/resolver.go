package network

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
	"golang.org/x/net/dns/dnsmessage"
)

// resolver answers a sandbox's DNS on its gateway address (UDP and TCP port
// 53; the firewall redirects DNS to any address there) by forwarding each
// query to the host's own resolvers. While domain rules are in force it
// answers only allowed names (NXDOMAIN otherwise). Every answer goes to the
// sandbox's egress log.
type resolver struct {
	udp       net.PacketConn
	tcp       net.Listener
	upstreams []netip.AddrPort
	view      sandboxView
	log       *slog.Logger
	sem       chan struct{}  // bounds queries in flight
	wg        sync.WaitGroup // the two accept loops; queries in flight end on their own deadlines
}

// resolverTimeout bounds the wait for each upstream (a variable for tests).
var resolverTimeout = 5 * time.Second

// sandboxView is what the proxy and resolver need of their sandbox.
type sandboxView struct {
	policy  func() Compiled
	denied  func(netip.Addr) bool // the platform deny set with the server's openings
	open    []netip.Prefix        // those openings: reachable by address only through allow_out entries inside them
	resolve func(ctx context.Context, name string) ([]netip.Addr, error)
	log     func(pandastack.EgressEntry)
	// answered records which addresses the resolver gave out for a name.
	answered func(name string, addrs []string)
}

func startResolver(addr netip.Addr, upstreams []netip.AddrPort, view sandboxView, log *slog.Logger) (*resolver, error) {
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
	r := &resolver{udp: udp, tcp: tcp, upstreams: upstreams, view: view, log: log, sem: make(chan struct{}, 64)}
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
			if a := r.answer(q, false); a != nil {
				r.udp.WriteTo(a, from)
			}
		}()
	}
}

// maxDNSConns bounds a sandbox's DNS-over-TCP connections at once; more
// are closed.
const maxDNSConns = 32

func (r *resolver) serveTCP() {
	defer r.wg.Done()
	conns := make(chan struct{}, maxDNSConns)
	for {
		c, err := r.tcp.Accept()
		if err != nil {
			return
		}
		select {
		case conns <- struct{}{}:
		default:
			c.Close()
			continue
		}
		go func() {
			defer func() { <-conns }()
			defer c.Close()
			for {
				c.SetDeadline(time.Now().Add(30 * time.Second))
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				q := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				a := r.answer(q, true)
				if a == nil {
					return
				}
				binary.BigEndian.PutUint16(l[:], uint16(len(a)))
				if _, err := c.Write(append(l[:], a...)); err != nil {
					return
				}
			}
		}()
	}
}

// hostViewName reports whether name, lower case without its final dot, is
// one only the host's own network answers: under localhost, local (mDNS),
// internal, home.arpa or ip6.arpa, or the reverse name of an IPv4
// address denied says no sandbox reaches (or of a whole range: a name of
// fewer than four octets under in-addr.arpa).
func hostViewName(name string, denied func(netip.Addr) bool) bool {
	for _, zone := range []string{"localhost", "local", "internal", "home.arpa", "ip6.arpa"} {
		if name == zone || strings.HasSuffix(name, "."+zone) {
			return true
		}
	}
	rev, ok := strings.CutSuffix(name, ".in-addr.arpa")
	if !ok {
		return name == "in-addr.arpa"
	}
	labels := strings.Split(rev, ".")
	if len(labels) != 4 {
		return true
	}
	slices.Reverse(labels)
	a, err := netip.ParseAddr(strings.Join(labels, "."))
	return err != nil || denied == nil || denied(a)
}

// answer returns the reply to query q, which came over TCP or not, or nil
// to stay silent.
func (r *resolver) answer(q []byte, tcp bool) []byte {
	h, question, edns, err := parseQuery(q)
	switch {
	case err == errUnreadable:
		return nil // not even a header to answer
	case err == errNotImplemented:
		return refusal(h, dnsmessage.RCodeNotImplemented)
	case err != nil:
		return refusal(h, dnsmessage.RCodeFormatError)
	}
	name := strings.ToLower(strings.TrimSuffix(question.Name.String(), "."))
	entry := pandastack.EgressEntry{Time: time.Now().UTC(), Kind: "dns", Domain: name}
	if name != "" && !strings.Contains(name, ".") {
		// A name of one label (the sandbox's own, sbx-..., whose IPv6
		// lookup /etc/hosts does not answer; a bare host name) is no
		// name on the internet: sent on, it would tell the upstream the
		// sandbox's id, and an upstream's answer would redirect it.
		entry.Rule = "single_label"
		r.view.log(entry)
		return nxdomain(h, question)
	}
	if question.Class != dnsmessage.ClassINET {
		// CHAOS and the like ask the resolver of itself (hostname.bind,
		// version.bind): the host's, which is none of the sandbox's.
		entry.Rule = "platform"
		r.view.log(entry)
		return refusal(h, dnsmessage.RCodeRefused)
	}
	if hostViewName(name, r.view.denied) {
		// Names only the host's own resolver knows: the reverse names of
		// the addresses no sandbox reaches (the host's, its LAN's, the
		// sandboxes'), which tell the host's name; local and private-use
		// zones. Sent on, they showed the sandbox the host's view.
		entry.Rule = "platform"
		r.view.log(entry)
		return nxdomain(h, question)
	}
	if pol := r.view.policy(); pol.DomainRules() {
		if ok, rule := pol.decideName(name); ok {
			entry.Rule = rule
		} else if pol.Internet {
			// Internet access with deny_out: the domains let names
			// through deny_out, and every other name resolves as
			// without them (an NXDOMAIN would keep nothing in that the
			// open addresses do not let out anyway).
			entry.Rule = "internet"
		} else {
			entry.Rule = "no_domain_rule"
			r.view.log(entry)
			return nxdomain(h, question)
		}
	} else if pol.Internet {
		entry.Rule = "internet"
	} else if len(pol.AllowNet) == 0 {
		// Nothing outside is reachable, so no name needs resolving; and
		// a query sent on would carry what the sandbox put in its name to
		// whoever serves that domain.
		entry.Rule = "no_internet"
		r.view.log(entry)
		return nxdomain(h, question)
	} else {
		// Addresses are allowed, and their names must resolve: queries
		// go on (docs/network.md says what that lets out).
		entry.Rule = "resolver"
	}
	// Only the question goes on, in a query of the resolver's own: what
	// else the sandbox put in its packet (more questions, EDNS options,
	// records, trailing bytes) would reach the upstream resolver, and
	// whoever it forwards to, whatever the policy says of names.
	id := uint16(rand.Uint32())
	clean, err := cleanQuery(h, question, edns, id)
	if err != nil {
		return refusal(h, dnsmessage.RCodeFormatError)
	}
	a := r.forward(clean, tcp)
	if a == nil {
		// The name went out; no upstream answered it in time. SERVFAIL
		// tells the sandbox at once (silence had glibc wait out its
		// retries, 10 s), and the log shows the query all the same.
		entry.Allowed = true // with no address: nothing came back
		r.view.log(entry)
		return answerOnly(h, question, dnsmessage.RCodeServerFailure)
	}
	binary.BigEndian.PutUint16(a, h.ID) // the sandbox's id back
	entry.Allowed = true
	addrs := answerAddrs(a)
	entry.Address = strings.Join(addrs, ",")
	if r.view.answered != nil {
		r.view.answered(name, addrs)
	}
	r.view.log(entry)
	return a
}

var errUnreadable = errors.New("not a DNS message")

// parseQuery reads a query the resolver answers: a standard query with
// exactly one question, and nothing in the answer or authority sections.
// udpSize is the payload size its EDNS record offers, 0 without one.
func parseQuery(q []byte) (h dnsmessage.Header, question dnsmessage.Question, edns ednsAsk, err error) {
	var p dnsmessage.Parser
	if h, err = p.Start(q); err != nil {
		return h, question, edns, errUnreadable
	}
	if h.Response || h.OpCode != 0 {
		return h, question, edns, errNotImplemented
	}
	if question, err = p.Question(); err != nil {
		return h, question, edns, err
	}
	if _, err := p.Question(); err != dnsmessage.ErrSectionDone {
		return h, question, edns, errors.New("more than one question")
	}
	if _, err := p.AnswerHeader(); err != dnsmessage.ErrSectionDone {
		return h, question, edns, errors.New("records in the answer section")
	}
	if _, err := p.AuthorityHeader(); err != dnsmessage.ErrSectionDone {
		return h, question, edns, errors.New("records in the authority section")
	}
	for {
		rh, err := p.AdditionalHeader()
		if err == dnsmessage.ErrSectionDone {
			break
		}
		if err != nil {
			return h, question, edns, err
		}
		if rh.Type == dnsmessage.TypeOPT {
			edns = ednsAsk{size: max(uint16(rh.Class), 512), dnssecOK: rh.DNSSECAllowed()}
		}
		if err := p.SkipAdditional(); err != nil {
			return h, question, edns, err
		}
	}
	return h, question, edns, nil
}

// ednsAsk is what a query's EDNS record asked for; size 0: it had none.
type ednsAsk struct {
	size     uint16
	dnssecOK bool
}

var errNotImplemented = errors.New("not a standard query")

// cleanQuery builds the query for question that goes upstream: an id of
// the resolver's own (the sandbox's could carry 16 bits of its choosing),
// the sandbox's flags, and an EDNS record of the resolver's own (no
// options; its DNSSEC OK bit) when the sandbox sent one, offering at most
// 4096 bytes.
func cleanQuery(h dnsmessage.Header, question dnsmessage.Question, edns ednsAsk, id uint16) ([]byte, error) {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: id, RecursionDesired: h.RecursionDesired, CheckingDisabled: h.CheckingDisabled, AuthenticData: h.AuthenticData})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(question); err != nil {
		return nil, err
	}
	if edns.size > 0 {
		if err := b.StartAdditionals(); err != nil {
			return nil, err
		}
		var rh dnsmessage.ResourceHeader
		if err := rh.SetEDNS0(int(min(edns.size, 4096)), dnsmessage.RCodeSuccess, edns.dnssecOK); err != nil {
			return nil, err
		}
		if err := b.OPTResource(rh, dnsmessage.OPTResource{}); err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// refusal answers a query the resolver does not pass on with rcode and
// no question.
func refusal(h dnsmessage.Header, rcode dnsmessage.RCode) []byte {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired, RecursionAvailable: true, RCode: rcode})
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

func nxdomain(h dnsmessage.Header, q dnsmessage.Question) []byte {
	return answerOnly(h, q, dnsmessage.RCodeNameError)
}

// answerOnly is an answer to q with rcode and no records. The question
// goes back with it: resolvers other than glibc's (Go's, c-ares,
// dnspython) drop an answer without it and wait out their timeout.
func answerOnly(h dnsmessage.Header, q dnsmessage.Question, rcode dnsmessage.RCode) []byte {
	h.Response, h.RecursionAvailable, h.RCode = true, true, rcode
	b := dnsmessage.NewBuilder(nil, h)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil {
		return nil
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// answerAddrs lists the A and AAAA records of a DNS answer.
func answerAddrs(a []byte) []string {
	var p dnsmessage.Parser
	if _, err := p.Start(a); err != nil {
		return nil
	}
	if p.SkipAllQuestions() != nil {
		return nil
	}
	var out []string
	for {
		h, err := p.AnswerHeader()
		if err != nil {
			return out
		}
		switch h.Type {
		case dnsmessage.TypeA:
			if rr, err := p.AResource(); err == nil {
				out = append(out, netip.AddrFrom4(rr.A).String())
			}
		case dnsmessage.TypeAAAA:
			if rr, err := p.AAAAResource(); err == nil {
				out = append(out, netip.AddrFrom16(rr.AAAA).String())
			}
		default:
			if p.SkipAnswer() != nil {
				return out
			}
		}
	}
}

// forward asks each upstream in turn; nil when none answered. For a query
// that came over TCP, a truncated answer is asked again over TCP: the
// sandbox retries over TCP for a large answer, which UDP upstream would
// truncate again. Over UDP the truncated answer goes back as it is.
func (r *resolver) forward(q []byte, tcp bool) []byte {
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
		if err != nil || n < 12 || buf[0] != q[0] || buf[1] != q[1] {
			continue
		}
		if tcp && buf[2]&0x02 != 0 { // TC
			if a := forwardTCP(up, q); a != nil {
				return a
			}
		}
		return buf[:n]
	}
	r.log.Debug("dns: no upstream answered")
	return nil
}

// forwardTCP asks up over TCP; nil when it did not answer.
func forwardTCP(up netip.AddrPort, q []byte) []byte {
	c, err := net.DialTimeout("tcp", up.String(), resolverTimeout)
	if err != nil {
		return nil
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(resolverTimeout))
	if _, err := c.Write(binary.BigEndian.AppendUint16(nil, uint16(len(q)))); err != nil {
		return nil
	}
	if _, err := c.Write(q); err != nil {
		return nil
	}
	var l [2]byte
	if _, err := io.ReadFull(c, l[:]); err != nil {
		return nil
	}
	a := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(c, a); err != nil || len(a) < 12 || a[0] != q[0] || a[1] != q[1] {
		return nil
	}
	return a
}
