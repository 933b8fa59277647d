package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/network"
	"github.com/pandastack/pandastack/internal/network/nettest"
)

// fetchScript prints the body of http://ADDR[:PORT]/ or the error's errno
// name, and how long the connect took.
const fetchScript = `
import socket, sys, time, errno
t = time.monotonic()
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 80), timeout=10)
    s.sendall(b"GET / HTTP/1.0\r\nHost: e2e.test\r\n\r\n")
    print(s.makefile("rb").read().decode().split("\r\n\r\n", 1)[1])
except OSError as e:
    print("ERR", errno.errorcode.get(e.errno, e), round(time.monotonic() - t, 3))
`

func fetch(t *testing.T, s *server, id, addr string, port ...string) string {
	t.Helper()
	res, err := s.client().Exec(context.Background(), id, client.ExecRequest{Argv: append([]string{"python3", "-c", fetchScript, addr}, port...), TimeoutSeconds: 30})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	return strings.TrimSpace(res.Stdout + res.Stderr)
}

// networkLeft names what of a server's network instance is on the host:
// namespaces (of ids, or all when none given), and with none given its
// veths and nftables table.
func networkLeft(dataDir string, ids ...string) string {
	inst := network.InstanceID(dataDir)
	var left []string
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		for _, id := range ids {
			if e.Name() == "pandastack-"+inst+"-"+id {
				left = append(left, "namespace "+e.Name())
			}
		}
		if len(ids) == 0 && strings.HasPrefix(e.Name(), "pandastack-"+inst+"-") {
			left = append(left, "namespace "+e.Name())
		}
	}
	if len(ids) == 0 {
		if out, _ := exec.Command("ip", "-o", "link").Output(); strings.Contains(string(out), " ps"+inst) {
			left = append(left, "veths")
		}
		if out, _ := exec.Command("nft", "list", "tables").Output(); strings.Contains(string(out), "pandastack_"+inst) {
			left = append(left, "nftables table")
		}
	}
	return strings.Join(left, ", ")
}

// assertNetworkGone waits a little for networkLeft to be empty.
func assertNetworkGone(t *testing.T, s *server, ids ...string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := networkLeft(s.dataDir, ids...)
		if left == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("network of the server left behind: %s", left)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// networkServer starts a server of the test's own (no warm templates: the
// tests boot base sandboxes) and, when the test ends, stops it and checks
// that nothing of its network is left.
func networkServer(t *testing.T, env ...string) *server {
	s := startServer(t, "", append([]string{"PANDASTACK_WARM=0"}, env...)...)
	t.Cleanup(func() {
		s.stop()
		defer os.RemoveAll(s.dataDir)
		defer func() {
			if t.Failed() {
				t.Log(tail(s.out.String(), 80))
			}
		}()
		assertNetworkGone(t, s)
	})
	return s
}

// gateway is the sandbox's default gateway (the host end of its veth).
func gateway(t *testing.T, s *server, id string) string {
	t.Helper()
	res, err := s.client().Exec(context.Background(), id, client.ExecRequest{Cmd: "awk '$2 == \"00000000\" {print $3}' /proc/net/route"})
	if err != nil {
		t.Fatal(err)
	}
	h := strings.TrimSpace(res.Stdout)
	if len(h) != 8 {
		t.Fatalf("no default route in the sandbox: %q %q", res.Stdout, res.Stderr)
	}
	var b [4]byte
	for i := range 4 {
		v, _ := strconv.ParseUint(h[2*i:2*i+2], 16, 8)
		b[3-i] = byte(v) // /proc/net/route is little-endian
	}
	return net.IP(b[:]).String()
}

// waitRefusedEntry waits for the sandbox's egress log to list a refused
// TCP connect to addr:port by rule.
func waitRefusedEntry(t *testing.T, s *server, id, addr string, port int, rule string) {
	t.Helper()
	var log []client.EgressEntry
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		var err error
		if log, err = s.client().NetworkLog(context.Background(), id); err != nil {
			t.Fatal(err)
		}
		for _, e := range log {
			if e.Kind == "tcp" && e.Address == addr && e.Port == port && !e.Allowed && e.Rule == rule {
				return
			}
		}
	}
	t.Errorf("egress log of %s has no refused connect to %s:%d by %q: %+v", id, addr, port, rule, log)
}

