package vxlan

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
)

// KernelNetlink implements Netlink with rtnetlink sockets bound to one
// network namespace, opened once and reused for every request: a
// netlink.Handle for links and addresses, which are few and rare, and an
// rtnlConn of our own for routes, neighbours and FDB entries, which come
// by the thousand: batched writes and lean, kernel-filtered listings (see
// rtnlConn). Notifications come through a socket of their own that a BPF
// filter limits to what the reconciler acts on (see notifyFilter).
//
// A KernelNetlink is safe for concurrent use: the two Backends of a
// dual-stack host may share one. Each request holds its socket's lock.
type KernelNetlink struct {
	ns netns.NsHandle // owned; the namespace the sockets live in
	h  *netlink.Handle
	rt *rtnlConn
}

var _ Netlink = (*KernelNetlink)(nil)

// OpenNetlink opens netlink sockets in the network namespace ns, or in the
// calling thread's namespace if ns is netns.None(). ns may be closed by the
// caller afterwards; Close releases everything OpenNetlink opened.
func OpenNetlink(ns netns.NsHandle) (*KernelNetlink, error) {
	var own netns.NsHandle
	var err error
	if ns.IsOpen() {
		var fd int
		fd, err = unix.FcntlInt(uintptr(ns), unix.F_DUPFD_CLOEXEC, 0)
		own = netns.NsHandle(fd)
	} else {
		// Pin the thread so that "current" means one namespace for both the
		// handle we record and the sockets we open.
		runtime.LockOSThread()
		own, err = netns.Get()
		runtime.UnlockOSThread()
	}
	if err != nil {
		return nil, fmt.Errorf("open network namespace handle: %w", err)
	}
	h, err := handleAt(own)
	if err != nil {
		own.Close()
		return nil, fmt.Errorf("open rtnetlink socket: %w", err)
	}
	rt, err := openRTNL(own)
	if err != nil {
		h.Close()
		own.Close()
		return nil, err
	}
	return &KernelNetlink{ns: own, h: h, rt: rt}, nil
}

// inNamespace reports whether the calling thread is in network namespace
// ns. The caller locks its thread.
func inNamespace(ns netns.NsHandle) bool {
	cur, err := netns.Get()
	if err != nil {
		return false
	}
	defer cur.Close()
	return cur.Equal(ns)
}

// Entering a network namespace takes CAP_SYS_ADMIN, even entering the one
// the thread is already in; a DaemonSet pod granted NET_ADMIN alone (as
// deploy/kubernetes/overlay.yaml's) lacks it. So a socket for the
// namespace the calling thread is in is opened where the thread stands,
// and only a socket for another namespace is opened by switching into it.

// handleAt opens a netlink.Handle for the route family in ns.
func handleAt(ns netns.NsHandle) (*netlink.Handle, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if inNamespace(ns) {
		return netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	return netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
}

// socketAt opens a netlink socket of protocol proto in ns.
func socketAt(ns netns.NsHandle, proto int) (*nl.NetlinkSocket, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if inNamespace(ns) {
		return nl.GetNetlinkSocketAt(netns.None(), netns.None(), proto)
	}
	return nl.GetNetlinkSocketAt(ns, netns.None(), proto)
}

// Close releases the sockets and the namespace handle. Safe to call twice.
func (k *KernelNetlink) Close() error {
	if k.h != nil {
		k.h.Close()
		k.h = nil
	}
	if k.rt != nil {
		k.rt.Close()
		k.rt = nil
	}
	if k.ns.IsOpen() {
		k.ns.Close()
		k.ns = netns.None()
	}
	return nil
}

func byIndex(index int) netlink.Link {
	return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: index}}
}

func ipOf(a netip.Addr) net.IP {
	if !a.IsValid() {
		return nil
	}
	return a.AsSlice()
}

func addrOf(ip net.IP) netip.Addr {
	if ip4 := ip.To4(); ip4 != nil {
		return netip.AddrFrom4([4]byte(ip4))
	}
	a, _ := netip.AddrFromSlice(ip)
	return a
}

func ipNetOf(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: ipOf(p.Addr()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func prefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addrOf(n.IP), ones)
}

func macOf(hw net.HardwareAddr) MAC {
	m, _ := backend.MACFrom(hw)
	return m
}

func linkOf(l netlink.Link) Link {
	a := l.Attrs()
	out := Link{
		Index: a.Index,
		Name:  a.Name,
		Kind:  l.Type(),
		MTU:   a.MTU,
		MAC:   macOf(a.HardwareAddr),
		Up:    a.Flags&net.FlagUp != 0,
	}
	if v, ok := l.(*netlink.Vxlan); ok {
		out.VNI = v.VxlanId
		out.Port = v.Port
		out.Local = addrOf(v.SrcAddr)
		out.UnderlayIndex = v.VtepDevIndex
		out.Learning = v.Learning
		out.External = v.FlowBased
		if g := addrOf(v.Group); g.IsValid() && !g.IsUnspecified() {
			out.Group = g
		}
	}
	return out
}

func notFound(err error, what string) error {
	var lnf netlink.LinkNotFoundError
	if errors.As(err, &lnf) || errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("%s: %w", what, ErrLinkNotFound)
	}
	return err
}

// LinkByName implements Netlink.
func (k *KernelNetlink) LinkByName(name string) (Link, error) {
	l, err := k.h.LinkByName(name)
	if err != nil {
		return Link{}, notFound(err, "link "+name)
	}
	return linkOf(l), nil
}

// LinkByIndex implements Netlink.
func (k *KernelNetlink) LinkByIndex(index int) (Link, error) {
	l, err := k.h.LinkByIndex(index)
	if err != nil {
		return Link{}, notFound(err, fmt.Sprintf("link index %d", index))
	}
	return linkOf(l), nil
}

