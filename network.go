package pandastack

import "time"

// NetworkPolicy says where a sandbox may connect to. allow_out wins over
// deny_out; a platform deny set (the host, loopback, link-local, private and
// CGNAT ranges, multicast, other sandboxes) applies whatever the policy says.
type NetworkPolicy struct {
	// AllowInternetAccess: without it only allow_out is reachable.
	AllowInternetAccess bool `json:"allow_internet_access"`
	// AllowOut: IPs, CIDRs, domains ("api.example.com") and wildcard domains
	// ("*.example.org") always reachable.
	AllowOut []string `json:"allow_out"`
	// DenyOut: IPs and CIDRs never reachable unless also in AllowOut.
	DenyOut []string `json:"deny_out"`
}

// InternetPolicy is the policy of a sandbox with the internet and no rules.
func InternetPolicy() NetworkPolicy {
	return NetworkPolicy{AllowInternetAccess: true, AllowOut: []string{}, DenyOut: []string{}}
}

// NoNetworkPolicy is the policy of a sandbox that may connect nowhere.
func NoNetworkPolicy() NetworkPolicy {
	return NetworkPolicy{AllowOut: []string{}, DenyOut: []string{}}
}

// Normalized returns p with nil lists as empty ones, as the API shows them.
func (p NetworkPolicy) Normalized() NetworkPolicy {
	if p.AllowOut == nil {
		p.AllowOut = []string{}
	}
	if p.DenyOut == nil {
		p.DenyOut = []string{}
	}
	return p
}

// EgressEntry is one line of a sandbox's egress log: a DNS answer, a
// connection (through the domain proxy or through NAT), or a connect the
// firewall refused (Allowed false, no bytes).
type EgressEntry struct {
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"`              // "dns", "tcp" or "udp"
	Address  string    `json:"address,omitempty"` // destination IP (tcp); for dns, the addresses answered, comma-separated
	Port     int       `json:"port,omitempty"`
	Domain   string    `json:"domain,omitempty"` // from DNS, TLS SNI or the HTTP Host header
	BytesOut int64     `json:"bytes_out"`        // sandbox → destination
	BytesIn  int64     `json:"bytes_in"`         // destination → sandbox
	Allowed  bool      `json:"allowed"`
	Rule     string    `json:"rule"` // what decided: "allow_out api.example.com", "deny_out 1.2.3.0/24", "platform", "internet", "no_internet", "no_domain_rule", "quic", "flow_limit", "before_restart"
}
