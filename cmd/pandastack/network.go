package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/network"
)

// NetConfig is the sandbox-network part of serve's configuration.
type NetConfig struct {
	Default      string         // internet, none or off (no namespaces: loopback only)
	CIDR         string         // sandbox address range; "" picks a free /20
	AllowPrivate []netip.Prefix // private ranges policies may open
	CACerts      string         // none, host (the host's system bundle) or a PEM file added to sandboxes' trust stores
	Resolvers    string         // upstream DNS servers (host[:port], comma-separated); default /etc/resolv.conf's
	PublicDomain string         // {port}-{id}.PublicDomain routes to the port proxy
	MaxFlows     int            // connections one sandbox may have open at once; 0: no limit
}

// defaultMaxFlows is --network-max-flows unless set: far above what a
// program opens (closed TCP connections do not count; UDP flows, DNS
// queries among them, count until the kernel forgets them: 30 s after
// their last packet, 120 s for a flow with answers both ways), and a
// thirty-second of the host's table (net.netfilter.nf_conntrack_max:
// 262144 entries on the project's 24 GiB machine).
const defaultMaxFlows = 8192

type prefixList struct{ p *[]netip.Prefix }

func (l prefixList) String() string {
	if l.p == nil {
		return ""
	}
	var s []string
	for _, p := range *l.p {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

func (l prefixList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil || !p.Addr().Is4() {
			return fmt.Errorf("%q is not an IPv4 CIDR", f)
		}
		*l.p = append(*l.p, p.Masked())
	}
	return nil
}

func (c *NetConfig) bind(fs *flag.FlagSet, bad func(env, v, want string)) {
	// str binds a string flag whose default an environment variable overrides.
	str := func(p *string, name, env, def, usage string) {
		*p = def
		if v, ok := os.LookupEnv(env); ok {
			*p = v
		}
		fs.StringVar(p, name, *p, usage+" ($"+env+")")
	}
	str(&c.Default, "network-default", "PANDASTACK_NETWORK_DEFAULT", "internet", "network of a sandbox created without a policy: internet, none, or off for no sandbox networking at all")
	str(&c.CIDR, "network-cidr", "PANDASTACK_NETWORK_CIDR", "", "IPv4 range of sandbox addresses, one /30 each; must not overlap a host route (default: a free /20 in 10.128.0.0/9)")
	str(&c.CACerts, "sandbox-ca-certs", "PANDASTACK_SANDBOX_CA_CERTS", "host", "certificates every sandbox trusts besides its own: none, host (this host's system bundle, so TLS-inspecting proxies the host trusts work) or a PEM file")
	str(&c.Resolvers, "network-resolvers", "PANDASTACK_NETWORK_RESOLVERS", "", "DNS servers the sandboxes' resolver forwards to, IP[:port] comma-separated (default: those of /etc/resolv.conf)")
	str(&c.PublicDomain, "public-domain", "PANDASTACK_PUBLIC_DOMAIN", "", "serve sandbox ports also as {port}-{id}.DOMAIN (a wildcard DNS name pointing at this server)")
	c.MaxFlows = defaultMaxFlows
	if v, ok := os.LookupEnv("PANDASTACK_NETWORK_MAX_FLOWS"); ok {
		if k, err := strconv.Atoi(v); err == nil {
			c.MaxFlows = k
		} else {
			c.MaxFlows = -1 // refused by startNetwork, naming the variable
		}
	}
	fs.IntVar(&c.MaxFlows, "network-max-flows", c.MaxFlows, "connections one sandbox may have open at once (TCP until closed, UDP until its tracking times out, 30 s or more), through NAT, DNS and the domain proxy together; new ones past it are refused, so one sandbox cannot fill the host's connection tracking table (0: no limit) ($PANDASTACK_NETWORK_MAX_FLOWS)")
	if v := os.Getenv("PANDASTACK_NETWORK_ALLOW_PRIVATE"); v != "" {
		if err := (prefixList{&c.AllowPrivate}).Set(v); err != nil {
			bad("PANDASTACK_NETWORK_ALLOW_PRIVATE", v, fmt.Sprintf("private IPv4 ranges (CIDR), comma-separated (%v)", err))
		}
	}
	fs.Var(prefixList{&c.AllowPrivate}, "network-allow-private", "private range (CIDR) that a sandbox policy may open by naming it in allow_out (internet access alone does not reach it); repeatable ($PANDASTACK_NETWORK_ALLOW_PRIVATE, comma-separated)")
}

// startNetwork sets up sandbox networking, or returns nil with "off".
func startNetwork(c NetConfig, dataDir string, log *slog.Logger) (*network.Network, error) {
	var def pandastack.NetworkPolicy
	switch c.Default {
	case "off":
		return nil, nil
	case "internet":
		def = pandastack.InternetPolicy()
	case "none":
		def = pandastack.NoNetworkPolicy()
	default:
		return nil, fmt.Errorf("--network-default must be internet, none or off, got %q", c.Default)
	}
	if c.MaxFlows < 0 {
		return nil, fmt.Errorf("--network-max-flows ($PANDASTACK_NETWORK_MAX_FLOWS) must be a whole number, 0 or more (0: no limit)")
	}
	var resolvers []netip.AddrPort
	for _, f := range strings.Split(c.Resolvers, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		ap, err := netip.ParseAddrPort(f)
		if err != nil {
			a, aerr := netip.ParseAddr(f)
			if aerr != nil {
				return nil, fmt.Errorf("--network-resolvers: %q is not IP or IP:port", f)
			}
			ap = netip.AddrPortFrom(a, 53)
		}
		resolvers = append(resolvers, ap)
	}
	return network.New(network.Config{
		CIDR: c.CIDR, AllowPrivate: c.AllowPrivate, Default: def, Resolvers: resolvers, MaxFlows: c.MaxFlows,
		StateDir: filepath.Join(dataDir, "network"), Instance: network.InstanceID(dataDir), Log: log,
	})
}

// hostCABundle is the system bundle of Debian-family hosts.
const hostCABundle = "/etc/ssl/certs/ca-certificates.crt"

// sandboxCA reads the certificates --sandbox-ca-certs adds to sandboxes.
func sandboxCA(mode string, log *slog.Logger) ([]byte, error) {
	switch mode {
	case "none", "":
		return nil, nil
	case "host":
		b, err := os.ReadFile(hostCABundle)
		if err != nil {
			log.Warn("no host CA bundle to add to sandboxes", "path", hostCABundle, "err", err)
			return nil, nil
		}
		return b, nil
	default:
		b, err := os.ReadFile(mode)
		if err != nil {
			return nil, fmt.Errorf("--sandbox-ca-certs: %w", err)
		}
		if !strings.Contains(string(b), "-----BEGIN CERTIFICATE-----") {
			return nil, fmt.Errorf("--sandbox-ca-certs: %s holds no PEM certificate", mode)
		}
		return b, nil
	}
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// cliNetwork turns `sandbox create`'s flags into a policy; nil leaves the
// server's default.
func cliNetwork(mode string, allowOut, denyOut []string) (*pandastack.NetworkPolicy, error) {
	if mode == "" && len(allowOut) == 0 && len(denyOut) == 0 {
		return nil, nil
	}
	// As in the API, a policy is never more open than it says: with
	// --allow-out and no --network only those are reachable, and a
	// --deny-out, which carves out of the internet, needs --network internet.
	p := pandastack.NetworkPolicy{AllowOut: allowOut, DenyOut: denyOut}
	switch mode {
	case "internet":
		p.AllowInternetAccess = true
	case "", "none":
		if len(denyOut) > 0 {
			return nil, fmt.Errorf("--deny-out needs --network internet: without internet access only --allow-out is reachable")
		}
	default:
		return nil, fmt.Errorf("--network must be internet or none, got %q", mode)
	}
	p = p.Normalized()
	return &p, nil
}
