package network

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The firewall is one inet table per server instance, holding:
//
//	forward (hook): from our veths → jump out; to our veths → jump in
//	input   (hook): from our veths → jump host
//	prerouting (nat hook): DNS from our veths → redirect to the resolver on the gateway
//	postrouting (nat hook): from our range to anywhere but our veths → masquerade
//	out:      cut connections → refused; established → accept; IPv6 → reject; jump platform;
//	          per veth → goto sbx_N
//	platform: other sandboxes → refused; opened private ranges → return; deny set → refused
//	sbx_N:    the sandbox's policy (anti-spoofing, jump lim_N, allow_out entries inside opened
//	          ranges, the opened ranges → refused, other allow_out, deny_out, internet)
//	lim_N:    a new connection past the sandbox's flow limit → refused
//	in:       established → accept; else reject
//	host:     per veth → jump lim_N; established, DNS and the domain proxy → accept; else refused
//	refused:  per veth → log to the NFLOG group (rate-limited); then goto reject
//	reject:   TCP → reset; anything else → ICMP administratively prohibited
//
// Rejects rather than drops: a blocked connect fails at once inside the
// sandbox instead of hanging until its timeout. What a sandbox sends that
// is refused goes through "refused" with a mark saying why (refusedPlatform,
// ...), so the egress log lists it.
type firewall struct {
	table  *nftables.Table
	prefix string // veth name prefix of this instance
	group  uint16 // NFLOG group refused packets are logged to; 0: not logged
	out    *nftables.Chain
	pre    *nftables.Chain // nat prerouting: per-sandbox jumps to the domain proxy redirects
	refus  *nftables.Chain // per-sandbox logging of refused packets
	host   *nftables.Chain // what sandboxes send to the host: per-sandbox jumps to their flow limit
	// maxFlows is each sandbox's limit of connections open at once
	// (network.Config.MaxFlows); 0: none.
	maxFlows uint32
	// open are the private ranges the operator opened to policies
	// (network.Config.AllowPrivate); install sets it.
	open []netip.Prefix
}

// refuse marks a packet with why it is refused and sends it to the
// "refused" chain, which logs and rejects it.
func refuse(why uint32) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binary.NativeEndian.AppendUint32(nil, why)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
		&expr.Verdict{Kind: expr.VerdictGoto, Chain: "refused"},
	}
}

func chainRef(t *nftables.Table, name string) *nftables.Chain {
	return &nftables.Chain{Name: name, Table: t}
}

