package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/google/nftables"
	mdnetlink "github.com/mdlayher/netlink"
	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/mountinfo"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Network gives each sandbox a namespace, a veth pair, firewall rules and
// a DNS resolver. Safe for concurrent use.
type Network struct {
	cfg       Config
	cidr      netip.Prefix
	deny      []netip.Prefix // the platform deny set with the host's own addresses
	fw        *firewall
	resolvers []netip.AddrPort
	log       *slog.Logger

	nftMu     sync.Mutex // one nftables batch at a time
	mu        sync.Mutex
	sbx       map[string]*sandboxNet
	slots     map[int]string
	closing   bool           // Prepare refuses once Drain began
	preparing sync.WaitGroup // Prepares under way
	stopFlows chan struct{}  // ends watchFlows
	flowsDone chan struct{}
	refused   *nflog // reads what the firewall refuses; nil when unavailable
	refDone   chan struct{}
}

type sandboxNet struct {
	ID     string                   `json:"id"`
	Slot   int                      `json:"slot"`
	Policy pandastack.NetworkPolicy `json:"policy"`
	up     bool
	hold   bool     // the next Release only takes the network down (a pause)
	comp   Compiled // Policy compiled
	dns    *resolver
	proxy  *proxy
	elog   egressLog
	names  sync.Map     // netip.Addr → the name the resolver answered it for
	nNames atomic.Int64 // about how many names holds
	// The rules that let through the connections a narrowed policy cut
	// (cutRefusedFlows), for their log entries; guarded by Network.mu.
	cutRules map[flowKey]string
	// chainStale: the firewall chain may not say comp (a write of it
	// failed), so that setting the same policy again writes it; guarded
	// by Network.mu.
	chainStale bool
}

// maxNames bounds what a sandbox's resolver remembers of its answers: a
// sandbox that resolves name after name cannot grow the server's memory.
// Past it the memory starts afresh (older NAT entries then lack a domain).
const maxNames = 4096

// remember records that the resolver answered a for name.
func (s *sandboxNet) remember(a netip.Addr, name string) {
	if _, loaded := s.names.Swap(a, name); !loaded && s.nNames.Add(1) > maxNames {
		s.names.Clear()
		s.nNames.Store(0)
	}
}

// nameOf is the name the sandbox's resolver last gave a for, or "".
func (s *sandboxNet) nameOf(a netip.Addr) string {
	if v, ok := s.names.Load(a); ok {
		return v.(string)
	}
	return ""
}

// view gives s's resolver and proxy its current policy and log.
func (n *Network) view(s *sandboxNet) sandboxView {
	return sandboxView{
		policy: func() Compiled {
			n.mu.Lock()
			defer n.mu.Unlock()
			return s.comp
		},
		denied: func(a netip.Addr) bool {
			return n.cidr.Contains(a) || platformDenied(a, n.deny, n.cfg.AllowPrivate) || isLocal(a)
		},
		open:    n.cfg.AllowPrivate,
		resolve: n.lookup,
		log:     s.elog.add,
		answered: func(name string, addrs []string) {
			for _, a := range addrs {
				if ip, err := netip.ParseAddr(a); err == nil {
					s.remember(ip, name)
				}
			}
		},
	}
}

// lookup resolves a name for the domain proxy with the host's resolvers.
func (n *Network) lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, n.resolvers[0].String())
	}}
	return r.LookupNetIP(ctx, "ip4", name)
}

// startServices starts s's resolver and domain proxy on its gateway.
//
// written is the policy the caller wrote s's chain with, outside n.mu: a
// SetPolicy meanwhile, which saw the network not up yet, only recorded its
// policy, so the chain is written again with it here, in the step that
// makes the network up (from then on SetPolicy writes the chain itself).
func (n *Network) startServices(s *sandboxNet, gw, addr netip.Addr, written Compiled) error {
	v := n.view(s)
	dns, err := startResolver(gw, n.resolvers, v, n.log.With("sandbox", s.ID))
	if err != nil {
		return fmt.Errorf("network %s: resolver: %w", s.ID, inUse(err))
	}
	px, err := startProxy(gw, addr, v)
	if err != nil {
		dns.Close()
		return fmt.Errorf("network %s: domain proxy: %w", s.ID, inUse(err))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.sbx[s.ID] != s || n.slots[s.Slot] != s.ID {
		// Released (a teardown) while these started: it found no
		// resolver or proxy to close, and they would hold the gateway's
		// ports for the next sandbox at this address.
		dns.Close()
		px.Close()
		return pandastack.Errorf(pandastack.EUnavailable, "network %s: released while it was being set up", s.ID)
	}
	if !reflect.DeepEqual(s.comp, written) {
		n.nftMu.Lock()
		err := n.withConn(func(c *nftables.Conn) error { return n.fw.setSandbox(c, s.Slot, n.veth(s.Slot), addr, s.comp) })
		n.nftMu.Unlock()
		if err != nil {
			dns.Close()
			px.Close()
			return fmt.Errorf("network %s: firewall, for the policy set meanwhile: %w", s.ID, err)
		}
		n.log.Debug("network policy changed while the network was prepared; its chain written again", "sandbox", s.ID)
	}
	s.dns, s.proxy, s.up = dns, px, true
	s.chainStale = false // written with s.comp, above or by the caller
	return nil
}

// inUse turns a listen's "address already in use" into a retryable error:
// another socket holds the gateway's port (one of the host's bound to that
// port on every address, or a resolver or proxy not yet closed).
func inUse(err error) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	return pandastack.Errorf(pandastack.EUnavailable, "%v: another socket on the host holds that port of the sandbox's gateway (one bound to it on every address does too); retry, and if it lasts, free that port", err)
}

