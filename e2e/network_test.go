package e2e

import (
	"context"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/network"
	"github.com/pandastack/pandastack/internal/network/nettest"
)

// fetchScript prints the body of http://ADDR/ or the error's errno name,
// and how long the connect took.
const fetchScript = `
import socket, sys, time, errno
t = time.monotonic()
try:
    s = socket.create_connection((sys.argv[1], 80), timeout=10)
    s.sendall(b"GET / HTTP/1.0\r\nHost: e2e.test\r\n\r\n")
    print(s.makefile("rb").read().decode().split("\r\n\r\n", 1)[1])
except OSError as e:
    print("ERR", errno.errorcode.get(e.errno, e), round(time.monotonic() - t, 3))
`

func fetch(t *testing.T, s *server, id, addr string) string {
	t.Helper()
	res, err := s.client().Exec(context.Background(), id, client.ExecRequest{Argv: []string{"python3", "-c", fetchScript, addr}, TimeoutSeconds: 30})
	if err != nil {
		t.Fatalf("exec: %v", err)
	}
	return strings.TrimSpace(res.Stdout + res.Stderr)
}

// assertNetworkGone fails when a namespace, veth or nftables table of the
// server's network instance is left (all of them with none given).
func assertNetworkGone(t *testing.T, s *server, ids ...string) {
	t.Helper()
	inst := network.InstanceID(s.dataDir)
	deadline := time.Now().Add(10 * time.Second)
	for {
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
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("network of the server left behind: %s", strings.Join(left, ", "))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestNetworkInternetAndDenySet(t *testing.T) {
	up := nettest.StartUpstream(t, "e", 10, 10)
	s := startServer(t, "", "PANDASTACK_WARM=0")
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
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "base"})
	if got := fetch(t, s, sb.ID, up.PublicIP.String()); got != "upstream e2e.test" {
		t.Fatalf("sandbox → test server through NAT: %q\n%s", got, tail(s.out.String(), 30))
	}
	// Private ranges, the host itself and cloud metadata: refused at once.
	targets := []string{up.PrivateIP.String(), "169.254.169.254"}
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() && !strings.HasPrefix(ip.IP.String(), "10.") {
			targets = append(targets, ip.IP.String()) // the host's own (not our gateways)
		}
	}
	for _, addr := range targets {
		got := fetch(t, s, sb.ID, addr)
		if !strings.HasPrefix(got, "ERR ECONNREFUSED") {
			t.Errorf("connect to %s from a sandbox: %q, want ECONNREFUSED", addr, got)
		}
	}
	if err := s.client().KillSandbox(context.Background(), sb.ID); err != nil {
		t.Fatal(err)
	}
	s.assertGone(t, sb.ID)
	assertNetworkGone(t, s, sb.ID)
}