// install (re)creates the instance's table from nothing. A table a crashed
// server left is deleted in the same batch that makes the new one: an
// nftables batch applies whole, so its sandboxes, whose veths are still
// up, meet no moment without a firewall.
func (f *firewall) install(c *nftables.Conn, cidr netip.Prefix, deny, open []netip.Prefix) error {
	f.open = open
	if old, _ := c.ListTableOfFamily(f.table.Name, nftables.TableFamilyINet); old != nil {
		c.DelTable(f.table)
	}
	t := c.AddTable(f.table)
	accept := nftables.ChainPolicyAccept
	hook := func(name string, typ nftables.ChainType, h *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Type: typ, Hooknum: h, Priority: prio, Policy: &accept})
	}
	forward := hook("forward", nftables.ChainTypeFilter, nftables.ChainHookForward, nftables.ChainPriorityFilter)
	input := hook("input", nftables.ChainTypeFilter, nftables.ChainHookInput, nftables.ChainPriorityFilter)
	pre := hook("prerouting", nftables.ChainTypeNAT, nftables.ChainHookPrerouting, nftables.ChainPriorityNATDest)
	post := hook("postrouting", nftables.ChainTypeNAT, nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
	reject := c.AddChain(&nftables.Chain{Name: "reject", Table: t})
	f.out = c.AddChain(&nftables.Chain{Name: "out", Table: t})
	f.pre = pre
	in := c.AddChain(&nftables.Chain{Name: "in", Table: t})
	host := c.AddChain(&nftables.Chain{Name: "host", Table: t})
	f.host = host
	platform := c.AddChain(&nftables.Chain{Name: "platform", Table: t})
	f.refus = c.AddChain(&nftables.Chain{Name: "refused", Table: t})

	rule := func(ch *nftables.Chain, ex ...expr.Any) { c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: ex}) }
	cat := func(parts ...[]expr.Any) []expr.Any {
		var all []expr.Any
		for _, p := range parts {
			all = append(all, p...)
		}
		return all
	}
	rule(reject, cat(l4proto(unix.IPPROTO_TCP), []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}})...)
	rule(reject, &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED})
	rule(f.refus, jump(expr.VerdictGoto, "reject")...) // per-sandbox logging rules go before this

	rule(forward, cat(ifname(unix.NFT_META_IIFNAME, f.prefix, true, expr.CmpOpEq), jump(expr.VerdictJump, "out"))...)
	// A veth of ours with no chain of its own yet (a crashed server's
	// sandbox, until this one adopts it) comes back from "out": refused,
	// not let through by the hook's accept. A known one never comes back,
	// every sandbox's chain ends in a verdict.
	rule(forward, cat(ifname(unix.NFT_META_IIFNAME, f.prefix, true, expr.CmpOpEq), refuse(refusedPolicy))...)
	rule(forward, cat(ifname(unix.NFT_META_OIFNAME, f.prefix, true, expr.CmpOpEq), jump(expr.VerdictJump, "in"))...)
	rule(input, cat(ifname(unix.NFT_META_IIFNAME, f.prefix, true, expr.CmpOpEq), jump(expr.VerdictJump, "host"))...)

	rule(f.out, cat(cutFlow(), refuse(refusedPolicy))...)
	rule(f.out, cat(established(), jump(expr.VerdictAccept, ""))...)
	rule(f.out, cat(nfproto(unix.NFPROTO_IPV6), jump(expr.VerdictGoto, "reject"))...)
	rule(f.out, jump(expr.VerdictJump, "platform")...)
	// Per-sandbox rules are appended here; an unknown veth returns, and
	// the forward hook refuses it.
	rule(in, cat(established(), jump(expr.VerdictAccept, ""))...)
	rule(in, jump(expr.VerdictGoto, "reject")...)
	// IPv6 is not the sandboxes' (their addresses and the policy are IPv4):
	// nothing of it reaches the host's services, whatever they listen on.
	rule(host, cat(nfproto(unix.NFPROTO_IPV6), jump(expr.VerdictGoto, "reject"))...)
	rule(host, cat(established(), jump(expr.VerdictAccept, ""))...)
	// Only its own gateway's services: not another sandbox's gateway, nor
	// anything else of the host's listening on those ports.
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		rule(host, cat(ownGateway(), cat(l4proto(proto), dport(53)), jump(expr.VerdictAccept, ""))...)
	}
	for _, port := range []uint16{proxyHTTPPort, proxyTLSPort} {
		rule(host, cat(ownGateway(), l4proto(unix.IPPROTO_TCP), dport(port), jump(expr.VerdictAccept, ""))...)
	}
	rule(host, refuse(refusedHost)...)

	rule(platform, cat(daddr(cidr), refuse(refusedPlatform))...)
	for _, p := range open {
		rule(platform, cat(daddr(p), jump(expr.VerdictReturn, ""))...)
	}
	for _, p := range deny {
		rule(platform, cat(daddr(p), refuse(refusedPlatform))...)
	}

	// DNS of any destination goes to our resolver on the sandbox's gateway.
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		rule(pre, cat(ifname(unix.NFT_META_IIFNAME, f.prefix, true, expr.CmpOpEq), nfproto(unix.NFPROTO_IPV4), l4proto(proto), dport(53), []expr.Any{&expr.Redir{}})...)
	}
	rule(post, cat(saddr(cidr), ifname(unix.NFT_META_OIFNAME, f.prefix, true, expr.CmpOpNeq), []expr.Any{&expr.Masq{}})...)
	_ = in
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install table %s: %w", f.table.Name, err)
	}
	return nil
}

// remove deletes the instance's table; a missing table is not an error.
func (f *firewall) remove(c *nftables.Conn) error {
	if t, _ := c.ListTableOfFamily(f.table.Name, nftables.TableFamilyINet); t == nil {
		return nil
	}
	c.DelTable(f.table)
	return c.Flush()
}

func slotTag(slot int) []byte { return []byte("sbx:" + strconv.Itoa(slot)) }

