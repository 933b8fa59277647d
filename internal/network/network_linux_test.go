package network

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/network/nettest"
	"github.com/pandastack/pandastack/internal/testutil"
	"github.com/vishvananda/netlink"
)

func newTestNetwork(t *testing.T, up nettest.Upstream, def pandastack.NetworkPolicy) *Network {
	t.Helper()
	return newTestNetworkWith(t, Config{Default: def, Resolvers: []netip.AddrPort{up.DNS}})
}

// newTestNetworkWith starts a network of cfg with a new instance and
// state directory of its own.
func newTestNetworkWith(t *testing.T, cfg Config) *Network {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("nft"); err != nil && os.Getenv("CI") == "true" {
		t.Fatal("nft not installed: run scripts/setup.sh")
	}
	inst := InstanceID(t.TempDir())
	cfg.Instance, cfg.StateDir = inst, t.TempDir()
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		assertNoLeaks(t, inst)
	})
	return n
}

// assertNoLeaks fails if any namespace, veth or table of the instance is left.
func assertNoLeaks(t *testing.T, inst string) {
	t.Helper()
	out, _ := exec.Command("ip", "-o", "link").CombinedOutput()
	if strings.Contains(string(out), "ps"+inst) {
		t.Errorf("veth of instance %s left: %s", inst, out)
	}
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "pandastack-"+inst+"-") {
			t.Errorf("namespace %s left", e.Name())
		}
	}
	if out, err := exec.Command("nft", "list", "tables").CombinedOutput(); err == nil && strings.Contains(string(out), "pandastack_"+inst) {
		t.Errorf("table pandastack_%s left", inst)
	}
}

// get fetches http://addr/ from inside ns; the error says how it failed.
func get(t *testing.T, ns string, addr netip.Addr) (string, time.Duration, error) {
	var body string
	var err error
	var took time.Duration
	nettest.InNS(t, ns, func() {
		start := time.Now()
		var c net.Conn
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(addr, 80).String(), 5*time.Second)
		took = time.Since(start)
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: test.example\r\n\r\n")
		var b []byte
		b, err = io.ReadAll(c)
		body = string(b)
	})
	return body, took, err
}

func TestSandboxNetwork(t *testing.T) {
	up := nettest.StartUpstream(t, "a", 2, 2)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())

	ns, err := n.Prepare("sbx_neta", nil)
	if err != nil {
		t.Fatal(err)
	}
	if l, err := netlink.LinkByName(n.veth(n.sbx["sbx_neta"].Slot)); err != nil || l.Attrs().MTU != vethMTU {
		t.Errorf("host end of the veth: %v, want MTU %d", err, vethMTU)
	} else if v6, _ := netlink.AddrList(l, netlink.FAMILY_V6); len(v6) != 0 {
		t.Errorf("host end of the veth has IPv6 addresses %v, want none", v6)
	}
	body, _, err := get(t, ns, up.PublicIP)
	if err != nil || !strings.Contains(body, "upstream test.example") {
		t.Fatalf("internet policy: GET %s = %q, %v", up.PublicIP, body, err)
	}
	// The connection through NAT reaches the egress log (from connection
	// tracking, read once a second) once it has closed.
	var logged *pandastack.EgressEntry
	for deadline := time.Now().Add(15 * time.Second); logged == nil && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		for _, e := range n.Log("sbx_neta") {
			if e.Kind == "tcp" && e.Address == up.PublicIP.String() && e.Port == 80 {
				logged = &e
			}
		}
	}
	if logged == nil || !logged.Allowed || logged.Rule != "internet" || logged.BytesIn < int64(len(body)) || logged.BytesOut == 0 {
		t.Errorf("egress log entry of the NAT connection: %+v (log %+v)", logged, n.Log("sbx_neta"))
	}

	// The platform deny set: a private address, the host's own, metadata.
	targets := []netip.Addr{up.PrivateIP, netip.MustParseAddr("169.254.169.254")}
	for _, p := range hostAddrs() {
		targets = append(targets, p.Addr())
	}
	for _, a := range targets {
		_, took, err := get(t, ns, a)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("connect to %s from a sandbox: %v after %s; want connection refused at once", a, err, took)
		}
	}
	// Each refused connect is in the egress log, with the rule that refused it.
	for _, a := range targets {
		if !a.IsLoopback() { // the namespace's own loopback refused that one
			waitRefused(t, n, "sbx_neta", a, 80, "platform")
		}
	}

	// A live change: deny_out the server, then allow_out wins.
	pol := pandastack.NetworkPolicy{AllowInternetAccess: true, DenyOut: []string{up.PublicIP.String() + "/32"}}
	if err := n.SetPolicy("sbx_neta", pol); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(t, ns, up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("deny_out: %v, want refused", err)
	}
	waitRefused(t, n, "sbx_neta", up.PublicIP, 80, "deny_out "+up.PublicIP.String()+"/32")
	pol.AllowOut = []string{up.PublicIP.String()}
	if err := n.SetPolicy("sbx_neta", pol); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(t, ns, up.PublicIP); err != nil {
		t.Errorf("allow_out wins over deny_out: %v", err)
	}
	if err := n.SetPolicy("sbx_neta", pandastack.NoNetworkPolicy()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(t, ns, up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("no internet: %v, want refused", err)
	}
	waitRefused(t, n, "sbx_neta", up.PublicIP, 80, "no_internet")
	// A bad policy changes nothing.
	if err := n.SetPolicy("sbx_neta", pandastack.NetworkPolicy{AllowInternetAccess: true, AllowOut: []string{"10.1.2.3"}}); !pandastack.IsCode(err, pandastack.ENetworkDenied) {
		t.Errorf("allow_out into the deny set: %v, want %s", err, pandastack.ENetworkDenied)
	}
	if _, _, err := get(t, ns, up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after a rejected change: %v, want the old policy (refused)", err)
	}
	// The largest policy the API takes: the kernel's acknowledgements of
	// its batch overflowed the socket's default buffer past about 128
	// entries (ENOBUFS), and a change the kernel had made was reported
	// as failed.
	var big pandastack.NetworkPolicy
	for i := range MaxRules / 2 {
		big.AllowOut = append(big.AllowOut, fmt.Sprintf("1.2.%d.%d/32", i/250, i%250))
		big.DenyOut = append(big.DenyOut, fmt.Sprintf("1.3.%d.%d/32", i/250, i%250))
	}
	if err := n.SetPolicy("sbx_neta", big); err != nil {
		t.Errorf("a policy of %d + %d entries: %v", len(big.AllowOut), len(big.DenyOut), err)
	}

	// Two sandboxes cannot reach each other.
	ns2, err := n.Prepare("sbx_netb", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, b := n.addrs(n.sbx["sbx_neta"].Slot)
	var lnErr error
	nettest.InNS(t, ns, func() {
		ln, err := net.Listen("tcp4", ":80")
		if lnErr = err; err == nil {
			t.Cleanup(func() { ln.Close() })
		}
	})
	if lnErr != nil {
		t.Fatal(lnErr)
	}
	if _, _, err := get(t, ns2, b); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("sandbox to sandbox: %v, want refused", err)
	}

	n.Release("sbx_neta")
	n.Release("sbx_netb")
	for _, id := range []string{"sbx_neta", "sbx_netb"} {
		if _, err := os.Stat(n.NSPath(id)); err == nil {
			t.Errorf("namespace of %s left after Release", id)
		}
	}
}

// waitRefused waits for the egress log entry of a refused connect to addr:port.
func waitRefused(t *testing.T, n *Network, id string, addr netip.Addr, port int, rule string) {
	t.Helper()
	waitRefusedAfter(t, n, id, 0, addr, port, rule)
}

// waitRefusedAfter is waitRefused for an entry past the log's first skip
// entries: the ones a test saw before.
func waitRefusedAfter(t *testing.T, n *Network, id string, skip int, addr netip.Addr, port int, rule string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		log := n.Log(id)
		for _, e := range log[min(skip, len(log)):] {
			if e.Kind == "tcp" && e.Address == addr.String() && e.Port == port && !e.Allowed && e.Rule == rule {
				return
			}
		}
	}
	t.Errorf("no refused entry for %s:%d by %q in the egress log: %+v", addr, port, rule, n.Log(id))
}

