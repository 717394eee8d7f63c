package daemon

import (
	"errors"
	"fmt"
	"github.com/overlaynet/overlay/subnet"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NodeID returns the host's identity: the flag if set, else /etc/machine-id,
// else the hostname. Simulated hosts on one machine share the last two, so
// they must pass --node-name.
func NodeID(flag, machineIDFile string) (string, error) {
	id := strings.TrimSpace(flag)
	source := "--node-name"
	if id == "" {
		if b, err := os.ReadFile(machineIDFile); err == nil {
			id, source = strings.TrimSpace(string(b)), machineIDFile
		}
	}
	if id == "" {
		h, err := os.Hostname()
		if err != nil {
			return "", fmt.Errorf("no node ID: --node-name is empty, %s is unreadable and the hostname is unknown (%v)", machineIDFile, err)
		}
		id, source = h, "hostname"
	}
	if err := subnet.CheckNodeID(id); err != nil { // the rule every lease is read with
		return "", fmt.Errorf("node ID from %s: %w", source, err)
	}
	return id, nil
}

// Underlay is the interface VXLAN packets leave by and this host's
// addresses on it, published as the lease's PublicIP and (in a network
// that carries IPv6) PublicIPv6.
type Underlay struct {
	Iface      string
	Index      int
	PublicIP   netip.Addr
	PublicIPv6 netip.Addr // zero if the interface has no global IPv6 address
	MTU        int
}

// linkLister is the part of a netlink handle detection needs, bound to the
// daemon's network namespace.
type linkLister interface {
	LinkByName(name string) (netlink.Link, error)
	LinkByIndex(index int) (netlink.Link, error)
	LinkList() ([]netlink.Link, error)
	AddrList(link netlink.Link, family int) ([]netlink.Addr, error)
	RouteListFiltered(family int, filter *netlink.Route, mask uint64) ([]netlink.Route, error)
}

// DetectUnderlay finds the underlay from --iface and --public-ip:
// both given: used as they are (the address must be on the interface);
// only the IP: the interface holding it; only the interface: its first
// global IPv4 address; neither: the interface of the IPv4 default route,
// or of the IPv6 one on a host without an IPv4 default route (IPv6-only).
// An interface with only an IPv6 address will do (for an IPv6-only network).
// The IPv6 address is --public-ipv6, which must be on that interface, or
// else the interface's first global IPv6 address, if any.
func DetectUnderlay(h linkLister, iface string, publicIP, publicIPv6 netip.Addr) (Underlay, error) {
	var link netlink.Link
	var err error
	switch {
	case iface != "":
		if link, err = h.LinkByName(iface); err != nil {
			return Underlay{}, fmt.Errorf("--iface %s: %w", iface, err)
		}
	case publicIP.IsValid():
		if link, err = linkWithAddr(h, publicIP); err != nil {
			return Underlay{}, err
		}
	default:
		if link, err = defaultRouteLink(h); err != nil {
			return Underlay{}, err
		}
	}
	attrs := link.Attrs()
	addrs, err := h.AddrList(link, unix.AF_INET)
	if err != nil {
		return Underlay{}, fmt.Errorf("list addresses of %s: %w", attrs.Name, err)
	}
	u := Underlay{Iface: attrs.Name, Index: attrs.Index, MTU: attrs.MTU}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP.To4())
		if !ok || !ip.IsGlobalUnicast() {
			continue
		}
		if !publicIP.IsValid() || ip == publicIP {
			u.PublicIP = ip
			break
		}
	}
	if u.PublicIPv6, err = underlayIPv6(h, link, publicIPv6); err != nil {
		return Underlay{}, err
	}
	switch {
	case publicIP.IsValid() && !u.PublicIP.IsValid():
		return Underlay{}, fmt.Errorf("--public-ip %s is not an address of %s: pick the interface that holds it with --iface", publicIP, attrs.Name)
	case !u.PublicIP.IsValid() && !u.PublicIPv6.IsValid():
		// Which family the network needs is known only once its config is read (join).
		return Underlay{}, fmt.Errorf("interface %s has no global IPv4 or IPv6 address: set --public-ip (or --public-ipv6) or choose another --iface", attrs.Name)
	}
	if attrs.Flags&net.FlagUp == 0 {
		return Underlay{}, fmt.Errorf("interface %s is down: bring it up or choose another --iface", attrs.Name)
	}
	return u, nil
}

// underlayIPv6 is want if link holds it, else link's first global IPv6
// address (zero if none: only a network that carries IPv6 needs one).
// A tentative address (duplicate address detection not done) is skipped:
// VXLAN cannot send from it yet.
func underlayIPv6(h linkLister, link netlink.Link, want netip.Addr) (netip.Addr, error) {
	addrs, err := h.AddrList(link, unix.AF_INET6)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("list IPv6 addresses of %s: %w", link.Attrs().Name, err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || !ip.Is6() || ip.Is4In6() || !ip.IsGlobalUnicast() || a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) != 0 {
			continue
		}
		if !want.IsValid() || ip == want {
			return ip, nil
		}
	}
	if want.IsValid() {
		return netip.Addr{}, fmt.Errorf("--public-ipv6 %s is not a usable address of %s: give the underlay interface's global IPv6 address", want, link.Attrs().Name)
	}
	return netip.Addr{}, nil
}

func linkWithAddr(h linkLister, ip netip.Addr) (netlink.Link, error) {
	links, err := h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	for _, l := range links {
		addrs, err := h.AddrList(l, unix.AF_INET)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if got, ok := netip.AddrFromSlice(a.IP.To4()); ok && got == ip {
				return l, nil
			}
		}
	}
	return nil, fmt.Errorf("--public-ip %s is on no interface of this host: set --iface and --public-ip to the underlay interface and its address", ip)
}

// defaultRouteLink is the interface of the IPv4 default route, else of
// the IPv6 default route (an IPv6-only host).
func defaultRouteLink(h linkLister) (netlink.Link, error) {
	for _, family := range []int{unix.AF_INET, unix.AF_INET6} {
		routes, err := h.RouteListFiltered(family, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, fmt.Errorf("list routes: %w", err)
		}
		for _, r := range routes {
			if (r.Dst == nil || r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask)) && r.LinkIndex > 0 {
				return h.LinkByIndex(r.LinkIndex)
			}
			// A multipath default route names its interfaces per hop.
			if (r.Dst == nil || r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask)) && len(r.MultiPath) > 0 && r.MultiPath[0].LinkIndex > 0 {
				return h.LinkByIndex(r.MultiPath[0].LinkIndex)
			}
		}
	}
	return nil, errors.New("no IPv4 or IPv6 default route to find the underlay interface: set --iface (and --public-ip or --public-ipv6 if it has several addresses)")
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}
