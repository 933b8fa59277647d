package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pandastack/pandastack/client"
)

// portProxy measures the port proxy (issue 10): `python3 -m http.server`
// inside a sandbox reached through /v1/sandboxes/{id}/ports/8000/, against
// the same server run on the host and reached directly, and against the
// sandbox's server reached directly at the sandbox's address (what the
// proxy itself dials), so the proxy's share and gVisor's share show apart.
// Every request opens a new connection on each side, as the proxy does.
func (b *bench) portProxy(ctx context.Context, srv *server, sb *client.Sandbox) error {
	const port = 8000
	if _, err := srv.c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: fmt.Sprintf(
		"mkdir -p /tmp/www && cd /tmp/www && echo hello > small.txt && head -c %d /dev/zero > big.bin && (nohup python3 -m http.server %d >/dev/null 2>&1 &)",
		throughputBytes, port), TimeoutSeconds: 60}); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "pandastack-bench-www-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, "small.txt"), []byte("hello\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "big.bin"), make([]byte, throughputBytes), 0o644); err != nil {
		return err
	}
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hostPort := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	ln.Close()
	host := exec.CommandContext(ctx, "python3", "-m", "http.server", "--bind", "127.0.0.1", "--directory", dir, hostPort)
	if err := host.Start(); err != nil {
		return err
	}
	defer func() { host.Process.Kill(); host.Wait() }()
	addr, err := sandboxAddr(ctx, srv, sb.ID)
	if err != nil {
		return err
	}
	hc := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true, DisableCompression: true}}
	get := func(u string, key bool) (int64, time.Duration, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", u, nil)
		if key {
			req.Header.Set("Authorization", "Bearer "+srv.key)
		}
		start := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			return 0, 0, err
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		if err == nil && resp.StatusCode != 200 {
			err = fmt.Errorf("GET %s: %s", u, resp.Status)
		}
		return n, time.Since(start), err
	}
	paths := []struct {
		name, note, base string
		key              bool
	}{
		{"host, direct", "python3 -m http.server on the host, 127.0.0.1", "http://127.0.0.1:" + hostPort + "/", false},
		{"sandbox, direct", "the sandbox's server at its address from the host (what the proxy dials)", "http://" + net.JoinHostPort(addr, strconv.Itoa(port)) + "/", false},
		{"sandbox, port proxy", "GET /v1/sandboxes/{id}/ports/8000/… with the API key", srv.c.PortURL(sb.ID, port), true},
	}
	// Both servers may take a moment to listen.
	for _, p := range paths {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if _, _, err := get(p.base+"small.txt", p.key); err == nil {
				break
			} else if time.Now().After(deadline) {
				return fmt.Errorf("%s: %w", p.name, err)
			}
		}
	}
	rtt := make([][]float64, len(paths))
	rate := make([][]float64, len(paths))
	for i := range b.set.N {
		for j := range paths {
			k := (i + j) % len(paths) // rotate who goes first
			p := paths[k]
			for range 5 {
				_, d, err := get(p.base+"small.txt", p.key)
				if err != nil {
					return err
				}
				rtt[k] = append(rtt[k], ms(d))
			}
			n, d, err := get(p.base+"big.bin", p.key)
			if err != nil {
				return err
			}
			if n != throughputBytes {
				return fmt.Errorf("%s: %d bytes, want %d", p.name, n, throughputBytes)
			}
			rate[k] = append(rate[k], float64(n)/d.Seconds()/1e6)
		}
	}
	for k, p := range paths {
		b.add(summarize("network", "port round trip (GET 6 B): "+p.name, "ms", rtt[k], p.note+"; a new connection per request"))
	}
	for k, p := range paths {
		b.add(summarizeRate("network", "port download 64 MB: "+p.name, "MB/s", rate[k], p.note))
	}
	return nil
}

// sandboxAddr is the sandbox's address: its default gateway's + 1 (each
// sandbox has a /30, gateway .1 and itself .2).
func sandboxAddr(ctx context.Context, srv *server, id string) (string, error) {
	res, err := srv.c.Exec(ctx, id, client.ExecRequest{Cmd: "awk '$2 == \"00000000\" {print $3}' /proc/net/route", TimeoutSeconds: 30})
	if err != nil {
		return "", err
	}
	h := strings.TrimSpace(res.Stdout)
	v, err := strconv.ParseUint(h, 16, 32)
	if err != nil || len(h) != 8 {
		return "", fmt.Errorf("no default route in sandbox %s: %q", id, res.Stdout)
	}
	// /proc/net/route is little-endian.
	return net.IPv4(byte(v), byte(v>>8), byte(v>>16), byte(v>>24)+1).String(), nil
}
