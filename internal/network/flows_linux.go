package network

import (
	"net/netip"
	"os"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Connections through NAT do not pass the domain proxy; the egress log
// learns of them from the kernel's connection tracking, read once a second,
// and from its events of their ends (ctevents_linux.go).
// A TCP connection is logged when it closes (or its tracking ends), a UDP
// flow when its tracking times out, with the bytes each way (which needs
// net.netfilter.nf_conntrack_acct=1: New sets it). Flows to the sandbox's
// gateway (DNS, the domain proxy) are logged by those instead.

type flowKey struct {
	proto    uint8
	src, dst netip.AddrPort
}

type flowSeen struct {
	first   time.Time
	out, in uint64
	sbx     *sandboxNet
	logged  bool
	rule    string    // what let it through, as the policy was when it was first seen
	gone    time.Time // when the poll found it gone from the table (flowsGone)
}

const tcpTimeWait = 7 // conntrack's TCP state after a close

func enableConntrackAcct() {
	os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_acct", []byte("1"), 0o644)
}

// watchFlows polls the tracking table and reads the end events of ev (nil:
// none, evErr says why), which the caller opened before any sandbox's
// network was up: a subscription opened here, once this goroutine ran,
// missed the ends that came before it (a connect refused right after New).
func (n *Network) watchFlows(stop <-chan struct{}, ev *ctEvents, evErr error) {
	seen := map[flowKey]*flowSeen{}
	var ended chan endedFlow // nil: no events, the poll alone
	if ev == nil {
		n.log.Warn("connections shorter than a second (a connect refused by the remote) will not be in the egress log", "err", evErr)
	} else {
		// Room for the ends that come while a poll reads the table (a busy
		// host's is long): past it the reader waits, and the socket's own
		// buffer fills and drops (ENOBUFS).
		ended = make(chan endedFlow, 4096)
		done := make(chan struct{})
		go func() {
			defer close(done)
			ev.read(ended, stop)
		}()
		defer func() {
			ev.close()
			<-done
		}()
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case f := <-ended:
			n.flowEnded(seen, f)
		case <-t.C:
			n.pollFlows(seen, ended != nil)
		}
	}
}

// goneKeep is how long a flow the poll found gone stays in its record
// when end events come: its event, which may come after the poll, finds
// it logged rather than logging it twice.
const goneKeep = 10 * time.Second

// flowEnded logs a tracked connection that ended: one the poll saw and has
// not logged yet, or one too short for it to see.
func (n *Network) flowEnded(seen map[flowKey]*flowSeen, f endedFlow) {
	src, dst := f.key.src.Addr(), f.key.dst.Addr()
	if !n.cidr.Contains(src) || n.cidr.Contains(dst) || n.cidr.Contains(f.replyFrom) {
		return // not a sandbox's, or to its gateway: DNS and the domain proxy log their own
	}
	fs := seen[f.key]
	if fs == nil {
		n.mu.Lock()
		s := n.sandboxAt(src)
		n.mu.Unlock()
		if s == nil {
			return
		}
		// Its end is all the log learns of it: its time is that, within
		// the poll's second of its start.
		fs = &flowSeen{first: time.Now().UTC(), sbx: s, rule: n.flowRule(s, f.key)}
	}
	delete(seen, f.key)
	if fs.logged {
		return
	}
	fs.out, fs.in = max(fs.out, f.out), max(fs.in, f.in)
	n.logFlow(f.key, fs)
}

