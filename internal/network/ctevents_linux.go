package network

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// A connection that lives less than the poll's second (a connect the
// remote refused with a reset, a short request) is gone from the tracking
// table before watchFlows looks. The kernel tells of each tracked
// connection's end on a netlink group; the log learns of those from it.

// From linux/netfilter/nfnetlink.h, nfnetlink_conntrack.h.
const (
	nfnlgrpConntrackDestroy = 3
	nfnlSubsysCTNetlink     = 1
	ipctnlMsgCTDelete       = 2

	ctaTupleOrig     = 1
	ctaTupleReply    = 2
	ctaTupleIP       = 1
	ctaTupleProto    = 2
	ctaIPv4Src       = 1
	ctaIPv4Dst       = 2
	ctaProtoNum      = 1
	ctaProtoSrcPort  = 2
	ctaProtoDstPort  = 3
	ctaCountersOrig  = 9
	ctaCountersReply = 10
	ctaCountersBytes = 2
)

// endedFlow is a tracked connection's end, as the kernel tells it.
type endedFlow struct {
	key       flowKey
	replyFrom netip.Addr // the reply's source: the gateway for what was redirected to the domain proxy
	out, in   uint64     // bytes each way (with nf_conntrack_acct)
}

// ctEvents receives the ends of tracked connections.
type ctEvents struct{ conn *netlink.Conn }

func openCTEvents() (*ctEvents, error) {
	// Events off host-wide (0) would leave the log without them; 2 (the
	// default) sends them to listeners, as 1 does.
	if b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_events"); err == nil && strings.TrimSpace(string(b)) == "0" {
		if err := os.WriteFile("/proc/sys/net/netfilter/nf_conntrack_events", []byte("1"), 0o644); err != nil {
			return nil, fmt.Errorf("net.netfilter.nf_conntrack_events is 0: %w", err)
		}
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{Groups: 1 << (nfnlgrpConntrackDestroy - 1)})
	if err != nil {
		return nil, err
	}
	// A burst of ends: past the buffer some go unlogged (ENOBUFS), never
	// memory of ours. As root past net.core.rmem_max (SO_RCVBUFFORCE).
	if rc, err := c.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20) })
	}
	return &ctEvents{conn: c}, nil
}

func (e *ctEvents) close() { e.conn.Close() }

// read sends each IPv4 connection's end to out until the socket is closed.
func (e *ctEvents) read(out chan<- endedFlow, stop <-chan struct{}) {
	for {
		msgs, err := e.conn.Receive()
		if err != nil {
			if errors.Is(err, syscall.ENOBUFS) {
				continue
			}
			return
		}
		for _, m := range msgs {
			if m.Header.Type != netlink.HeaderType(nfnlSubsysCTNetlink<<8|ipctnlMsgCTDelete) || len(m.Data) < 4 || m.Data[0] != unix.AF_INET {
				continue
			}
			if f, ok := parseCTEnd(m.Data[4:]); ok {
				select {
				case out <- f:
				case <-stop:
					return
				}
			}
		}
	}
}

// ctTuple is one direction of a tracked connection.
type ctTuple struct {
	src, dst     netip.Addr
	proto        uint8
	sport, dport uint16
}

// tuple decodes a CTA_TUPLE_ORIG or CTA_TUPLE_REPLY into t.
func (t *ctTuple) tuple(td *netlink.AttributeDecoder) error {
	for td.Next() {
		switch td.Type() {
		case ctaTupleIP:
			td.Nested(func(id *netlink.AttributeDecoder) error {
				for id.Next() {
					a, ok := netip.AddrFromSlice(id.Bytes())
					switch {
					case !ok:
					case id.Type() == ctaIPv4Src:
						t.src = a
					case id.Type() == ctaIPv4Dst:
						t.dst = a
					}
				}
				return nil
			})
		case ctaTupleProto:
			td.Nested(func(pd *netlink.AttributeDecoder) error {
				for pd.Next() {
					switch pd.Type() {
					case ctaProtoNum:
						t.proto = pd.Uint8()
					case ctaProtoSrcPort:
						t.sport = pd.Uint16()
					case ctaProtoDstPort:
						t.dport = pd.Uint16()
					}
				}
				return nil
			})
		}
	}
	return nil
}

// parseCTEnd reads a conntrack message's attributes (after its nfgenmsg).
func parseCTEnd(b []byte) (endedFlow, bool) {
	var f endedFlow
	var orig, reply ctTuple
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return f, false
	}
	ad.ByteOrder = binary.BigEndian
	counter := func(into *uint64) func(*netlink.AttributeDecoder) error {
		return func(nd *netlink.AttributeDecoder) error {
			for nd.Next() {
				if nd.Type() == ctaCountersBytes {
					*into = nd.Uint64()
				}
			}
			return nil
		}
	}
	for ad.Next() {
		switch ad.Type() {
		case ctaTupleOrig:
			ad.Nested(orig.tuple)
		case ctaTupleReply:
			ad.Nested(reply.tuple)
		case ctaCountersOrig:
			ad.Nested(counter(&f.out))
		case ctaCountersReply:
			ad.Nested(counter(&f.in))
		}
	}
	if ad.Err() != nil || !orig.src.Is4() || !orig.dst.Is4() {
		return f, false
	}
	f.key = flowKey{orig.proto, netip.AddrPortFrom(orig.src, orig.sport), netip.AddrPortFrom(orig.dst, orig.dport)}
	f.replyFrom = reply.src
	return f, true
}