// A flood of refused packets is logged only up to the firewall's limit.
func TestRefusedFloodIsRateLimited(t *testing.T) {
	up := nettest.StartUpstream(t, "f", 42, 42)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	ns, err := n.Prepare("sbx_flood", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_flood")
	const sent = 3000
	nettest.InNS(t, ns, func() {
		c, err := net.ListenPacket("udp4", ":0")
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(up.PrivateIP, 9))
		for range sent {
			c.WriteTo([]byte("x"), to)
		}
	})
	count := func() int {
		k := 0
		for _, e := range n.Log("sbx_flood") {
			if e.Kind == "udp" && e.Address == up.PrivateIP.String() && e.Port == 9 && !e.Allowed && e.Rule == "platform" {
				k++
			}
		}
		return k
	}
	for deadline := time.Now().Add(10 * time.Second); count() == 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
	}
	time.Sleep(500 * time.Millisecond) // the rest of what was logged
	k := count()
	t.Logf("%d of %d refused datagrams logged", k, sent)
	if k == 0 || k >= sent/2 {
		t.Errorf("%d of %d refused datagrams logged; want some, limited to about %d a second after a burst of %d", k, sent, refusedLogRate, refusedLogBurst)
	}
}

// TestFlowLimit: a sandbox that opens flows to ever new ports (UDP to a
// server that never answers) holds no more than its limit in the host's
// connection tracking table; past it, new flows are refused and logged
// (flow_limit), DNS to its resolver too, while a connection opened before
// goes on; and the limit goes with the sandbox.
func TestFlowLimit(t *testing.T) {
	up := nettest.StartUpstream(t, "q", 78, 78)
	const limit = 40
	n := newTestNetworkWith(t, Config{Default: pandastack.InternetPolicy(), Resolvers: []netip.AddrPort{up.DNS}, MaxFlows: limit})
	ns, err := n.Prepare("sbx_flows", nil)
	if err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			n.Release("sbx_flows")
		}
	}()
	addr, _ := n.Addr("sbx_flows")
	tracked := func() int {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		k := 0
		for _, f := range flows {
			if a, ok := netip.AddrFromSlice(f.Forward.SrcIP.To4()); ok && a == addr {
				k++
			}
		}
		return k
	}
	// flood sends a datagram to each of ten times the limit's ports from
	// first on, each a flow of its own.
	flood := func(first int) {
		nettest.InNS(t, ns, func() {
			c, err := net.ListenUDP("udp4", nil)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			for port := first; port < first+10*limit; port++ {
				c.WriteToUDP([]byte("x"), net.UDPAddrFromAddrPort(netip.AddrPortFrom(up.PublicIP, uint16(port))))
			}
		})
	}
	var kept net.Conn
	nettest.InNS(t, ns, func() {
		// Open before the flood: established, it is never counted again.
		var err error
		if kept, err = net.DialTimeout("tcp4", netip.AddrPortFrom(up.PublicIP, 80).String(), 5*time.Second); err != nil {
			t.Errorf("a first connection: %v", err)
		}
	})
	if kept == nil {
		t.FailNow()
	}
	flood(20000)
	defer kept.Close()
	if k := tracked(); k > limit+2 {
		t.Errorf("%d flows of the sandbox tracked; its limit is %d", k, limit)
	}
	// A policy change (one that rewrites the chain, and still lets the
	// upstream through) does not start the count again.
	if err := n.SetPolicy("sbx_flows", pandastack.NetworkPolicy{AllowInternetAccess: true, DenyOut: []string{"192.0.2.1"}}); err != nil {
		t.Fatal(err)
	}
	flood(30000)
	if k := tracked(); k > limit+2 {
		t.Errorf("%d flows of the sandbox tracked after a policy change; its limit is %d", k, limit)
	}
	// A query to its resolver is a new flow past the limit too.
	if rc := queryRcode(t, ns, addr.Prev(), "allowed.example"); rc != -1 {
		t.Errorf("DNS answered (rcode %d) past the flow limit", rc)
	}
	// The connection from before still works.
	kept.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(kept, "GET / HTTP/1.0\r\nHost: test.example\r\n\r\n")
	if b, err := io.ReadAll(kept); err != nil || !strings.Contains(string(b), "upstream") {
		t.Errorf("the connection opened before the flood: %q %v", b, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !slices.ContainsFunc(n.Log("sbx_flows"), func(e pandastack.EgressEntry) bool { return e.Rule == "flow_limit" && !e.Allowed }) {
		if time.Now().After(deadline) {
			t.Fatalf("no flow_limit entry in the egress log: %+v", n.Log("sbx_flows"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.Release("sbx_flows")
	released = true
	// Its connections went with it: the next sandbox at its address gets
	// nothing of theirs.
	if k := tracked(); k != 0 {
		t.Errorf("%d flows of the sandbox still tracked after it ended", k)
	}
	out, _ := exec.Command("nft", "list", "table", "inet", "pandastack_"+n.cfg.Instance).CombinedOutput()
	if strings.Contains(string(out), "lim_") || strings.Contains(string(out), "ct count") {
		t.Errorf("the sandbox's flow limit outlived it:\n%s", out)
	}
}

func TestResolverForwards(t *testing.T) {
	up := nettest.StartUpstream(t, "b", 6, 6)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	ns, err := n.Prepare("sbx_dns", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_dns")
	// Nothing listens on port 53 of the upstream: an answer can only come
	// from our resolver, to which the firewall redirects any DNS.
	var answer []byte
	nettest.InNS(t, ns, func() {
		var c net.Conn
		if c, err = net.Dial("udp4", netip.AddrPortFrom(up.PublicIP, 53).String()); err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		// id 0x1234, recursion desired, one question: pypi.test A IN.
		q := []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 4, 'p', 'y', 'p', 'i', 4, 't', 'e', 's', 't', 0, 0, 1, 0, 1}
		if _, err = c.Write(q); err != nil {
			return
		}
		buf := make([]byte, 512)
		var k int
		k, err = c.Read(buf)
		answer = buf[:k]
	})
	if err != nil || len(answer) < 4 || answer[0] != 0x12 || !strings.HasSuffix(string(answer), string([]byte{198, 51, 100, 77})) {
		t.Fatalf("query through the sandbox resolver: % x, %v", answer, err)
	}
}

// A sandbox that reaches nothing outside resolves no name: its queries
// never leave (they could carry data out); with an allowed address they go
// on, so that its names resolve.
func TestResolverWithoutInternet(t *testing.T) {
	up := nettest.StartUpstream(t, "g", 22, 22)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	closed := pandastack.NetworkPolicy{}
	ns, err := n.Prepare("sbx_closed", &closed)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_closed")
	if rc := queryRcode(t, ns, up.PublicIP, "pypi.test"); rc != 3 {
		t.Errorf("no internet, no allow_out: rcode %d, want NXDOMAIN (3)", rc)
	}
	var logged bool
	for _, e := range n.Log("sbx_closed") {
		logged = logged || (e.Kind == "dns" && e.Domain == "pypi.test" && !e.Allowed && e.Rule == "no_internet")
	}
	if !logged {
		t.Errorf("the refused query is not in the egress log: %+v", n.Log("sbx_closed"))
	}
	if err := n.SetPolicy("sbx_closed", pandastack.NetworkPolicy{AllowOut: []string{"198.51.100.0/24"}}); err != nil {
		t.Fatal(err)
	}
	if rc := queryRcode(t, ns, up.PublicIP, "pypi.test"); rc != 0 {
		t.Errorf("with an allowed address: rcode %d, want an answer", rc)
	}
}

func TestCompile(t *testing.T) {
	deny := PlatformDeny
	open := []netip.Prefix{netip.MustParsePrefix("10.9.0.0/16")}
	cases := []struct {
		p    pandastack.NetworkPolicy
		code string
		want string
	}{
		{pandastack.NetworkPolicy{AllowOut: []string{"1.2.3.0/24", "8.8.8.8", "api.example.com", "*.example.org"}, DenyOut: []string{"0.0.0.0/0"}}, "", ""},
		{pandastack.NetworkPolicy{AllowOut: []string{"8.8.8.8", "1.2.3.4/40"}}, pandastack.EInvalid, "allow_out[1]"},
		{pandastack.NetworkPolicy{AllowOut: []string{"exa mple.com"}}, pandastack.EInvalid, "allow_out[0]"},
		{pandastack.NetworkPolicy{DenyOut: []string{"1.2.3.4", "example.com"}}, pandastack.EInvalid, "deny_out[1]"},
		{pandastack.NetworkPolicy{AllowOut: []string{"192.168.1.1"}}, pandastack.ENetworkDenied, "allow_out[0]"},
		{pandastack.NetworkPolicy{AllowOut: []string{"169.254.169.254"}}, pandastack.ENetworkDenied, "allow_out[0]"},
		{pandastack.NetworkPolicy{AllowOut: []string{"0.0.0.0/0"}}, "", ""},
		{pandastack.NetworkPolicy{AllowOut: []string{"10.0.0.0/7"}}, "", ""},
		{pandastack.NetworkPolicy{AllowOut: []string{"10.9.1.0/24"}}, "", ""},
		{pandastack.NetworkPolicy{AllowOut: []string{"10.8.1.0/24"}}, pandastack.ENetworkDenied, "allow_out[0]"},
		{pandastack.NetworkPolicy{AllowOut: []string{"1.2.3.999"}}, pandastack.EInvalid, "allow_out[0]"},
		{pandastack.NetworkPolicy{DenyOut: make([]string, MaxRules+1)}, pandastack.EInvalid, "at most"},
	}
	for i, c := range cases {
		_, err := Compile(c.p, deny, open)
		if c.code == "" {
			if err != nil {
				t.Errorf("case %d: %v", i, err)
			}
			continue
		}
		if !pandastack.IsCode(err, c.code) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("case %d: %v, want %s naming %s", i, err, c.code, c.want)
		}
	}
	if !MatchDomain([]string{"*.example.org"}, "a.b.example.org") || MatchDomain([]string{"*.example.org"}, "example.org") || MatchDomain([]string{"api.example.com"}, "evilapi.example.com") {
		t.Error("MatchDomain")
	}
}

// request sends one HTTP/1.0 request with the given Host to addr:80 (or, with
// sni set, over TLS to addr:443 with that server name) from inside ns and
// returns the whole response.
func request(t *testing.T, ns string, addr netip.Addr, host, sni string) (string, error) {
	var out string
	var err error
	nettest.InNS(t, ns, func() {
		port := uint16(80)
		if sni != "" {
			port = 443
		}
		var c net.Conn
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(addr, port).String(), 5*time.Second)
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if sni != "" {
			tc := tls.Client(c, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
			if err = tc.Handshake(); err != nil {
				return
			}
			c = tc
		}
		fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", host)
		var b []byte
		b, err = io.ReadAll(c)
		out = string(b)
	})
	return out, err
}

// A sandbox's domain proxy serves that sandbox only: another sandbox
// that connects to its port straight away gets a reset, not the first
// one's policy (and no line in its egress log).
func TestProxyServesOnlyItsSandbox(t *testing.T) {
	up := nettest.StartUpstream(t, "h", 34, 34)
	up.SetDNS("b.allowed.test", up.PublicIP)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	polA := pandastack.NetworkPolicy{AllowOut: []string{"a.allowed.test"}}
	polB := pandastack.NetworkPolicy{AllowOut: []string{"b.allowed.test"}}
	nsA, err := n.Prepare("sbx_pxa", &polA)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_pxa")
	nsB, err := n.Prepare("sbx_pxb", &polB)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_pxb")
	// B's own way works.
	if out, err := request(t, nsB, up.PublicIP, "b.allowed.test", ""); err != nil || !strings.Contains(out, "upstream b.allowed.test") {
		t.Fatalf("B through its own proxy: %q, %v", out, err)
	}
	// A straight to B's proxy port: refused by the firewall (a sandbox
	// reaches only its own gateway's services), and by the proxy were it
	// let through (it serves only its own sandbox's redirected
	// connections).
	addrB, _ := n.Addr("sbx_pxb")
	gwB := netip.AddrFrom4([4]byte{addrB.As4()[0], addrB.As4()[1], addrB.As4()[2], addrB.As4()[3] - 1})
	var out string
	nettest.InNS(t, nsA, func() {
		c, derr := net.DialTimeout("tcp4", netip.AddrPortFrom(gwB, proxyHTTPPort).String(), 5*time.Second)
		if derr != nil {
			err = derr
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: b.allowed.test\r\n\r\n")
		b, _ := io.ReadAll(c)
		out = string(b)
	})
	if strings.Contains(out, "upstream") {
		t.Errorf("sandbox A got through B's proxy: %q", out)
	}
	if err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("sandbox A's connection to B's gateway: %v, want it refused", err)
	}
	for _, e := range n.Log("sbx_pxb") {
		if e.Kind == "tcp" && e.Port != 80 {
			t.Errorf("B's egress log has A's connection: %+v", e)
		}
	}
}

// exchange writes payload to addr:80 from inside ns and reads until the
// connection ends or read says it has seen enough.
func exchange(t *testing.T, ns string, addr netip.Addr, payload string, read func(c net.Conn) string) (string, error) {
	var out string
	var err error
	nettest.InNS(t, ns, func() {
		var c net.Conn
		if c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(addr, 80).String(), 5*time.Second); err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err = io.WriteString(c, payload); err != nil {
			return
		}
		if read != nil {
			out = read(c)
			return
		}
		var b []byte
		b, err = io.ReadAll(c)
		out = string(b)
	})
	return out, err
}

// Under domain rules every HTTP request on a connection must name the host
// it was let through for: a later one (keep-alive) naming another site on
// the same address is not passed on, and the connection ends after the
// answers before it. Keep-alive, bodies (as sent), "Expect: 100-continue"
// and an accepted upgrade work; a refused upgrade leaves HTTP as it was,
// and an h2c upgrade is refused.
func TestDomainProxyChecksEveryRequest(t *testing.T) {
	up := nettest.StartUpstream(t, "i", 66, 66)
	up.SetDNS("api.allowed.test", up.PublicIP)
	up.SetDNS("other.test", up.PublicIP)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	pol := pandastack.NetworkPolicy{AllowOut: []string{"api.allowed.test"}}
	ns, err := n.Prepare("sbx_ka", &pol)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_ka")

	two := "GET /1 HTTP/1.1\r\nHost: api.allowed.test\r\n\r\nGET /2 HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n"
	out, err := exchange(t, ns, up.PublicIP, two, nil)
	if err != nil || !strings.Contains(out, "upstream api.allowed.test") || strings.Contains(out, "other.test") {
		t.Errorf("a second request naming another site: %q, %v", out, err)
	}
	var logged bool
	for _, e := range n.Log("sbx_ka") {
		logged = logged || (e.Domain == "other.test" && !e.Allowed)
	}
	if !logged {
		t.Errorf("the refused request is not in the egress log: %+v", n.Log("sbx_ka"))
	}
	same := "GET /1 HTTP/1.1\r\nHost: api.allowed.test\r\n\r\nGET /2 HTTP/1.0\r\nHost: API.allowed.test:80\r\n\r\n"
	if out, err := exchange(t, ns, up.PublicIP, same, nil); err != nil || strings.Count(out, "upstream api.allowed.test") != 1 || strings.Count(out, "upstream API.allowed.test") != 1 {
		t.Errorf("two requests for the same site (keep-alive, then HTTP/1.0): %q, %v", out, err)
	}
	absolute := "GET http://other.test/ HTTP/1.1\r\nHost: api.allowed.test\r\nConnection: close\r\n\r\n"
	if out, _ := exchange(t, ns, up.PublicIP, absolute, nil); strings.Contains(out, "upstream") {
		t.Errorf("an absolute URL naming another site: %q", out)
	}
	smuggle := "POST /echo HTTP/1.1\r\nHost: api.allowed.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
	if out, _ := exchange(t, ns, up.PublicIP, smuggle, nil); strings.Contains(out, "HTTP/1.1 200") {
		t.Errorf("a body framed twice: %q", out)
	}
	h2c := "GET / HTTP/1.1\r\nHost: api.allowed.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n\r\n"
	if out, _ := exchange(t, ns, up.PublicIP, h2c, nil); strings.Contains(out, "upstream") || strings.Contains(out, "101") {
		t.Errorf("an h2c upgrade: %q", out)
	}
	// Heads a server could frame differently from the proxy: their "body"
	// would be a second request, unchecked. Refused, and logged.
	second := "GET /2 HTTP/1.1\r\nHost: other.test\r\nConnection: close\r\n\r\n"
	for name, head := range map[string]string{
		"a folded length":          "POST /echo HTTP/1.1\r\nHost: api.allowed.test\r\nX-A: 1\r\n Content-Length: %d\r\n\r\n",
		"a space before the colon": "POST /echo HTTP/1.1\r\nHost: api.allowed.test\r\nContent-Length : %d\r\n\r\n",
		"a signed length":          "POST /echo HTTP/1.1\r\nHost: api.allowed.test\r\nContent-Length: +%d\r\n\r\n",
		"a bare LF":                "POST /echo HTTP/1.1\r\nHost: api.allowed.test\nContent-Length: %d\r\n\r\n",
		"CONNECT":                  "CONNECT other.test:80 HTTP/1.1\r\nHost: api.allowed.test\r\nContent-Length: %d\r\n\r\n",
	} {
		if out, _ := exchange(t, ns, up.PublicIP, fmt.Sprintf(head, len(second))+second, nil); strings.Contains(out, "other.test") {
			t.Errorf("%s: %q", name, out)
		}
	}
	var malformed bool
	for _, e := range n.Log("sbx_ka") {
		malformed = malformed || (e.Rule == "malformed_request" && !e.Allowed)
	}
	if !malformed {
		t.Errorf("no malformed request in the egress log: %+v", n.Log("sbx_ka"))
	}
	// A body that comes with the head in one read, larger than the proxy
	// looks at for the head; and a head that comes in two writes.
	big := strings.Repeat("b", 40<<10)
	out, err = exchange(t, ns, up.PublicIP, fmt.Sprintf("POST /echo HTTP/1.1\r\nHost: api.allowed.test\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(big), big), nil)
	if resp, rerr := http.ReadResponse(bufio.NewReader(strings.NewReader(out)), nil); err != nil || rerr != nil {
		t.Errorf("a 40 KiB body with its head: %v %v", err, rerr)
	} else if b, _ := io.ReadAll(resp.Body); string(b) != big {
		t.Errorf("a 40 KiB body with its head: %d bytes echoed, not the body sent", len(b))
	}
	split := func(c net.Conn) string {
		io.WriteString(c, "nection: close\r\n\r\n")
		c.SetDeadline(time.Now().Add(5 * time.Second)) // the head's own deadline is 10 s
		b, _ := io.ReadAll(c)
		return string(b)
	}
	if out, _ := exchange(t, ns, up.PublicIP, "GET /split HTTP/1.1\r\nHost: api.allowed.test\r\nCon", split); !strings.Contains(out, "upstream api.allowed.test") {
		t.Errorf("a head in two writes: %q", out)
	}
	post := "POST /echo HTTP/1.1\r\nHost: api.allowed.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\nhello"
	if out, err := exchange(t, ns, up.PublicIP, post, nil); err != nil || !strings.HasPrefix(out, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200") || !strings.HasSuffix(out, "\r\n\r\nhello") {
		t.Errorf("a POST with a body: %q, %v", out, err)
	}
	chunked := "POST /echo HTTP/1.1\r\nHost: api.allowed.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
	if out, err := exchange(t, ns, up.PublicIP, chunked, nil); err != nil || !strings.HasSuffix(out, "abcde") {
		t.Errorf("a chunked POST: %q, %v", out, err)
	}
	upgrade := "GET /upgrade HTTP/1.1\r\nHost: api.allowed.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"
	out, err = exchange(t, ns, up.PublicIP, upgrade, func(c net.Conn) string {
		br := bufio.NewReader(c)
		var head strings.Builder
		for {
			l, err := br.ReadString('\n')
			head.WriteString(l)
			if err != nil || l == "\r\n" {
				break
			}
		}
		io.WriteString(c, "ping")
		b := make([]byte, 4)
		io.ReadFull(br, b)
		return head.String() + string(b)
	})
	if err != nil || !strings.HasPrefix(out, "HTTP/1.1 101") || !strings.HasSuffix(out, "ping") {
		t.Errorf("an upgrade: %q, %v", out, err)
	}
	// A refused upgrade (the server answers it as a plain GET): what
	// follows on the connection is HTTP again, each request checked.
	refusedUpgrade := "GET /1 HTTP/1.1\r\nHost: api.allowed.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nGET /2 HTTP/1.1\r\nHost: other.test\r\n\r\n"
	if out, err := exchange(t, ns, up.PublicIP, refusedUpgrade, nil); err != nil || !strings.Contains(out, "upstream api.allowed.test") || strings.Contains(out, "other.test") {
		t.Errorf("after a refused upgrade: %q, %v", out, err)
	}
}

func TestDomainRules(t *testing.T) {
	up := nettest.StartUpstream(t, "d", 18, 18)
	up.SetDNS("api.allowed.test", up.PublicIP)
	up.SetDNS("www.wild.test", up.PublicIP)
	up.SetDNS("rebind.allowed.test", up.PrivateIP)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	pol := pandastack.NetworkPolicy{AllowOut: []string{"api.allowed.test", "*.wild.test", "rebind.allowed.test"}}
	ns, err := n.Prepare("sbx_dom", &pol)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_dom")
	served := "X-Served-By: " + netip.AddrPortFrom(up.PublicIP, 80).String()

	// Allowed by Host and by SNI (wildcard).
	if out, err := request(t, ns, up.PublicIP, "api.allowed.test", ""); err != nil || !strings.Contains(out, "upstream api.allowed.test") {
		t.Errorf("Host api.allowed.test: %q, %v", out, err)
	}
	if out, err := request(t, ns, up.PublicIP, "www.wild.test", "www.wild.test"); err != nil || !strings.Contains(out, "upstream www.wild.test") {
		t.Errorf("SNI www.wild.test: %q, %v", out, err)
	}
	// A name not allowed: reset at once, not a hang.
	if out, err := request(t, ns, up.PublicIP, "evil.test", ""); err == nil || !(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)) {
		t.Errorf("Host evil.test: %q, %v; want a reset", out, err)
	}
	if _, err := request(t, ns, up.PublicIP, "x", "evil.test"); err == nil {
		t.Error("SNI evil.test: handshake succeeded; want a reset")
	}
	// A forged Host aimed at a private address reaches only what the name
	// resolves to, never the private server.
	out, err := request(t, ns, up.PrivateIP, "api.allowed.test", "")
	if err != nil || !strings.Contains(out, served) {
		t.Errorf("forged Host to %s: %q, %v; want the public server's answer", up.PrivateIP, out, err)
	}
	// A name that resolves to a private address (rebinding): refused.
	if out, err := request(t, ns, up.PublicIP, "rebind.allowed.test", ""); err == nil {
		t.Errorf("rebinding name: %q; want a reset", out)
	}
	// A private address on port 80 without a name: the proxy resets it.
	if _, _, err := get(t, ns, up.PrivateIP); !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("private address: %v, want reset", err)
	}

	// QUIC (UDP 443) is rejected while domain rules are in force.
	nettest.InNS(t, ns, func() {
		c, err := net.Dial("udp4", netip.AddrPortFrom(up.PublicIP, 443).String())
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write([]byte("quic initial"))
		// ICMP administratively prohibited: the socket fails at once.
		if _, err := c.Read(make([]byte, 16)); !errors.Is(err, syscall.EHOSTUNREACH) && !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("UDP 443: %v, want an ICMP error", err)
		}
	})

	// DNS answers only allowed names.
	if rc := queryRcode(t, ns, up.PublicIP, "api.allowed.test"); rc != 0 {
		t.Errorf("DNS api.allowed.test: rcode %d, want 0", rc)
	}
	if rc := queryRcode(t, ns, up.PublicIP, "evil.test"); rc != 3 {
		t.Errorf("DNS evil.test: rcode %d, want 3 (NXDOMAIN)", rc)
	}

	// The egress log has the allowed and the blocked connection and the DNS answers.
	var sawAllowed, sawBlocked, sawDNS bool
	for _, e := range n.Log("sbx_dom") {
		switch {
		case e.Kind == "tcp" && e.Domain == "api.allowed.test" && e.Allowed && e.BytesIn > 0 && e.Rule == "allow_out api.allowed.test":
			sawAllowed = true
		case e.Kind == "tcp" && e.Domain == "evil.test" && !e.Allowed:
			sawBlocked = true
		case e.Kind == "dns" && e.Domain == "evil.test" && !e.Allowed:
			sawDNS = true
		case e.Kind == "tcp" && e.Domain == "rebind.allowed.test" && e.Address != up.PublicIP.String():
			// Refused: the name resolves into the deny set; the entry keeps
			// the address the sandbox asked for.
			t.Errorf("the refused rebinding name's entry: %+v", e)
		}
	}
	if !sawAllowed || !sawBlocked || !sawDNS {
		t.Errorf("egress log lacks entries (allowed %v, blocked %v, dns %v): %+v", sawAllowed, sawBlocked, sawDNS, n.Log("sbx_dom"))
	}
}

// queryRcode asks the sandbox's resolver (via any address: the firewall
// redirects DNS) for name's A record and returns the answer's rcode.
func queryRcode(t *testing.T, ns string, via netip.Addr, name string) int {
	var rc = -1
	nettest.InNS(t, ns, func() {
		c, err := net.Dial("udp4", netip.AddrPortFrom(via, 53).String())
		if err != nil {
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		q := []byte{0xab, 0xcd, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0}
		for _, l := range strings.Split(name, ".") {
			q = append(append(q, byte(len(l))), l...)
		}
		q = append(q, 0, 0, 1, 0, 1)
		c.Write(q)
		buf := make([]byte, 512)
		if k, err := c.Read(buf); err == nil && k >= 4 {
			rc = int(buf[3] & 0x0f)
		}
	})
	return rc
}

// --network-cidr: a range that overlaps a route of the host, or is too
// small, is refused at start.
func TestCIDRChecked(t *testing.T) {
	up := nettest.StartUpstream(t, "o", 50, 50)
	testutil.RequireRoot(t)
	for _, c := range []struct{ cidr, want string }{
		{"198.51.100.0/24", "overlaps the host's route to 198.51.100."},
		{"10.99.0.0/30", "/28 or larger"},
		{"fd00::/64", "IPv4"},
	} {
		_, err := New(Config{Instance: InstanceID(t.TempDir()), StateDir: t.TempDir(), CIDR: c.cidr, Resolvers: []netip.AddrPort{up.DNS}})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--network-cidr %s: %v, want an error saying %q", c.cidr, err, c.want)
		}
	}
}

// --network-allow-private opens a private range to policies that name it;
// without it the same policy is refused.
func TestAllowPrivate(t *testing.T) {
	up := nettest.StartUpstream(t, "v", 54, 54)
	priv := netip.PrefixFrom(up.PrivateIP, 30).Masked()
	pol := pandastack.NetworkPolicy{AllowOut: []string{up.PrivateIP.String()}}
	closed := newTestNetwork(t, up, pandastack.NoNetworkPolicy())
	if err := closed.Validate(pol); !pandastack.IsCode(err, pandastack.ENetworkDenied) {
		t.Errorf("allow_out %s without --network-allow-private: %v, want %s", up.PrivateIP, err, pandastack.ENetworkDenied)
	}
	// A public range is not the deny set's to open: refused at start.
	public := netip.MustParsePrefix("198.51.100.0/24")
	if _, err := New(Config{Instance: InstanceID(t.TempDir()), StateDir: t.TempDir(), Default: pandastack.NoNetworkPolicy(), AllowPrivate: []netip.Prefix{public}, Resolvers: []netip.AddrPort{up.DNS}}); err == nil || !strings.Contains(err.Error(), "nothing to open") {
		t.Errorf("opening the public range %s: %v, want refused", public, err)
	}
	inst := InstanceID(t.TempDir())
	n, err := New(Config{Instance: inst, StateDir: t.TempDir(), Default: pandastack.NoNetworkPolicy(), AllowPrivate: []netip.Prefix{priv}, Resolvers: []netip.AddrPort{up.DNS}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		assertNoLeaks(t, inst)
	})
	ns, err := n.Prepare("sbx_priv", &pol)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_priv")
	if body, _, err := get(t, ns, up.PrivateIP); err != nil || !strings.Contains(body, "upstream") {
		t.Errorf("allow_out %s with the range opened: %q, %v", up.PrivateIP, body, err)
	}
	// Opened to policies only: one without it still cannot reach it.
	ns2, err := n.Prepare("sbx_priv2", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_priv2")
	if _, _, err := get(t, ns2, up.PrivateIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("default policy to the opened range: %v, want refused", err)
	}
	waitRefused(t, n, "sbx_priv2", up.PrivateIP, 80, "platform")
	// Nor does internet access, or an entry that covers the range without
	// naming it: the opening is for policies that name it.
	for i, p := range []pandastack.NetworkPolicy{{AllowInternetAccess: true}, {AllowOut: []string{"0.0.0.0/0"}}} {
		id := fmt.Sprintf("sbx_priv_wide%d", i)
		ns, err := n.Prepare(id, &p)
		if err != nil {
			t.Fatal(err)
		}
		defer n.Release(id)
		if _, _, err := get(t, ns, up.PrivateIP); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("policy %+v to the opened range: %v, want refused", p, err)
		}
		waitRefused(t, n, id, up.PrivateIP, 80, "platform")
		if body, _, err := get(t, ns, up.PublicIP); err != nil || !strings.Contains(body, "upstream") {
			t.Errorf("policy %+v to the internet: %q, %v", p, body, err)
		}
	}
}

// Other sandboxes stay closed even when an opening covers their range, and
// a policy that names them is refused, not accepted in vain.
func TestSandboxRangeNeverOpens(t *testing.T) {
	up := nettest.StartUpstream(t, "l", 74, 74)
	inst := InstanceID(t.TempDir())
	n, err := New(Config{Instance: inst, StateDir: t.TempDir(), Default: pandastack.NoNetworkPolicy(), AllowPrivate: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Resolvers: []netip.AddrPort{up.DNS}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		assertNoLeaks(t, inst)
	})
	inRange := n.CIDR().Addr().Next().Next()
	for _, e := range []string{inRange.String(), n.CIDR().String()} {
		if err := n.Validate(pandastack.NetworkPolicy{AllowOut: []string{"api.example.com", e}}); !pandastack.IsCode(err, pandastack.ENetworkDenied) || !strings.Contains(err.Error(), "allow_out[1]") {
			t.Errorf("allow_out %s with the range opened: %v, want %s naming allow_out[1]", e, err, pandastack.ENetworkDenied)
		}
	}
	// A wider range that holds the sandbox range is fine: the rest of it works.
	for _, e := range []string{"0.0.0.0/0", "10.0.0.0/8"} {
		if err := n.Validate(pandastack.NetworkPolicy{AllowOut: []string{e}}); err != nil {
			t.Errorf("allow_out %s: %v", e, err)
		}
	}
}

// A sandbox's policy made while the server opened a private range outlives
// a restart without that opening: the entries now inside the platform deny
// set are dropped (the firewall refuses them either way) rather than the
// sandbox failing to resume, or being lost.
func TestPolicyKeptWhenAnOpeningIsGone(t *testing.T) {
	up := nettest.StartUpstream(t, "j", 70, 70)
	priv := netip.PrefixFrom(up.PrivateIP, 30).Masked()
	inst, state := InstanceID(t.TempDir()), t.TempDir()
	open, err := New(Config{Instance: inst, StateDir: state, Default: pandastack.NoNetworkPolicy(), AllowPrivate: []netip.Prefix{priv}, Resolvers: []netip.AddrPort{up.DNS}})
	if err != nil {
		t.Fatal(err)
	}
	// A paused sandbox's policy, kept for its resume.
	pol := pandastack.NetworkPolicy{AllowOut: []string{up.PrivateIP.String(), "api.allowed.test"}}
	if err := open.SetPolicy("sbx_kept", pol); err != nil {
		t.Fatal(err)
	}
	open.Close()
	n, err := New(Config{Instance: inst, StateDir: state, Default: pandastack.NoNetworkPolicy(), Resolvers: []netip.AddrPort{up.DNS}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		assertNoLeaks(t, inst)
	})
	if got := n.Known(); !slices.Equal(got, []string{"sbx_kept"}) {
		t.Fatalf("after the restart the network knows %v, want sbx_kept", got)
	}
	if _, err := n.Prepare("sbx_kept", nil); err != nil {
		t.Fatalf("resume with a policy made under an opening that is gone: %v", err)
	}
	defer func() {
		// The release the server's start does for a sandbox that is gone.
		n.Release("sbx_kept")
		if got := n.Known(); len(got) != 0 {
			t.Errorf("after the release the network knows %v", got)
		}
		if _, err := os.Stat(n.statePath("sbx_kept")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("the released sandbox's state file: %v", err)
		}
	}()
	if got, _ := n.Policy("sbx_kept"); !slices.Equal(got.AllowOut, []string{"api.allowed.test"}) {
		t.Errorf("policy after the resume: %+v", got)
	}
	// A snapshot's policy made then: a restore takes it without the entry
	// (it was refused, 422 over an entry its caller never sent); one that
	// fails for another reason is left for Prepare to refuse.
	if got := n.Kept("snap_x", pol); !slices.Equal(got.AllowOut, []string{"api.allowed.test"}) {
		t.Errorf("a snapshot's policy kept as %+v", got)
	}
	bad := pandastack.NetworkPolicy{AllowOut: []string{"not an address"}}
	if got := n.Kept("snap_x", bad); !slices.Equal(got.AllowOut, bad.AllowOut) {
		t.Errorf("a bad policy kept as %+v", got)
	}
}

// A sandbox cannot hold more than maxProxyConns connections through the
// domain proxy at once: the rest are reset at once.
func TestProxyConnectionsBounded(t *testing.T) {
	up := nettest.StartUpstream(t, "x", 58, 58)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	pol := pandastack.NetworkPolicy{AllowOut: []string{"api.allowed.test"}}
	ns, err := n.Prepare("sbx_many", &pol)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_many")
	const extra = 20
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	resets := 0
	nettest.InNS(t, ns, func() {
		for range maxProxyConns + extra {
			c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(up.PublicIP, 80).String(), 5*time.Second)
			if errors.Is(err, syscall.ECONNRESET) {
				resets++ // reset before the connect returned
				continue
			}
			if err != nil {
				t.Error(err)
				return
			}
			conns = append(conns, c) // says nothing: the proxy waits for its Host header
		}
	})
	// Each read at once (a read past its deadline would not look): those
	// let through wait for their Host header until the deadline.
	var mu sync.Mutex
	var wg sync.WaitGroup
	deadline := time.Now().Add(3 * time.Second)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(deadline)
			if _, err := c.Read(make([]byte, 1)); errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF) {
				mu.Lock()
				resets++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if resets < extra {
		t.Errorf("%d of %d connections reset, want at least the %d past the bound", resets, maxProxyConns+extra, extra)
	}
}

// TestRemovePinnedStacked: a namespace file with bind mounts stacked on it
// is unpinned and removed whole, and a plain file left behind is removed
// too, so the sandbox's next Prepare can pin its namespace there again.
func TestRemovePinnedStacked(t *testing.T) {
	testutil.RequireRoot(t)
	dir := t.TempDir()
	path := dir + "/ns"
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := syscall.Mount("/proc/self/ns/net", path, "", syscall.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for syscall.Unmount(path, syscall.MNT_DETACH) == nil {
		}
	})
	if err := removePinned(path); err != nil {
		t.Fatalf("removePinned with two mounts stacked: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after removePinned: stat %s: %v, want it gone", path, err)
	}
	if err := removePinned(path); err != nil {
		t.Errorf("removePinned of a missing path: %v, want nil", err)
	}
}

