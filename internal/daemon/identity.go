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

// Underlay is the interface VXLAN packets leave by and this host's address
// on it, published as the lease's PublicIP.
type Underlay struct {
	Iface    string
	Index    int
	PublicIP netip.Addr
	MTU      int
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
// global IPv4 address; neither: the interface of the IPv4 default route.
func DetectUnderlay(h linkLister, iface string, publicIP netip.Addr) (Underlay, error) {
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
	switch {
	case publicIP.IsValid() && !u.PublicIP.IsValid():
		return Underlay{}, fmt.Errorf("--public-ip %s is not an address of %s: pick the interface that holds it with --iface", publicIP, attrs.Name)
	case !u.PublicIP.IsValid():
		return Underlay{}, fmt.Errorf("interface %s has no global IPv4 address: set --public-ip or choose another --iface", attrs.Name)
	}
	if attrs.Flags&net.FlagUp == 0 {
		return Underlay{}, fmt.Errorf("interface %s is down: bring it up or choose another --iface", attrs.Name)
	}
	return u, nil
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

func defaultRouteLink(h linkLister) (netlink.Link, error) {
	routes, err := h.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask)) && r.LinkIndex > 0 {
			return h.LinkByIndex(r.LinkIndex)
		}
	}
	return nil, errors.New("no IPv4 default route to find the underlay interface: set --iface (and --public-ip if it has several addresses)")
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}
