package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"github.com/pandastack/pandastack"
	"golang.org/x/sys/unix"
)

// Connects the firewall refuses never reach the proxy or connection
// tracking: the rules that refuse them also log them (nftables `log group`,
// NFLOG), rate-limited per sandbox by the firewall, and a reader here turns
// each logged packet into an egress log entry with allowed false. The
// packet's mark says which part of the firewall refused it.

// Marks set on a refused packet before it is logged and rejected.
const (
	refusedPlatform = 1 + iota // the platform deny set, from the forward hook
	refusedPolicy              // the sandbox's own chain: deny_out or no internet
	refusedQUIC                // UDP 443 while domain rules are in force
	refusedHost                // the host through the gateway, other than DNS and the domain proxy
	refusedFlows               // a new connection past the sandbox's limit (Config.MaxFlows)
)

// Rate of refused packets logged per sandbox; more are refused unlogged.
const (
	refusedLogRate  = 20 // per second
	refusedLogBurst = 50
	refusedSnaplen  = 64 // an IPv4 header with options and the ports
)

// From linux/netfilter/nfnetlink_log.h (not in x/sys/unix).
const (
	nfnlSubsysULOG      = 4
	nfulnlMsgPacket     = 0
	nfulnlMsgConfig     = 1
	nfulaCfgCmd         = 1
	nfulaCfgMode        = 2
	nfulaCfgQThresh     = 5
	nfulaMark           = 2
	nfulaPayload        = 9
	nfulnlCfgCmdBind    = 1
	nfulnlCopyPacket    = 2
	nflogGroupBase      = 20000
	nflogGroupTries     = 64
	nflogGroupSpan      = 4096
	nflogReadBufferSize = 1 << 20
)

// nflog receives the packets one NFLOG group logs.
type nflog struct {
	conn  *netlink.Conn
	group uint16
}

// openNFLOG binds a free NFLOG group, starting from one derived from the
// instance id: a group has one reader per host, and several servers (each
// with its own table) share a host.
func openNFLOG(instance string) (*nflog, error) {
	h := fnv.New32a()
	h.Write([]byte(instance))
	start := h.Sum32() % nflogGroupSpan
	var lastErr error
	for i := range uint32(nflogGroupTries) {
		group := uint16(nflogGroupBase + (start+i)%nflogGroupSpan)
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return nil, fmt.Errorf("nflog: %w", err)
		}
		if err := nflogConfig(c, group, []netlink.Attribute{{Type: nfulaCfgCmd, Data: []byte{nfulnlCfgCmdBind}}}); err != nil {
			c.Close()
			lastErr = err
			if errors.Is(err, syscall.EBUSY) || errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EEXIST) {
				continue // another server's group
			}
			return nil, fmt.Errorf("nflog: bind group %d: %w", group, err)
		}
		mode := make([]byte, 6)
		binary.BigEndian.PutUint32(mode, refusedSnaplen)
		mode[4] = nfulnlCopyPacket
		qthresh := binary.BigEndian.AppendUint32(nil, 1)
		if err := nflogConfig(c, group, []netlink.Attribute{{Type: nfulaCfgMode, Data: mode}, {Type: nfulaCfgQThresh, Data: qthresh}}); err != nil {
			c.Close()
			return nil, fmt.Errorf("nflog: configure group %d: %w", group, err)
		}
		// A flood beyond the firewall's limit fills the socket's buffer and
		// loses packets (ENOBUFS, ignored), never memory of ours.
		c.SetReadBuffer(nflogReadBufferSize)
		return &nflog{conn: c, group: group}, nil
	}
	return nil, fmt.Errorf("nflog: no free group in %d..%d: %w", nflogGroupBase, nflogGroupBase+nflogGroupSpan-1, lastErr)
}