// pollFlows reads the tracking table once and logs the flows that ended.
func (n *Network) pollFlows(seen map[flowKey]*flowSeen, events bool) {
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
	if err != nil {
		return
	}
	bySrc := n.sandboxesByAddr()
	now := time.Now().UTC()
	live := map[flowKey]bool{}
	for _, f := range flows {
		src, ok := netip.AddrFromSlice(f.Forward.SrcIP.To4())
		if !ok || !n.cidr.Contains(src) {
			continue
		}
		if rsrc, ok := netip.AddrFromSlice(f.Reverse.SrcIP.To4()); ok && n.cidr.Contains(rsrc) {
			continue // to the gateway: DNS or the domain proxy
		}
		s := bySrc[src]
		dst, _ := netip.AddrFromSlice(f.Forward.DstIP.To4())
		k := flowKey{f.Forward.Protocol, netip.AddrPortFrom(src, f.Forward.SrcPort), netip.AddrPortFrom(dst, f.Forward.DstPort)}
		live[k] = true
		fs := seen[k]
		if fs == nil || !fs.gone.IsZero() { // new, or anew on the same addresses and ports
			if s == nil {
				continue
			}
			fs = &flowSeen{first: now, sbx: s, rule: n.flowRule(s, k)}
			seen[k] = fs
		}
		fs.out, fs.in = f.Forward.Bytes, f.Reverse.Bytes
		if tcp, ok := f.ProtoInfo.(*netlink.ProtoInfoTCP); ok && tcp.State >= tcpTimeWait && !fs.logged {
			n.logFlow(k, fs)
		}
	}
	n.flowsGone(seen, live, events, now)
}

// flowsGone logs the flows of seen no longer in the table (live) and
// forgets them; with end events, only goneKeep after.
func (n *Network) flowsGone(seen map[flowKey]*flowSeen, live map[flowKey]bool, events bool, now time.Time) {
	for k, fs := range seen {
		if live[k] {
			continue
		}
		if !fs.logged {
			n.logFlow(k, fs)
		}
		if events && fs.gone.IsZero() {
			fs.gone = now
		}
		if !events || now.Sub(fs.gone) >= goneKeep {
			delete(seen, k)
		}
	}
}

func (n *Network) logFlow(k flowKey, fs *flowSeen) {
	fs.logged = true
	kind := "tcp"
	if k.proto == 17 {
		kind = "udp"
	} else if k.proto != 6 {
		return
	}
	fs.sbx.elog.add(pandastack.EgressEntry{
		Time: fs.first, Kind: kind, Address: k.dst.Addr().String(), Port: int(k.dst.Port()),
		Domain: fs.sbx.nameOf(k.dst.Addr()), BytesOut: int64(fs.out), BytesIn: int64(fs.in), Allowed: true, Rule: fs.rule,
	})
}

// maxCutRules bounds sandboxNet.cutRules; past it the record starts again.
const maxCutRules = 4096

// flowRule is the rule that let connection k of s through: the rule of its
// policy when the connection was cut by a narrower one, else of its policy
// now (a flow is first seen within a second of its start). Its entry names
// that, not the rule of a later policy which cut it.
func (n *Network) flowRule(s *sandboxNet, k flowKey) string {
	n.mu.Lock()
	comp := s.comp
	rule, cut := s.cutRules[k]
	delete(s.cutRules, k)
	n.mu.Unlock()
	if !cut {
		_, rule = comp.decideAddr(k.dst.Addr(), nil, n.cfg.AllowPrivate)
	}
	return rule
}

// sandboxesByAddr maps each sandbox address with its network up to it.
func (n *Network) sandboxesByAddr() map[netip.Addr]*sandboxNet {
	n.mu.Lock()
	defer n.mu.Unlock()
	m := make(map[netip.Addr]*sandboxNet, len(n.sbx))
	for _, s := range n.sbx {
		if s.up {
			_, a := n.addrs(s.Slot)
			m[a] = s
		}
	}
	return m
}

