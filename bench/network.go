package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/network/nettest"
)

// Networking (issue 10): create → first run_code with sandbox networking on
// and off, and HTTP throughput from a sandbox to a server in a namespace of
// the bench's own (through NAT and through the domain proxy) against the
// host fetching from the same server. No traffic leaves the machine.

const throughputBytes = 64 << 20

// fetchRate reads http://HOST/bytes?n=N with Host: NAME on a raw socket
// and prints MB/s: the same code on the host and in a sandbox.
const fetchRate = `
import socket, sys, time
t = time.monotonic()
s = socket.create_connection((sys.argv[1], 80))
s.sendall(("GET /bytes?n=%s HTTP/1.0\r\nHost: %s\r\n\r\n" % (sys.argv[2], sys.argv[3])).encode())
n = 0
while True:
    b = s.recv(1 << 20)
    if not b:
        break
    n += len(b)
print(n / (time.monotonic() - t) / 1e6)
`

// loopRate serves N zero bytes over 127.0.0.1 to itself, on a raw socket
// as fetchRate reads, and prints MB/s: the most a sandbox's TCP stack and
// Python reader manage with no network in between.
const loopRate = `
import socket, sys, threading, time
n = int(sys.argv[1])
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(1)
def serve():
    c, _ = ls.accept(); buf = bytes(256 << 10); left = n
    while left > 0:
        c.sendall(buf[:min(left, len(buf))]); left -= len(buf)
    c.close()
threading.Thread(target=serve).start()
t = time.monotonic()
s = socket.create_connection(ls.getsockname())
got = 0
while True:
    b = s.recv(1 << 20)
    if not b:
        break
    got += len(b)
print(got / (time.monotonic() - t) / 1e6)
`

// benchT stands in for a *testing.T so the bench can use nettest.
type benchT struct {
	cleanups []func()
	err      error
}

type benchFatal struct{}

func (b *benchT) Helper() {}
func (b *benchT) Error(args ...any) {
	if b.err == nil {
		b.err = errors.New(fmt.Sprint(args...))
	}
}
func (b *benchT) Fatal(args ...any) { b.Error(args...); panic(benchFatal{}) }
func (b *benchT) Cleanup(f func())  { b.cleanups = append(b.cleanups, f) }
func (b *benchT) close() {
	for i := len(b.cleanups) - 1; i >= 0; i-- {
		b.cleanups[i]()
	}
}

func (b *bench) network(ctx context.Context) (err error) {
	binDir := filepath.Dir(b.pool.cmd.Path)
	fmt.Fprintln(os.Stderr, "  starting a server with --network-default off")
	off, err := startServer(ctx, "no-network", binDir, b.pool.runsc, b.set.PoolSize, "--network-default", "off")
	if err != nil {
		return err
	}
	stopped := false
	defer func() {
		if !stopped {
			off.stop()
		}
	}()
	if err := off.waitWarm(ctx, ciTemplate, 20*time.Minute); err != nil {
		return err
	}
	var on, none []float64
	var onSplit, noneSplit poolSplit
	for i := range b.set.N {
		sides := []*server{b.pool, off}
		if i%2 == 1 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		for _, s := range sides {
			s.settle(ctx, 30*time.Second)
			d, hit, err := s.createRunKill(ctx)
			if err != nil {
				return err
			}
			if s == off {
				none = append(none, d)
				noneSplit.add(d, hit)
			} else {
				on = append(on, d)
				onSplit.add(d, hit)
			}
		}
	}
	b.add(summarize("create", "create code-interpreter → first run_code, network on", "ms", on,
		fmt.Sprintf("pool %d, --network-default internet; alternating with the server without networking", b.set.PoolSize)).
		withTarget(targetCreateP50, targetCreateP95, "issue 4"))
	b.add(summarize("create", "same, --network-default off", "ms", none, fmt.Sprintf("pool %d, loopback only", b.set.PoolSize)))
	onSplit.report(b, "network on, alternating with network off")
	noneSplit.report(b, "network off, alternating with network on")
	off.stop()
	stopped = true
	return b.throughput(ctx, binDir)
}

