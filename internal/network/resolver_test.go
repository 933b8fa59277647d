package network

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"golang.org/x/net/dns/dnsmessage"
)

// upstreamRecorder is a DNS server on loopback that answers every query
// with 192.0.2.1 and keeps what it was sent.
type upstreamRecorder struct {
	addr netip.AddrPort
	mu   sync.Mutex
	got  [][]byte
}

func startUpstreamRecorder(t *testing.T) *upstreamRecorder {
	t.Helper()
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	u := &upstreamRecorder{addr: c.LocalAddr().(*net.UDPAddr).AddrPort()}
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			q := append([]byte(nil), buf[:n]...)
			u.mu.Lock()
			u.got = append(u.got, q)
			u.mu.Unlock()
			var p dnsmessage.Parser
			h, err := p.Start(q)
			if err != nil {
				continue
			}
			question, err := p.Question()
			if err != nil {
				continue
			}
			h.Response = true
			b := dnsmessage.NewBuilder(nil, h)
			b.StartQuestions()
			b.Question(question)
			b.StartAnswers()
			b.AResource(dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: [4]byte{192, 0, 2, 1}})
			a, _ := b.Finish()
			c.WriteTo(a, from)
		}
	}()
	return u
}

func (u *upstreamRecorder) sent() [][]byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([][]byte(nil), u.got...)
}

// query builds a query for name with extra, a function that adds what a
// sandbox may smuggle into the rest of the message.
func query(t *testing.T, name string, extra func(b *dnsmessage.Builder)) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 0x1234, RecursionDesired: true})
	b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	if extra != nil {
		extra(&b)
	}
	q, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// The resolver passes on a query's one question only, in a query of its
// own: a second question, EDNS option data, records in other sections and
// trailing bytes never reach the upstream resolver; a query that is not
// one plain question is answered FORMERR and not passed on.
func TestResolverForwardsOnlyTheQuestion(t *testing.T) {
	up := startUpstreamRecorder(t)
	r := &resolver{upstreams: []netip.AddrPort{up.addr}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		view: sandboxView{policy: func() Compiled { return Compiled{Internet: true} }, log: func(pandastack.EgressEntry) {}}}
	secret := []byte("SECRET-OPTION-DATA")
	withOption := query(t, "allowed.test.", func(b *dnsmessage.Builder) {
		b.StartAdditionals()
		var rh dnsmessage.ResourceHeader
		rh.SetEDNS0(1232, dnsmessage.RCodeSuccess, true)
		b.OPTResource(rh, dnsmessage.OPTResource{Options: []dnsmessage.Option{{Code: 65001, Data: secret}}})
	})
	withOption = append(withOption, []byte("SECRET-TRAILING")...)
	a := r.answer(withOption, false)
	var p dnsmessage.Parser
	if h, err := p.Start(a); err != nil || h.RCode != dnsmessage.RCodeSuccess || h.ID != 0x1234 || len(answerAddrs(a)) != 1 {
		t.Fatalf("answer: %+v %v %v", h, err, answerAddrs(a))
	}
	sent := up.sent()
	if len(sent) != 1 {
		t.Fatalf("upstream got %d queries, want 1", len(sent))
	}
	for _, s := range []string{"SECRET-OPTION-DATA", "SECRET-TRAILING"} {
		if bytes.Contains(sent[0], []byte(s)) {
			t.Errorf("upstream got %q", s)
		}
	}
	h, q, edns, err := parseQuery(sent[0])
	if err != nil || q.Name.String() != "allowed.test." || edns.size != 1232 || !edns.dnssecOK {
		t.Errorf("upstream query: %+v %+v %+v %v", h, q, edns, err)
	}
	if h.ID == 0x1234 {
		t.Errorf("the sandbox's query id went upstream") // 1 in 65536 by chance
	}

	for name, bad := range map[string][]byte{
		"two questions": query(t, "allowed.test.", func(b *dnsmessage.Builder) {
			b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("secret.evil.test."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
		}),
		"an answer record": query(t, "allowed.test.", func(b *dnsmessage.Builder) {
			b.StartAnswers()
			b.AResource(dnsmessage.ResourceHeader{Name: dnsmessage.MustNewName("secret.evil.test."), Class: dnsmessage.ClassINET}, dnsmessage.AResource{A: [4]byte{1, 2, 3, 4}})
		}),
		"no question": func() []byte {
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 0x1234})
			q, _ := b.Finish()
			return q
		}(),
	} {
		a := r.answer(bad, false)
		var p dnsmessage.Parser
		if h, err := p.Start(a); err != nil || h.RCode != dnsmessage.RCodeFormatError || h.ID != 0x1234 {
			t.Errorf("%s: answered %+v %v, want FORMERR at once", name, h, err)
		}
	}
	if a := r.answer([]byte{1, 2, 3}, false); a != nil {
		t.Errorf("a few bytes answered %x", a)
	}
	time.Sleep(100 * time.Millisecond)
	if n := len(up.sent()); n != 1 {
		t.Errorf("upstream got %d queries in all, want only the good one", n)
	}
}