// TestPrepareOverStaleFile: a plain file where the sandbox's namespace is
// pinned (a removal that failed half-way) does not stop its next Prepare.
func TestPrepareOverStaleFile(t *testing.T) {
	up := nettest.StartUpstream(t, "s", 2, 2)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	if err := os.WriteFile(n.NSPath("sbx_stale"), nil, 0o444); err != nil {
		t.Fatal(err)
	}
	ns, err := n.Prepare("sbx_stale", nil)
	if err != nil {
		t.Fatalf("Prepare over a stale namespace file: %v", err)
	}
	if body, _, err := get(t, ns, up.PublicIP); err != nil || !strings.Contains(body, "upstream test.example") {
		t.Errorf("GET %s from the new namespace = %q, %v", up.PublicIP, body, err)
	}
	n.Release("sbx_stale")
}

// iprouteNetnsAdd does to dir what iproute2's `ip netns add` does to
// /run/netns before it pins a namespace there: make it shared, binding it
// onto itself first when it is not a mount of its own.
func iprouteNetnsAdd(t *testing.T, dir string) {
	t.Helper()
	err := syscall.Mount("", dir, "", syscall.MS_SHARED|syscall.MS_REC, "")
	if errors.Is(err, syscall.EINVAL) {
		if err = syscall.Mount(dir, dir, "", syscall.MS_BIND|syscall.MS_REC, ""); err == nil {
			err = syscall.Mount("", dir, "", syscall.MS_SHARED|syscall.MS_REC, "")
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}

// TestOwnMountKeepsPinsRemovable: a namespace pinned in a directory that
// iproute2 later binds onto itself can no longer be removed, unless the
// directory was a mount of its own first (what New does to /run/netns).
func TestOwnMountKeepsPinsRemovable(t *testing.T) {
	testutil.RequireRoot(t)
	for _, own := range []bool{false, true} {
		dir := t.TempDir()
		if own {
			if err := ownMount(dir); err != nil {
				t.Fatal(err)
			}
			if err := ownMount(dir); err != nil {
				t.Fatalf("ownMount of a mount already: %v", err)
			}
		}
		pin := dir + "/ns"
		if err := os.WriteFile(pin, nil, 0o444); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount("/proc/self/ns/net", pin, "", syscall.MS_BIND, ""); err != nil {
			t.Fatal(err)
		}
		iprouteNetnsAdd(t, dir)
		err := removePinned(pin)
		switch {
		case own && err != nil:
			t.Errorf("own mount: removePinned after iproute2's bind: %v", err)
		case !own && err == nil:
			t.Errorf("no own mount: removePinned after iproute2's bind succeeded; the hazard this guards against is gone?")
		}
		// Undo: the binds on dir, then what they hid.
		for syscall.Unmount(dir, syscall.MNT_DETACH) == nil {
		}
		removePinned(pin)
		if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("own=%v: %s left: %v", own, pin, err)
		}
	}
	fresh := t.TempDir() + "/new"
	if err := ownMount(fresh); err != nil {
		t.Errorf("ownMount of a new directory: %v", err)
	}
	for syscall.Unmount(fresh, syscall.MNT_DETACH) == nil {
	}
}

// The host's LAN is in the deny set: the gateway of each default route
// (read here from /proc/net/route) and the network of its interface.
// Checked in the set, not by a connect: no test sends to the host's LAN.
func TestUplinkNetsDenied(t *testing.T) {
	b, err := os.ReadFile("/proc/net/route")
	if err != nil {
		t.Fatal(err)
	}
	up := uplinkNets()
	defaults := 0
	for _, l := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(l)
		if len(f) < 3 || f[1] != "00000000" {
			continue
		}
		defaults++
		gw, err := strconv.ParseUint(f[2], 16, 32)
		if err != nil || gw == 0 {
			continue
		}
		a := netip.AddrFrom4([4]byte{byte(gw), byte(gw >> 8), byte(gw >> 16), byte(gw >> 24)})
		if !slices.Contains(up, netip.PrefixFrom(a, 32)) {
			t.Errorf("default gateway %s (%s) not among %v", a, f[0], up)
		}
		// A network holding the gateway, unless the interface's address
		// is a /32 reaching its gateway by a route of its own (clouds).
		onLink := false
		if ifc, err := net.InterfaceByName(f[0]); err == nil {
			addrs, _ := ifc.Addrs()
			for _, ad := range addrs {
				if ipn, ok := ad.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.Contains(a.AsSlice()) {
					onLink = true
				}
			}
		}
		if onLink && !slices.ContainsFunc(up, func(p netip.Prefix) bool { return p.Bits() < 32 && p.Contains(a) }) {
			t.Errorf("the network of %s, which holds gateway %s, not among %v", f[0], a, up)
		}
	}
	if defaults == 0 && len(up) != 0 {
		t.Errorf("no default route, yet uplink networks %v", up)
	}
	n := newTestNetwork(t, nettest.StartUpstream(t, "ul", 106, 106), pandastack.InternetPolicy())
	for _, p := range up {
		if !slices.Contains(n.deny, p) {
			t.Errorf("%s not in the deny set %v", p, n.deny)
		}
	}
}

