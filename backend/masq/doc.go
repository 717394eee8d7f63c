// Package masq is overlayd's own masquerade (`--ip-masq`): one nftables table,
// programmed over netlink with github.com/google/nftables (no `nft` or
// `iptables` binary, no shelling out), that source-NATs pod traffic leaving
// the cluster networks and leaves pod-to-pod traffic alone, for IPv4 and
// IPv6 alike. The bridge CNI plugin is then told ipMasq=false, so exactly
// one component decides what is NATed.
//
// # The table
//
// For the networks N4 = 10.244.0.0/16 and N6 = fd00:10:244::/48 with the
// VXLAN devices overlay.1 and overlay-v6.1 the kernel holds (as Rules
// renders it, in `nft list` syntax):
//
//	table inet overlay {
//		chain postrouting {
//			type nat hook postrouting priority srcnat; policy accept;
//			meta nfproto ipv4 ip saddr 10.244.0.0/16 ip daddr 10.244.0.0/16 return comment "overlay: pod to pod, no NAT"
//			meta nfproto ipv4 ip saddr 10.244.0.0/16 ip daddr 224.0.0.0/4 return comment "overlay: multicast, no NAT"
//			meta nfproto ipv4 ip saddr 10.244.0.0/16 masquerade fully-random comment "overlay: pod to outside"
//			meta nfproto ipv4 ip saddr != 10.244.0.0/16 ip daddr 10.244.0.0/16 oifname "overlay.1" masquerade fully-random comment "overlay: outside to remote pod"
//			meta nfproto ipv6 ip6 saddr fd00:10:244::/48 ip6 daddr fd00:10:244::/48 return comment "overlay: pod to pod, no NAT"
//			meta nfproto ipv6 ip6 saddr fd00:10:244::/48 ip6 daddr ff00::/8 return comment "overlay: multicast, no NAT"
//			meta nfproto ipv6 ip6 saddr fd00:10:244::/48 masquerade fully-random comment "overlay: pod to outside"
//			meta nfproto ipv6 ip6 saddr != fd00:10:244::/48 ip6 daddr fd00:10:244::/48 oifname "overlay-v6.1" masquerade fully-random comment "overlay: outside to remote pod"
//		}
//	}
//
// An IPv4-only cluster (New(N4)) has the first four rules, an IPv6-only one
// (New(N6)) the last four; WithNetwork adds the other family's network, and
// WithOverlayDevice / WithIPv6OverlayDevice the device rule of each family.
// `nft list table inet overlay` prints the same rules without the `meta
// nfproto` matches: nft treats them as the implied dependency of an `ip` or
// `ip6` address match and hides them. They are there, and needed: in an
// inet table every rule sees both families' packets, and without the guard
// an IPv4 rule would compare bytes 12-19 of an IPv6 header as addresses.
//
// Why a table of our own: we never edit anyone else's chains, the whole
// ruleset is replaced or removed atomically by deleting and re-adding one
// table in one netlink batch (one nftables transaction: a packet sees the
// old rules or the new ones, never none), and "ours" is simply everything
// in table inet overlay. Why family inet: one table, one chain, one
// transaction for both families — a dual-stack host never holds the rules
// of one family without the other's.
//
// NAT in family inet needs Linux 5.2 or later (CONFIG_NF_TABLES_INET,
// CONFIG_NFT_NAT, CONFIG_NFT_MASQ, built in or loadable; some distribution
// kernels older than 5.2 have it backported). On a kernel without it the
// batch is refused as a whole — nothing changes, and a table of an older
// version keeps working — and Ensure returns an error that names the
// kernel release and the requirement. overlayd does not fall back to
// per-family tables.
//
// # The packet paths
//
// The rules of the two families mirror each other; rule numbers below
// count within one family. A pod's packet to the internet leaves the
// bridge, is forwarded, and in postrouting (priority srcnat, 100) matches
// rule 3: its source becomes the address of the interface it leaves by (for
// IPv6, the best source address for the destination on that interface). Port allocation is fully random
// (NF_NAT_RANGE_PROTO_RANDOM_FULLY), as flannel does, which avoids the
// SNAT port-collision races of sequential allocation.
//
// A pod's packet to another pod, local or remote, matches rule 1 and keeps
// its source: pods see each other's real addresses. Multicast (rule 2:
// 224.0.0.0/4, ff00::/8) is not NATed either, as flannel. A return ends only our chain: another
// table's NAT chain on the same hook (the bridge plugin's ipMasq rules, say)
// could still NAT pod-to-pod traffic, which is why the CNI delegate is given
// ipMasq=false. The host's own connections to pods need no rule: routing
// gives them a source inside N (the bridge's address for local pods, the
// VTEP's for remote ones).
//
// Rule 4 is optional (WithOverlayDevice). It handles packets from outside
// the cluster network to a pod on another host: an external client reaching
// a NodePort, the host itself after kube-proxy DNATs a service VIP (the
// routing decision, and so the source address, was made for the VIP via
// the underlay), a process bound to an underlay address. Without it such a
// packet arrives at the remote host on its VXLAN device with a source that
// host routes via the underlay: strict reverse-path filtering drops it, and
// otherwise the reply goes straight back via the underlay, bypassing this
// host's conntrack (the DNAT is never undone) — flannel issue #318, fixed by
// flannel's `! -s N -d N -j MASQUERADE`. Masquerading gives the packet the
// VTEP's address (own subnet .0/32; for IPv6 the address of the IPv6
// device, the own IPv6 subnet's first address/128), so the reply returns
// through the overlay. Each family has its own VXLAN device, hence its own
// device rule. Flannel matches "destination in N but not in my own subnet"; we
// match "leaves through the VXLAN device" instead, which needs no lease
// (it survives a lease change untouched), keeps client addresses for local
// pods (externalTrafficPolicy=Local, flannel #734) and does not NAT
// DirectRouting peers, whose routes use the underlay symmetrically.
//
// # No forward chain
//
// overlayd adds no chain on the forward hook, deliberately. In nftables an
// accept is final only for the base chain that issued it: every base chain
// registered on the forward hook, in any table, still sees the packet, and
// a drop in any of them wins. So an accept of ours cannot override a drop
// in another base chain, and a chain that only accepts, with policy accept,
// cannot change any packet's verdict — it would only cost every forwarded
// packet an evaluation on the data path. (Older versions installed such a
// chain, "forward"; Ensure removes it as drift.)
//
// If the host drops forwarded traffic by policy — Docker's iptables-nft
// FORWARD policy drop, an administrator's firewall — the operator must
// accept the cluster networks in that very chain; overlayd does not write
// into other owners' tables. ForwardDrops lists the nftables base chains of
// other tables on the forward hook whose policy is drop, in the families
// that see the cluster's traffic (inet, plus ip for an IPv4 network and ip6
// for an IPv6 one; legacy iptables is invisible to it), so the daemon can
// warn at start.
//
// # Upgrading from family ip
//
// Versions before dual stack kept table ip overlay (the IPv4 rules above
// without the nfproto matches; the oldest also had a forward chain in it).
// The batch Ensure writes always also deletes that table, so on an upgraded
// host the first Ensure creates table inet overlay and deletes table ip
// overlay in one transaction: NAT moves from the old table to the new one
// at one instant, and no new connection from a pod ever leaves un-NATed.
// Connections already open keep their NAT binding, which lives in
// conntrack, not in the table. If the kernel refuses the batch (no inet
// NAT, say), neither change happens and the old table keeps masquerading.
// table ip overlay is treated as drift from then on: should it reappear (a
// downgraded daemon running once), Ensure deletes it again, and Remove
// deletes it along with ours. Rules shows it after our table while it
// exists.
//
// # Reconciling
//
// Ensure reads back what the kernel holds (our table and table ip overlay:
// chains, rules — between two reads of the ruleset generation, so a dump
// that raced another writer is retried), renders it and the desired state
// to the same canonical text and rewrites the table only if the two differ.
// Any drift — a rule deleted, a foreign rule, chain or set added to our
// table (the forward chain of older versions included), a rule of either
// family changed or stripped of its nfproto match, a chain policy turned
// to drop, the table made dormant, the table deleted, table ip overlay
// present — is repaired with one batch. When nothing differs, Ensure sends
// no writes. The daemon calls Ensure periodically and when the networks
// change (a new Masq for the new networks: Ensure replaces the old rules
// atomically), or uses Run.
package masq