// A large answer, which the upstream truncates over UDP, resolves for a
// sandbox that asks over TCP: the resolver asks the upstream over TCP too.
// Over UDP the truncated answer goes back, and the sandbox retries.
func TestResolverLargeAnswersOverTCP(t *testing.T) {
	udp, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	addr := udp.LocalAddr().(*net.UDPAddr).AddrPort()
	tcp, err := net.Listen("tcp4", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	reply := func(q []byte, full bool) []byte {
		var p dnsmessage.Parser
		h, _ := p.Start(q)
		question, _ := p.Question()
		h.Response, h.Truncated = true, !full
		b := dnsmessage.NewBuilder(nil, h)
		b.StartQuestions()
		b.Question(question)
		if full {
			b.StartAnswers()
			for i := range 110 {
				b.AResource(dnsmessage.ResourceHeader{Name: question.Name, Class: dnsmessage.ClassINET, TTL: 60}, dnsmessage.AResource{A: [4]byte{192, 0, 2, byte(i)}})
			}
		}
		a, _ := b.Finish()
		return a
	}
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := udp.ReadFrom(buf)
			if err != nil {
				return
			}
			udp.WriteTo(reply(buf[:n], false), from)
		}
	}()
	go func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			var l [2]byte
			io.ReadFull(c, l[:])
			q := make([]byte, int(l[0])<<8|int(l[1]))
			io.ReadFull(c, q)
			a := reply(q, true)
			c.Write(append([]byte{byte(len(a) >> 8), byte(len(a))}, a...))
			c.Close()
		}
	}()
	r := &resolver{upstreams: []netip.AddrPort{addr}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		view: sandboxView{policy: func() Compiled { return Compiled{Internet: true} }, log: func(pandastack.EgressEntry) {}}}
	if got := answerAddrs(r.answer(query(t, "big.test.", nil), true)); len(got) != 110 {
		t.Errorf("over TCP: %d addresses, want 110", len(got))
	}
	a := r.answer(query(t, "big.test.", nil), false)
	var p dnsmessage.Parser
	if h, err := p.Start(a); err != nil || !h.Truncated {
		t.Errorf("over UDP: %+v %v, want the truncated answer", h, err)
	}
}

// A name of one label (the sandbox's own name, asked for IPv6, which
// /etc/hosts does not answer) is answered NXDOMAIN and logged, never sent
// on; the root and names with a dot still are.
func TestResolverKeepsSingleLabelNames(t *testing.T) {
	up := startUpstreamRecorder(t)
	var logged []pandastack.EgressEntry
	r := &resolver{upstreams: []netip.AddrPort{up.addr}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		view: sandboxView{policy: func() Compiled { return Compiled{Internet: true} }, log: func(e pandastack.EgressEntry) { logged = append(logged, e) }}}
	for _, name := range []string{"sbx-abcdefgh12345678.", "SBX-ABCDEFGH12345678.", "intranet."} {
		var p dnsmessage.Parser
		if h, err := p.Start(r.answer(query(t, name, nil), false)); err != nil || h.RCode != dnsmessage.RCodeNameError || h.ID != 0x1234 {
			t.Errorf("%s: answered %+v %v, want NXDOMAIN", name, h, err)
		}
	}
	if n := len(up.sent()); n != 0 {
		t.Errorf("upstream got %d queries for names of one label", n)
	}
	if len(logged) != 3 || logged[0].Rule != "single_label" || logged[0].Allowed || logged[0].Domain != "sbx-abcdefgh12345678" {
		t.Errorf("logged %+v, want each refused with rule single_label", logged)
	}
	for _, name := range []string{"example.test.", "."} {
		r.answer(query(t, name, nil), false)
	}
	if n := len(up.sent()); n != 2 {
		t.Errorf("upstream got %d queries for a name with a dot and the root, want 2", n)
	}
}

// Under domain rules the resolver answers the allowed names; the others
// too when the policy has internet access (with deny_out: the domains let
// names through it, and an NXDOMAIN would keep nothing in), but not
// without it.
func TestResolverUnderDomainRules(t *testing.T) {
	for _, c := range []struct {
		name     string
		pol      Compiled
		answered bool
		rule     string
	}{
		{"internet, deny_out", Compiled{Internet: true, DenyNet: []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}, Domains: []string{"foo.example"}}, true, "internet"},
		{"no internet, CIDR allowed", Compiled{AllowNet: []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}, Domains: []string{"foo.example"}}, false, "no_domain_rule"},
		{"no internet, domains only", Compiled{Domains: []string{"foo.example"}}, false, "no_domain_rule"},
	} {
		if !c.pol.DomainRules() {
			t.Fatalf("%s: no domain rules", c.name)
		}
		up := startUpstreamRecorder(t)
		var logged []pandastack.EgressEntry
		r := &resolver{upstreams: []netip.AddrPort{up.addr}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
			view: sandboxView{policy: func() Compiled { return c.pol }, log: func(e pandastack.EgressEntry) { logged = append(logged, e) }}}
		var p dnsmessage.Parser
		h, err := p.Start(r.answer(query(t, "other.example.", nil), false))
		if err != nil || (h.RCode == dnsmessage.RCodeSuccess) != c.answered || (len(up.sent()) == 1) != c.answered {
			t.Errorf("%s: other.example answered %+v %v, upstream asked %d times; want answered %v", c.name, h, err, len(up.sent()), c.answered)
		}
		if len(logged) != 1 || logged[0].Rule != c.rule || logged[0].Allowed != c.answered {
			t.Errorf("%s: logged %+v, want rule %s", c.name, logged, c.rule)
		}
		if h, err := p.Start(r.answer(query(t, "foo.example.", nil), false)); err != nil || h.RCode != dnsmessage.RCodeSuccess {
			t.Errorf("%s: the allowed name: %+v %v", c.name, h, err)
		}
	}
}