func TestNetworkInternetAndDenySet(t *testing.T) {
	up := nettest.StartUpstream(t, "e", 10, 10)
	s := networkServer(t)
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "base"})
	if got := fetch(t, s, sb.ID, up.PublicIP.String()); got != "upstream e2e.test" {
		t.Fatalf("sandbox → test server through NAT: %q\n%s", got, tail(s.out.String(), 30))
	}
	// Private ranges and cloud metadata: refused at once.
	for _, addr := range []string{up.PrivateIP.String(), "169.254.169.254"} {
		got := fetch(t, s, sb.ID, addr)
		if !strings.HasPrefix(got, "ERR ECONNREFUSED") {
			t.Errorf("connect to %s from a sandbox: %q, want ECONNREFUSED", addr, got)
		}
		waitRefusedEntry(t, s, sb.ID, addr, 80, "platform")
	}
	// The host itself: a server the test runs on all the host's addresses
	// (the public-looking test veth's among them) is refused to sandboxes.
	hostLn, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hostLn.Close()
	go func() {
		for {
			c, err := hostLn.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("HTTP/1.0 200 OK\r\n\r\nhost server"))
			c.Close()
		}
	}()
	hostPort := strconv.Itoa(hostLn.Addr().(*net.TCPAddr).Port)
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		ip, ok := a.(*net.IPNet)
		if !ok || ip.IP.To4() == nil || ip.IP.IsLoopback() || strings.HasPrefix(ip.IP.String(), "10.") {
			continue // loopback is the sandbox's own; 10.x are the gateways of every server's sandboxes
		}
		if got := fetch(t, s, sb.ID, ip.IP.String(), hostPort); !strings.HasPrefix(got, "ERR ECONNREFUSED") {
			t.Errorf("connect to the host's %s:%s from a sandbox: %q, want ECONNREFUSED", ip.IP, hostPort, got)
		}
	}
	// Its resolv.conf names the resolver on its gateway, whatever the template had.
	if res, err := s.client().Exec(context.Background(), sb.ID, client.ExecRequest{Cmd: "grep ^nameserver /etc/resolv.conf"}); err != nil || strings.TrimSpace(res.Stdout) != "nameserver "+gateway(t, s, sb.ID) {
		t.Errorf("resolv.conf of the sandbox: %+v, %v; want its gateway only", res, err)
	}
	// Its own name, looked up for IPv6 (which /etc/hosts does not
	// answer), stays in the sandbox: NXDOMAIN, never asked upstream.
	if res, err := s.client().Exec(context.Background(), sb.ID, client.ExecRequest{Cmd: "getent hosts $(hostname); hostname"}); err != nil || res.ExitCode != 0 {
		t.Errorf("its own name: %+v, %v", res, err)
	} else {
		name := strings.TrimSpace(res.Stdout[strings.LastIndex(strings.TrimSpace(res.Stdout), "\n")+1:])
		log, err := s.client().NetworkLog(context.Background(), sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		kept := false
		for _, e := range log {
			if e.Domain == name && (e.Allowed || e.Rule != "single_label") {
				t.Errorf("its own name went upstream: %+v", e)
			}
			kept = kept || e.Domain == name
		}
		if !kept {
			t.Errorf("no lookup of %q in the egress log: %+v", name, log)
		}
	}
	// Its own gateway too, on any port but DNS and the domain proxy.
	if got := fetch(t, s, sb.ID, gateway(t, s, sb.ID), hostPort); !strings.HasPrefix(got, "ERR ECONNREFUSED") {
		t.Errorf("connect to the gateway's %s from a sandbox: %q, want ECONNREFUSED", hostPort, got)
	}
	gw := gateway(t, s, sb.ID)
	if listeners(gw) == "" {
		t.Errorf("no resolver or domain proxy listening on the gateway %s", gw)
	}
	if err := s.client().KillSandbox(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	s.assertGone(t, sb.ID)
	assertNetworkGone(t, s, sb.ID)
	if l := listeners(gw); l != "" {
		t.Errorf("listeners left on the killed sandbox's gateway %s:\n%s", gw, l)
	}
}

// listeners lists the sockets listening on addr (the resolver's and the
// domain proxy's on a sandbox's gateway).
func listeners(addr string) string {
	out, _ := exec.Command("ss", "-Hlntu", "src", addr).Output()
	return strings.TrimSpace(string(out))
}

func TestNetworkPolicy(t *testing.T) {
	up := nettest.StartUpstream(t, "p", 14, 14)
	// Without kill-on-exit: the restart below must keep the sandboxes.
	s := networkServer(t, "PANDASTACK_KILL_ON_EXIT=0")
	ctx := context.Background()
	c := s.client()
	pub := up.PublicIP.String()
	refused := func(id string) {
		t.Helper()
		if got := fetch(t, s, id, pub); !strings.HasPrefix(got, "ERR ECONNREFUSED") {
			t.Errorf("sandbox %s → %s: %q, want ECONNREFUSED", id, pub, got)
		}
	}
	reaches := func(id string) {
		t.Helper()
		if got := fetch(t, s, id, pub); got != "upstream e2e.test" {
			t.Errorf("sandbox %s → %s: %q, want the test server's answer", id, pub, got)
		}
	}

	// Created with no internet but the test server in allow_out.
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "base", Network: &client.NetworkPolicy{AllowOut: []string{pub}}})
	if sb.Network == nil || sb.Network.AllowInternetAccess || len(sb.Network.AllowOut) != 1 {
		t.Fatalf("create answered network %+v", sb.Network)
	}
	reaches(sb.ID)

	// Bad input: named by index, nothing half-applied.
	for _, c := range []struct {
		body   string
		status int
		code   string
		names  string
	}{
		{`{"allow_internet_access": true, "allow_out": ["8.8.8.8", "300.1.1.1"]}`, 400, "invalid_request", "allow_out[1]"},
		{`{"deny_out": ["example.com"]}`, 400, "invalid_request", "deny_out[0]"},
		// deny_out carves out of the internet: alone, it would deny nothing
		// and leave the sandbox offline.
		{`{"deny_out": ["203.0.113.0/24"]}`, 400, "invalid_request", "leaves the sandbox no internet"},
		{`{"allow_out": ["192.168.0.0/24"]}`, 422, "network_denied", "allow_out[0]"},
		{`{"allow_out": ["169.254.169.254"]}`, 422, "network_denied", "allow_out[0]"},
		{`{"allow_out": "1.2.3.4"}`, 400, "invalid_request", ""},
		{`{"allow_out": [], "bogus": 1}`, 400, "invalid_request", ""},
		// No body is no policy: refused, not read as {} (which cuts the
		// sandbox off).
		{``, 400, "invalid_request", "body is required"},
		{" \n", 400, "invalid_request", "body is required"},
	} {
		status, code, msg := api(t, s, s.key, "PUT", "/v1/sandboxes/"+sb.ID+"/network", c.body)
		if status != c.status || code != c.code || !strings.Contains(msg, c.names) {
			t.Errorf("PUT network %s: %d %s %q, want %d %s naming %s", c.body, status, code, msg, c.status, c.code, c.names)
		}
	}
	many := `{"deny_out": [` + strings.TrimSuffix(strings.Repeat(`"1.2.3.4",`, 257), ",") + `]}`
	if status, code, _ := api(t, s, s.key, "PUT", "/v1/sandboxes/"+sb.ID+"/network", many); status != 400 || code != "invalid_request" {
		t.Errorf("257 entries: %d %s, want 400", status, code)
	}
	if status, code, _ := api(t, s, s.key, "POST", "/v1/sandboxes", `{"template": "base", "network": {"allow_out": ["10.0.0.1"]}}`); status != 422 || code != "network_denied" {
		t.Errorf("create with a denied entry: %d %s, want 422 network_denied", status, code)
	}
	reaches(sb.ID) // the old policy is still in force

	// A live change: deny_out the server while the internet is on.
	got, err := c.SetNetwork(ctx, sb.ID, client.NetworkPolicy{AllowInternetAccess: true, DenyOut: []string{up.PublicIP.String() + "/32"}})
	if err != nil || !got.Network.AllowInternetAccess {
		t.Fatalf("set network: %+v, %v", got, err)
	}
	refused(sb.ID)
	waitRefusedEntry(t, s, sb.ID, pub, 80, "deny_out "+pub+"/32")
	if g, _ := c.GetSandbox(ctx, sb.ID); g.Network == nil || len(g.Network.DenyOut) != 1 {
		t.Errorf("GET shows network %+v", g.Network)
	}

	// The policy survives pause/resume and goes to fork children, each
	// with an address of its own. A sandbox made while it is paused takes
	// its address; it resumes behind a new gateway, which its resolv.conf
	// names (it named the other sandbox's).
	gwBefore := gateway(t, s, sb.ID)
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	meanwhile := newSandbox(t, s, client.CreateSandboxRequest{Template: "base"})
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	gwAfter := gateway(t, s, sb.ID)
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "grep ^nameserver /etc/resolv.conf"}); err != nil || strings.TrimSpace(res.Stdout) != "nameserver "+gwAfter {
		t.Errorf("resolv.conf after a resume behind gateway %s (before the pause %s; %s's is %s): %+v, %v", gwAfter, gwBefore, meanwhile.ID, gateway(t, s, meanwhile.ID), res, err)
	}
	// The egress log is kept across the pause.
	if log, err := c.NetworkLog(ctx, sb.ID); err != nil || !slices.ContainsFunc(log, func(e client.EgressEntry) bool { return e.Rule == "deny_out "+pub+"/32" }) {
		t.Errorf("egress log after pause/resume: %+v, %v; want the refused connect from before", log, err)
	}
	refused(sb.ID)
	// A policy set while paused is the one the resume brings.
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetNetwork(ctx, sb.ID, client.NetworkPolicy{AllowOut: []string{pub}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	reaches(sb.ID)
	kids, err := c.Fork(ctx, sb.ID, client.ForkRequest{Count: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		t.Cleanup(func() { c.KillSandbox(context.Background(), k.ID) })
		if k.Network == nil || len(k.Network.AllowOut) != 1 || k.Network.AllowInternetAccess {
			t.Errorf("fork child %s network %+v, want the parent's", k.ID, k.Network)
		}
		reaches(k.ID)
	}
	reaches(sb.ID)
	// forkClosed forks one child that should allow nothing, as what says.
	forkClosed := func(req client.ForkRequest, what string) {
		t.Helper()
		kids, err := c.Fork(ctx, sb.ID, req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.KillSandbox(context.Background(), kids[0].ID) })
		if n := kids[0].Network; n == nil || len(n.AllowOut) != 0 || n.AllowInternetAccess {
			t.Errorf("%s has network %+v, want nothing allowed", what, n)
		}
		refused(kids[0].ID)
	}
	// A fork may give its children a narrower policy, in force from their
	// first instant; the parent keeps its own.
	forkClosed(client.ForkRequest{Count: 1, Network: &client.NetworkPolicy{}}, "a child forked with a policy of its own")
	reaches(sb.ID)
	if _, err := c.Fork(ctx, sb.ID, client.ForkRequest{Network: &client.NetworkPolicy{AllowOut: []string{"10.1.2.3"}}}); !client.IsCode(err, "network_denied") {
		t.Errorf("a fork with a policy inside the platform deny set: %v, want network_denied", err)
	}

	// A paused parent's children (restored from its paused image) get the
	// policy it has now, set while paused; the parent stays paused.
	if _, err := c.Pause(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetNetwork(ctx, sb.ID, client.NetworkPolicy{}); err != nil {
		t.Fatal(err)
	}
	forkClosed(client.ForkRequest{Count: 1}, "the paused parent's fork child (the parent's present policy)")
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != "paused" {
		t.Fatalf("the parent after its fork while paused: %+v %v", got, err)
	}
	// So does a snapshot of it, which shows the policy its restores get.
	pausedSnap, err := c.CreateSnapshot(ctx, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.DeleteSnapshot(context.Background(), pausedSnap.ID) })
	if got, err := c.GetSnapshot(ctx, pausedSnap.ID); err != nil || got.Network == nil || len(got.Network.AllowOut) != 0 || got.Network.AllowInternetAccess {
		t.Errorf("the paused parent's snapshot: %+v %v, want its present policy (nothing allowed)", got, err)
	}
	fromPaused, err := c.CreateSandboxFromSnapshot(ctx, client.RestoreRequest{SnapshotID: pausedSnap.ID})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.KillSandbox(context.Background(), fromPaused.ID) })
	if n := fromPaused.Network; n == nil || len(n.AllowOut) != 0 || n.AllowInternetAccess {
		t.Errorf("restored from the paused parent's snapshot: network %+v, want nothing allowed", n)
	}
	refused(fromPaused.ID)
	if _, err := c.SetNetwork(ctx, sb.ID, client.NetworkPolicy{AllowOut: []string{pub}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resume(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	reaches(sb.ID)

	// A sandbox restored from a snapshot gets the snapshotted policy,
	// which the snapshot shows.
	snap, err := c.CreateSnapshot(ctx, sb.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := c.GetSnapshot(ctx, snap.ID); err != nil || got.Network == nil || len(got.Network.AllowOut) != 1 || got.Network.AllowOut[0] != pub || got.Network.AllowInternetAccess {
		t.Errorf("snapshot %+v %v, want its sandbox's policy (only %s)", got, err, pub)
	}
	restored, err := c.CreateSandboxFromSnapshot(ctx, client.RestoreRequest{SnapshotID: snap.ID})
	if err != nil {
		t.Fatal(err)
	}
	if restored.Network == nil || len(restored.Network.AllowOut) != 1 || restored.Network.AllowInternetAccess {
		t.Errorf("restored sandbox network %+v, want the snapshotted one", restored.Network)
	}
	reaches(restored.ID)
	if err := c.KillSandbox(ctx, restored.ID); err != nil {
		t.Fatal(err)
	}
	s.assertGone(t, restored.ID)

	// A serve restart keeps the sandbox, its network and its policy.
	s.stop()
	s.start()
	c = s.client()
	reaches(sb.ID)
	// And a crash of serve: its table is left and remade on the next start.
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
	s.start()
	c = s.client()
	reaches(sb.ID)
	if _, err := c.SetNetwork(ctx, sb.ID, client.NetworkPolicy{}); err != nil {
		t.Fatal(err)
	}
	refused(sb.ID)
	for _, id := range append([]string{sb.ID}, kids[0].ID, kids[1].ID) {
		if err := s.client().KillSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
		s.assertGone(t, id)
	}
}

// TestPipInstallFromPackageIndex installs a small pure-Python package inside
// a sandbox from the package index this machine reaches (pip's own default,
// or the index the host's pip configuration names): the one test that sends
// traffic off the machine. The host reaches the index through a
// TLS-inspecting proxy, so this also proves the host's CA bundle is trusted
// inside (serve --sandbox-ca-certs host, the default).
func TestPipInstallFromPackageIndex(t *testing.T) {
	s := networkServer(t)
	env := map[string]string{"PIP_DISABLE_PIP_VERSION_CHECK": "1"} // the template lets pip install; no PIP_BREAK_SYSTEM_PACKAGES
	if idx := hostPipIndex(); idx != "" {
		env["PIP_INDEX_URL"] = idx
	}
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter"})
	res, err := s.client().Exec(context.Background(), sb.ID, client.ExecRequest{
		Cmd: `echo "$SSL_CERT_FILE $REQUESTS_CA_BUNDLE $PIP_CERT $NODE_EXTRA_CA_CERTS"; python3 -m pip install --no-cache-dir six && python3 -c "import six; print('six', six.__version__)"`,
		Env: env, TimeoutSeconds: 180,
	})
	if err != nil {
		t.Fatal(err)
	}
	const bundle = "/etc/ssl/certs/ca-certificates.crt"
	if first, _, _ := strings.Cut(res.Stdout, "\n"); first != strings.Repeat(bundle+" ", 3)+bundle {
		t.Errorf("CA variables in the sandbox: %q", first)
	}
	if res.ExitCode != 0 || !strings.Contains(res.Stdout, "\nsix ") {
		t.Fatalf("pip install six in a sandbox: exit %d\n%s\n%s", res.ExitCode, res.Stdout, res.Stderr)
	}
}

// hostPipIndex is the index URL of the host's pip configuration, if any.
func hostPipIndex() string {
	if v := os.Getenv("PIP_INDEX_URL"); v != "" {
		return v
	}
	out, err := exec.Command("python3", "-m", "pip", "config", "get", "global.index-url").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// domainScript fetches http://NAME/ (resolved by the sandbox's resolver) or,
// with a third argument, connects to that address and sends Host: NAME.
const domainScript = `
import socket, sys, errno
name = sys.argv[1]
try:
    addr = sys.argv[2] if len(sys.argv) > 2 else socket.gethostbyname(name)
    s = socket.create_connection((addr, 80), timeout=10)
    s.sendall(("GET / HTTP/1.0\r\nHost: %s\r\n\r\n" % name).encode())
    head, body = s.makefile("rb").read().decode().split("\r\n\r\n", 1)
    print(body, [l for l in head.split("\r\n") if l.startswith("X-Served-By")])
except socket.gaierror as e:
    print("DNS", e.args[0] == socket.EAI_NONAME)
except OSError as e:
    print("ERR", errno.errorcode.get(e.errno, e))
`

// tlsScript fetches https://ADDR/ with the server name NAME (SNI and Host).
const tlsScript = `
import socket, ssl, sys
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
try:
    s = ctx.wrap_socket(socket.create_connection((sys.argv[1], 443), timeout=10), server_hostname=sys.argv[2])
    s.sendall(("GET / HTTP/1.0\r\nHost: %s\r\n\r\n" % sys.argv[2]).encode())
    print(s.makefile("rb").read().decode().split("\r\n\r\n", 1)[1])
except OSError as e:
    print("ERR", type(e).__name__)
`

func TestNetworkDomainRules(t *testing.T) {
	up := nettest.StartUpstream(t, "m", 26, 26)
	up.SetDNS("api.allowed.test", up.PublicIP)
	s := networkServer(t, "PANDASTACK_NETWORK_RESOLVERS="+up.DNS.String())
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "base", Network: &client.NetworkPolicy{AllowOut: []string{"api.allowed.test"}}})
	run := func(args ...string) string {
		t.Helper()
		res, err := s.client().Exec(context.Background(), sb.ID, client.ExecRequest{Argv: append([]string{"python3", "-c", domainScript}, args...), TimeoutSeconds: 30})
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(res.Stdout + res.Stderr)
	}
	served := "X-Served-By: " + up.PublicIP.String() + ":80"
	if got := run("api.allowed.test"); !strings.Contains(got, "upstream api.allowed.test") || !strings.Contains(got, served) {
		t.Errorf("allowed domain: %q", got)
	}
	if got := run("evil.test"); got != "DNS True" {
		t.Errorf("a name not allowed: %q, want NXDOMAIN", got)
	}
	if got := run("evil.test", up.PublicIP.String()); got != "ERR ECONNRESET" {
		t.Errorf("Host evil.test to an address: %q, want a reset", got)
	}
	// A Host that names an allowed domain but aims at a private address
	// reaches only what the name resolves to.
	if got := run("api.allowed.test", up.PrivateIP.String()); !strings.Contains(got, served) {
		t.Errorf("forged Host to %s: %q, want the public server", up.PrivateIP, got)
	}
	// TLS: the proxy reads the SNI (the test server's certificate is
	// self-signed, so the client does not verify it).
	res, err := s.client().Exec(context.Background(), sb.ID, client.ExecRequest{Argv: []string{"python3", "-c", tlsScript, up.PublicIP.String(), "api.allowed.test"}, TimeoutSeconds: 30})
	if err != nil || !strings.Contains(res.Stdout, "upstream api.allowed.test") {
		t.Errorf("TLS with SNI api.allowed.test: %+v, %v", res, err)
	}
	res, err = s.client().Exec(context.Background(), sb.ID, client.ExecRequest{Argv: []string{"python3", "-c", tlsScript, up.PublicIP.String(), "evil.test"}, TimeoutSeconds: 30})
	if err != nil || !strings.Contains(res.Stdout, "ERR") {
		t.Errorf("TLS with SNI evil.test: %+v, %v; want a reset", res, err)
	}
	log, err := s.client().NetworkLog(context.Background(), sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	var ok, blocked, dns bool
	for _, e := range log {
		ok = ok || (e.Kind == "tcp" && e.Domain == "api.allowed.test" && e.Allowed && e.BytesIn > 0 && e.Address == up.PublicIP.String())
		blocked = blocked || (e.Kind == "tcp" && e.Domain == "evil.test" && !e.Allowed)
		dns = dns || (e.Kind == "dns" && e.Domain == "evil.test" && !e.Allowed)
	}
	if !ok || !blocked || !dns {
		t.Errorf("egress log (allowed %v, blocked %v, dns %v): %+v", ok, blocked, dns, log)
	}
}

// wsEcho is a WebSocket echo server on port 8765, in plain Python. It
// makes /tmp/ws.ready once it listens; startPortServers waits for that.
const wsEcho = `
import socket, hashlib, base64, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8765)); s.listen(5)
open("/tmp/ws.ready", "w").close()
def serve(c):
    req = b""
    while b"\r\n\r\n" not in req:
        req += c.recv(4096)
    key = [l.split(b":", 1)[1].strip() for l in req.split(b"\r\n") if l.lower().startswith(b"sec-websocket-key")][0]
    acc = base64.b64encode(hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
    c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: " + acc + b"\r\n\r\n")
    def rd(n):
        b = b""
        while len(b) < n:
            x = c.recv(n - len(b))
            if not x:
                raise EOFError
            b += x
        return b
    while True:
        h0, h1 = rd(2)
        n = h1 & 127
        m = rd(4) if h1 & 128 else b"\0\0\0\0"
        p = bytes(b ^ m[i % 4] for i, b in enumerate(rd(n)))
        if h0 & 15 == 8:
            return
        c.sendall(bytes([0x81, len(p)]) + p)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
`

func TestPortProxy(t *testing.T) {
	s := networkServer(t, "PANDASTACK_PUBLIC_DOMAIN=sbx.test")
	ctx := context.Background()
	c := s.client()
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "base"})
	// getAs GETs u, with host as its Host when not "".
	getAs := func(u, host string, withKey bool) (*http.Response, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", u, nil)
		if host != "" {
			req.Host = host
		}
		if withKey {
			req.Header.Set("Authorization", "Bearer "+s.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	get := func(u string, withKey bool) (*http.Response, string) {
		t.Helper()
		return getAs(u, "", withKey)
	}

	// Nothing listens yet: 502 with a clear error, not a hang.
	resp, body := get(c.PortURL(sb.ID, 8000), true)
	if resp.StatusCode != 502 || !strings.Contains(body, "port_unreachable") {
		t.Fatalf("no listener: %d %s", resp.StatusCode, body)
	}
	// getOnceUp polls u until the server behind it answers 200, for 20 s.
	getOnceUp := func(u string) (*http.Response, string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			resp, body := get(u, true)
			if resp.StatusCode == 200 || time.Now().After(deadline) {
				return resp, body
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	startPortServers(t, c, sb.ID, "hello-from-sandbox")
	resp, body = getOnceUp(c.PortURL(sb.ID, 8000) + "page.txt")
	if resp.StatusCode != 200 || body != "hello-from-sandbox\n" {
		t.Fatalf("GET page.txt through the port proxy: %d %q", resp.StatusCode, body)
	}
	// Host-based routing: {port}-{id}.public-domain, the whole path passed on.
	for _, host := range []string{"8000-" + sb.ID + ".sbx.test", "8000-" + strings.Replace(sb.ID, "_", "-", 1) + ".sbx.test"} {
		req, _ := http.NewRequest("GET", s.url+"/page.txt", nil)
		req.Host = host
		req.Header.Set("Authorization", "Bearer "+s.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "hello-from-sandbox\n" {
			t.Errorf("Host %s: %d %q", host, resp.StatusCode, b)
		}
	}
	if resp, _ := get(c.PortURL(sb.ID, 8000)+"page.txt", false); resp.StatusCode != 401 {
		t.Errorf("without key or token: %d, want 401", resp.StatusCode)
	}
	if resp, body := get(strings.Replace(c.PortURL(sb.ID, 8000), "/8000/", "/70000/", 1), true); resp.StatusCode != 400 {
		t.Errorf("port 70000: %d %s, want 400", resp.StatusCode, body)
	}

	// A token URL works with no header, sets a cookie for the page, and
	// stops working once revoked.
	tok, err := c.CreatePortToken(ctx, sb.ID, 8000, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// With --public-domain the URL is the port's own origin,
	// {port}-sbx-{id}.{domain}: sent here with that Host (no DNS in tests).
	u, _ := url.Parse(tok.URL)
	if want := "8000-sbx-" + strings.TrimPrefix(sb.ID, "sbx_") + ".sbx.test"; u.Hostname() != want {
		t.Fatalf("token URL %s: host %s, want %s", tok.URL, u.Hostname(), want)
	}
	u.Path += "page.txt"
	viaHost := func(host string) (*http.Response, string) {
		t.Helper()
		return getAs(s.url+u.RequestURI(), host, false)
	}
	resp, body = viaHost(u.Host)
	if resp.StatusCode != 200 || body != "hello-from-sandbox\n" || len(resp.Cookies()) == 0 {
		t.Errorf("token URL: %d %q cookies %v", resp.StatusCode, body, resp.Cookies())
	}
	// A browser's navigation to it (over HTTPS, where browsers say so) is
	// sent on without the token once the cookie is set, so the token
	// leaves the address bar and the Referer.
	nav, _ := http.NewRequest("GET", s.url+u.RequestURI(), nil)
	nav.Host = u.Host
	nav.Header.Set("Sec-Fetch-Mode", "navigate")
	nav.Header.Set("Sec-Fetch-Dest", "document")
	if resp, err := (&http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}).Do(nav); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != 303 || resp.Header.Get("Location") != u.Path || len(resp.Cookies()) == 0 {
			t.Errorf("a browser's navigation to the token URL: %d to %q, cookies %v; want 303 to %s with the cookie", resp.StatusCode, resp.Header.Get("Location"), resp.Cookies(), u.Path)
		}
	}
	if resp, _ := viaHost(strings.Replace(u.Host, "8000-", "8765-", 1)); resp.StatusCode != 401 {
		t.Errorf("token of port 8000 on port 8765: %d, want 401", resp.StatusCode)
	}
	// The cookie lets in the port's own pages, and a page of another port
	// of the sandbox; not another sandbox's page, whose host is the same
	// site, so the browser sends the cookie along.
	if cookies := resp.Cookies(); len(cookies) > 0 {
		byPage := func(origin, site string) int {
			t.Helper()
			req, _ := http.NewRequest("POST", s.url+u.Path, strings.NewReader("x"))
			req.Host = u.Host
			req.AddCookie(cookies[0])
			req.Header.Set("Origin", origin)
			req.Header.Set("Sec-Fetch-Site", site)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode
		}
		if st := byPage("http://"+u.Host, "same-origin"); st == 401 || st == 403 {
			t.Errorf("the port's own page with the cookie: %d", st)
		}
		if st := byPage("http://"+strings.Replace(u.Host, "8000-", "3000-", 1), "same-site"); st == 401 || st == 403 {
			t.Errorf("a page of another port of the sandbox with the cookie: %d", st)
		}
		if st := byPage("http://8000-sbx-aaaaaaaaaaaaaaaa.sbx.test", "same-site"); st != 403 {
			t.Errorf("another sandbox's page with the cookie: %d, want 403", st)
		}
	}
	// The path form, on the console's origin, takes no token here: a
	// browser's GET goes to the port's own host, path and query kept;
	// a POST is refused.
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, method := range []string{"GET", "POST"} {
		req, _ := http.NewRequest(method, c.PortURL(sb.ID, 8000)+"page.txt?"+u.RawQuery, nil)
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		to, _ := url.Parse(resp.Header.Get("Location"))
		switch {
		case method == "GET" && (resp.StatusCode != 307 || to == nil || to.Host != u.Host || to.RequestURI() != u.RequestURI()):
			t.Errorf("token on the path form, GET: %d to %s, want 307 to %s", resp.StatusCode, resp.Header.Get("Location"), u)
		case method == "POST" && (resp.StatusCode != 403 || !strings.Contains(string(b), "permission_denied")):
			t.Errorf("token on the path form, POST: %d %s, want 403", resp.StatusCode, b)
		}
	}
	if err := c.RevokePortTokens(ctx, sb.ID, 8000); err != nil {
		t.Fatal(err)
	}
	if resp, _ := viaHost(u.Host); resp.StatusCode != 401 {
		t.Errorf("revoked token: %d, want 401", resp.StatusCode)
	}

	// WebSocket through the proxy.
	checkWSEcho(t, s.url, sb.ID, s.key, "ping through the proxy")

	// The path and query reach the sandbox's server as the caller wrote
	// them; a slow stream through the proxy, and a followed output, are
	// work in flight: the sandbox is not idle-suspended under them.
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: `nohup python3 -c "$SRV" >/dev/null 2>&1 &`, Env: map[string]string{"SRV": echoPathServer}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("starting the echo server: %+v %v", res, err)
	}
	resp, body = getOnceUp(c.PortURL(sb.ID, 8001) + "a%2Fb?b=2&a=1&flag&t=%20")
	if resp.StatusCode != 200 || body != "/a%2Fb?b=2&a=1&flag&t=%20" {
		t.Errorf("path and query through the proxy: %d %q", resp.StatusCode, body)
	}
	// Any method, WebDAV's too, as the host form passes it.
	req, _ := http.NewRequest("PROPFIND", c.PortURL(sb.ID, 8001)+"dav/x?depth=1", nil)
	req.Header.Set("Authorization", "Bearer "+s.key)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 207 || string(b) != "PROPFIND /dav/x?depth=1" {
			t.Errorf("PROPFIND through the path form: %d %q", resp.StatusCode, b)
		}
		// The path form's origin is the console's, whatever the method.
		if resp.Header.Get("Clear-Site-Data") != "" {
			t.Errorf("PROPFIND through the path form passed Clear-Site-Data on: %v", resp.Header)
		}
	}
	// The path form shares the console's origin: a sandbox's server may
	// not widen a service worker's scope to it, nor clear its data; the key
	// a browser sends as a WebSocket subprotocol stays with us. A host route
	// is an origin of its own and passes those headers on.
	req, _ = http.NewRequest("GET", c.PortURL(sb.ID, 8001)+"headers", nil)
	req.Header.Set("Sec-WebSocket-Protocol", "chat, bearer."+s.key)
	req.Header.Add("Sec-WebSocket-Protocol", "bearer."+s.key)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "['chat']" {
			t.Errorf("subprotocols reaching the sandbox: %d %s", resp.StatusCode, b)
		}
		if h := resp.Header; h.Get("Service-Worker-Allowed") != "" || h.Get("Clear-Site-Data") != "" || h.Get("X-Kept") != "yes" {
			t.Errorf("origin-wide headers through the path form: %v", h)
		}
	}
	req, _ = http.NewRequest("GET", s.url+"/headers", nil)
	req.Host = "8001-" + sb.ID + ".sbx.test"
	req.Header.Set("Authorization", "Bearer "+s.key)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Service-Worker-Allowed") != "/" {
			t.Errorf("a host route's answer: %d %v", resp.StatusCode, resp.Header)
		}
	}
	// Every answer describing the sandbox has its network policy: PATCH
	// and the list too, not only GET and create.
	if got, err := c.SetIdleTimeout(ctx, sb.ID, time.Second); err != nil || got.Network == nil {
		t.Fatalf("PATCH: %+v %v", got, err)
	}
	if list, err := c.ListSandboxes(ctx, nil, ""); err != nil || !slices.ContainsFunc(list, func(x client.Sandbox) bool { return x.ID == sb.ID && x.Network != nil }) {
		t.Errorf("the list has no network policy for %s: %v", sb.ID, err)
	}
	if resp, body := get(c.PortURL(sb.ID, 8001)+"slow", true); resp.StatusCode != 200 || strings.Count(body, "tick") != 6 {
		t.Errorf("a 6 s stream through the proxy with a 1 s idle timeout: %d %q", resp.StatusCode, body)
	}
	status, started := rawCall(t, s, "POST", "/v1/sandboxes/"+sb.ID+"/exec", `{"cmd": "for i in 1 2 3 4 5 6; do echo tick $i; sleep 1; done", "background": true}`)
	var h struct {
		PID int `json:"pid"`
	}
	if status != 200 || json.Unmarshal(started, &h) != nil {
		t.Fatalf("background exec: %d %s", status, started)
	}
	req, _ = http.NewRequest("GET", s.url+"/v1/sandboxes/"+sb.ID+"/processes/"+strconv.Itoa(h.PID)+"/output?follow=1", nil)
	req.Header.Set("Authorization", "Bearer "+s.key)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Count(string(b), "tick") != 6 || !strings.Contains(string(b), `"exit"`) || strings.Contains(string(b), `"error"`) {
			t.Errorf("a 6 s followed output with a 1 s idle timeout: %d %s", resp.StatusCode, b)
		}
	}
	if _, err := c.SetIdleTimeout(ctx, sb.ID, 0); err != nil {
		t.Fatal(err)
	}

	// A token of a sandbox killed since answers without a cookie.
	tok, err = c.CreatePortToken(ctx, sb.ID, 8000, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.KillSandbox(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	killed, _ := url.Parse(tok.URL) // the port's own host
	if resp, body := getAs(s.url+"/page.txt?"+killed.RawQuery, killed.Host, false); resp.StatusCode < 400 || len(resp.Cookies()) != 0 {
		t.Errorf("the token of a killed sandbox: %d %q, cookies %v", resp.StatusCode, body, resp.Cookies())
	}

	// The CLI's network flags.
	out, errOut, err := s.cli("sandbox", "create", "--template", "base", "--network", "none", "--allow-out", "198.51.100.0/24", "--allow-out", "api.example.com")
	if err != nil {
		t.Fatalf("sandbox create --network none: %v\n%s", err, errOut)
	}
	id := strings.TrimSpace(out)
	t.Cleanup(func() { c.KillSandbox(context.Background(), id) })
	got, err := c.GetSandbox(ctx, id)
	if err != nil || got.Network == nil || got.Network.AllowInternetAccess || strings.Join(got.Network.AllowOut, " ") != "198.51.100.0/24 api.example.com" {
		t.Errorf("CLI-created sandbox network: %+v, %v", got.Network, err)
	}
}

// A server stopped while it warms its templates (a sandbox booting) leaves
// no namespace, veth or table behind.
func TestNetworkShutdownDuringWarmup(t *testing.T) {
	s := startServer(t, "")
	defer os.RemoveAll(s.dataDir)
	time.Sleep(time.Second) // the warm-up boot is under way
	s.stop()
	if left := networkLeft(s.dataDir); left != "" {
		t.Errorf("left after a stop during warm-up: %s\n%s", left, tail(s.out.String(), 40))
	}
}

// echoPathServer, on port 8001, answers a GET with the request's path and
// query as they arrived, /headers with the Sec-WebSocket-Protocol headers it
// got, and /slow with six lines, one a second. Its answers carry headers that
// act on a whole origin (Service-Worker-Allowed, Clear-Site-Data).
const echoPathServer = `
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/slow":
            self.send_response(200)
            self.end_headers()
            for i in range(6):
                self.wfile.write(b"tick %d\n" % i)
                self.wfile.flush()
                time.sleep(1)
            return
        b = self.path.encode()
        if self.path == "/headers":
            b = repr(self.headers.get_all("Sec-WebSocket-Protocol")).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(b)))
        self.send_header("Service-Worker-Allowed", "/")
        self.send_header("Clear-Site-Data", '"storage"')
        self.send_header("X-Kept", "yes")
        self.end_headers()
        self.wfile.write(b)
    def do_PROPFIND(self):
        b = ("PROPFIND " + self.path).encode()
        self.send_response(207)
        self.send_header("Content-Length", str(len(b)))
        self.send_header("Clear-Site-Data", '"storage"')
        self.end_headers()
        self.wfile.write(b)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8001), H).serve_forever()
`

// startPortServers starts, in sandbox id, a web server on port 8000
// serving /tmp/page.txt (page, a line) and wsEcho on port 8765, and waits
// until the echo server listens (the caller polls port 8000 itself).
func startPortServers(t *testing.T, c *client.Client, id, page string) {
	t.Helper()
	cmd := "cd /tmp && rm -f ws.ready && echo " + page + " > page.txt && " +
		"{ nohup python3 -m http.server 8000 >/dev/null 2>&1 & nohup python3 -c \"$WS\" >/dev/null 2>&1 & } && " +
		"for i in $(seq 600); do [ -e ws.ready ] && exit 0; sleep 0.1; done; echo 'the WebSocket server did not start' >&2; exit 1"
	res, err := c.Exec(context.Background(), id, client.ExecRequest{Cmd: cmd, Env: map[string]string{"WS": wsEcho}, TimeoutSeconds: 120})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("starting the servers: %+v %v", res, err)
	}
}

// checkWSEcho opens a WebSocket to the echo server on port 8765 of sandbox id
// through the port proxy of the server at apiURL, sends msg in one masked
// text frame and checks that the same text comes back.
func checkWSEcho(t *testing.T, apiURL, id, key, msg string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(apiURL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "GET /v1/sandboxes/%s/ports/8765/ws HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n", id, key)
	br := bufio.NewReader(conn)
	if status, _ := br.ReadString('\n'); !strings.Contains(status, "101") {
		t.Fatalf("WebSocket upgrade through %s: %q", apiURL, status)
	}
	for {
		l, err := br.ReadString('\n')
		if err != nil || l == "\r\n" {
			break
		}
	}
	mask := []byte{1, 2, 3, 4}
	frame := append([]byte{0x81, 0x80 | byte(len(msg))}, mask...)
	for i := range len(msg) {
		frame = append(frame, msg[i]^mask[i%4])
	}
	conn.Write(frame)
	hdr := make([]byte, 2)
	if _, err := io.ReadFull(br, hdr); err != nil {
		t.Fatal(err)
	}
	echo := make([]byte, hdr[1]&127)
	io.ReadFull(br, echo)
	if string(echo) != msg {
		t.Errorf("WebSocket echo through %s: %q, want %q", apiURL, echo, msg)
	}
}

// A policy set while a sandbox is suspended for idleness (its resume
// prepared ahead) is the one it has after a restart of serve, and the one
// its resume gets: it used to go with the prepared container's clean-up,
// leaving the older, more open policy of pause time.
func TestPolicySetWhilePausedOutlivesARestart(t *testing.T) {
	s := networkServer(t, "PANDASTACK_KILL_ON_EXIT=0")
	ctx := context.Background()
	c := s.client()
	sb, err := c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", IdleTimeoutSeconds: idleSeconds(2), TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { s.client().KillSandbox(context.Background(), sb.ID) }()
	waitState(t, s, sb.ID, "paused for idleness", func(x *client.Sandbox) bool { return x.State == "paused" })
	closed := client.NetworkPolicy{AllowInternetAccess: false, AllowOut: []string{"198.51.100.7"}}
	if _, err := c.SetNetwork(ctx, sb.ID, closed); err != nil {
		t.Fatal(err)
	}
	for _, how := range []string{"a restart", "a second restart"} {
		s.stop()
		s.start()
		c = s.client()
		got, err := c.GetSandbox(ctx, sb.ID)
		if err != nil || got.State != "paused" || got.Network == nil || got.Network.AllowInternetAccess || strings.Join(got.Network.AllowOut, ",") != "198.51.100.7" {
			t.Fatalf("after %s: %+v %v, want paused with the policy set while paused", how, got, err)
		}
	}
	if res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "true"}); err != nil || res.ExitCode != 0 {
		t.Fatalf("resume: %+v %v", res, err)
	}
	if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.Network == nil || got.Network.AllowInternetAccess {
		t.Errorf("after the resume: %+v %v", got.Network, err)
	}
}

