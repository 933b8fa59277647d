package network

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/pandastack/pandastack"
)

// MaxRules bounds allow_out and deny_out together: every entry is a rule
// that each new connection of the sandbox walks.
const MaxRules = 256

// PlatformDeny are the destinations no sandbox policy can open: "this
// network", RFC 1918 private ranges, CGNAT, loopback, link-local (with
// cloud metadata at 169.254.169.254), the IETF protocol assignments (a
// cloud's metadata at 192.0.0.192), a cloud's host agent at the public
// 168.63.129.16 (Azure's, which hands any guest the VM's settings),
// multicast and the reserved range above it. The host's own addresses and the sandboxes' range are added
// per server; an operator opens private ranges with --network-allow-private.
// The documentation nets are not here: tests play the internet on them.
var PlatformDeny = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("168.63.129.16/32"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// Compiled is a validated policy: CIDR rules the firewall enforces and the
// domain rules the resolver and proxy enforce.
type Compiled struct {
	Internet bool
	AllowNet []netip.Prefix
	DenyNet  []netip.Prefix
	Domains  []string // exact names and "*.suffix" patterns, lower case
}

// Compile validates p against the platform deny set deny (minus the
// operator's openings open) and returns its rules. Errors name the entry
// by its index: EInvalid for a malformed entry, a domain in deny_out or
// too many entries; ENetworkDenied for an entry inside the platform deny
// set, which no policy can open.
func Compile(p pandastack.NetworkPolicy, deny, open []netip.Prefix) (Compiled, error) {
	c := Compiled{Internet: p.AllowInternetAccess}
	if n := len(p.AllowOut) + len(p.DenyOut); n > MaxRules {
		return c, pandastack.Errorf(pandastack.EInvalid, "network: at most %d allow_out and deny_out entries together, got %d", MaxRules, n)
	}
	for i, e := range p.AllowOut {
		if d, ok := domain(e); ok {
			c.Domains = append(c.Domains, d)
			continue
		}
		pfx, err := prefix(e)
		if err != nil {
			return c, pandastack.Errorf(pandastack.EInvalid, "network.allow_out[%d]: %q is not an IPv4 address, IPv4 CIDR or domain name (sandboxes have IPv4 only; write an internationalised name in its xn-- form)", i, e)
		}
		if d := denied(pfx, deny, open); d.IsValid() {
			return c, pandastack.Errorf(pandastack.ENetworkDenied, "network.allow_out[%d]: %s is inside the platform deny set (%s), which no sandbox policy can open", i, pfx, d)
		}
		c.AllowNet = append(c.AllowNet, pfx)
	}
	for i, e := range p.DenyOut {
		pfx, err := prefix(e)
		if err != nil {
			if _, ok := domain(e); ok {
				return c, pandastack.Errorf(pandastack.EInvalid, "network.deny_out[%d]: %q is a domain; domains are allowed only in allow_out", i, e)
			}
			return c, pandastack.Errorf(pandastack.EInvalid, "network.deny_out[%d]: %q is not an IPv4 address or IPv4 CIDR (sandboxes have IPv4 only)", i, e)
		}
		c.DenyNet = append(c.DenyNet, pfx)
	}
	return c, nil
}

// prefix parses an IPv4 address or CIDR (the sandbox network is IPv4 only).
func prefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil || !p.Addr().Is4() {
			return netip.Prefix{}, fmt.Errorf("bad CIDR")
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return netip.Prefix{}, fmt.Errorf("bad address")
	}
	return netip.PrefixFrom(a, 32), nil
}

// domain accepts a DNS name of letters, digits and hyphens with at least
// two labels, or "*." and such a name; it returns it in lower case.
func domain(s string) (string, bool) {
	d := strings.ToLower(strings.TrimSuffix(s, "."))
	name := strings.TrimPrefix(d, "*.")
	if len(name) == 0 || len(name) > 253 || !strings.Contains(name, ".") {
		return "", false
	}
	for _, l := range strings.Split(name, ".") {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return "", false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return "", false
			}
		}
	}
	// An all-numeric last label would make "1.2.3.999" a domain.
	if last := name[strings.LastIndex(name, ".")+1:]; strings.Trim(last, "0123456789") == "" {
		return "", false
	}
	return d, true
}

// denied returns the deny prefix that holds all of p when no opened range
// holds p, or the zero Prefix. A wider p that only overlaps the deny set
// is fine: the deny set still applies to the overlap.
func denied(p netip.Prefix, deny, open []netip.Prefix) netip.Prefix {
	if within(p, open) {
		return netip.Prefix{}
	}
	for _, d := range deny {
		if d.Bits() <= p.Bits() && d.Contains(p.Addr()) {
			return d
		}
	}
	return netip.Prefix{}
}

// MatchDomain reports whether name is allowed by one of the patterns.
func MatchDomain(patterns []string, name string) bool {
	_, ok := matchDomain(patterns, name)
	return ok
}

// matchDomain returns the pattern that allows name.
func matchDomain(patterns []string, name string) (string, bool) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	for _, p := range patterns {
		if suffix, ok := strings.CutPrefix(p, "*."); ok {
			if strings.HasSuffix(name, "."+suffix) {
				return p, true
			}
		} else if name == p {
			return p, true
		}
	}
	return "", false
}

// DomainRules reports whether domain rules are in force: the policy names
// domains and does not let everything out anyway. Then the resolver
// answers only allowed names, HTTP and TLS go through the domain proxy and
// QUIC is blocked so clients fall back to TCP.
func (c Compiled) DomainRules() bool {
	return len(c.Domains) > 0 && !(c.Internet && len(c.DenyNet) == 0)
}

// decideAddr says whether a connection to a may go out by the CIDR rules,
// and which rule decided. deny is the full platform deny set, open the
// server's openings of it: an opened range is reachable only through an
// allow_out entry inside it (one that names it), never by internet access
// alone, nor by a wider entry (0.0.0.0/0) that merely covers it.
func (c Compiled) decideAddr(a netip.Addr, deny, open []netip.Prefix) (bool, string) {
	if platformDenied(a, deny, open) {
		return false, "platform"
	}
	opened := inAny(a, open)
	for _, p := range c.AllowNet {
		if p.Contains(a) && (!opened || within(p, open)) {
			return true, "allow_out " + p.String()
		}
	}
	if opened {
		return false, "platform"
	}
	for _, p := range c.DenyNet {
		if p.Contains(a) {
			return false, "deny_out " + p.String()
		}
	}
	if c.Internet {
		return true, "internet"
	}
	return false, "no_internet"
}

// decideName says whether the sandbox may reach name by a domain rule.
func (c Compiled) decideName(name string) (bool, string) {
	if p, ok := matchDomain(c.Domains, name); ok {
		return true, "allow_out " + p
	}
	return false, ""
}

// inAny reports whether one of ps holds a.
func inAny(a netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// within reports whether one of ps holds all of p.
func within(p netip.Prefix, ps []netip.Prefix) bool {
	for _, o := range ps {
		if o.Bits() <= p.Bits() && o.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

func platformDenied(a netip.Addr, deny, open []netip.Prefix) bool {
	if inAny(a, open) {
		return false
	}
	return inAny(a, deny) || !a.Is4()
}
