package pandastack

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