// tickServer answers every GET with a line a second, without end.
const tickServer = `
import http.server, time
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        while True:
            line = b"tick\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
            self.wfile.flush()
            time.sleep(1)
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
`

// A stream through the port proxy ends when its sandbox is paused or
// killed: the sandbox's network stack goes with it and sends no reset, so
// it used to hang for minutes.
func TestPortStreamEndsWithTheSandbox(t *testing.T) {
	s := sharedServer(t)
	ctx := context.Background()
	c := s.client()
	// The stream ends too when the port token that opened it is revoked
	// or expires, as it does when its API key is revoked.
	for _, how := range []string{"pause", "kill", "revoke token", "token expires"} {
		t.Run(how, func(t *testing.T) {
			sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "base"})
			if _, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: `nohup python3 -c "$SRV" >/dev/null 2>&1 &`, Env: map[string]string{"SRV": tickServer}}); err != nil {
				t.Fatal(err)
			}
			byToken := strings.Contains(how, "token")
			var token *client.PortToken
			if byToken {
				ttl := time.Hour
				if how == "token expires" {
					ttl = 4 * time.Second
				}
				var err error
				if token, err = c.CreatePortToken(ctx, sb.ID, 8000, ttl); err != nil {
					t.Fatal(err)
				}
			}
			var resp *http.Response
			for deadline := time.Now().Add(20 * time.Second); ; {
				req, _ := http.NewRequest("GET", c.PortURL(sb.ID, 8000), nil)
				if byToken {
					req, _ = http.NewRequest("GET", token.URL, nil)
				} else {
					req.Header.Set("Authorization", "Bearer "+s.key)
				}
				r, err := http.DefaultClient.Do(req)
				if err == nil && r.StatusCode == 200 {
					resp = r
					break
				}
				if err == nil {
					r.Body.Close()
				}
				if time.Now().After(deadline) {
					t.Fatalf("the tick server did not answer: %v", err)
				}
				time.Sleep(200 * time.Millisecond)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			if l, err := br.ReadString('\n'); err != nil || l != "tick\n" {
				t.Fatalf("first line %q, %v", l, err)
			}
			ended := make(chan error, 1)
			go func() {
				_, err := io.Copy(io.Discard, br)
				ended <- err
			}()
			var err error
			switch how {
			case "pause":
				_, err = c.Pause(ctx, sb.ID)
			case "kill":
				err = c.KillSandbox(ctx, sb.ID)
			case "revoke token":
				err = c.RevokePortTokens(ctx, sb.ID, 8000)
			}
			if err != nil {
				t.Fatal(err)
			}
			select {
			case <-ended:
			case <-time.After(15 * time.Second):
				t.Fatalf("the stream still ran 15 s after the %s", how)
			}
			if byToken {
				// And the sandbox runs on: only the token's stream ended.
				if got, err := c.GetSandbox(ctx, sb.ID); err != nil || got.State != pandastack.StateRunning {
					t.Fatalf("after the token's end the sandbox is %v, %v; want running", got.State, err)
				}
			}
		})
	}
}
