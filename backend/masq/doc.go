// Package masq is overlayd's own masquerade (`--ip-masq`): one nftables table,
// programmed over netlink with github.com/google/nftables (no `nft` or
// `iptables` binary, no shelling out), that source-NATs pod traffic leaving
// the cluster network and leaves pod-to-pod traffic alone. The bridge CNI
// plugin is then told ipMasq=false, so exactly one component decides what is
// NATed.
//
// # The table
//
// For network N = 10.244.0.0/16 and the VXLAN device overlay.1 the kernel
// holds (as Rules renders it, in `nft list` syntax):
//
//	table ip overlay {
//		chain postrouting {
//			type nat hook postrouting priority srcnat; policy accept;
//			ip saddr 10.244.0.0/16 ip daddr 10.244.0.0/16 return comment "overlay: pod to pod, no NAT"
//			ip saddr 10.244.0.0/16 ip daddr 224.0.0.0/4 return comment "overlay: multicast, no NAT"
//			ip saddr 10.244.0.0/16 masquerade fully-random comment "overlay: pod to outside"
//			ip saddr != 10.244.0.0/16 ip daddr 10.244.0.0/16 oifname "overlay.1" masquerade fully-random comment "overlay: outside to remote pod"
//		}
//	}
//
// Why a table of our own, family ip: we never edit anyone else's chains, the
// whole ruleset is replaced or removed atomically by deleting and re-adding
// one table in one netlink batch (one nftables transaction: a packet sees
// the old rules or the new ones, never none), and "ours" is simply
// everything in table ip overlay. The cluster network is IPv4 (the etcd
// schema is flannel's), so family ip needs no `meta nfproto ipv4` guard in
// every rule, and NAT in the ip family works on every kernel with nf_tables
// NAT (family inet needs 5.2+).
//
// # The packet paths
//
// A pod's packet to the internet leaves the bridge, is forwarded, and in
// postrouting (priority srcnat, 100) matches rule 3: its source becomes the
// address of the interface it leaves by. Port allocation is fully random
// (NF_NAT_RANGE_PROTO_RANDOM_FULLY), as flannel does, which avoids the
// SNAT port-collision races of sequential allocation.
//
// A pod's packet to another pod, local or remote, matches rule 1 and keeps
// its source: pods see each other's real addresses. Multicast (rule 2) is
// not NATed either, as flannel. A return ends only our chain: another
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
// VTEP's address (own subnet .0/32), so the reply returns through the
// overlay. Flannel matches "destination in N but not in my own subnet"; we
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
// accept the cluster network in that very chain; overlayd does not write
// into other owners' tables. ForwardDrops lists the nftables base chains of
// other tables on the forward hook whose policy is drop (legacy iptables is
// invisible to it), so the daemon can warn at start.
//
// # Reconciling
//
// Ensure reads back what the kernel holds (table, chains, rules — between
// two reads of the ruleset generation, so a dump that raced another writer
// is retried), renders it and the desired state to the same canonical text
// and rewrites the table only if the two differ. Any drift — a rule
// deleted, a foreign rule, chain or set added to our table (the forward
// chain of older versions included), a chain policy turned to drop, the
// table made dormant, the table deleted — is repaired with one batch. When
// nothing differs, Ensure sends no writes. The daemon calls Ensure
// periodically and when the network changes (a new Masq for the new
// network: Ensure replaces the old rules atomically), or uses Run.
package masq
