// Package vxlan is the VXLAN data plane of the overlay: one VXLAN device per
// host and address family (the VTEP, named overlay.<VNI>, and
// overlay-v6.<VNI> on a dual-stack host) and, for every other host, three
// kernel entries that carry a pod's packet to it.
//
// The packet path, for a pod on host A (lease 10.244.1.0/24, public address
// 198.18.0.1) sending to 10.244.2.5 on host B (10.244.2.0/24, 198.18.0.2):
//
//  1. route  10.244.2.0/24 via 10.244.2.0 dev overlay.1 onlink proto 115
//     sends it to overlay.1 with next hop 10.244.2.0 (B's VTEP address; the
//     onlink flag tells the kernel not to look for a route to the next hop);
//  2. neigh  10.244.2.0 lladdr <B's VTEP MAC> dev overlay.1 PERMANENT
//     gives the inner Ethernet header its destination without ARP;
//  3. fdb    <B's VTEP MAC> dst 198.18.0.2 dev overlay.1 self permanent
//     tells the VXLAN driver where to send frames for that MAC: it wraps the
//     frame in UDP (port 8472, VNI 1) from 198.18.0.1 to 198.18.0.2.
//
// B's overlay.1 decapsulates it (its MAC matches, learning is off) and
// routes it to the pod. With DirectRouting, a peer whose public address is
// on a subnet directly connected to the underlay gets just a route,
// 10.244.2.0/24 via 198.18.0.2 dev <underlay> proto 115, and no
// encapsulation.
//
// IPv6 is a second overlay of the same shape, run by a second Backend on a
// dual-stack host; Config's LocalIP and OwnSubnet choose the family. Its
// device is overlay-v6.<VNI>: same VNI and port, VXLAN over the IPv6
// underlay (local = the host's public IPv6 address, MTU = underlay MTU −
// OverheadV6, 70), with a MAC of its own (VtepMACv6: the peers' FDB of the
// IPv6 device maps it to our IPv6 address) and the network address of the
// host's IPv6 lease as a /128, added without duplicate address detection
// so that it is usable at once (and, like the IPv4 /32, without a prefix
// route). For host B with fd00:10:244:2::/64 at 2001:db8::2:
//
//	route  fd00:10:244:2::/64 via fd00:10:244:2:: dev overlay-v6.1 onlink proto 115
//	neigh  fd00:10:244:2:: lladdr <B's IPv6 VTEP MAC> dev overlay-v6.1 PERMANENT
//	fdb    <B's IPv6 VTEP MAC> dst 2001:db8::2 dev overlay-v6.1 self permanent
//
// Each Backend lists and writes only its family: routes of that family
// (RouteProtocol, on its device or the underlay), neighbours of that family
// and FDB entries on its own device. The two overlays of a host therefore
// never see, let alone remove, each other's entries, though they share the
// underlay, the route protocol and a netlink connection.
//
// The kernel state is reconciled, not scripted. The backend keeps one model
// of the kernel, the view: an index of what it holds of ours, replaced by a
// full listing (one dump per kind) and updated by each write the kernel
// accepts. Every pass diffs the desired peers against the view with a pure
// function and applies only the delta with idempotent writes, many requests
// per sendmsg. A full pass lists first; a pass woken only because the
// desired peers changed lists nothing and diffs just the changed peers
// against the view, so a lease event costs its own writes rather than a
// listing of every peer. The notifications of deleted entries and the
// periodic resync bring full passes (see reconciler.pass).
// Everything the backend owns is identifiable from the kernel alone — the
// device by name, routes by RouteProtocol, neighbour and FDB entries by
// device — so a restarted daemon adopts what is there without flushing it,
// stale entries of peers that left while it was down are removed, and drift
// (an entry deleted by hand, a device recreated by someone) is repaired.
// See Documentation/design.md, "Data plane: the VXLAN backend".
package vxlan