// Addr returns the address of a sandbox whose network is up.
func (n *Network) Addr(id string) (netip.Addr, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.sbx[id]
	if s == nil || !s.up {
		return netip.Addr{}, false
	}
	_, a := n.addrs(s.Slot)
	return a, true
}

// Log returns the sandbox's egress log, oldest first; nil when unknown.
func (n *Network) Log(id string) []pandastack.EgressEntry {
	n.mu.Lock()
	s := n.sbx[id]
	n.mu.Unlock()
	if s == nil {
		return nil
	}
	return s.elog.list()
}

// New checks the range, enables IPv4 forwarding and installs the firewall
// table. Call Close on exit.
func New(cfg Config) (*Network, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if len(cfg.Instance) == 0 || len(cfg.Instance) > 5 || strings.Trim(cfg.Instance, "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
		return nil, fmt.Errorf("network: instance id %q must be 1 to 5 of [a-z0-9]", cfg.Instance)
	}
	cfg.Default = cfg.Default.Normalized()
	n := &Network{cfg: cfg, log: cfg.Log, sbx: map[string]*sandboxNet{}, slots: map[int]string{}}
	n.fw = &firewall{table: &nftables.Table{Family: nftables.TableFamilyINet, Name: "pandastack_" + cfg.Instance}, prefix: n.vethPrefix(), maxFlows: uint32(max(cfg.MaxFlows, 0))}
	if err := n.pickCIDR(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	if err := ownMount("/run/netns"); err != nil {
		n.log.Warn("/run/netns is not a mount of its own: a later `ip netns add` would hide the namespaces pinned now from their removal", "err", err)
	}
	// Forwarding is host-wide and left on at exit: other servers on this
	// host (or other software) may rely on it by then.
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
		return nil, fmt.Errorf("network: enable net.ipv4.ip_forward: %w", err)
	}
	n.resolvers = cfg.Resolvers
	if len(n.resolvers) == 0 {
		n.resolvers = systemResolvers("/etc/resolv.conf")
	}
	if len(n.resolvers) == 0 {
		return nil, errors.New("network: no DNS resolver in /etc/resolv.conf for the sandboxes' resolver to forward to")
	}
	n.deny = append(append(append([]netip.Prefix{}, PlatformDeny...), hostAddrs()...), uplinkNets()...)
	for _, p := range cfg.AllowPrivate {
		if !slices.ContainsFunc(n.deny, func(d netip.Prefix) bool { return d.Bits() <= p.Bits() && d.Contains(p.Addr()) }) {
			return nil, fmt.Errorf("network: --network-allow-private %s: not within one range of the platform deny set (a private range, the host, its LAN), so there is nothing to open there: an allow_out entry or internet access reaches a public range already, and opening one would keep sandboxes with internet access from it", p)
		}
		if p.Overlaps(netip.MustParsePrefix("169.254.169.254/32")) {
			n.log.Warn("--network-allow-private opens the cloud metadata address 169.254.169.254 to the policies that name it", "range", p)
		}
	}
	if _, err := n.compile(cfg.Default); err != nil {
		return nil, fmt.Errorf("network: default policy: %w", err)
	}
	c, err := newNFT()
	if err != nil {
		return nil, fmt.Errorf("network: nftables: %w", err)
	}
	// Without NFLOG the sandboxes still work; only refused connects go
	// unlogged.
	if n.refused, err = openNFLOG(cfg.Instance); err != nil {
		n.log.Warn("refused connections will not be in the egress log", "err", err)
	} else {
		n.fw.group = n.refused.group
	}
	if err := n.fw.install(c, n.cidr, n.deny, cfg.AllowPrivate); err != nil {
		if n.refused != nil {
			n.refused.Close()
		}
		return nil, fmt.Errorf("network: %w", err)
	}
	if n.fw.maxFlows > 0 {
		if err := n.fw.probeConnlimit(c); err != nil {
			// Every sandbox's chain would fail to load: run without it.
			n.log.Warn("this kernel cannot count connections in nftables (nft_connlimit); sandboxes run without --network-max-flows", "err", err)
			n.fw.maxFlows = 0
		}
	}
	if n.refused != nil {
		n.refDone = make(chan struct{})
		go func() {
			defer close(n.refDone)
			n.refused.read(n.logRefused)
		}()
	}
	n.loadState()
	enableConntrackAcct()
	ev, evErr := openCTEvents() // before New returns: see watchFlows
	stop, done := make(chan struct{}), make(chan struct{})
	n.stopFlows, n.flowsDone = stop, done
	go func() {
		defer close(done)
		n.watchFlows(stop, ev, evErr) // not n.stopFlows: a Close right away sets it to nil
	}()
	n.log.Info("sandbox network ready", "cidr", n.cidr, "table", "inet "+n.fw.table.Name, "instance", cfg.Instance)
	return n, nil
}

// CIDR returns the range sandbox addresses come from.
func (n *Network) CIDR() netip.Prefix { return n.cidr }

func (n *Network) vethPrefix() string   { return "ps" + n.cfg.Instance }
func (n *Network) veth(slot int) string { return n.vethPrefix() + strconv.FormatInt(int64(slot), 36) }
func (n *Network) nsName(id string) string {
	return "pandastack-" + n.cfg.Instance + "-" + id
}

// NSPath is where a sandbox's namespace is pinned.
func (n *Network) NSPath(id string) string { return filepath.Join("/run/netns", n.nsName(id)) }

// addrs returns a slot's gateway (host side) and sandbox addresses.
func (n *Network) addrs(slot int) (gw, sb netip.Addr) {
	base := n.cidr.Addr().As4()
	v := uint32(base[0])<<24 | uint32(base[1])<<16 | uint32(base[2])<<8 | uint32(base[3])
	v += uint32(slot) * 4
	gw = netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v + 1)})
	sb = netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v + 2)})
	return gw, sb
}