// cutRefusedFlows ends the connections through NAT of the sandbox at addr
// that policy comp refuses: the firewall accepts a tracked connection's
// packets without asking the policy, so a connection opened before a
// policy was narrowed (a UDP flow that keeps sending, a TCP connection
// kept open) would go on for as long as it lives. A TCP connection is
// marked cut (ctMarkCut): the next packet of the sandbox's on it, or its
// answer to the server's next, is refused with a reset. Any other loses
// its tracking: its next packet is a new connection, which the policy
// refuses. Connections the policy still allows keep their tracking (and
// their NAT mapping). s is the sandbox, old its policy until now (nil:
// unknown, a restarted server's adoption, whose cut flows are logged with
// the rule "before_restart"). n.mu is not held: it is taken only to
// record the rules.
func (n *Network) cutRefusedFlows(s *sandboxNet, addr netip.Addr, old *Compiled, comp Compiled) {
	refused := narrowedFlows{n: n, addr: addr, comp: comp}
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
	if err != nil {
		n.log.Warn("listing the connections the new policy refuses", "addr", addr, "err", err)
	}
	var toCut []*netlink.ConntrackFlow
	for _, f := range flows {
		if f.Forward.Protocol == unix.IPPROTO_TCP && f.Mark != ctMarkCut && refused.MatchConntrackFlow(f) {
			toCut = append(toCut, f)
		}
	}
	// Their log entries, written once they end, name what let them
	// through: recorded before the cut, which may end them at once.
	if len(toCut) > 0 {
		n.mu.Lock()
		for _, f := range toCut {
			dst, _ := netip.AddrFromSlice(f.Forward.DstIP.To4())
			rule := "before_restart"
			if old != nil {
				_, rule = old.decideAddr(dst, nil, n.cfg.AllowPrivate)
			}
			if s.cutRules == nil || len(s.cutRules) >= maxCutRules {
				s.cutRules = map[flowKey]string{}
			}
			s.cutRules[flowKey{f.Forward.Protocol, netip.AddrPortFrom(addr, f.Forward.SrcPort), netip.AddrPortFrom(dst, f.Forward.DstPort)}] = rule
		}
		n.mu.Unlock()
	}
	marked := 0
	for _, f := range toCut {
		f.Mark = ctMarkCut
		if err := netlink.ConntrackUpdate(netlink.ConntrackTable, netlink.FAMILY_V4, f); err != nil {
			n.log.Debug("marking a connection the new policy refuses; its tracking goes instead", "addr", addr, "err", err)
			continue
		}
		marked++
	}
	cut, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.FAMILY_V4, unmarked{refused})
	if err != nil {
		n.log.Warn("ending connections the new policy refuses", "addr", addr, "err", err)
	} else if cut+uint(marked) > 0 {
		n.log.Debug("ended connections the new policy refuses", "addr", addr, "reset", marked, "untracked", cut)
	}
}

// unmarked matches the flows of narrowedFlows not marked cut.
type unmarked struct{ narrowedFlows }

func (f unmarked) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	return flow.Mark != ctMarkCut && f.narrowedFlows.MatchConntrackFlow(flow)
}

// narrowedFlows matches the tracked connections from addr to a destination
// outside the sandbox range that comp refuses.
type narrowedFlows struct {
	n    *Network
	addr netip.Addr
	comp Compiled
}

func (f narrowedFlows) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	src, ok := netip.AddrFromSlice(flow.Forward.SrcIP.To4())
	if !ok || src != f.addr {
		return false
	}
	dst, ok := netip.AddrFromSlice(flow.Forward.DstIP.To4())
	if !ok || f.n.cidr.Contains(dst) {
		return false // to the gateway: DNS and the domain proxy, which ask the policy themselves
	}
	if rsrc, ok := netip.AddrFromSlice(flow.Reverse.SrcIP.To4()); ok && f.n.cidr.Contains(rsrc) {
		return false // redirected to the domain proxy on the gateway, which checks its own
	}
	allowed, _ := f.comp.decideAddr(dst, f.n.deny, f.n.cfg.AllowPrivate)
	return !allowed
}

// forgetFlows ends the tracking of every connection from addr.
func (n *Network) forgetFlows(addr netip.Addr) {
	if _, err := netlink.ConntrackDeleteFilters(netlink.ConntrackTable, netlink.FAMILY_V4, flowsFrom(addr)); err != nil {
		n.log.Warn("ending a stopped sandbox's connections", "addr", addr, "err", err)
	}
}

// flowsFrom matches the tracked connections a sandbox at an address opened.
type flowsFrom netip.Addr

func (a flowsFrom) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	src, ok := netip.AddrFromSlice(flow.Forward.SrcIP.To4())
	return ok && src == netip.Addr(a)
}
