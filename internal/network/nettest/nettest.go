//go:build linux

// Package nettest plays the internet for tests of sandbox networking: a
// network namespace the test makes, with servers on addresses it assigns,
// routed from the host so no packet leaves the machine. Only tests import it.
package nettest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netns"
)

// T is what the helpers need of a test: *testing.T and *testing.B are T,
// and so is a benchmark's own stand-in.
type T interface {
	Helper()
	Error(args ...any)
	Fatal(args ...any)
	Cleanup(func())
}

// InNS runs f on a thread inside the namespace at path.
func InNS(t T, path string, f func()) {
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

func sh(t T, cmd string) {
	t.Helper()
	if out, err := exec.Command("sh", "-c", cmd).CombinedOutput(); err != nil {
		t.Fatal(fmt.Sprintf("%s: %v: %s", cmd, err, out))
	}
}

// Upstream is a namespace the test makes to play the internet: an HTTP
// server on a documentation address (PublicIP), reachable through NAT, and
// the same server on a private address (PrivateIP) and a DNS stub on
// DNSAddr. Nothing leaves the machine: the host routes both /30s into it.
type Upstream struct {
	PublicIP, PrivateIP netip.Addr
	DNS                 netip.AddrPort
	zone                *sync.Map // name → netip.Addr for the DNS stub
}

// SetDNS makes the DNS stub answer name with a (default: 198.51.100.77).
func (u Upstream) SetDNS(name string, a netip.Addr) { u.zone.Store(name, a) }

// StartUpstream makes the namespace; cleanup removes it. Its tag and its
// /30 networks (pubNet, privNet: the namespace's end) must be unique
// among every package's calls, not just this package's: go test runs
// packages at once, and a start removes what has the same name first.
func StartUpstream(t T, tag string, pubNet, privNet byte) Upstream {
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
	u := Upstream{PublicIP: netip.MustParseAddr(pub), PrivateIP: netip.MustParseAddr(priv), DNS: netip.AddrPortFrom(netip.MustParseAddr(pub), 5353), zone: &sync.Map{}}
	InNS(t, "/run/netns/"+ns, func() {
		ln, err := net.Listen("tcp4", ":80")
		if err != nil {
			t.Fatal(err)
		}
		// The body names the Host asked for; X-Served-By the address the
		// request reached, so a test sees which server answered.
		// /bytes?n=N answers N zero bytes, for throughput; /echo answers
		// the request's body; /upgrade switches to a protocol that echoes;
		// /ticks sends a line every 100 ms until the client goes.
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Served-By", r.Context().Value(http.LocalAddrContextKey).(net.Addr).String())
			switch r.URL.Path {
			case "/echo":
				io.Copy(w, r.Body)
				return
			case "/upgrade":
				c, rw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					return
				}
				defer c.Close()
				rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
				rw.Flush()
				io.Copy(c, rw)
				return
			}
			if r.URL.Path == "/ticks" {
				rc := http.NewResponseController(w)
				for i := 0; ; i++ {
					if _, err := fmt.Fprintf(w, "tick %d\n", i); err != nil || rc.Flush() != nil {
						return
					}
					select {
					case <-r.Context().Done():
						return
					case <-time.After(100 * time.Millisecond):
					}
				}
			}
			if r.URL.Path == "/bytes" {
				n, _ := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
				w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
				buf := make([]byte, 64<<10)
				for ; n > 0; n -= int64(len(buf)) {
					if _, err := w.Write(buf[:min(n, int64(len(buf)))]); err != nil {
						return
					}
				}
				return
			}
			fmt.Fprintf(w, "upstream %s", r.Host)
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		tln, err := net.Listen("tcp4", ":443")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(tls.NewListener(tln, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}}))
		pc, err := net.ListenPacket("udp4", u.DNS.String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		go dnsStub(pc, u.zone)
	})
	return u
}

// dnsStub answers every A query with its header and question echoed and
// one A record: the zone's address for the name, else 198.51.100.77.
func dnsStub(pc net.PacketConn, zone *sync.Map) {
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
		var labels []string
		i := 12
		for ; i < n && q[i] != 0 && i+1+int(q[i]) <= n; i += 1 + int(q[i]) {
			labels = append(labels, string(q[i+1:i+1+int(q[i])]))
		}
		if i+5 > n {
			continue
		}
		q = q[:i+5] // the question only: drop an EDNS record in the additional section
		a := netip.MustParseAddr("198.51.100.77")
		if v, ok := zone.Load(strings.Join(labels, ".")); ok {
			a = v.(netip.Addr)
		}
		ip := a.As4()
		q[2] |= 0x80      // response
		q[3] |= 0x80      // recursion available
		q[6], q[7] = 0, 1 // one answer
		q[8], q[9], q[10], q[11] = 0, 0, 0, 0
		q = append(q, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, ip[0], ip[1], ip[2], ip[3])
		pc.WriteTo(q, from)
	}
}

// selfSigned makes a throwaway certificate for the HTTPS server.
func selfSigned(t T) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "upstream.test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), DNSNames: []string{"*.test"}}
	der, err := x509.CreateCertificate(rand.Reader, tpl, tpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