func (n *Network) maxSlots() int {
	s := 1 << (32 - n.cidr.Bits()) / 4
	if s > 1<<20 { // veth names hold at most 4 base-36 digits
		s = 1 << 20
	}
	return s
}

// pickCIDR checks the configured range, or picks a free one.
func (n *Network) pickCIDR() error {
	routes, err := n.hostRoutes()
	if err != nil {
		return err
	}
	overlap := func(p netip.Prefix) netip.Prefix {
		for _, r := range routes {
			if r.Overlaps(p) {
				return r
			}
		}
		return netip.Prefix{}
	}
	if n.cfg.CIDR != "" {
		p, err := netip.ParsePrefix(n.cfg.CIDR)
		if err != nil || !p.Addr().Is4() || p.Bits() > 28 {
			return fmt.Errorf("network: --network-cidr %q must be an IPv4 CIDR of /28 or larger", n.cfg.CIDR)
		}
		p = p.Masked()
		if r := overlap(p); r.IsValid() {
			return fmt.Errorf("network: --network-cidr %s overlaps the host's route to %s; pick a free range", p, r)
		}
		n.cidr = p
		return nil
	}
	// 2048 blocks of /20 in 10.128.0.0/9; start where the instance id says.
	h, _ := strconv.ParseUint(n.cfg.Instance, 36, 64)
	for i := range 2048 {
		blk := (int(h) + i) % 2048
		a := netip.AddrFrom4([4]byte{10, byte(128 + blk>>4), byte(blk & 15 << 4), 0})
		p := netip.PrefixFrom(a, 20)
		if !overlap(p).IsValid() {
			n.cidr = p
			return nil
		}
	}
	return errors.New("network: no free /20 in 10.128.0.0/9 for sandboxes; pass --network-cidr")
}

// hostRoutes lists the host's IPv4 routes except default routes and our
// own veths' (a restarted server finds those of its running sandboxes).
func (n *Network) hostRoutes() ([]netip.Prefix, error) {
	rs, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("network: list routes: %w", err)
	}
	names := map[int]string{}
	links, _ := netlink.LinkList()
	for _, l := range links {
		names[l.Attrs().Index] = l.Attrs().Name
	}
	var out []netip.Prefix
	for _, r := range rs {
		if r.Dst == nil || strings.HasPrefix(names[r.LinkIndex], n.vethPrefix()) {
			continue
		}
		ones, _ := r.Dst.Mask.Size()
		a, ok := netip.AddrFromSlice(r.Dst.IP.To4())
		if !ok || ones == 0 {
			continue
		}
		out = append(out, netip.PrefixFrom(a, ones).Masked())
	}
	return out, nil
}

// hostAddrs returns the host's own IPv4 addresses as /32s.
func hostAddrs() []netip.Prefix {
	addrs, _ := netlink.AddrList(nil, netlink.FAMILY_V4)
	var out []netip.Prefix
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			out = append(out, netip.PrefixFrom(ip, 32))
		}
	}
	return out
}

// isLocal reports whether the host delivers a to itself: one of its own
// addresses as they are now (the deny set has them as they were at start;
// an opened private range may hold one). The domain proxy connects from
// the host, past the firewall's host chain, so it asks this before each
// connection. An address the host cannot route is not (its connect
// fails: "unreachable").
func isLocal(a netip.Addr) bool {
	routes, err := netlink.RouteGet(a.AsSlice())
	if err != nil {
		return false
	}
	for _, r := range routes {
		if r.Type == unix.RTN_LOCAL {
			return true
		}
	}
	return false
}

// uplinkNets returns the host's default gateways (as /32s) and the IPv4
// networks of the interfaces that carry its default routes: the host's own
// LAN (its router's management, its neighbours), which a sandbox with
// internet access would reach through NAT when it is not a private range.
func uplinkNets() []netip.Prefix {
	routes, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
	var out []netip.Prefix
	links := map[int]bool{}
	hop := func(link int, gw net.IP) {
		links[link] = true
		if a, ok := netip.AddrFromSlice(gw.To4()); ok {
			out = append(out, netip.PrefixFrom(a, 32))
		}
	}
	for _, r := range routes {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue // not a default route
			}
		}
		hop(r.LinkIndex, r.Gw)
		for _, nh := range r.MultiPath {
			hop(nh.LinkIndex, nh.Gw)
		}
	}
	addrs, _ := netlink.AddrList(nil, netlink.FAMILY_V4)
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok || !links[a.LinkIndex] || a.IPNet == nil {
			continue
		}
		ones, _ := a.IPNet.Mask.Size()
		if ones > 0 && ones < 32 {
			out = append(out, netip.PrefixFrom(ip, ones).Masked())
		}
	}
	return out
}

// systemResolvers reads the nameservers of a resolv.conf.
func systemResolvers(path string) []netip.AddrPort {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []netip.AddrPort
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil {
				out = append(out, netip.AddrPortFrom(a, 53))
			}
		}
	}
	return out
}

func (n *Network) statePath(id string) string { return filepath.Join(n.cfg.StateDir, id+".json") }

func (n *Network) saveState(s *sandboxNet) error {
	b, _ := json.Marshal(s)
	tmp := n.statePath(s.ID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, n.statePath(s.ID))
}

// loadState reads the policies of sandboxes an earlier run left running
// or paused.
func (n *Network) loadState() {
	ents, _ := os.ReadDir(n.cfg.StateDir)
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(n.cfg.StateDir, e.Name()))
		var s sandboxNet
		if err != nil || json.Unmarshal(b, &s) != nil || s.ID == "" {
			continue
		}
		n.sbx[s.ID] = &s
		if _, taken := n.slots[s.Slot]; !taken && n.nsExists(s.ID) {
			n.slots[s.Slot] = s.ID
		}
	}
}

func (n *Network) nsExists(id string) bool {
	_, err := os.Stat(n.NSPath(id))
	return err == nil
}

