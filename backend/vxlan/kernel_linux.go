package vxlan

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// KernelNetlink implements Netlink with rtnetlink sockets bound to one
// network namespace, opened once and reused for every request: a
// netlink.Handle for everything but FDB listings, and a socket with
// NETLINK_GET_STRICT_CHK set for those. Only a strict request makes the
// kernel filter an AF_BRIDGE dump by device; without it every bridge port's
// entries on the host (each pod veth's unicast and multicast addresses) are
// dumped and filtered here. The request is built by hand: the netlink
// package serialises its Ndmsg straight from a Go struct, padding bytes
// included, and a strict kernel rejects non-zero padding with EINVAL.
//
// A KernelNetlink is not safe for concurrent use; the Backend serialises its
// calls.
type KernelNetlink struct {
	ns  netns.NsHandle // owned; the namespace the sockets live in
	h   *netlink.Handle
	fdb map[int]*nl.SocketHandle
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
	h, err := netlink.NewHandleAt(own, unix.NETLINK_ROUTE)
	if err != nil {
		own.Close()
		return nil, fmt.Errorf("open rtnetlink socket: %w", err)
	}
	fdb, err := nl.GetNetlinkSocketAt(own, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		h.Close()
		own.Close()
		return nil, fmt.Errorf("open rtnetlink socket: %w", err)
	}
	// Kernels before 4.20 lack strict checking; the FDB listing then
	// filters by device in user space, which is only slower.
	_ = unix.SetsockoptInt(fdb.GetFd(), unix.SOL_NETLINK, unix.NETLINK_GET_STRICT_CHK, 1)
	return &KernelNetlink{ns: own, h: h, fdb: map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: fdb}}}, nil
}

// Close releases the sockets and the namespace handle. Safe to call twice.
func (k *KernelNetlink) Close() error {
	if k.h != nil {
		k.h.Close()
		k.h = nil
	}
	if k.fdb != nil {
		k.fdb[unix.NETLINK_ROUTE].Close()
		k.fdb = nil
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
	s := a.As4()
	return net.IP(s[:])
}

func addrOf(ip net.IP) netip.Addr {
	if ip4 := ip.To4(); ip4 != nil {
		return netip.AddrFrom4([4]byte(ip4))
	}
	a, _ := netip.AddrFromSlice(ip)
	return a
}

func ipNetOf(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: ipOf(p.Addr()), Mask: net.CIDRMask(p.Bits(), 32)}
}

func prefixOf(n *net.IPNet) netip.Prefix {
	if n == nil {
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(addrOf(n.IP), ones)
}

func macOf(hw net.HardwareAddr) MAC {
	m, _ := MACFrom(hw)
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
	as, err := k.h.AddrList(byIndex(index), netlink.FAMILY_V4)
	out := make([]netip.Prefix, 0, len(as))
	for _, a := range as {
		if a.LinkIndex == index {
			out = append(out, prefixOf(a.IPNet))
		}
	}
	return out, err
}

// AddrReplace implements Netlink.
func (k *KernelNetlink) AddrReplace(index int, addr netip.Prefix) error {
	return k.h.AddrReplace(byIndex(index), &netlink.Addr{IPNet: ipNetOf(addr)})
}

// AddrDel implements Netlink.
func (k *KernelNetlink) AddrDel(index int, addr netip.Prefix) error {
	return k.h.AddrDel(byIndex(index), &netlink.Addr{IPNet: ipNetOf(addr)})
}

// RouteList implements Netlink.
func (k *KernelNetlink) RouteList() ([]Route, error) {
	var out []Route
	err := k.h.RouteListFilteredIter(netlink.FAMILY_V4, &netlink.Route{}, 0, func(r netlink.Route) bool {
		out = append(out, Route{
			Dst:       prefixOf(r.Dst),
			Gw:        addrOf(r.Gw),
			LinkIndex: r.LinkIndex,
			OnLink:    r.Flags&int(netlink.FLAG_ONLINK) != 0,
			Protocol:  int(r.Protocol),
			Scope:     int(r.Scope),
			Priority:  r.Priority,
		})
		return true
	})
	return out, err
}

func nlRoute(r Route) *netlink.Route {
	nr := &netlink.Route{
		Dst:       ipNetOf(r.Dst),
		Gw:        ipOf(r.Gw),
		LinkIndex: r.LinkIndex,
		Protocol:  netlink.RouteProtocol(r.Protocol),
		Scope:     netlink.Scope(r.Scope),
		Priority:  r.Priority,
		Table:     unix.RT_TABLE_MAIN,
	}
	if r.OnLink {
		nr.Flags = int(netlink.FLAG_ONLINK)
	}
	return nr
}

// RouteReplace implements Netlink.
func (k *KernelNetlink) RouteReplace(r Route) error { return k.h.RouteReplace(nlRoute(r)) }

// RouteDel implements Netlink.
func (k *KernelNetlink) RouteDel(r Route) error { return k.h.RouteDel(nlRoute(r)) }

// NeighList implements Netlink.
func (k *KernelNetlink) NeighList(index int) ([]Neigh, error) {
	ns, err := k.h.NeighList(index, netlink.FAMILY_V4)
	out := make([]Neigh, 0, len(ns))
	for _, n := range ns {
		out = append(out, Neigh{LinkIndex: n.LinkIndex, IP: addrOf(n.IP), MAC: macOf(n.HardwareAddr), State: n.State})
	}
	return out, err
}

// NeighSet implements Netlink.
func (k *KernelNetlink) NeighSet(n Neigh) error {
	return k.h.NeighSet(&netlink.Neigh{
		LinkIndex:    n.LinkIndex,
		Family:       netlink.FAMILY_V4,
		State:        n.State,
		IP:           ipOf(n.IP),
		HardwareAddr: n.MAC.HardwareAddr(),
	})
}

// NeighDel implements Netlink.
func (k *KernelNetlink) NeighDel(n Neigh) error {
	return k.h.NeighDel(&netlink.Neigh{LinkIndex: n.LinkIndex, Family: netlink.FAMILY_V4, IP: ipOf(n.IP)})
}

// ndmsg is a struct ndmsg serialised by hand, padding zeroed.
type ndmsg [12]byte

func (m *ndmsg) Len() int          { return len(m) }
func (m *ndmsg) Serialize() []byte { return m[:] }

// FDBList implements Netlink.
func (k *KernelNetlink) FDBList(index int) ([]FDB, error) {
	var m ndmsg
	m[0] = unix.AF_BRIDGE
	binary.NativeEndian.PutUint32(m[4:8], uint32(index)) // ndm_ifindex: the filter
	req := nl.NewNetlinkRequest(unix.RTM_GETNEIGH, unix.NLM_F_DUMP)
	req.Sockets = k.fdb
	req.AddData(&m)
	msgs, err := req.Execute(unix.NETLINK_ROUTE, unix.RTM_NEWNEIGH)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, err
	}
	out := make([]FDB, 0, len(msgs))
	for _, raw := range msgs {
		n, derr := netlink.NeighDeserialize(raw)
		if derr != nil || n.LinkIndex != index || n.Family != unix.AF_BRIDGE {
			continue
		}
		out = append(out, FDB{LinkIndex: n.LinkIndex, MAC: macOf(n.HardwareAddr), Dst: addrOf(n.IP), State: n.State})
	}
	return out, err
}