// setSandbox (re)writes a sandbox's chain and its jump in one batch, so a
// policy change applies whole or not at all.
func (f *firewall) setSandbox(c *nftables.Conn, slot int, veth string, addr netip.Addr, p Compiled) error {
	name := "sbx_" + strconv.Itoa(slot)
	ch := c.AddChain(&nftables.Chain{Name: name, Table: f.table})
	c.FlushChain(ch)
	rule := func(ex ...expr.Any) { c.AddRule(&nftables.Rule{Table: f.table, Chain: ch, Exprs: ex}) }
	cat := func(a, b []expr.Any) []expr.Any { return append(append([]expr.Any{}, a...), b...) }
	// Only the sandbox's own address leaves its veth.
	rule(cat(saddrNot(addr), jump(expr.VerdictDrop, ""))...)
	lim := "lim_" + strconv.Itoa(slot)
	if f.maxFlows > 0 {
		// The count is the rule's own: the kernel keeps the connections
		// it matched and forgets each once its tracking ends (a TCP one
		// once closed). Established packets never reach it. Made once per
		// sandbox and never rewritten: a new rule would count from zero,
		// and each policy change would let the sandbox open as many again.
		if !f.hasChain(c, lim) {
			lch := c.AddChain(&nftables.Chain{Name: lim, Table: f.table})
			c.AddRule(&nftables.Rule{Table: f.table, Chain: lch, Exprs: cat(ctNew(), append([]expr.Any{
				&expr.Connlimit{Count: f.maxFlows, Flags: expr.NFT_CONNLIMIT_F_INV}}, refuse(refusedFlows)...))})
		}
		rule(jump(expr.VerdictJump, lim)...)
	}
	if p.DomainRules() {
		// QUIC cannot be checked by name: clients fall back to TCP.
		rule(cat(l4proto(unix.IPPROTO_UDP), append(dport(443), refuse(refusedQUIC)...))...)
	}
	// An opened private range (the platform chain returned for it) only
	// through an entry inside it: internet access, or a wider entry,
	// does not reach it (decideAddr).
	for _, n := range p.AllowNet {
		if within(n, f.open) {
			rule(cat(daddr(n), jump(expr.VerdictAccept, ""))...)
		}
	}
	for _, o := range f.open {
		rule(cat(daddr(o), refuse(refusedPlatform))...)
	}
	for _, n := range p.AllowNet {
		if !within(n, f.open) {
			rule(cat(daddr(n), jump(expr.VerdictAccept, ""))...)
		}
	}
	for _, n := range p.DenyNet {
		rule(cat(daddr(n), refuse(refusedPolicy))...)
	}
	if !p.Internet {
		rule(refuse(refusedPolicy)...)
	}
	rule(jump(expr.VerdictAccept, "")...)

	// While domain rules are in force, HTTP and TLS go to the domain proxy.
	nat := c.AddChain(&nftables.Chain{Name: "nat_" + strconv.Itoa(slot), Table: f.table, Type: nftables.ChainTypeNAT})
	c.FlushChain(nat)
	if p.DomainRules() {
		for _, m := range [][2]uint16{{80, proxyHTTPPort}, {443, proxyTLSPort}} {
			port := make([]byte, 2)
			binary.BigEndian.PutUint16(port, m[1])
			c.AddRule(&nftables.Rule{Table: f.table, Chain: nat, Exprs: append(append(l4proto(unix.IPPROTO_TCP), dport(m[0])...),
				&expr.Immediate{Register: 1, Data: port}, &expr.Redir{RegisterProtoMin: 1})})
		}
	}

	rules, err := c.GetRules(f.table, f.out)
	if err != nil {
		return err
	}
	if !hasTag(rules, slotTag(slot)) {
		c.AddRule(&nftables.Rule{Table: f.table, Chain: f.out, UserData: slotTag(slot),
			Exprs: append(ifname(unix.NFT_META_IIFNAME, veth, false, expr.CmpOpEq), jump(expr.VerdictGoto, name)...)})
	}
	if f.group != 0 {
		if rules, err = c.GetRules(f.table, f.refus); err != nil {
			return err
		}
		if !hasTag(rules, slotTag(slot)) {
			// Its own limit per sandbox: one sandbox's flood cannot crowd
			// out another's entries.
			c.InsertRule(&nftables.Rule{Table: f.table, Chain: f.refus, UserData: slotTag(slot),
				Exprs: append(ifname(unix.NFT_META_IIFNAME, veth, false, expr.CmpOpEq),
					&expr.Limit{Type: expr.LimitTypePkts, Rate: refusedLogRate, Unit: expr.LimitTimeSecond, Burst: refusedLogBurst},
					&expr.Log{Key: 1<<unix.NFTA_LOG_GROUP | 1<<unix.NFTA_LOG_SNAPLEN | 1<<unix.NFTA_LOG_QTHRESHOLD,
						Group: f.group, Snaplen: refusedSnaplen, QThreshold: 1})})
		}
	}
	if f.maxFlows > 0 {
		// DNS and the domain proxy count too: every query from a new port
		// is a tracked flow of its own.
		if rules, err = c.GetRules(f.table, f.host); err != nil {
			return err
		}
		if !hasTag(rules, slotTag(slot)) {
			c.InsertRule(&nftables.Rule{Table: f.table, Chain: f.host, UserData: slotTag(slot),
				Exprs: append(ifname(unix.NFT_META_IIFNAME, veth, false, expr.CmpOpEq), jump(expr.VerdictJump, lim)...)})
		}
	}
	if rules, err = c.GetRules(f.table, f.pre); err != nil {
		return err
	}
	if !hasTag(rules, slotTag(slot)) {
		c.AddRule(&nftables.Rule{Table: f.table, Chain: f.pre, UserData: slotTag(slot),
			Exprs: append(ifname(unix.NFT_META_IIFNAME, veth, false, expr.CmpOpEq), jump(expr.VerdictGoto, "nat_"+strconv.Itoa(slot))...)})
	}
	return c.Flush()
}