// A connection opened under a policy that allowed it ends when the policy
// is narrowed to refuse it; one the new policy still allows goes on.
func TestNarrowedPolicyCutsOpenConnections(t *testing.T) {
	up := nettest.StartUpstream(t, "t", 82, 82)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	ns, err := n.Prepare("sbx_narrow", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_narrow")
	other := nettest.StartUpstream(t, "u", 86, 86)
	var cut, kept net.Conn
	nettest.InNS(t, ns, func() {
		var err error
		if cut, err = net.DialTimeout("tcp4", netip.AddrPortFrom(up.PublicIP, 80).String(), 5*time.Second); err != nil {
			t.Error(err)
			return
		}
		if kept, err = net.DialTimeout("tcp4", netip.AddrPortFrom(other.PublicIP, 80).String(), 5*time.Second); err != nil {
			t.Error(err)
		}
	})
	if cut == nil || kept == nil {
		t.FailNow()
	}
	defer cut.Close()
	defer kept.Close()
	// Only the other server stays reachable.
	if err := n.SetPolicy("sbx_narrow", pandastack.NetworkPolicy{AllowOut: []string{other.PublicIP.String()}}); err != nil {
		t.Fatal(err)
	}
	ask := func(c net.Conn) (string, error) {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := fmt.Fprintf(c, "GET / HTTP/1.0\r\nHost: test.example\r\n\r\n"); err != nil {
			return "", err
		}
		b, err := io.ReadAll(c)
		return string(b), err
	}
	if b, err := ask(kept); err != nil || !strings.Contains(b, "upstream") {
		t.Errorf("the connection the new policy allows: %q %v", b, err)
	}
	if b, err := ask(cut); err == nil && strings.Contains(b, "upstream") {
		t.Errorf("the connection the new policy refuses still answered: %q", b)
	}
}

// A connect the remote refuses (a reset to its SYN) is in the egress log:
// its tracking ends before the once-a-second poll could see it, so the log
// learns of it from the kernel's event of its end. A port scan leaves a
// trace.
func TestRefusedByTheRemoteIsLogged(t *testing.T) {
	up := nettest.StartUpstream(t, "cr", 110, 110)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	ns, err := n.Prepare("sbx_scan", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_scan")
	nettest.InNS(t, ns, func() {
		for _, port := range []int{9, 81} {
			if c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(up.PublicIP, uint16(port)).String(), 5*time.Second); err == nil {
				c.Close()
				t.Errorf("port %d of the upstream answered", port)
			} else if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("port %d: %v, want refused by the remote", port, err)
			}
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		found := 0
		for _, e := range n.Log("sbx_scan") {
			if e.Kind == "tcp" && e.Address == up.PublicIP.String() && (e.Port == 9 || e.Port == 81) && e.Allowed && e.Rule == "internet" {
				found++
			}
		}
		if found == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("connects refused by the remote: %d of 2 logged: %+v", found, n.Log("sbx_scan"))
		}
	}
}

// A connection the sandbox only reads from (a download, a stream, a long
// poll) ends with a reset when a narrowed policy refuses it: it waited for
// the server forever, since only the sandbox's next packet was refused.
func TestNarrowedPolicyResetsAReadingConnection(t *testing.T) {
	up := nettest.StartUpstream(t, "rd", 102, 102)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	ns, err := n.Prepare("sbx_reader", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_reader")
	c, r := openTicks(t, ns, up.PublicIP)
	if err := n.SetPolicy("sbx_reader", pandastack.NetworkPolicy{AllowInternetAccess: true, DenyOut: []string{up.PublicIP.String() + "/32"}}); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = io.Copy(io.Discard, r)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reading after the policy refused the connection: %v, want a reset", err)
	}
	// Its log entry names the rule that let it through, not the one that
	// cut it.
	if e := cutEntry(t, n, "sbx_reader", up.PublicIP); e.Rule != "internet" || e.BytesIn == 0 {
		t.Errorf("the cut connection's log entry: %+v, want allowed by internet", e)
	}
}

// openTicks opens, from inside ns, a connection to addr's /ticks, which
// sends a line every 100 ms, and reads until its first tick.
func openTicks(t *testing.T, ns string, addr netip.Addr) (net.Conn, *bufio.Reader) {
	t.Helper()
	var c net.Conn
	var err error
	nettest.InNS(t, ns, func() {
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(addr, 80).String(), 5*time.Second)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "GET /ticks HTTP/1.0\r\nHost: test.example\r\n\r\n")
	r := bufio.NewReader(c)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	for {
		l, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("before the change: %v", err)
		}
		if strings.HasPrefix(l, "tick 1") {
			return c, r
		}
	}
}

