// Package network gives sandboxes their own network: per sandbox a network
// namespace with a veth pair into the host, addresses from the server's
// range, a firewall chain holding its egress policy and a DNS resolver on
// its gateway; per server one nftables table (NAT and filtering) named
// after the server's instance, made at start and removed at exit, so
// several servers share a host and no other rule of the host is touched.
// Runtime wraps a pandastack.Runtime so the sandbox manager need not know.
// Only cmd/ and tests import it.
package network