// Namespaces lists the sandbox ids with a namespace of ours on the host.
func (n *Network) Namespaces() []string {
	ents, _ := os.ReadDir("/run/netns")
	var ids []string
	pfx := "pandastack-" + n.cfg.Instance + "-"
	for _, e := range ents {
		if id, ok := strings.CutPrefix(e.Name(), pfx); ok {
			ids = append(ids, id)
		}
	}
	return ids
}

// Policy returns a sandbox's policy; ok is false for an unknown sandbox.
func (n *Network) Policy(id string) (pandastack.NetworkPolicy, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	s := n.sbx[id]
	if s == nil {
		return pandastack.NetworkPolicy{}, false
	}
	return s.Policy, true
}

// Validate checks a policy as SetPolicy and Prepare would.
func (n *Network) Validate(p pandastack.NetworkPolicy) error {
	_, err := n.compile(p)
	return err
}

// Prepare makes the sandbox's namespace, veth pair, addresses, firewall
// chain and resolver before its runtime starts or restores it, and returns
// the namespace's path. p nil keeps the sandbox's policy (a resume) or takes
// the default. runsc moves the interface's addresses into its own stack,
// so every boot needs a fresh namespace: an existing one is rebuilt. On
// failure nothing of it is left but the policy a sandbox had before (a
// paused one's, kept for its resume), down.
func (n *Network) Prepare(id string, p *pandastack.NetworkPolicy) (_ string, err error) {
	n.mu.Lock()
	if n.closing {
		n.mu.Unlock()
		return "", pandastack.Errorf(pandastack.EUnavailable, "the server is shutting down")
	}
	n.preparing.Add(1)
	defer n.preparing.Done()
	s := n.sbx[id]
	had := s != nil
	if s == nil {
		s = &sandboxNet{ID: id, Policy: n.cfg.Default}
	}
	oldPolicy, oldComp := s.Policy, s.comp
	var comp Compiled
	if p != nil {
		s.Policy = p.Normalized()
		comp, err = n.compile(s.Policy)
	} else {
		// The sandbox's own policy (a resume): made under other openings,
		// perhaps.
		s.Policy, comp, err = n.compileKept(id, s.Policy)
	}
	if err != nil {
		n.mu.Unlock()
		return "", err
	}
	if s.up {
		n.mu.Unlock()
		n.teardown(s)
		n.mu.Lock()
	}
	slot := -1
	for i := range n.maxSlots() {
		if _, taken := n.slots[i]; !taken {
			slot = i
			break
		}
	}
	if slot < 0 {
		n.mu.Unlock()
		return "", pandastack.Errorf(pandastack.EUnavailable, "no free sandbox address in %s", n.cidr)
	}
	n.slots[slot] = id
	s.Slot = slot
	s.comp = comp
	n.sbx[id] = s
	n.mu.Unlock()
	defer func() {
		if err == nil {
			return
		}
		n.teardown(s)
		if had {
			// Its policy kept for the next Prepare: one set while it was
			// paused must not give way to the one of pause time. (Given
			// p, this Prepare replaced it: put back. Without, it is the
			// one it had, or one set since by SetPolicy.)
			n.mu.Lock()
			if p != nil {
				s.Policy, s.comp = oldPolicy, oldComp
			}
			n.mu.Unlock()
			if serr := n.saveState(s); serr != nil {
				n.log.Warn("keep the network policy of a sandbox whose network failed", "sandbox", id, "err", serr)
			}
			return
		}
		n.mu.Lock()
		delete(n.sbx, id)
		n.mu.Unlock()
		os.Remove(n.statePath(id))
	}()
	t0 := time.Now()
	if err := n.saveState(s); err != nil {
		return "", fmt.Errorf("network %s: %w", id, err)
	}
	t1 := time.Now()
	gw, addr := n.addrs(slot)
	if err := n.makeNamespace(id, n.veth(slot), gw, addr); err != nil {
		return "", fmt.Errorf("network %s: %w", id, err)
	}
	t2 := time.Now()
	n.nftMu.Lock()
	err = n.withConn(func(c *nftables.Conn) error { return n.fw.setSandbox(c, slot, n.veth(slot), addr, comp) })
	n.nftMu.Unlock()
	if err != nil {
		return "", fmt.Errorf("network %s: firewall: %w", id, err)
	}
	t3 := time.Now()
	if chainWritten != nil {
		chainWritten(id)
	}
	if err := n.startServices(s, gw, addr, comp); err != nil {
		return "", err
	}
	n.log.Debug("network prepared", "sandbox", id, "state_ms", ms(t1.Sub(t0)), "namespace_ms", ms(t2.Sub(t1)),
		"firewall_ms", ms(t3.Sub(t2)), "services_ms", ms(time.Since(t3)))
	return n.NSPath(id), nil
}

