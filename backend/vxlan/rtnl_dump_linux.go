package vxlan

import (
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// dump sends a dump request (the message built by build) and calls each
// for every reply message of type want, with the message's payload. A dump
// the kernel marks interrupted (NLM_F_DUMP_INTR) is read to its end and
// reported as netlink.ErrDumpInterrupted.
func (c *rtnlConn) dump(typ uint16, build func(), want uint16, each func(payload []byte)) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wbuf = c.wbuf[:0]
	start := c.begin(typ, unix.NLM_F_DUMP)
	build()
	c.end(start)
	seq := c.seq
	if err := c.send(c.wbuf); err != nil {
		return err
	}
	interrupted := false
	for {
		b, err := c.recv()
		if err != nil {
			return err
		}
		for len(b) >= unix.NLMSG_HDRLEN {
			l := int(ne.Uint32(b[0:4]))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				break
			}
			mtyp, flags, mseq, pid := ne.Uint16(b[4:6]), ne.Uint16(b[6:8]), ne.Uint32(b[8:12]), ne.Uint32(b[12:16])
			payload := b[unix.NLMSG_HDRLEN:l]
			b = b[min(len(b), nlmAlign(l)):]
			if mseq != seq || pid != c.pid {
				continue // a stale reply to an earlier request
			}
			if flags&unix.NLM_F_DUMP_INTR != 0 {
				interrupted = true
			}
			switch mtyp {
			case unix.NLMSG_DONE:
				if len(payload) >= 4 {
					if code := int32(ne.Uint32(payload)); code < 0 {
						return syscall.Errno(-code)
					}
				}
				if interrupted {
					return netlink.ErrDumpInterrupted
				}
				return nil
			case unix.NLMSG_ERROR:
				if len(payload) >= 4 {
					if code := int32(ne.Uint32(payload)); code < 0 {
						return syscall.Errno(-code)
					}
				}
				return nil
			case want:
				each(payload)
			}
		}
	}
}

// rtAttrs calls fn for each attribute in b.
func rtAttrs(b []byte, fn func(typ uint16, val []byte)) {
	for len(b) >= 4 {
		l := int(ne.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return
		}
		fn(ne.Uint16(b[2:4])&^unix.NLA_F_NESTED, b[4:l])
		b = b[min(len(b), nlmAlign(l)):]
	}
}

// addrFrom decodes an address attribute: 4 bytes for IPv4, 16 for IPv6,
// anything else is no address.
func addrFrom(b []byte) netip.Addr {
	switch len(b) {
	case 4:
		return netip.AddrFrom4([4]byte(b))
	case 16:
		return netip.AddrFrom16([16]byte(b))
	}
	return netip.Addr{}
}

// unspecified is the all-zeros address of family af, the destination of a
// default route (which has no RTA_DST).
func unspecified(af uint8) netip.Addr {
	if af == unix.AF_INET6 {
		return netip.IPv6Unspecified()
	}
	return netip.IPv4Unspecified()
}

// parseRoute decodes a route message of family af; ok is false for
// anything that is not a route of that family in the main table (or is a
// cached clone).
func parseRoute(p []byte, af uint8) (r Route, ok bool) {
	if len(p) < unix.SizeofRtMsg || p[0] != af {
		return r, false
	}
	flags := ne.Uint32(p[8:12])
	table := uint32(p[4])
	var dst netip.Addr
	rtAttrs(p[unix.SizeofRtMsg:], func(typ uint16, val []byte) {
		switch typ {
		case unix.RTA_DST:
			dst = addrFrom(val)
		case unix.RTA_GATEWAY:
			r.Gw = addrFrom(val)
		case unix.RTA_OIF:
			if len(val) == 4 {
				r.LinkIndex = int(ne.Uint32(val))
			}
		case unix.RTA_PRIORITY:
			if len(val) == 4 {
				r.Priority = int(ne.Uint32(val))
			}
		case unix.RTA_TABLE:
			if len(val) == 4 {
				table = ne.Uint32(val)
			}
		}
	})
	if table != unix.RT_TABLE_MAIN || flags&unix.RTM_F_CLONED != 0 {
		return r, false
	}
	if !dst.IsValid() {
		dst = unspecified(af)
	}
	r.Dst = netip.PrefixFrom(dst, int(p[1]))
	r.OnLink = flags&unix.RTNH_F_ONLINK != 0
	r.Protocol = int(p[5])
	r.Scope = int(p[6])
	return r, true
}

// parseNeigh decodes a neighbour or FDB message.
func parseNeigh(p []byte) (family uint8, link, state int, ip netip.Addr, mac MAC, ok bool) {
	if len(p) < 12 {
		return 0, 0, 0, ip, mac, false
	}
	family = p[0]
	link = int(ne.Uint32(p[4:8]))
	state = int(ne.Uint16(p[8:10]))
	rtAttrs(p[12:], func(typ uint16, val []byte) {
		switch typ {
		case unix.NDA_DST:
			ip = addrFrom(val)
		case unix.NDA_LLADDR:
			if len(val) == 6 {
				mac = MAC(val)
			}
		}
	})
	return family, link, state, ip, mac, true
}

// routeList lists the routes of family fam of the main table.
func (c *rtnlConn) routeList(fam Family) ([]Route, error) {
	var out []Route
	af := famAF(fam)
	err := c.dump(unix.RTM_GETROUTE, func() {
		var m [unix.SizeofRtMsg]byte
		m[0] = af
		m[4] = unix.RT_TABLE_MAIN // a strict kernel dumps only this table
		c.wbuf = append(c.wbuf, m[:]...)
	}, unix.RTM_NEWROUTE, func(p []byte) {
		if r, ok := parseRoute(p, af); ok {
			out = append(out, r)
		}
	})
	return out, err
}

// neighList lists the neighbours of family fam of link index.
func (c *rtnlConn) neighList(index int, fam Family) ([]Neigh, error) {
	var out []Neigh
	af := famAF(fam)
	err := c.dump(unix.RTM_GETNEIGH, func() {
		var m [12]byte
		m[0] = af
		c.wbuf = append(c.wbuf, m[:]...)
		c.attrU32(unix.NDA_IFINDEX, uint32(index)) // a strict kernel filters by it
	}, unix.RTM_NEWNEIGH, func(p []byte) {
		if got, link, state, ip, mac, ok := parseNeigh(p); ok && got == af && link == index && ip.IsValid() {
			out = append(out, Neigh{LinkIndex: link, IP: ip, MAC: mac, State: state})
		}
	})
	return out, err
}

// fdbList lists the FDB entries of link index, one per remote.
func (c *rtnlConn) fdbList(index int) ([]FDB, error) {
	var out []FDB
	err := c.dump(unix.RTM_GETNEIGH, func() {
		var m [12]byte
		m[0] = unix.AF_BRIDGE
		ne.PutUint32(m[4:], uint32(index)) // ndm_ifindex: a strict kernel filters by it
		c.wbuf = append(c.wbuf, m[:]...)
	}, unix.RTM_NEWNEIGH, func(p []byte) {
		if fam, link, state, ip, mac, ok := parseNeigh(p); ok && fam == unix.AF_BRIDGE && link == index {
			out = append(out, FDB{LinkIndex: link, MAC: mac, Dst: ip, State: state})
		}
	})
	return out, err
}