// cutEntry waits for the egress log entry of sandbox id's connection to
// addr:80 that was let through (not the refusals of its last packets).
func cutEntry(t *testing.T, n *Network, id string, addr netip.Addr) pandastack.EgressEntry {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		log := n.Log(id)
		if i := slices.IndexFunc(log, func(e pandastack.EgressEntry) bool {
			return e.Kind == "tcp" && e.Address == addr.String() && e.Port == 80 && e.Allowed
		}); i >= 0 {
			return log[i]
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cut connection is not in the log: %+v", log)
		}
	}
}

// A download through the domain proxy goes on across a policy change that
// still allows its name: the narrowing's clean-up leaves the proxy's
// connections to the proxy.
func TestPolicyChangeKeepsProxiedDownloads(t *testing.T) {
	up := nettest.StartUpstream(t, "w", 90, 90)
	up.SetDNS("api.allowed.test", up.PublicIP)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	pol := pandastack.NetworkPolicy{AllowOut: []string{"api.allowed.test"}}
	ns, err := n.Prepare("sbx_proxied", &pol)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_proxied")
	var c net.Conn
	nettest.InNS(t, ns, func() {
		c, err = net.DialTimeout("tcp4", netip.AddrPortFrom(up.PublicIP, 80).String(), 5*time.Second)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const size = 200 << 20
	fmt.Fprintf(c, "GET /bytes?n=%d HTTP/1.1\r\nHost: api.allowed.test\r\n\r\n", size)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // under way, the window full
	if err := n.SetPolicy("sbx_proxied", pandastack.NetworkPolicy{AllowOut: []string{"api.allowed.test", "more.test"}}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // the proxy's side probes the window meanwhile
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if got, err := io.Copy(io.Discard, resp.Body); err != nil || got != size {
		t.Errorf("the download across the policy change: %d of %d bytes, %v", got, size, err)
	}
}

// A policy set while a sandbox's network is being prepared (its resume
// under way: the chain written, the network not up yet) is the one the
// firewall enforces, for Prepare and for Rename (a resume into a prepared
// container) alike. The firewall kept the policy the preparation began
// with, while the API showed the new one.
func TestSetPolicyDuringPrepare(t *testing.T) {
	up := nettest.StartUpstream(t, "z", 98, 98)
	n := newTestNetwork(t, up, pandastack.NetworkPolicy{AllowInternetAccess: true})
	open := pandastack.NetworkPolicy{AllowInternetAccess: true}
	closeDuring := func(t *testing.T) {
		chainWritten = func(id string) {
			if err := n.SetPolicy(id, pandastack.NoNetworkPolicy()); err != nil {
				t.Error(err)
			}
		}
	}
	t.Cleanup(func() { chainWritten = nil })
	refused := func(t *testing.T, ns, id string) {
		t.Helper()
		if _, _, err := get(t, ns, up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("the internet after the policy closed it: %v, want refused", err)
		}
		if p, ok := n.Policy(id); !ok || p.AllowInternetAccess {
			t.Errorf("the policy kept: %+v %v, want the closed one", p, ok)
		}
	}

	t.Run("prepare", func(t *testing.T) {
		// Paused with an open policy; the resume prepares with it.
		if err := n.SetPolicy("sbx_resume", open); err != nil {
			t.Fatal(err)
		}
		closeDuring(t)
		ns, err := n.Prepare("sbx_resume", nil)
		chainWritten = nil
		if err != nil {
			t.Fatal(err)
		}
		defer n.Release("sbx_resume")
		refused(t, ns, "sbx_resume")
	})
	t.Run("rename", func(t *testing.T) {
		if _, err := n.Prepare("sbx_standby", nil); err != nil {
			t.Fatal(err)
		}
		defer n.Release("sbx_standby")
		if err := n.SetPolicy("sbx_suspended", open); err != nil {
			t.Fatal(err)
		}
		closeDuring(t)
		ns, err := n.Rename("sbx_standby", "sbx_suspended")
		chainWritten = nil
		if err != nil {
			t.Fatal(err)
		}
		defer n.Release("sbx_suspended")
		refused(t, ns, "sbx_suspended")
	})
}

// A gateway port that another socket holds (one bound before the gateway
// existed, as a host daemon's on every address would) fails the network's
// setup with a retryable error that says so, and leaves nothing behind.
func TestGatewayPortInUse(t *testing.T) {
	up := nettest.StartUpstream(t, "pi", 114, 114)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	gw, _ := n.addrs(0) // the first sandbox's
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_IP, syscall.IP_FREEBIND, 1) })
		return errors.Join(err, serr)
	}}
	held, err := lc.ListenPacket(context.Background(), "udp4", netip.AddrPortFrom(gw, 53).String())
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.Prepare("sbx_inuse", nil)
	held.Close()
	if !pandastack.IsCode(err, pandastack.EUnavailable) || !strings.Contains(err.Error(), "another socket on the host holds that port") {
		t.Fatalf("Prepare with the gateway's port 53 taken: %v, want %s saying so", err, pandastack.EUnavailable)
	}
	ns, err := n.Prepare("sbx_inuse", nil)
	if err != nil {
		t.Fatalf("Prepare once the port is free: %v", err)
	}
	if body, _, err := get(t, ns, up.PublicIP); err != nil || !strings.Contains(body, "upstream test.example") {
		t.Errorf("GET %s from the sandbox = %q, %v", up.PublicIP, body, err)
	}
	n.Release("sbx_inuse")
}

