package vxlan

import (
	"fmt"
	"net/netip"
	"os"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Classic BPF opcodes for the notification filter.
const (
	bpfLdAbsB = unix.BPF_LD | unix.BPF_B | unix.BPF_ABS
	bpfJeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfRetK   = unix.BPF_RET | unix.BPF_K
)

// notifyFilter is the socket filter of the notification socket. It keeps
// link changes and deletions of routes and neighbours, the only
// notifications the reconciler acts on, and drops additions in the kernel:
// those are mostly our own writes — 15,000 at a cold start with 5,000
// peers — which would otherwise be copied, parsed and thrown away here,
// and could overflow the socket.
func notifyFilter() []unix.SockFilter {
	// nlmsg_type is a host-order u16 at offset 4; every rtnetlink type is
	// below 256, so one byte decides.
	lo, hi := uint32(4), uint32(5)
	if ne.Uint16([]byte{0, 1}) == 1 { // big endian
		lo, hi = 5, 4
	}
	const drop, accept = 7, 8
	return []unix.SockFilter{
		0:      {Code: bpfLdAbsB, K: hi},
		1:      {Code: bpfJeqK, K: 0, Jt: 0, Jf: drop - 2},
		2:      {Code: bpfLdAbsB, K: lo},
		3:      {Code: bpfJeqK, K: unix.RTM_NEWLINK, Jt: accept - 4},
		4:      {Code: bpfJeqK, K: unix.RTM_DELLINK, Jt: accept - 5},
		5:      {Code: bpfJeqK, K: unix.RTM_DELROUTE, Jt: accept - 6},
		6:      {Code: bpfJeqK, K: unix.RTM_DELNEIGH, Jt: accept - 7},
		drop:   {Code: bpfRetK, K: 0},
		accept: {Code: bpfRetK, K: 0xffffffff},
	}
}

// subscribeBuffer is the receive buffer asked for on the notification
// socket: a burst of deletions elsewhere on a busy host should not
// overflow it (the kernel caps it at net.core.rmem_max).
const subscribeBuffer = 1 << 20

// openNotify opens a socket in ns that receives link, route (of both
// families) and neighbour notifications, filtered by notifyFilter.
func openNotify(ns netns.NsHandle) (*os.File, error) {
	s, err := socketAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	fd, err := unix.FcntlInt(uintptr(s.GetFd()), unix.F_DUPFD_CLOEXEC, 0)
	s.Close()
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "rtnetlink-notify") // non-blocking: Close wakes a Read
	prog := notifyFilter()
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER,
		&unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}); err != nil {
		f.Close()
		return nil, fmt.Errorf("attach notification filter: %w", err)
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, subscribeBuffer)
	for _, g := range []int{unix.RTNLGRP_LINK, unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE, unix.RTNLGRP_NEIGH} {
		if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, g); err != nil {
			f.Close()
			return nil, fmt.Errorf("join rtnetlink group %d: %w", g, err)
		}
	}
	return f, nil
}

// parseEvent turns one notification into an Event; ok is false for
// anything else.
func parseEvent(typ uint16, p []byte) (Event, bool) {
	switch typ {
	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		if len(p) < unix.SizeofIfInfomsg {
			return Event{}, false
		}
		e := Event{Kind: EventLink, LinkIndex: int(int32(ne.Uint32(p[4:8]))), Deleted: typ == unix.RTM_DELLINK}
		rtAttrs(p[unix.SizeofIfInfomsg:], func(t uint16, val []byte) {
			if t == unix.IFLA_IFNAME {
				for len(val) > 0 && val[len(val)-1] == 0 {
					val = val[:len(val)-1]
				}
				e.LinkName = string(val)
			}
		})
		return e, true
	case unix.RTM_DELROUTE:
		if len(p) < unix.SizeofRtMsg || (p[0] != unix.AF_INET && p[0] != unix.AF_INET6) {
			return Event{}, false
		}
		e := Event{Kind: EventRouteDel, Protocol: int(p[5])}
		var dst netip.Addr
		rtAttrs(p[unix.SizeofRtMsg:], func(t uint16, val []byte) {
			switch t {
			case unix.RTA_DST:
				dst = addrFrom(val)
			case unix.RTA_OIF:
				if len(val) == 4 {
					e.LinkIndex = int(ne.Uint32(val))
				}
			}
		})
		if !dst.IsValid() {
			dst = unspecified(p[0])
		}
		e.Dst = netip.PrefixFrom(dst, int(p[1]))
		return e, true
	case unix.RTM_DELNEIGH:
		fam, link, _, ip, mac, ok := parseNeigh(p)
		if !ok {
			return Event{}, false
		}
		e := Event{Kind: EventNeighDel, LinkIndex: link}
		switch fam {
		case unix.AF_INET, unix.AF_INET6:
			e.IP = ip
		case unix.AF_BRIDGE:
			e.FDB, e.MAC = true, mac
		default:
			return Event{}, false
		}
		return e, true
	}
	return Event{}, false
}