// Rename hands the network Prepare made for from, a sandbox prepared and
// not yet restored, to sandbox to, and returns the path of to's namespace
// (as Prepare does): to takes its namespace (pinned anew
// under to's name), veth, address and firewall chain, with to's own
// policy and egress log when it has them (a suspended sandbox keeps them
// through its pause), else from's policy. from's record goes. ENotFound
// if from has no network up, EConflict if to has one: then nothing
// changed. On another failure to's policy and log are as they were, and
// from's network may be gone: Release(from) removes what is left.
func (n *Network) Rename(from, to string) (_ string, err error) {
	n.mu.Lock()
	if n.closing {
		n.mu.Unlock()
		return "", pandastack.Errorf(pandastack.EUnavailable, "the server is shutting down")
	}
	sf, st := n.sbx[from], n.sbx[to]
	switch {
	case sf == nil || !sf.up || n.slots[sf.Slot] != from:
		n.mu.Unlock()
		return "", pandastack.Errorf(pandastack.ENotFound, "no network prepared for sandbox %s", from)
	case st != nil && st.up:
		n.mu.Unlock()
		return "", pandastack.Errorf(pandastack.EConflict, "sandbox %s has a network already", to)
	}
	n.preparing.Add(1)
	defer n.preparing.Done()
	fresh := st == nil
	if fresh {
		st = &sandboxNet{ID: to, Policy: sf.Policy}
	}
	slot, policy, fromComp := sf.Slot, st.Policy, sf.comp
	n.mu.Unlock()

	t0 := time.Now()
	pol, comp, err := n.compileKept(to, policy)
	if err != nil {
		return "", err
	}
	if err := n.pinAgain(n.NSPath(from), n.NSPath(to)); err != nil {
		return "", fmt.Errorf("network %s: %w", to, err)
	}
	t1 := time.Now()
	gw, addr := n.addrs(slot)
	// The chain from's policy made holds already when the two policies
	// compile alike (the default one, most often): rewriting it took
	// 10-30 ms on a busy host, on the resume's path.
	if !reflect.DeepEqual(comp, fromComp) {
		n.nftMu.Lock()
		err = n.withConn(func(c *nftables.Conn) error { return n.fw.setSandbox(c, slot, n.veth(slot), addr, comp) })
		n.nftMu.Unlock()
	}
	t2 := time.Now()
	if err != nil {
		n.removeNamespace(to)
		return "", fmt.Errorf("network %s: firewall: %w", to, err)
	}
	if chainWritten != nil {
		chainWritten(to)
	}
	// From here on to holds the slot: from's resolver and proxy, which
	// answer with from's policy and log, make way for to's own.
	n.mu.Lock()
	dns, px := sf.dns, sf.proxy
	sf.dns, sf.proxy, sf.up = nil, nil, false
	delete(n.sbx, from)
	n.slots[slot] = to
	switch cur := n.sbx[to]; {
	case cur != nil && cur != st:
		// A SetPolicy meanwhile recorded to's policy afresh: it stands
		// (startServices writes the chain with it).
		st.Policy, st.comp = cur.Policy, cur.comp
	case reflect.DeepEqual(st.Policy, policy):
		st.Policy, st.comp = pol, comp
	} // else a SetPolicy meanwhile changed st's policy: it stands
	st.Slot, st.hold = slot, false
	n.sbx[to] = st
	n.mu.Unlock()
	if dns != nil {
		dns.Close()
	}
	if px != nil {
		px.Close()
	}
	// to's record with the slot before from's goes: after a crash between
	// the two both claim it, and the next start removes from as an orphan
	// (to, still paused then, gets a new network at its resume); the other
	// way round to's record would name a slot another sandbox may hold.
	t3 := time.Now()
	err = n.saveState(st)
	var t4, t5 time.Time
	if err == nil {
		os.Remove(n.statePath(from))
		t4 = time.Now()
		n.removeNamespace(from)
		t5 = time.Now()
		err = n.startServices(st, gw, addr, comp)
	}
	if err != nil {
		n.teardown(st)
		if fresh {
			n.mu.Lock()
			delete(n.sbx, to)
			n.mu.Unlock()
			os.Remove(n.statePath(to))
		}
		return "", fmt.Errorf("network %s: %w", to, err)
	}
	n.log.Debug("network renamed", "from", from, "sandbox", to, "pin_ms", ms(t1.Sub(t0)), "firewall_ms", ms(t2.Sub(t1)),
		"handover_ms", ms(t3.Sub(t2)), "state_ms", ms(t4.Sub(t3)), "unpin_ms", ms(t5.Sub(t4)), "services_ms", ms(time.Since(t5)))
	return n.NSPath(to), nil
}

// pinAgain pins the namespace pinned at from at to as well (a bind mount),
// replacing what a crash may have left there.
func (n *Network) pinAgain(from, to string) error {
	if err := removePinned(to); err != nil {
		return err
	}
	f, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	if err := syscall.Mount(from, to, "", syscall.MS_BIND, ""); err != nil {
		os.Remove(to)
		return fmt.Errorf("pin namespace: %w", err)
	}
	return nil
}

// nftRecvBuffer is the receive buffer of our nftables sockets. The kernel
// acknowledges every message of a batch, and a sandbox's policy of
// MaxRules entries is hundreds of messages: with the default buffer (208 KiB) the
// acknowledgements of a policy over about 128 entries overflowed it
// (ENOBUFS), so a change the kernel had made was reported as failed.
const nftRecvBuffer = 8 << 20

// newNFT opens an nftables connection whose receive buffer holds the
// acknowledgements of the largest batch we send: SO_RCVBUFFORCE (we have
// CAP_NET_ADMIN, as nftables needs), else as much as net.core.rmem_max
// allows.
func newNFT() (*nftables.Conn, error) {
	return nftables.New(nftables.WithSockOptions(func(c *mdnetlink.Conn) error {
		raw, err := c.SyscallConn()
		if err == nil {
			var serr error
			if err = raw.Control(func(fd uintptr) {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, nftRecvBuffer)
			}); err == nil && serr == nil {
				return nil
			}
		}
		return c.SetReadBuffer(nftRecvBuffer)
	}))
}

func (n *Network) withConn(f func(*nftables.Conn) error) error {
	c, err := newNFT()
	if err != nil {
		return err
	}
	return f(c)
}

// chainWritten, when set (by tests), is called once Prepare or Rename has
// written a sandbox's chain and before its network is up: where a
// SetPolicy finds the network not up and only records the policy.
var chainWritten func(id string)

