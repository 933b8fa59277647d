package network

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/testutil"
	"github.com/vishvananda/netns"
)

// inNS runs f on a thread inside the namespace at path.
func inNS(t *testing.T, path string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			t.Error(err)
			return
		}
		ns, err := netns.GetFromPath(path)
		if err != nil {
			t.Error(err)
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			t.Error(err)
			return
		}
		f()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
	}()
	<-done
}

func sh(t *testing.T, cmd string) {
	t.Helper()
	if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", cmd, err, out)
	}
}

// Upstream is a namespace the test makes to play the internet: an HTTP
// server on a documentation address (PublicIP), reachable through NAT, and
// the same server on a private address (PrivateIP) and a DNS stub on
// DNSAddr. Nothing leaves the machine: the host routes both /30s into it.
type Upstream struct {
	PublicIP, PrivateIP netip.Addr
	DNS                 netip.AddrPort
}

// StartUpstream makes the namespace; cleanup removes it.
func StartUpstream(t *testing.T, tag string, pubNet, privNet byte) Upstream {
	t.Helper()
	ns := "pstest-up-" + tag
	hostIf := "pstu" + tag
	exec.Command("ip", "netns", "del", ns).Run()
	exec.Command("ip", "link", "del", hostIf).Run()
	pub := fmt.Sprintf("198.51.100.%d", pubNet)
	priv := fmt.Sprintf("172.31.254.%d", privNet)
	sh(t, fmt.Sprintf(`ip netns add %[1]s && ip link add %[2]s type veth peer name eth0 netns %[1]s &&
ip addr add 198.51.100.%[3]d/30 dev %[2]s && ip addr add 172.31.254.%[4]d/30 dev %[2]s && ip link set %[2]s up &&
ip -n %[1]s addr add %[5]s/30 dev eth0 && ip -n %[1]s addr add %[6]s/30 dev eth0 &&
ip -n %[1]s link set eth0 up && ip -n %[1]s link set lo up && ip -n %[1]s route add default via 198.51.100.%[3]d`,
		ns, hostIf, pubNet-1, privNet-1, pub, priv))
	t.Cleanup(func() {
		exec.Command("ip", "link", "del", hostIf).Run()
		exec.Command("ip", "netns", "del", ns).Run()
	})
	u := Upstream{PublicIP: netip.MustParseAddr(pub), PrivateIP: netip.MustParseAddr(priv), DNS: netip.AddrPortFrom(netip.MustParseAddr(pub), 5353)}
	inNS(t, "/run/netns/"+ns, func() {
		ln, err := net.Listen("tcp4", ":80")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "upstream %s", r.Host)
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		pc, err := net.ListenPacket("udp4", u.DNS.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		go dnsStub(pc)
	})
	return u
}

// dnsStub answers every query with its own header and question echoed, one
// A record 198.51.100.77.
func dnsStub(pc net.PacketConn) {
	buf := make([]byte, 1500)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if n < 12 {
			continue
		}
		q := append([]byte(nil), buf[:n]...)
		q[2] |= 0x80      // response
		q[6], q[7] = 0, 1 // one answer
		q[8], q[9], q[10], q[11] = 0, 0, 0, 0
		q = append(q, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 198, 51, 100, 77)
		pc.WriteTo(q, from)
	}
}

func newTestNetwork(t *testing.T, up Upstream, def pandastack.NetworkPolicy) *Network {
	t.Helper()
	testutil.RequireRoot(t)
	if _, err := exec.LookPath("nft"); err != nil && os.Getenv("CI") == "true" {
		t.Fatal("nft not installed: run scripts/setup.sh")
	}
	inst := InstanceID(t.TempDir())
	n, err := New(Config{Instance: inst, StateDir: t.TempDir(), Default: def, Resolvers: []netip.AddrPort{up.DNS}})
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
	inNS(t, ns, func() {
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
	up := StartUpstream(t, "a", 2, 2)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())

	ns, err := n.Prepare("sbx_neta", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _, err := get(t, ns, up.PublicIP)
	if err != nil || !strings.Contains(body, "upstream test.example") {
		t.Fatalf("internet policy: GET %s = %q, %v", up.PublicIP, body, err)
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

	// A live change: deny_out the server, then allow_out wins.
	pol := pandastack.NetworkPolicy{AllowInternetAccess: true, DenyOut: []string{up.PublicIP.String() + "/32"}}
	if err := n.SetPolicy("sbx_neta", pol); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(t, ns, up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("deny_out: %v, want refused", err)
	}
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
	// A bad policy changes nothing.
	if err := n.SetPolicy("sbx_neta", pandastack.NetworkPolicy{AllowInternetAccess: true, AllowOut: []string{"10.1.2.3"}}); !pandastack.IsCode(err, pandastack.ENetworkDenied) {
		t.Errorf("allow_out into the deny set: %v, want %s", err, pandastack.ENetworkDenied)
	}
	if _, _, err := get(t, ns, up.PublicIP); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after a rejected change: %v, want the old policy (refused)", err)
	}

	// Two sandboxes cannot reach each other.
	ns2, err := n.Prepare("sbx_netb", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, b := n.addrs(n.sbx["sbx_neta"].Slot)
	var lnErr error
	inNS(t, ns, func() {
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

func TestResolverForwards(t *testing.T) {
	up := StartUpstream(t, "b", 6, 6)
	n := newTestNetwork(t, up, pandastack.InternetPolicy())
	ns, err := n.Prepare("sbx_dns", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Release("sbx_dns")
	// Nothing listens on port 53 of the upstream: an answer can only come
	// from our resolver, to which the firewall redirects any DNS.
	var answer []byte
	inNS(t, ns, func() {
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