// probeConnlimit loads a rule that counts connections, as every
// sandbox's flow limit does, and removes it: a kernel without
// nft_connlimit refuses it.
func (f *firewall) probeConnlimit(c *nftables.Conn) error {
	ch := c.AddChain(&nftables.Chain{Name: "probe_flows", Table: f.table})
	c.AddRule(&nftables.Rule{Table: f.table, Chain: ch, Exprs: append(ctNew(), &expr.Connlimit{Count: 1, Flags: expr.NFT_CONNLIMIT_F_INV}, &expr.Verdict{Kind: expr.VerdictDrop})})
	err := c.Flush()
	c.DelChain(ch)
	if derr := c.Flush(); err == nil {
		err = derr
	}
	return err
}

// hasChain reports whether the instance's table has chain name.
func (f *firewall) hasChain(c *nftables.Conn, name string) bool {
	ch, err := c.ListChain(f.table, name)
	return err == nil && ch != nil
}

// removeSandbox deletes a sandbox's jump and chain; missing ones are fine.
func (f *firewall) removeSandbox(c *nftables.Conn, slot int) error {
	for _, ch := range []*nftables.Chain{f.out, f.pre, f.refus, f.host} {
		rules, err := c.GetRules(f.table, ch)
		if err != nil {
			return err
		}
		for _, r := range rules {
			if string(r.UserData) == string(slotTag(slot)) {
				if err := c.DelRule(r); err != nil {
					return err
				}
			}
		}
	}
	if err := c.Flush(); err != nil {
		return err
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return err
	}
	// In this order: sbx_N jumps to lim_N, which can go only once nothing
	// does.
	for _, name := range []string{"sbx_", "nat_", "lim_"} {
		for _, ch := range chains {
			if ch.Table.Name == f.table.Name && ch.Name == name+strconv.Itoa(slot) {
				c.DelChain(ch)
			}
		}
	}
	return c.Flush()
}

func hasTag(rules []*nftables.Rule, tag []byte) bool {
	for _, r := range rules {
		if string(r.UserData) == string(tag) {
			return true
		}
	}
	return false
}

// Expression helpers. Each match loads into register 1 and compares.

func jump(kind expr.VerdictKind, chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: kind, Chain: chain}}
}

// ifname matches the in/out interface name, whole or by prefix (the kernel
// compares only as many bytes as given, so a prefix leaves out the NUL).
func ifname(key expr.MetaKey, name string, prefix bool, op expr.CmpOp) []expr.Any {
	data := []byte(name)
	if !prefix {
		data = make([]byte, unix.IFNAMSIZ)
		copy(data, name)
	}
	return []expr.Any{&expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: op, Register: 1, Data: data}}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

func l4proto(p byte) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}}}
}

func dport(port uint16) []expr.Any {
	b := make([]byte, 2)
	binary.BigEndian.PutUint16(b, port)
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

// ctNew matches the first packet of a connection.
func ctNew() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitNEW)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// ownGateway matches packets addressed to an address of the interface
// they came in on: from a sandbox's veth, its gateway.
func ownGateway() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, FlagIIF: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)},
	}
}

// ctMarkCut is the conntrack mark of a TCP connection a narrowed policy
// refuses (cutRefusedFlows): what the sandbox sends on it is refused, with
// a reset, while what the server sends still reaches the sandbox, whose
// answer (an ACK) then meets that reset. A connection the sandbox only
// reads from ends at the server's next segment instead of hanging.
const ctMarkCut = 0x70645f63 // "pd_c"

func cutFlow() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeyMARK},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, ctMarkCut)},
	}
}

func established() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

// addrMatch matches the IPv4 source (offset 12) or destination (16) address
// against p.
func addrMatch(offset uint32, p netip.Prefix, op expr.CmpOp) []expr.Any {
	p = p.Masked()
	a := p.Addr().As4()
	mask := net4Mask(p.Bits())
	ex := append(nfproto(unix.NFPROTO_IPV4), &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4})
	if p.Bits() < 32 {
		ex = append(ex, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)})
	}
	return append(ex, &expr.Cmp{Op: op, Register: 1, Data: a[:]})
}

func daddr(p netip.Prefix) []expr.Any { return addrMatch(16, p, expr.CmpOpEq) }
func saddr(p netip.Prefix) []expr.Any { return addrMatch(12, p, expr.CmpOpEq) }
func saddrNot(a netip.Addr) []expr.Any {
	return addrMatch(12, netip.PrefixFrom(a, 32), expr.CmpOpNeq)
}

func net4Mask(bits int) []byte {
	m := make([]byte, 4)
	binary.BigEndian.PutUint32(m, ^uint32(0)<<(32-bits))
	if bits == 0 {
		return make([]byte, 4)
	}
	return m
}