// Adopt takes over a running sandbox's namespace after a server restart:
// its veth comes up again, its chain and resolver are remade.
func (n *Network) Adopt(id string) error {
	n.mu.Lock()
	s := n.sbx[id]
	n.mu.Unlock()
	if s == nil || !n.nsExists(id) {
		return nil // it never had networking
	}
	pol, comp, err := n.compileKept(id, s.Policy)
	if err != nil {
		return err
	}
	if !slices.Equal(pol.AllowOut, s.Policy.AllowOut) {
		n.mu.Lock()
		s.Policy = pol
		serr := n.saveState(s)
		n.mu.Unlock()
		if serr != nil {
			return fmt.Errorf("network %s: %w", id, serr)
		}
	}
	l, err := netlink.LinkByName(n.veth(s.Slot))
	if err != nil {
		return fmt.Errorf("network %s: veth: %w", id, err)
	}
	// Its chain first, then its link: not a moment up without its policy.
	gw, addr := n.addrs(s.Slot)
	n.nftMu.Lock()
	err = n.withConn(func(c *nftables.Conn) error { return n.fw.setSandbox(c, s.Slot, n.veth(s.Slot), addr, comp) })
	n.nftMu.Unlock()
	if err != nil {
		return fmt.Errorf("network %s: firewall: %w", id, err)
	}
	// Connections tracked from before (opened under the policy as it was,
	// which the operator's openings may since have narrowed) go on only
	// if this policy allows them: an established one is accepted before
	// any sandbox's chain. Cut before the link is up again.
	n.cutRefusedFlows(s, addr, nil, comp)
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("network %s: %w", id, err)
	}
	n.mu.Lock()
	n.slots[s.Slot] = id
	if reflect.DeepEqual(s.Policy, pol) {
		s.comp = comp
	} // else a SetPolicy meanwhile recorded its own: startServices writes the chain with it
	n.mu.Unlock()
	return n.startServices(s, gw, addr, comp)
}

// compile is Compile with this server's deny set and openings, and the
// sandbox range closed whatever the openings say: other sandboxes are
// never reachable, so an entry wholly inside their range would be accepted
// in vain (a wider one, 0.0.0.0/0 say, is fine: the rest of it works).
func (n *Network) compile(p pandastack.NetworkPolicy) (Compiled, error) {
	c, err := Compile(p, n.deny, n.cfg.AllowPrivate)
	if err != nil {
		return c, err
	}
	for i, e := range p.AllowOut {
		if pfx, err := prefix(e); err == nil && n.cidr.IsValid() && pfx.Bits() >= n.cidr.Bits() && n.cidr.Contains(pfx.Addr()) {
			return c, pandastack.Errorf(pandastack.ENetworkDenied, "network.allow_out[%d]: %s is inside the sandbox range (%s): other sandboxes are never reachable", i, pfx, n.cidr)
		}
	}
	return c, nil
}

// compileKept compiles a policy a sandbox already has (a resume, or a
// sandbox taken over after a restart). One made while the server opened a
// private range (--network-allow-private) that it no longer opens would
// not compile, and the sandbox would be lost for it: the allow_out entries
// now inside the platform deny set are dropped instead (the firewall
// refuses those destinations either way), with a warning.
func (n *Network) compileKept(id string, p pandastack.NetworkPolicy) (pandastack.NetworkPolicy, Compiled, error) {
	comp, err := n.compile(p)
	if !pandastack.IsCode(err, pandastack.ENetworkDenied) {
		return p, comp, err
	}
	kept := p
	kept.AllowOut = nil
	var dropped []string
	for _, e := range p.AllowOut {
		one := pandastack.NetworkPolicy{AllowOut: []string{e}}
		if _, err := n.compile(one); pandastack.IsCode(err, pandastack.ENetworkDenied) {
			dropped = append(dropped, e)
			continue
		}
		kept.AllowOut = append(kept.AllowOut, e)
	}
	kept = kept.Normalized()
	comp, cerr := n.compile(kept)
	if cerr != nil {
		return p, Compiled{}, err // not only that: the first error stands
	}
	n.log.Warn("the sandbox's network policy allows destinations the server no longer opens (--network-allow-private); they are dropped from it",
		"sandbox", id, "dropped", dropped)
	return kept, comp, nil
}

// Kept returns a stored policy (a snapshot's) as this server can enforce
// it for sandbox id: allow_out entries it no longer opens
// (--network-allow-private) are dropped, with a warning, as a resume drops
// them. A policy that does not compile for another reason is returned as
// it is, for Prepare to refuse.
func (n *Network) Kept(id string, p pandastack.NetworkPolicy) pandastack.NetworkPolicy {
	kept, _, err := n.compileKept(id, p)
	if err != nil {
		return p
	}
	return kept
}

// SetPolicy replaces a sandbox's policy at once; a policy that does not
// validate changes nothing. For a sandbox with no network now (a paused
// one, whose runtime was stopped) it is kept for its next Prepare. On
// failure the policy stays the one it was. A sandbox whose network is up
// with that policy already, its chain written with it, is left alone:
// the chain's rewrite and two scans of the host's connections took 18 ms
// of a fork's child, restored into a container prepared with the
// server's default policy, which its parent had too.
func (n *Network) SetPolicy(id string, p pandastack.NetworkPolicy) error {
	return n.setPolicy(id, p, true)
}

// setPolicy is SetPolicy; cut says to end the sandbox's connections the
// new policy refuses, which one that has not run since its network was
// made (a prepared restore's) has none of.
func (n *Network) setPolicy(id string, p pandastack.NetworkPolicy, cut bool) error {
	comp, err := n.compile(p)
	if err != nil {
		return err
	}
	n.mu.Lock()
	after, err := n.setPolicyLocked(id, p, comp, cut)
	n.mu.Unlock()
	if after != nil {
		// Outside n.mu: two dumps of the host's connection tracking, which
		// every sandbox's DNS answers, proxied connections and creates
		// would otherwise wait for.
		after()
	}
	return err
}