func nlFDB(f FDB) *netlink.Neigh {
	return &netlink.Neigh{
		LinkIndex:    f.LinkIndex,
		Family:       unix.AF_BRIDGE,
		Flags:        netlink.NTF_SELF,
		State:        f.State,
		IP:           ipOf(f.Dst),
		HardwareAddr: f.MAC.HardwareAddr(),
	}
}

// FDBSet implements Netlink.
func (k *KernelNetlink) FDBSet(f FDB) error { return k.h.NeighSet(nlFDB(f)) }

// FDBDel implements Netlink.
func (k *KernelNetlink) FDBDel(f FDB) error { return k.h.NeighDel(nlFDB(f)) }

// subscribeBuffer is the receive buffer asked for on notification sockets:
// a burst of route or neighbour changes elsewhere on a busy host should not
// overflow it (the kernel caps it at net.core.rmem_max).
const subscribeBuffer = 1 << 20

// Subscribe implements Netlink.
func (k *KernelNetlink) Subscribe(done <-chan struct{}, fn func(Event)) (<-chan struct{}, error) {
	stop := make(chan struct{})
	var once sync.Once
	halt := func() { once.Do(func() { close(stop) }) }
	go func() {
		select {
		case <-done:
		case <-stop:
		}
		halt()
	}()

	var wg sync.WaitGroup
	forward := func(loop func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer halt() // one broken subscription ends them all
			loop()
		}()
	}
	ns := k.ns
	onErr := func(error) {} // a broken subscription shows as a closed channel

	links := make(chan netlink.LinkUpdate, 64)
	if err := netlink.LinkSubscribeWithOptions(links, stop, netlink.LinkSubscribeOptions{
		Namespace: &ns, ErrorCallback: onErr,
	}); err != nil {
		halt()
		return nil, fmt.Errorf("subscribe to link changes: %w", err)
	}
	forward(func() {
		for u := range links {
			fn(Event{Kind: EventLink, LinkIndex: int(u.Index), LinkName: u.Attrs().Name, Deleted: u.Header.Type == unix.RTM_DELLINK})
		}
	})

	routes := make(chan netlink.RouteUpdate, 256)
	if err := netlink.RouteSubscribeWithOptions(routes, stop, netlink.RouteSubscribeOptions{
		Namespace: &ns, ErrorCallback: onErr, ReceiveBufferSize: subscribeBuffer,
	}); err != nil {
		halt()
		wg.Wait()
		return nil, fmt.Errorf("subscribe to route changes: %w", err)
	}
	forward(func() {
		for u := range routes {
			if u.Type == unix.RTM_DELROUTE {
				fn(Event{Kind: EventRouteDel, LinkIndex: u.LinkIndex, Protocol: int(u.Protocol)})
			}
		}
	})

	neighs := make(chan netlink.NeighUpdate, 256)
	if err := netlink.NeighSubscribeWithOptions(neighs, stop, netlink.NeighSubscribeOptions{
		Namespace: &ns, ErrorCallback: onErr, ReceiveBufferSize: subscribeBuffer,
	}); err != nil {
		halt()
		wg.Wait()
		return nil, fmt.Errorf("subscribe to neighbour changes: %w", err)
	}
	forward(func() {
		for u := range neighs {
			if u.Type == unix.RTM_DELNEIGH {
				fn(Event{Kind: EventNeighDel, LinkIndex: u.LinkIndex})
			}
		}
	})

	ended := make(chan struct{})
	go func() {
		wg.Wait()
		close(ended)
	}()
	return ended, nil
}