func nflogConfig(c *netlink.Conn, group uint16, attrs []netlink.Attribute) error {
	b, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		return err
	}
	// nfgenmsg: family (unspecified), version 0, the group (big endian).
	hdr := []byte{unix.AF_UNSPEC, 0, byte(group >> 8), byte(group)}
	_, err = c.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(nfnlSubsysULOG<<8 | nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append(hdr, b...),
	})
	return err
}

// refusedPacket is what the reader learns of one logged packet.
type refusedPacket struct {
	mark     uint32
	proto    uint8
	src, dst netip.Addr
	dport    uint16
}

// read calls f for each logged IPv4 packet until the socket is closed.
func (l *nflog) read(f func(refusedPacket)) {
	for {
		msgs, err := l.conn.Receive()
		if err != nil {
			if errors.Is(err, syscall.ENOBUFS) {
				continue // the kernel dropped some: the log is a sample under a flood
			}
			return
		}
		for _, m := range msgs {
			if m.Header.Type != netlink.HeaderType(nfnlSubsysULOG<<8|nfulnlMsgPacket) || len(m.Data) < 4 {
				continue
			}
			if p, ok := parseNFLOG(m.Data[4:]); ok {
				f(p)
			}
		}
	}
}

func (l *nflog) Close() { l.conn.Close() }

// parseNFLOG reads the mark and the IPv4 header (and ports) of a packet
// message's attributes.
func parseNFLOG(attrs []byte) (refusedPacket, bool) {
	var p refusedPacket
	ad, err := netlink.NewAttributeDecoder(attrs)
	if err != nil {
		return p, false
	}
	var payload []byte
	for ad.Next() {
		switch ad.Type() {
		case nfulaMark:
			if b := ad.Bytes(); len(b) == 4 {
				p.mark = binary.BigEndian.Uint32(b)
			}
		case nfulaPayload:
			payload = ad.Bytes()
		}
	}
	if len(payload) < 20 || payload[0]>>4 != 4 {
		return p, false
	}
	ihl := int(payload[0]&0x0f) * 4
	p.proto = payload[9]
	p.src = netip.AddrFrom4([4]byte(payload[12:16]))
	p.dst = netip.AddrFrom4([4]byte(payload[16:20]))
	if (p.proto == unix.IPPROTO_TCP || p.proto == unix.IPPROTO_UDP) && len(payload) >= ihl+4 {
		p.dport = binary.BigEndian.Uint16(payload[ihl+2 : ihl+4])
	}
	return p, true
}

// logRefused adds a refused packet to its sandbox's egress log.
func (n *Network) logRefused(p refusedPacket) {
	kind := "tcp"
	switch p.proto {
	case unix.IPPROTO_TCP:
	case unix.IPPROTO_UDP:
		kind = "udp"
	default:
		return // ICMP and the rest are refused unlogged
	}
	n.mu.Lock()
	s := n.sandboxAt(p.src)
	var comp Compiled
	if s != nil {
		comp = s.comp
	}
	n.mu.Unlock()
	if s == nil {
		return
	}
	rule := "platform"
	switch p.mark {
	case refusedPolicy:
		_, rule = comp.decideAddr(p.dst, nil, nil)
	case refusedQUIC:
		rule = "quic"
	case refusedFlows:
		rule = "flow_limit"
	}
	s.elog.add(pandastack.EgressEntry{
		Time: time.Now().UTC(), Kind: kind, Address: p.dst.String(), Port: int(p.dport),
		Domain: s.nameOf(p.dst), Allowed: false, Rule: rule,
	})
}

// sandboxAt is the sandbox whose network is up on address a, or nil. n.mu held.
func (n *Network) sandboxAt(a netip.Addr) *sandboxNet {
	if !n.cidr.Contains(a) {
		return nil
	}
	off := binary.BigEndian.Uint32(a.AsSlice()) - binary.BigEndian.Uint32(n.cidr.Addr().AsSlice())
	if off%4 != 2 {
		return nil
	}
	s := n.sbx[n.slots[int(off/4)]]
	if s == nil || !s.up {
		return nil
	}
	return s
}
