package network

import (
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/netip"
	"path/filepath"

	"github.com/pandastack/pandastack"
)

// Config configures the sandbox network of one server.
type Config struct {
	// CIDR is the IPv4 range sandbox addresses come from, one /30 per
	// sandbox (gateway .1, sandbox .2). "" picks a free /20 in 10.128.0.0/9
	// from the instance id. A range that overlaps a route of the host is
	// refused.
	CIDR string
	// AllowPrivate opens these ranges of the platform deny set to policies.
	AllowPrivate []netip.Prefix
	// Default is the policy of a sandbox created without one.
	Default pandastack.NetworkPolicy
	// StateDir keeps each sandbox's policy and slot across server restarts.
	StateDir string
	// Instance names everything of this server on the host (table,
	// namespaces, veths), so several servers share a machine: at most 5
	// characters [a-z0-9]. InstanceID derives one from the data directory.
	Instance string
	// MaxFlows is how many connections (TCP not yet closed, UDP and others
	// until their tracking times out) one sandbox may have open at once,
	// through NAT, to its resolver and to the domain proxy together; a new
	// one past it is refused. The kernel's connection tracking table is
	// the host's, shared by every sandbox and the host itself: without a
	// limit, one sandbox sending UDP to changing ports filled a fifth of it
	// in 5 s. 0: no limit.
	MaxFlows int
	// Resolvers are the upstream DNS servers; empty reads /etc/resolv.conf.
	Resolvers []netip.AddrPort
	Log       *slog.Logger
}

// InstanceID derives a short stable id from a server's data directory.
func InstanceID(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	sum := sha256.Sum256([]byte(abs))
	return hex.EncodeToString(sum[:])[:5]
}