// TestSetPolicyOfTheSamePolicyChangesNothing: the policy a sandbox has
// already leaves its chain as it is (here emptied by hand, so that a
// rewrite would show); another policy rewrites it.
func TestSetPolicyOfTheSamePolicyChangesNothing(t *testing.T) {
	up := nettest.StartUpstream(t, "sp", 118, 118)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	if _, err := n.Prepare("sbx_same", nil); err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_same")
	n.mu.Lock()
	chain := "sbx_" + strconv.Itoa(n.sbx["sbx_same"].Slot)
	n.mu.Unlock()
	table := "pandastack_" + n.cfg.Instance
	rules := func() int {
		out, err := exec.Command("nft", "-a", "list", "chain", "inet", table, chain).CombinedOutput()
		if err != nil {
			t.Fatalf("nft list chain: %v: %s", err, out)
		}
		k := 0
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "# handle") && !strings.Contains(l, "chain ") {
				k++
			}
		}
		return k
	}
	if rules() == 0 {
		t.Fatal("the sandbox's chain has no rules after Prepare")
	}
	if out, err := exec.Command("nft", "flush", "chain", "inet", table, chain).CombinedOutput(); err != nil {
		t.Fatalf("nft flush chain: %v: %s", err, out)
	}
	// nil and empty lists alike: the same policy.
	if err := n.SetPolicy("sbx_same", pandastack.NetworkPolicy{AllowInternetAccess: true}); err != nil {
		t.Fatal(err)
	}
	if k := rules(); k != 0 {
		t.Errorf("the same policy rewrote the chain: %d rules", k)
	}
	if err := n.SetPolicy("sbx_same", pandastack.NoNetworkPolicy()); err != nil {
		t.Fatal(err)
	}
	if rules() == 0 {
		t.Error("another policy left the chain empty")
	}
	if _, _, err := get(t, n.NSPath("sbx_same"), up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after a policy with no internet: %v, want refused", err)
	}
}