// A name no upstream answers gets SERVFAIL once the upstreams' time is up
// (silence had the sandbox's resolver library wait out its retries), and
// is logged: it went out.
func TestResolverServfailWhenNoUpstreamAnswers(t *testing.T) {
	c, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close() // reads nothing, answers nothing
	defer func(d time.Duration) { resolverTimeout = d }(resolverTimeout)
	resolverTimeout = 200 * time.Millisecond
	var logged []pandastack.EgressEntry
	r := &resolver{upstreams: []netip.AddrPort{c.LocalAddr().(*net.UDPAddr).AddrPort()}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		view: sandboxView{policy: func() Compiled { return Compiled{Internet: true} }, log: func(e pandastack.EgressEntry) { logged = append(logged, e) }}}
	var p dnsmessage.Parser
	if h, err := p.Start(r.answer(query(t, "drop.example.", nil), false)); err != nil || h.RCode != dnsmessage.RCodeServerFailure || h.ID != 0x1234 {
		t.Errorf("answered %+v %v, want SERVFAIL", h, err)
	} else if q, err := p.Question(); err != nil || q.Name.String() != "drop.example." {
		// Without its question, Go's resolver, c-ares and dnspython drop
		// the answer and wait out their timeout.
		t.Errorf("the SERVFAIL's question: %+v %v, want drop.example.", q, err)
	}
	if len(logged) != 1 || logged[0].Domain != "drop.example" || !logged[0].Allowed || logged[0].Rule != "internet" || logged[0].Address != "" {
		t.Errorf("logged %+v, want the query, allowed, with no address", logged)
	}
}

// Names only the host's own network answers are not sent on: the reverse
// names of addresses no sandbox reaches (a host's resolver names the host
// there), local and private-use zones, and classes other than IN (CHAOS
// hostname.bind asks the resolver of itself). Public reverse names are.
func TestResolverKeepsTheHostsView(t *testing.T) {
	up := startUpstreamRecorder(t)
	var logged []pandastack.EgressEntry
	deny := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16")}
	r := &resolver{upstreams: []netip.AddrPort{up.addr}, log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		view: sandboxView{policy: func() Compiled { return Compiled{Internet: true} }, log: func(e pandastack.EgressEntry) { logged = append(logged, e) },
			denied: func(a netip.Addr) bool { return inAny(a, deny) }}}
	for _, name := range []string{"1.0.0.10.in-addr.arpa.", "7.1.168.192.IN-ADDR.ARPA.", "168.192.in-addr.arpa.", "printer.local.", "db.internal.", "x.localhost.", "router.home.arpa.", "1.0.0.0.ip6.arpa.", "x.y.z.w.v.in-addr.arpa."} {
		var p dnsmessage.Parser
		if h, err := p.Start(r.answer(query(t, name, nil), false)); err != nil || h.RCode != dnsmessage.RCodeNameError {
			t.Errorf("%s: answered %+v %v, want NXDOMAIN", name, h, err)
		}
	}
	chaos := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7})
	chaos.StartQuestions()
	chaos.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("hostname.bind."), Type: dnsmessage.TypeTXT, Class: dnsmessage.ClassCHAOS})
	q, _ := chaos.Finish()
	var p dnsmessage.Parser
	if h, err := p.Start(r.answer(q, false)); err != nil || h.RCode != dnsmessage.RCodeRefused {
		t.Errorf("CHAOS hostname.bind: answered %+v %v, want REFUSED", h, err)
	}
	if n := len(up.sent()); n != 0 {
		t.Errorf("upstream got %d queries of the host's view", n)
	}
	if len(logged) != 10 || logged[0].Rule != "platform" || logged[0].Allowed {
		t.Errorf("logged %+v, want each refused with rule platform", logged)
	}
	for _, name := range []string{"4.3.2.1.in-addr.arpa.", "example.test."} {
		r.answer(query(t, name, nil), false)
	}
	if n := len(up.sent()); n != 2 {
		t.Errorf("upstream got %d queries for a public reverse name and a public name, want 2", n)
	}
}