// setPolicyLocked is setPolicy with n.mu held; after, if not nil, is what
// remains to do once it is released (ending the connections the new
// policy refuses).
func (n *Network) setPolicyLocked(id string, p pandastack.NetworkPolicy, comp Compiled, cut bool) (after func(), _ error) {
	s := n.sbx[id]
	if s != nil && s.up && !s.chainStale && samePolicy(s.Policy, p) && reflect.DeepEqual(s.comp, comp) {
		return nil, nil
	}
	if s == nil {
		s = &sandboxNet{ID: id, Slot: -1, Policy: p.Normalized(), comp: comp}
		if err := n.saveState(s); err != nil {
			return nil, fmt.Errorf("network %s: %w", id, err)
		}
		n.sbx[id] = s
		return nil, nil
	}
	_, addr := n.addrs(s.Slot)
	write := func(comp Compiled) error {
		n.nftMu.Lock()
		defer n.nftMu.Unlock()
		return n.withConn(func(c *nftables.Conn) error { return n.fw.setSandbox(c, s.Slot, n.veth(s.Slot), addr, comp) })
	}
	if s.up {
		if err := write(comp); err != nil {
			// The kernel may have taken the rules all the same.
			s.chainStale = true
			return nil, fmt.Errorf("network %s: firewall: %w", id, err)
		}
		s.chainStale = false
	}
	old := s.Policy
	s.Policy = p.Normalized()
	if err := n.saveState(s); err != nil {
		s.Policy = old
		if s.up {
			// Its chain goes back to the policy it keeps.
			if werr := write(s.comp); werr != nil {
				s.chainStale = true
				n.log.Warn("putting a sandbox's firewall back after a failed policy change", "sandbox", id, "err", werr)
			}
		}
		return nil, fmt.Errorf("network %s: %w", id, err)
	}
	// Once the change stands: a failed one cuts nothing.
	if s.up && cut {
		old := s.comp
		after = func() {
			// Not if a later change came meanwhile: its own cut follows,
			// and this one could end what it allows again.
			n.mu.Lock()
			current := reflect.DeepEqual(s.comp, comp)
			n.mu.Unlock()
			if current {
				n.cutRefusedFlows(s, addr, &old, comp)
			}
		}
	}
	s.comp = comp
	return after, nil
}

// samePolicy says whether a and b are the same policy (nil and empty lists
// alike).
func samePolicy(a, b pandastack.NetworkPolicy) bool {
	a, b = a.Normalized(), b.Normalized()
	return a.AllowInternetAccess == b.AllowInternetAccess && slices.Equal(a.AllowOut, b.AllowOut) && slices.Equal(a.DenyOut, b.DenyOut)
}

// Down removes the sandbox's namespace, veth, chain and resolver but keeps
// its policy for a later Prepare (pause).
func (n *Network) Down(id string) {
	n.mu.Lock()
	s := n.sbx[id]
	n.mu.Unlock()
	if s != nil {
		n.teardown(s)
	} else {
		n.removeNamespace(id)
	}
}

// Release removes everything of the sandbox, its policy too. Releasing an
// unknown sandbox is not an error. After Hold, one Release is only a Down.
func (n *Network) Release(id string) {
	n.Down(id)
	n.mu.Lock()
	if s := n.sbx[id]; s != nil && s.hold {
		s.hold = false
		n.mu.Unlock()
		return
	}
	delete(n.sbx, id)
	n.mu.Unlock()
	os.Remove(n.statePath(id))
}

