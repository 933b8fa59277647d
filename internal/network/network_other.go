//go:build !linux

package network

import (
	"errors"
	"net/netip"

	"github.com/pandastack/pandastack"
)

// Network is unavailable off Linux.
type Network struct{}

var errUnsupported = errors.New("network: sandbox networking needs Linux")

// New fails off Linux.
func New(Config) (*Network, error) { return nil, errUnsupported }

func (n *Network) Prepare(string, *pandastack.NetworkPolicy) (string, error) {
	return "", errUnsupported
}
func (n *Network) Adopt(string) error                               { return errUnsupported }
func (n *Network) Rename(string, string) (string, error)            { return "", errUnsupported }
func (n *Network) SetPolicy(string, pandastack.NetworkPolicy) error { return errUnsupported }
func (n *Network) setPolicy(string, pandastack.NetworkPolicy, bool) error {
	return errUnsupported
}
func (n *Network) Policy(string) (pandastack.NetworkPolicy, bool) {
	return pandastack.NetworkPolicy{}, false
}
func (n *Network) Validate(pandastack.NetworkPolicy) error { return errUnsupported }
func (n *Network) Kept(_ string, p pandastack.NetworkPolicy) pandastack.NetworkPolicy {
	return p
}
func (n *Network) Addr(string) (netip.Addr, bool)      { return netip.Addr{}, false }
func (n *Network) Log(string) []pandastack.EgressEntry { return nil }
func (n *Network) Down(string)                         {}
func (n *Network) Release(string)                      {}
func (n *Network) Hold(string)                         {}
func (n *Network) Known() []string                     { return nil }
func (n *Network) Namespaces() []string                { return nil }
func (n *Network) Drain()                              {}
func (n *Network) Close() error                        { return nil }
