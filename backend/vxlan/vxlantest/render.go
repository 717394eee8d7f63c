package vxlantest

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/overlaynet/overlay/backend/vxlan"
)

// State renders what the backend owns in a namespace, read through nl, as
// sorted lines for golden comparisons:
//
//	device overlay.1 vni 1 port 8472 local 198.18.0.1 underlay ul0 mtu 1450 mac 0e:... up
//	addr overlay.1 10.244.1.0/32
//	route 10.244.2.0/24 via 10.244.2.0 dev overlay.1 onlink
//	route 10.250.0.0/24 dev overlay.1 proto 4         (another program's route on our device)
//	neigh 10.244.2.0 lladdr 0e:... dev overlay.1
//	fdb 0e:... dst 198.18.0.2 dev overlay.1
//
// Addresses, routes and neighbours are those of the device's family (its
// local address's; without a device, the family its name says:
// vxlan.DeviceNameV6 names the IPv6 one), so the two devices of a
// dual-stack host render apart. Routes are those of our protocol on any
// link plus any route on the device; our routes' metric is shown only if
// it is not vxlan.RouteMetric of their destination. Neighbours: only
// permanent ones (the kernel's own come and go). The IPv6 link-local
// address and route the kernel gives every device are left out. Without a
// device, only the routes are rendered and the first line says so.
func State(nl vxlan.Netlink, dev string) (string, error) {
	var lines []string
	d, err := nl.LinkByName(dev)
	present := err == nil
	fam := vxlan.IPv4
	switch {
	case present:
		fam = d.Family()
	case errors.Is(err, vxlan.ErrLinkNotFound):
		lines = append(lines, "no device "+dev)
		if _, vni, _ := strings.Cut(dev, "."); dev == vxlan.DeviceNameV6(atoi(vni)) {
			fam = vxlan.IPv6
		}
	default:
		return "", fmt.Errorf("look up %s: %w", dev, err)
	}
	name := func(i int) string {
		if l, err := nl.LinkByIndex(i); err == nil {
			return l.Name
		}
		return fmt.Sprintf("if%d", i)
	}
	if present {
		up := "down"
		if d.Up {
			up = "up"
		}
		lines = append(lines, fmt.Sprintf("device %s %s vni %d port %d local %s underlay %s learning %t mtu %d mac %s %s",
			d.Name, d.Kind, d.VNI, d.Port, d.Local, name(d.UnderlayIndex), d.Learning, d.MTU, d.MAC, up))
		addrs, err := nl.AddrListFamily(d.Index, fam)
		if err != nil {
			return "", fmt.Errorf("list addresses: %w", err)
		}
		var as []string
		for _, a := range addrs {
			if !kernelsOwn(a) {
				as = append(as, fmt.Sprintf("addr %s %s", d.Name, a))
			}
		}
		slices.Sort(as)
		lines = append(lines, as...)
	}

	routes, err := nl.RouteListFamily(fam)
	if err != nil {
		return "", fmt.Errorf("list routes: %w", err)
	}
	var rs []string
	for _, r := range routes {
		if r.Protocol != vxlan.RouteProtocol && !(present && r.LinkIndex == d.Index && !kernelsOwn(r.Dst)) {
			continue
		}
		rs = append(rs, routeLine(r, name(r.LinkIndex)))
	}
	slices.Sort(rs)
	lines = append(lines, rs...)
	if !present {
		return strings.Join(lines, "\n") + "\n", nil
	}

	entries, err := entryLines(nl, d, fam)
	if err != nil {
		return "", err
	}
	return strings.Join(append(lines, entries...), "\n") + "\n", nil
}

// routeLine renders a route on dev like `ip route`, our metric (a
// function of the destination) only when it is not the expected one.
func routeLine(r vxlan.Route, dev string) string {
	s := "route " + r.Dst.String()
	if r.Gw.IsValid() {
		s += " via " + r.Gw.String()
	}
	s += " dev " + dev
	if r.OnLink {
		s += " onlink"
	}
	if r.Protocol != vxlan.RouteProtocol {
		s += fmt.Sprintf(" proto %d", r.Protocol)
	}
	if r.Priority != 0 && !(r.Protocol == vxlan.RouteProtocol && r.Priority == vxlan.RouteMetric(r.Dst)) {
		s += fmt.Sprintf(" metric %d", r.Priority)
	}
	return s
}

// entryLines renders d's permanent neighbours of family fam and its FDB
// entries, sorted.
func entryLines(nl vxlan.Netlink, d vxlan.Link, fam vxlan.Family) ([]string, error) {
	neighs, err := nl.NeighListFamily(d.Index, fam)
	if err != nil {
		return nil, fmt.Errorf("list neighbours: %w", err)
	}
	var ns []string
	for _, n := range neighs {
		if n.State&vxlan.NUDPermanent != 0 {
			ns = append(ns, fmt.Sprintf("neigh %s lladdr %s dev %s", n.IP, n.MAC, d.Name))
		}
	}
	slices.Sort(ns)
	fdbs, err := nl.FDBList(d.Index)
	if err != nil {
		return nil, fmt.Errorf("list FDB: %w", err)
	}
	var fs []string
	for _, f := range fdbs {
		s := fmt.Sprintf("fdb %s dst %s dev %s", f.MAC, f.Dst, d.Name)
		if f.State&vxlan.NUDPermanent == 0 {
			s += fmt.Sprintf(" state %#x", f.State)
		}
		fs = append(fs, s)
	}
	slices.Sort(fs)
	return append(ns, fs...), nil
}

// kernelsOwn reports whether p is an IPv6 link-local address or route,
// which the kernel gives every device.
func kernelsOwn(p netip.Prefix) bool { return p.Addr().Is6() && p.Addr().IsLinkLocalUnicast() }

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
