package network

import (
	"net/netip"
	"testing"

	"github.com/pandastack/pandastack"
)

// decideAddr is the firewall's rule in Go (the domain proxy and the cut of
// connections a narrowing refuses ask it): an opened private range is
// reachable only through an allow_out entry inside it.
func TestDecideAddr(t *testing.T) {
	open := []netip.Prefix{netip.MustParsePrefix("172.31.253.0/30")}
	deny := PlatformDeny
	priv, other, public := netip.MustParseAddr("172.31.253.2"), netip.MustParseAddr("172.20.0.1"), netip.MustParseAddr("203.0.113.9")
	for _, c := range []struct {
		name   string
		policy pandastack.NetworkPolicy
		to     netip.Addr
		ok     bool
		rule   string
	}{
		{"internet alone, the opened range", pandastack.NetworkPolicy{AllowInternetAccess: true}, priv, false, "platform"},
		{"internet alone, the internet", pandastack.NetworkPolicy{AllowInternetAccess: true}, public, true, "internet"},
		{"a wider entry covers the range but does not name it", pandastack.NetworkPolicy{AllowOut: []string{"0.0.0.0/0"}}, priv, false, "platform"},
		{"a wider entry, the internet", pandastack.NetworkPolicy{AllowOut: []string{"0.0.0.0/0"}}, public, true, "allow_out 0.0.0.0/0"},
		{"an entry inside the range", pandastack.NetworkPolicy{AllowOut: []string{"0.0.0.0/0", "172.31.253.2"}}, priv, true, "allow_out 172.31.253.2/32"},
		{"the whole opened range", pandastack.NetworkPolicy{AllowInternetAccess: true, AllowOut: []string{"172.31.253.0/30"}}, priv, true, "allow_out 172.31.253.0/30"},
		{"a private address not opened", pandastack.NetworkPolicy{AllowInternetAccess: true, AllowOut: []string{"0.0.0.0/0"}}, other, false, "platform"},
		{"no internet", pandastack.NetworkPolicy{}, public, false, "no_internet"},
		{"a cloud's host agent, public but denied", pandastack.NetworkPolicy{AllowInternetAccess: true, AllowOut: []string{"0.0.0.0/0"}}, netip.MustParseAddr("168.63.129.16"), false, "platform"},
		{"a cloud's metadata among the protocol assignments", pandastack.NetworkPolicy{AllowInternetAccess: true}, netip.MustParseAddr("192.0.0.192"), false, "platform"},
		{"the addresses beside them are the internet", pandastack.NetworkPolicy{AllowInternetAccess: true}, netip.MustParseAddr("168.63.129.17"), true, "internet"},
	} {
		comp, err := Compile(c.policy, deny, open)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if ok, rule := comp.decideAddr(c.to, deny, open); ok != c.ok || rule != c.rule {
			t.Errorf("%s: %s → %v %q, want %v %q", c.name, c.to, ok, rule, c.ok, c.rule)
		}
	}
}