// throughput measures MB/s from the bench's test server: the host with
// curl and with the sandbox's own script, a sandbox through NAT, and a
// sandbox whose domain rules send HTTP through the domain proxy.
func (b *bench) throughput(ctx context.Context, binDir string) (err error) {
	bt := &benchT{}
	defer bt.close()
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(benchFatal); !ok {
				panic(r)
			}
			err = bt.err
		}
	}()
	up := nettest.StartUpstream(bt, "bn", 34, 34)
	up.SetDNS("bench.test", up.PublicIP)
	srv, err := startServer(ctx, "net-throughput", binDir, b.pool.runsc, 0, "--warm=false", "--network-resolvers", up.DNS.String())
	if err != nil {
		return err
	}
	defer srv.stop()
	nat, err := srv.create(ctx, "base")
	if err != nil {
		return err
	}
	proxied, err := srv.c.CreateSandbox(ctx, client.CreateSandboxRequest{Template: "base", TTLSeconds: sandboxTTL, Network: &client.NetworkPolicy{AllowOut: []string{"bench.test"}}})
	if err != nil {
		return err
	}
	srv.track(proxied.ID)
	n := strconv.Itoa(throughputBytes)
	pub := up.PublicIP.String()
	url := "http://" + pub + "/bytes?n=" + n
	rate := func(out []byte, err error) (float64, error) {
		if err != nil {
			return 0, fmt.Errorf("%v: %s", err, out)
		}
		return strconv.ParseFloat(strings.TrimSpace(string(out)), 64)
	}
	inSandbox := func(id string, argv ...string) (float64, error) {
		if len(argv) == 0 {
			argv = []string{"python3", "-c", fetchRate, pub, n, "bench.test"}
		}
		res, err := srv.c.Exec(ctx, id, client.ExecRequest{Argv: argv, TimeoutSeconds: 120})
		if err != nil {
			return 0, err
		}
		if res.ExitCode != 0 {
			return 0, fmt.Errorf("fetch in sandbox %s: exit %d: %s", id, res.ExitCode, res.Stderr)
		}
		return strconv.ParseFloat(strings.TrimSpace(res.Stdout), 64)
	}
	series := []struct {
		name, note string
		fn         func() (float64, error)
		xs         []float64
	}{
		{name: "HTTP 64 MB: host, curl", note: "curl -o /dev/null from the host to the same server", fn: func() (float64, error) {
			v, err := rate(exec.CommandContext(ctx, "curl", "-s", "-o", "/dev/null", "-w", "%{speed_download}", url).CombinedOutput())
			return v / 1e6, err
		}},
		{name: "HTTP 64 MB: host, the sandbox's Python script", note: "raw socket reads in python3 on the host", fn: func() (float64, error) {
			return rate(exec.CommandContext(ctx, "python3", "-c", fetchRate, pub, n, "bench.test").CombinedOutput())
		}},
		{name: "HTTP 64 MB: sandbox through NAT", note: "gVisor netstack → veth → nftables masquerade", fn: func() (float64, error) { return inSandbox(nat.ID) }},
		{name: "HTTP 64 MB: sandbox through the domain proxy", note: "allow_out bench.test: redirected to the proxy, which resolves the name and splices", fn: func() (float64, error) { return inSandbox(proxied.ID) }},
		{name: "TCP 64 MB over loopback: host", note: "the Python server and reader on the host's 127.0.0.1", fn: func() (float64, error) {
			return rate(exec.CommandContext(ctx, "python3", "-c", loopRate, n).CombinedOutput())
		}},
		{name: "TCP 64 MB over loopback: inside a sandbox", note: "the same, inside the sandbox: gVisor's own ceiling, no veth or NAT", fn: func() (float64, error) {
			return inSandbox(nat.ID, "python3", "-c", loopRate, n)
		}},
	}
	for i := range b.set.N {
		for j := range series {
			s := &series[(i+j)%len(series)] // rotate who goes first
			v, err := s.fn()
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			s.xs = append(s.xs, v)
		}
	}
	for _, s := range series {
		b.add(summarizeRate("network", s.name, "MB/s", s.xs, s.note))
	}
	return b.portProxy(ctx, srv, nat)
}