// LinkList implements Netlink.
func (k *KernelNetlink) LinkList() ([]Link, error) {
	ls, err := k.h.LinkList()
	out := make([]Link, 0, len(ls))
	for _, l := range ls {
		out = append(out, linkOf(l))
	}
	return out, err
}

// LinkAdd implements Netlink.
func (k *KernelNetlink) LinkAdd(l Link) error {
	if l.Kind != "vxlan" {
		return fmt.Errorf("LinkAdd: kind %q not supported, only vxlan", l.Kind)
	}
	v := &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: l.Name, MTU: l.MTU},
		VxlanId:      l.VNI,
		VtepDevIndex: l.UnderlayIndex,
		SrcAddr:      ipOf(l.Local),
		Port:         l.Port,
		Learning:     l.Learning,
	}
	if !l.MAC.IsZero() {
		v.HardwareAddr = l.MAC.HardwareAddr()
	}
	return k.h.LinkAdd(v)
}

// LinkDel implements Netlink.
func (k *KernelNetlink) LinkDel(index int) error { return k.h.LinkDel(byIndex(index)) }

// LinkSetUp implements Netlink.
func (k *KernelNetlink) LinkSetUp(index int) error { return k.h.LinkSetUp(byIndex(index)) }

// LinkSetMTU implements Netlink.
func (k *KernelNetlink) LinkSetMTU(index, mtu int) error { return k.h.LinkSetMTU(byIndex(index), mtu) }

// LinkSetMAC implements Netlink.
func (k *KernelNetlink) LinkSetMAC(index int, mac MAC) error {
	return k.h.LinkSetHardwareAddr(byIndex(index), mac.HardwareAddr())
}

// AddrList implements Netlink.
func (k *KernelNetlink) AddrList(index int) ([]netip.Prefix, error) {
	return k.AddrListFamily(index, IPv4)
}

// AddrListFamily implements Netlink.
func (k *KernelNetlink) AddrListFamily(index int, fam Family) ([]netip.Prefix, error) {
	as, err := k.h.AddrList(byIndex(index), int(famAF(fam)))
	out := make([]netip.Prefix, 0, len(as))
	for _, a := range as {
		if a.LinkIndex == index {
			out = append(out, prefixOf(a.IPNet))
		}
	}
	return out, err
}

// AddrReplace implements Netlink. An IPv6 address skips duplicate address
// detection: the device address is ours by construction (our lease), and
// while tentative it could not be used, nor would routes through the
// device work at once. Nor does it get a prefix route: like an IPv4 /32,
// the /128 device address has none, so the main table holds no route of
// the kernel's for it on our device.
func (k *KernelNetlink) AddrReplace(index int, addr netip.Prefix) error {
	a := &netlink.Addr{IPNet: ipNetOf(addr)}
	if addr.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD | unix.IFA_F_NOPREFIXROUTE
	}
	return k.h.AddrReplace(byIndex(index), a)
}

// AddrDel implements Netlink.
func (k *KernelNetlink) AddrDel(index int, addr netip.Prefix) error {
	return k.h.AddrDel(byIndex(index), &netlink.Addr{IPNet: ipNetOf(addr)})
}

// RouteList implements Netlink.
func (k *KernelNetlink) RouteList() ([]Route, error) { return k.rt.routeList(IPv4) }

// RouteListFamily implements Netlink.
func (k *KernelNetlink) RouteListFamily(fam Family) ([]Route, error) { return k.rt.routeList(fam) }

// Write implements Netlink: many requests per sendmsg (rtnlConn.writeBatch).
func (k *KernelNetlink) Write(batch []Write) []error { return k.rt.writeBatch(batch) }

// NeighList implements Netlink.
func (k *KernelNetlink) NeighList(index int) ([]Neigh, error) { return k.rt.neighList(index, IPv4) }

// NeighListFamily implements Netlink.
func (k *KernelNetlink) NeighListFamily(index int, fam Family) ([]Neigh, error) {
	return k.rt.neighList(index, fam)
}

// FDBList implements Netlink. Only a strict request makes the kernel filter
// an AF_BRIDGE dump by device; without it every bridge port's entries on
// the host (each pod veth's unicast and multicast addresses) are dumped
// and filtered here.
func (k *KernelNetlink) FDBList(index int) ([]FDB, error) { return k.rt.fdbList(index) }

// Subscribe implements Netlink.
func (k *KernelNetlink) Subscribe(done <-chan struct{}, fn func(Event)) (<-chan struct{}, error) {
	f, err := openNotify(k.ns)
	if err != nil {
		return nil, fmt.Errorf("subscribe to kernel notifications: %w", err)
	}
	ended := make(chan struct{})
	stop := make(chan struct{})
	go func() {
		select {
		case <-done:
		case <-stop:
		}
		f.Close() // wakes the Read below
	}()
	go func() {
		defer close(ended)
		defer close(stop)
		buf := make([]byte, 64<<10)
		for {
			// One notification per datagram; a read error is a closed
			// socket or an overflow (ENOBUFS): either ends the
			// subscription, and the reconciler resubscribes and relists.
			n, err := f.Read(buf)
			if err != nil {
				return
			}
			b := buf[:n]
			for len(b) >= unix.NLMSG_HDRLEN {
				l := int(ne.Uint32(b[0:4]))
				if l < unix.NLMSG_HDRLEN || l > len(b) {
					break
				}
				if e, ok := parseEvent(ne.Uint16(b[4:6]), b[unix.NLMSG_HDRLEN:l]); ok {
					fn(e)
				}
				b = b[min(len(b), nlmAlign(l)):]
			}
		}
	}()
	return ended, nil
}