// TestFailedSetPolicyLeavesTheFirewallAsItWas: a policy change whose
// record cannot be written fails and leaves the sandbox's firewall with
// the policy it keeps; setting that policy again is then a no-op that
// leaves it so.
func TestFailedSetPolicyLeavesTheFirewallAsItWas(t *testing.T) {
	up := nettest.StartUpstream(t, "fp", 122, 122)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	ns, err := n.Prepare("sbx_fail", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_fail")
	// The record's temp file cannot be written: a directory is in its way.
	blocker := n.statePath("sbx_fail") + ".tmp"
	if err := os.Mkdir(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := n.SetPolicy("sbx_fail", pandastack.NoNetworkPolicy()); err == nil {
		t.Fatal("SetPolicy succeeded without its record")
	}
	if p, _ := n.Policy("sbx_fail"); !p.AllowInternetAccess {
		t.Errorf("the policy after a failed change: %+v, want the one it had", p)
	}
	if _, _, err := get(t, ns, up.PublicIP); err != nil {
		t.Errorf("the internet after a failed change that would close it: %v", err)
	}
	os.Remove(blocker)
	if err := n.SetPolicy("sbx_fail", pandastack.InternetPolicy()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(t, ns, up.PublicIP); err != nil {
		t.Errorf("the internet after setting the policy it kept: %v", err)
	}
}

// A Prepare that fails leaves a sandbox that had a policy before (a paused
// one's, kept for its resume) with that policy, down: the resume tried
// again applied the policy of pause time instead, internet open again
// after it had been shut while paused.
func TestFailedPrepareKeepsThePolicyItHad(t *testing.T) {
	n := newTestNetworkWith(t, Config{Default: pandastack.InternetPolicy()})
	const id = "sbx_kept"
	if err := n.SetPolicy(id, pandastack.NoNetworkPolicy()); err != nil { // as while paused
		t.Fatal(err)
	}
	defer n.Release(id)
	blocker := n.statePath(id) + ".tmp" // the record cannot be written
	if err := os.Mkdir(blocker, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*pandastack.NetworkPolicy{nil, new(pandastack.InternetPolicy())} {
		if _, err := n.Prepare(id, p); err == nil {
			t.Fatal("Prepare succeeded without its record")
		}
		if got, ok := n.Policy(id); !ok || got.AllowInternetAccess {
			t.Errorf("after a failed Prepare(%v): %+v %v, want the policy it had (no internet)", p, got, ok)
		}
	}
	os.Remove(blocker)
	if _, err := n.Prepare(id, nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := n.Policy(id); got.AllowInternetAccess {
		t.Errorf("after the next Prepare: %+v, want the policy it kept", got)
	}
}

// A crashed server leaves its sandboxes' veths up. The next server's
// firewall refuses what they send until it adopts each (the hook's accept
// let it all through, whatever the policy), and once adopted, a sandbox
// has its own policy again.
func TestUnadoptedSandboxRefused(t *testing.T) {
	up := nettest.StartUpstream(t, "ad", 126, 126)
	inst, state := InstanceID(t.TempDir()), t.TempDir()
	cfg := Config{Instance: inst, StateDir: state, Default: pandastack.NoNetworkPolicy(), Resolvers: []netip.AddrPort{up.DNS}}
	testutil.RequireRoot(t)
	n1, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := n1.Prepare("sbx_adopt", &pandastack.NetworkPolicy{AllowInternetAccess: true})
	if err != nil {
		n1.Close()
		t.Fatal(err)
	}
	veth := n1.veth(n1.sbx["sbx_adopt"].Slot)
	n1.Close()
	// What a crash leaves: the veth up (a stop sets it down).
	l, err := netlink.LinkByName(veth)
	if err == nil {
		err = netlink.LinkSetUp(l)
	}
	if err != nil {
		t.Fatal(err)
	}
	n2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n2.Release("sbx_adopt")
		n2.Close()
		assertNoLeaks(t, inst)
	})
	if body, _, err := get(t, ns, up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("before its adoption: GET %s = %q, %v; want refused", up.PublicIP, body, err)
	}
	if err := n2.Adopt("sbx_adopt"); err != nil {
		t.Fatal(err)
	}
	if body, _, err := get(t, ns, up.PublicIP); err != nil || !strings.Contains(body, "upstream test.example") {
		t.Fatalf("adopted, with internet access: GET %s = %q, %v", up.PublicIP, body, err)
	}
}

// A connection a sandbox holds across a server restart goes on only if its
// policy still allows it once adopted: here the operator no longer opens
// the private range it reached. Its log entry says it was let through
// before the restart.
func TestAdoptionCutsWhatThePolicyNoLongerAllows(t *testing.T) {
	testutil.RequireRoot(t)
	up := nettest.StartUpstream(t, "ac", 130, 130)
	priv := netip.PrefixFrom(up.PrivateIP, 30).Masked()
	inst, state := InstanceID(t.TempDir()), t.TempDir()
	cfg := Config{Instance: inst, StateDir: state, Default: pandastack.NoNetworkPolicy(), Resolvers: []netip.AddrPort{up.DNS}}
	opened := cfg
	opened.AllowPrivate = []netip.Prefix{priv}
	n1, err := New(opened)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			n1.Release("sbx_held")
			n1.Close()
		}
	})
	ns, err := n1.Prepare("sbx_held", &pandastack.NetworkPolicy{AllowOut: []string{up.PrivateIP.String()}})
	if err != nil {
		t.Fatal(err)
	}
	c, r := openTicks(t, ns, up.PrivateIP)
	n1.Close()
	closed = true
	n2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n2.Release("sbx_held")
		n2.Close()
		assertNoLeaks(t, inst)
	})
	if err := n2.Adopt("sbx_held"); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, r); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reading once adopted under a policy that no longer allows it: %v, want a reset", err)
	}
	if e := cutEntry(t, n2, "sbx_held", up.PrivateIP); e.Rule != "before_restart" {
		t.Errorf("the cut connection's log entry: %+v, want rule before_restart", e)
	}
}

