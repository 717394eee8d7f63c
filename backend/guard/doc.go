// Package guard is the VXLAN guard (`--vxlan-guard`, on by default): an
// nftables table of overlayd's own, programmed over netlink with
// github.com/google/nftables, that lets UDP to the VXLAN port in only from
// the public addresses of the peers this host programs, and drops and
// counts the rest.
//
// # Why
//
// The kernel's VXLAN device accepts any datagram with its VNI on its UDP
// port, from anyone: a host that can reach UDP 8472 of a cluster host can
// hand its pods any inner packet, with any (spoofed) pod source. The guard
// closes that to everyone who does not hold a valid lease.
//
// # The table
//
// For port 8472, on a dual-stack host, `nft list table inet overlay-guard`
// prints:
//
//	table inet overlay-guard {
//		set peers4 {
//			type ipv4_addr
//			elements = { 198.18.0.2, 198.18.0.3 }
//		}
//		set refused4 {
//			type ipv4_addr
//			size 1024
//			flags dynamic,timeout
//			timeout 10m
//		}
//		chain vxlan4 {
//			type filter hook prerouting priority raw; policy accept;
//			udp dport 8472 ip saddr != @peers4 fib daddr type local-multicast update @refused4 { ip saddr } comment "overlay: record refused VXLAN sources"
//			udp dport 8472 ip saddr != @peers4 fib daddr type local-multicast counter packets 0 bytes 0 drop comment "overlay: VXLAN only from peers"
//		}
//		(peers6, refused6 and vxlan6 alike, for IPv6)
//	}
//
// The first rule records the source of each datagram the second drops in
// the refused set (RefusedMax sources, each for RefusedTimeout after its
// last datagram), which the daemon logs and shows in its status: a host
// whose VXLAN datagrams leave from another address than the PublicIP its
// lease publishes shows up there. The rules are apart because an update
// of a full set ends its rule: a full set records no new source, and
// its datagrams are dropped all the same.
//
// Each rule also matches `meta nfproto ipv4` (ipv6) and `meta l4proto udp`
// first, which nft hides as the dependencies of the address and port
// matches. Each address family has its own set and chain, owned by that family's
// Gate (the data plane of that family drives it), so that the two families
// never rewrite each other's state. The table is not masq's `table inet
// overlay`: masq repairs its table by replacing it whole, which would empty
// a set kept there, and the guard runs without --ip-masq too.
//
// # The hook
//
// Prerouting at priority raw (-300) runs before connection tracking
// (-200): a flood of spoofed datagrams is dropped without a conntrack
// lookup or an entry allocated for each (an entry of a packet dropped at
// input would not be confirmed, but it is still allocated, looked up and
// freed per packet), and before the routing decision and the UDP socket
// lookup, so the VXLAN socket never sees a dropped datagram. Prerouting
// also sees packets routed through the host, which the guard must leave
// alone (a pod may use UDP 8472 itself): `fib daddr type local-multicast`
// (route types 2-5: local, broadcast, anycast, multicast) keeps the drop
// to datagrams the host would receive itself (the VXLAN socket listens on
// every address of the host); a datagram the host would forward, or has no
// route for (unreachable, blackhole, prohibit), is left to the kernel. The set lookup comes first, so a peer's datagram costs a hash
// lookup and no FIB lookup. A non-first fragment has no UDP header and
// passes; without its first fragment it is never reassembled.
//
// # Ordering with the data plane
//
// A Gate is driven by its family's data plane, inside the plane's
// reconcile pass (backend.Gate): Admit before the pass writes any FDB
// entry, Settle after the pass removed every entry of the peers that left.
// So the addresses a host sends VXLAN to are always admitted, and a peer
// that left is refused only once nothing here sends to it. DirectRouting
// peers are admitted like the others: their routed traffic is not VXLAN
// and no rule matches it.
//
// # Reconciling
//
// The Gate keeps a view of its set's elements, read from the kernel at its
// first pass and at every full pass of the plane (the periodic resync, a
// notified change), and updated by each write; it writes only the
// difference, so a restart with the same peers makes no write at all, and
// the set is never flushed and refilled. Its chain and set are checked at
// those passes too: a deleted element, rule, chain or set is put back, in
// one transaction with the elements the set must hold. Remove deletes the
// table (`overlayd teardown`, `--vxlan-guard=false`).
package guard