// Known lists the sandboxes whose policy the network keeps: running or
// paused ones, and those whose state an earlier run left.
func (n *Network) Known() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	ids := make([]string, 0, len(n.sbx))
	for id := range n.sbx {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Hold keeps a sandbox's policy and egress log through the next Release:
// a pause stops the sandbox's runtime, and its resume is a new Prepare.
func (n *Network) Hold(id string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s := n.sbx[id]; s != nil {
		s.hold = true
	}
}

// teardown undoes Prepare for s, whatever part of it was done.
func (n *Network) teardown(s *sandboxNet) {
	n.mu.Lock()
	dns, px := s.dns, s.proxy
	s.dns, s.proxy, s.up = nil, nil, false
	owner, held := n.slots[s.Slot]
	n.mu.Unlock()
	if dns != nil {
		dns.Close()
	}
	if px != nil {
		px.Close()
	}
	if held && owner == s.ID {
		n.nftMu.Lock()
		if err := n.withConn(func(c *nftables.Conn) error { return n.fw.removeSandbox(c, s.Slot) }); err != nil {
			n.log.Warn("remove firewall chain", "sandbox", s.ID, "err", err)
		}
		n.nftMu.Unlock()
		if l, err := netlink.LinkByName(n.veth(s.Slot)); err == nil {
			netlink.LinkDel(l) // takes the peer with it, at once
		}
		// Its connections go too: the next sandbox at its address would
		// otherwise get what their far ends still send (its tracking of a
		// silent established TCP connection lasts days), and a resume
		// would find them open past its flow limit.
		_, addr := n.addrs(s.Slot)
		n.forgetFlows(addr)
	}
	n.removeNamespace(s.ID)
	n.mu.Lock()
	if n.slots[s.Slot] == s.ID {
		delete(n.slots, s.Slot)
	}
	n.mu.Unlock()
}

func (n *Network) removeNamespace(id string) {
	if err := removePinned(n.NSPath(id)); err != nil {
		n.log.Warn("remove network namespace", "sandbox", id, "err", err)
	}
}

// removePinned unpins a namespace: it unmounts every bind mount stacked on
// path, then removes the file. netns.DeleteNamed unmounts once and gives
// up on the first error; under heavy load (load above 100 here) the
// remove then failed with EBUSY, and a later one found the file no longer
// a mount point (EINVAL) and left it, so the sandbox's next Prepare (its
// resume) failed with "file exists". A missing path is not an error.
func removePinned(path string) error {
	var err error
	for attempt := range 5 {
		for syscall.Unmount(path, syscall.MNT_DETACH) == nil {
		}
		err = os.Remove(path)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if !errors.Is(err, syscall.EBUSY) {
			return err
		}
		time.Sleep(10 * time.Millisecond << attempt)
	}
	return err
}

// ownMount makes dir (/run/netns) a mount of its own, a bind of itself,
// unless it is one already or already holds mounts. iproute2's `ip netns
// add` (run by an admin, or a test) makes it one when it is not: that
// bind hides every namespace pinned in dir before it, which then can be
// neither unmounted through its path (EINVAL) nor removed (EBUSY), so
// those sandboxes could never be paused and resumed again. Done before our
// first pin, iproute2 finds a mount and only changes its propagation.
func ownMount(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dir = filepath.Clean(dir)
	mounts, err := mountinfo.Under(dir)
	if err != nil {
		return err
	}
	if slices.Contains(mounts, dir) {
		return nil
	}
	if len(mounts) > 0 {
		return fmt.Errorf("%s holds mounts (%s) but is no mount itself: a later `ip netns add` would hide them", dir, mounts[0])
	}
	return syscall.Mount(dir, dir, "", syscall.MS_BIND, "")
}

// vethMTU is the MTU of both ends of a sandbox's veth. gVisor's netstack
// pays per packet, so larger packets between the sandbox and the host (the
// port proxy, the domain proxy, DNS) cost it less; TCP to the internet
// still takes the remote's smaller MSS, and the host fragments or answers
// "fragmentation needed" for anything else, as on any router.
const vethMTU = 65000

// makeNamespace pins a new namespace with the sandbox end of a veth pair
// (eth0, addr/30, default route via gw) and the host end (gw/30, up).
func (n *Network) makeNamespace(id, veth string, gw, addr netip.Addr) error {
	name := n.nsName(id)
	if err := removePinned(n.NSPath(id)); err != nil { // left by a crash, or a failed removal
		return fmt.Errorf("create namespace: remove the old one: %w", err)
	}
	if l, err := netlink.LinkByName(veth); err == nil {
		netlink.LinkDel(l) // left by a crash
	}
	ns, err := newNamed(name)
	if err != nil {
		return fmt.Errorf("create namespace: %w", err)
	}
	defer ns.Close()
	la := netlink.NewLinkAttrs()
	la.Name = veth
	la.MTU = vethMTU // the peer takes the same
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	host, err := netlink.LinkByName(veth)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: ipnet(gw, 30)}); err != nil {
		return fmt.Errorf("gateway address: %w", err)
	}
	// No IPv6 address on the host's end (a link-local one comes with the
	// link otherwise): sandboxes have IPv4 only. On a host without IPv6
	// the file is missing, which is as good.
	os.WriteFile("/proc/sys/net/ipv6/conf/"+veth+"/disable_ipv6", []byte("1"), 0o644)
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	for _, name := range []string{"lo", "eth0"} {
		l, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		if name == "eth0" {
			if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipnet(addr, 30)}); err != nil {
				return fmt.Errorf("sandbox address: %w", err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			return err
		}
	}
	eth0, _ := h.LinkByName("eth0")
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: net.IP(gw.AsSlice())}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// newNamed creates and pins a named namespace without leaving the calling
// goroutine's thread in it.
func newNamed(name string) (netns.NsHandle, error) {
	type result struct {
		ns  netns.NsHandle
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{err: err}
			return
		}
		defer orig.Close()
		ns, err := netns.NewNamed(name)
		if serr := netns.Set(orig); serr != nil {
			// The thread stays in the wrong namespace: let it die with the
			// goroutine rather than return to the pool.
			ch <- result{ns, err}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{ns, err}
	}()
	r := <-ch
	return r.ns, r.err
}

func ipnet(a netip.Addr, bits int) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}
}

// Drain refuses new Prepares and waits for those under way, so a boot
// that was starting during shutdown cannot make a namespace after the
// last sweep. Close drains too.
func (n *Network) Drain() {
	n.mu.Lock()
	n.closing = true
	n.mu.Unlock()
	n.preparing.Wait()
}

// Close stops the resolvers and removes the firewall table. Sandboxes left
// running (a server restart without --kill-on-exit) keep their namespaces
// with their veths down, so they reach nothing until the next start
// adopts them.
func (n *Network) Close() error {
	n.Drain()
	n.mu.Lock()
	if n.stopFlows != nil {
		close(n.stopFlows)
		n.stopFlows = nil
		n.mu.Unlock()
		<-n.flowsDone
		n.mu.Lock()
	}
	var all []*sandboxNet
	for _, s := range n.sbx {
		all = append(all, s)
	}
	n.mu.Unlock()
	for _, s := range all {
		n.mu.Lock()
		dns, px := s.dns, s.proxy
		s.dns, s.proxy, s.up = nil, nil, false
		n.mu.Unlock()
		if dns != nil {
			dns.Close()
		}
		if px != nil {
			px.Close()
		}
		if l, err := netlink.LinkByName(n.veth(s.Slot)); err == nil {
			netlink.LinkSetDown(l)
		}
	}
	// Tried again on failure: several servers stopping at once change the
	// ruleset together, and a table left behind outlives its server (a
	// bench run left three).
	var err error
	for try := range 5 {
		n.nftMu.Lock()
		err = n.withConn(func(c *nftables.Conn) error { return n.fw.remove(c) })
		n.nftMu.Unlock()
		if err == nil {
			break
		}
		n.log.Warn("removing the firewall table; trying again", "table", n.fw.table.Name, "err", err)
		time.Sleep(time.Duration(try+1) * 100 * time.Millisecond)
	}
	if n.refused != nil {
		n.refused.Close()
		<-n.refDone
		n.refused = nil
	}
	return err
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