// The domain proxy connects from the host: an opened private range that
// holds one of the host's own addresses does not bring a sandbox's
// connection, passed on by the proxy, to a server of the host's there.
func TestProxyNeverReachesTheHost(t *testing.T) {
	up := nettest.StartUpstream(t, "hl", 134, 134)
	priv := netip.PrefixFrom(up.PrivateIP, 30).Masked()
	hostAddr := up.PrivateIP.Prev() // the host's end of the upstream's link
	ln, err := net.Listen("tcp4", netip.AddrPortFrom(hostAddr, 80).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "the host's own server") })}
	go srv.Serve(ln)
	defer srv.Close()
	n := newTestNetworkWith(t, Config{Default: pandastack.NoNetworkPolicy(), AllowPrivate: []netip.Prefix{priv}, Resolvers: []netip.AddrPort{up.DNS}})
	// The whole range, and a name: domain rules, so port 80 goes to the proxy.
	pol := pandastack.NetworkPolicy{AllowOut: []string{priv.String(), "api.allowed.test"}}
	ns, err := n.Prepare("sbx_hostl", &pol)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_hostl")
	if body, _, err := get(t, ns, up.PrivateIP); err != nil || !strings.Contains(body, "upstream") {
		t.Fatalf("the opened range's server: %q, %v", body, err)
	}
	if body, _, err := get(t, ns, hostAddr); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the host's address %s in the opened range: %q, %v; want a reset", hostAddr, body, err)
	}
}
