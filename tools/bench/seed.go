package main

import (
	"context"
	"fmt"
	"net/netip"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// benchNetwork is the cluster network of the control-plane benchmarks: a /8
// of /24s has room for 65,000 peers.
const benchNetwork = `{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}`

// benchNetworkDual is benchNetwork with IPv6 as well: a /48 of /64s, room
// for as many peers.
const benchNetworkDual = `{"Network":"10.0.0.0/8","SubnetLen":24,"EnableIPv6":true,"IPv6Network":"fd00:10::/48","IPv6SubnetLen":64,"Backend":{"Type":"vxlan"}}`

// stack is the address families of a synthetic cluster.
type stack int

const (
	ipv4Only  stack = iota // IPv4 leases, one VXLAN device
	dualStack              // dual-stack leases, a second (IPv6) device
)

// String is the stack's name in the results ("family").
func (s stack) String() string {
	if s == dualStack {
		return "dual"
	}
	return "ipv4"
}

// network is the stack's network config.
func (s stack) network() string {
	if s == dualStack {
		return benchNetworkDual
	}
	return benchNetwork
}

// useNetwork stores s's network config, for the daemons started next.
func useNetwork(ctx context.Context, cli *clientv3.Client, s stack) error {
	if _, err := etcdv3.NewRegistry(cli, etcdv3.DefaultPrefix).PutConfig(ctx, []byte(s.network())); err != nil {
		return fmt.Errorf("store the %s network config: %w", s, err)
	}
	return nil
}

// maxTxnOps stays under etcd's default limit of 128 operations per
// transaction.
const maxTxnOps = 128

// maxPeers bounds the synthetic peers: i is 16 bits.
const maxPeers = 65535

// synthPeer is synthetic peer number i (1..maxPeers): subnet
// 10.<i/256>.<i%256>.0/24 (10.0.1.0/24 first, the network's SubnetMin),
// public IP 198.19.<i/256>.<i%256> (outside the lab's underlay
// 198.18.0.0/24, and never on any wire: routes are onlink, FDB entries
// static), VTEP MAC 0e:00:00:00:<i/256>:<i%256>.
func synthPeer(i int) peerEntry {
	hi, lo := byte(i>>8), byte(i)
	return peerEntry{
		Subnet:   netip.PrefixFrom(netip.AddrFrom4([4]byte{10, hi, lo, 0}), 24),
		PublicIP: netip.AddrFrom4([4]byte{198, 19, hi, lo}),
		MAC:      vxlan.MAC{0x0e, 0, 0, 0, hi, lo},
	}
}

// synthPeer6 is the IPv6 half of dual-stack peer i: subnet
// fd00:10:0:<i>::/64, public IPv6 fd19::<i> (outside the lab's underlay
// fd18::/64), VTEP MAC 0e:00:00:01:<i/256>:<i%256> (never one of the IPv4
// MACs).
func synthPeer6(i int) peerEntry {
	hi, lo := byte(i>>8), byte(i)
	return peerEntry{
		Subnet:   netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0x00, 0x00, 0x10, 0, 0, hi, lo}), 64),
		PublicIP: netip.AddrFrom16([16]byte{0xfd, 0x19, 14: hi, 15: lo}),
		MAC:      vxlan.MAC{0x0e, 0, 0, 1, hi, lo},
	}
}

// synthPeers returns peers from..to-1.
func synthPeers(from, to int) []peerEntry { return synthRange(synthPeer, from, to) }

// synthPeers6 returns the IPv6 halves of peers from..to-1.
func synthPeers6(from, to int) []peerEntry { return synthRange(synthPeer6, from, to) }

func synthRange(peer func(int) peerEntry, from, to int) []peerEntry {
	out := make([]peerEntry, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, peer(i))
	}
	return out
}

// leaseValue is the flannel-compatible value of a synthetic lease.
func leaseValue(p peerEntry) string {
	v, _ := leaseAttrs(p).Marshal()
	return string(v)
}

func leaseAttrs(p peerEntry) subnet.LeaseAttrs {
	return subnet.LeaseAttrs{PublicIP: p.PublicIP.String(), BackendType: "vxlan", BackendData: leasedata.Codec{VNI: 1}.Encode(p.MAC.HardwareAddr())}
}

// dualLeaseValue is the value of a dual-stack lease: v4's fields, plus
// PublicIPv6 and BackendV6Data from v6.
func dualLeaseValue(v4, v6 peerEntry) string {
	v, _ := leaseAttrs(v4).WithIPv6(v6.PublicIP, leasedata.Codec{VNI: 1}.Encode(v6.MAC.HardwareAddr())).Marshal()
	return string(v)
}

func leaseKey(p netip.Prefix) string {
	return etcdv3.DefaultPrefix + "/subnets/" + subnet.Key(p)
}

func dualLeaseKey(v4, v6 netip.Prefix) string {
	return etcdv3.DefaultPrefix + "/subnets/" + subnet.Subnets{IPv4: v4, IPv6: v6}.Key()
}

// putLeases writes peers' leases in transactions of up to maxTxnOps keys
// (one transaction, one watch response, when there are few enough) and
// returns the revision of the last.
func putLeases(ctx context.Context, cli *clientv3.Client, peers []peerEntry) (int64, error) {
	return inTxns(ctx, cli, "write", len(peers), func(i int) clientv3.Op {
		return clientv3.OpPut(leaseKey(peers[i].Subnet), leaseValue(peers[i]))
	})
}

// putDualLeases writes dual-stack leases, v4[i] with v6[i], the same way.
func putDualLeases(ctx context.Context, cli *clientv3.Client, v4, v6 []peerEntry) (int64, error) {
	return inTxns(ctx, cli, "write", len(v4), func(i int) clientv3.Op {
		return clientv3.OpPut(dualLeaseKey(v4[i].Subnet, v6[i].Subnet), dualLeaseValue(v4[i], v6[i]))
	})
}

// deleteLeases deletes peers' leases the same way.
func deleteLeases(ctx context.Context, cli *clientv3.Client, peers []peerEntry) (int64, error) {
	return inTxns(ctx, cli, "delete", len(peers), func(i int) clientv3.Op {
		return clientv3.OpDelete(leaseKey(peers[i].Subnet))
	})
}

// inTxns commits the operations op(0..n-1) in transactions of up to
// maxTxnOps and returns the revision of the last.
func inTxns(ctx context.Context, cli *clientv3.Client, verb string, n int, op func(i int) clientv3.Op) (int64, error) {
	var rev int64
	for start := 0; start < n; start += maxTxnOps {
		ops := make([]clientv3.Op, 0, maxTxnOps)
		for i := start; i < min(n, start+maxTxnOps); i++ {
			ops = append(ops, op(i))
		}
		resp, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return 0, fmt.Errorf("%s %d leases: %w", verb, len(ops), err)
		}
		rev = resp.Header.Revision
	}
	return rev, nil
}

// seedLeases writes k synthetic leases of stack s (peers 1..k) and returns
// every kernel entry a host must program for them: the IPv4 peers, then,
// in a dual-stack cluster, the IPv6 ones.
func seedLeases(ctx context.Context, cli *clientv3.Client, s stack, k int) (v4, v6 []peerEntry, err error) {
	v4 = synthPeers(1, k+1)
	if s != dualStack {
		_, err = putLeases(ctx, cli, v4)
		return v4, nil, err
	}
	v6 = synthPeers6(1, k+1)
	_, err = putDualLeases(ctx, cli, v4, v6)
	return v4, v6, err
}

// resetLeases empties the subnets and nodes prefixes and compacts etcd, so
// every cold run starts from the same store.
func resetLeases(ctx context.Context, cli *clientv3.Client) error {
	for _, pfx := range []string{"/subnets/", "/nodes/"} {
		if _, err := cli.Delete(ctx, etcdv3.DefaultPrefix+pfx, clientv3.WithPrefix()); err != nil {
			return fmt.Errorf("clear %s: %w", pfx, err)
		}
	}
	resp, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		return err
	}
	if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
		return fmt.Errorf("compact etcd: %w", err)
	}
	return nil
}

// seededHost is a lab whose etcd holds k synthetic peers, with one host whose
// kernel is watched; the host's daemon is not started yet. Every scenario
// that measures convergence starts from one.
type seededHost struct {
	lab   *lab.Lab
	cli   *clientv3.Client
	node  *lab.Node
	watch *kernelWatch
	peers []peerEntry // every kernel entry of the peers: IPv4, then IPv6 (dual stack)
}

// seedHost builds a seededHost: a lab tagged tag, k peers of stack s, host
// name.
func (b *bench) seedHost(ctx context.Context, tag, name string, k int, s stack) (_ *seededHost, err error) {
	// h, not the named result: a failed step returns nil, and the cleanup
	// must still reach what was built so far.
	h := &seededHost{}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	if h.lab, err = b.newLab(ctx, tag, s.network()); err != nil {
		return nil, err
	}
	if h.cli, err = h.lab.Etcd.Client(); err != nil {
		return nil, err
	}
	v4, v6, err := seedLeases(ctx, h.cli, s, k)
	if err != nil {
		return nil, err
	}
	h.peers = append(v4, v6...)
	if h.node, err = h.lab.AddNode(name, 1); err != nil {
		return nil, err
	}
	if h.watch, err = watchKernel(h.node.NS); err != nil {
		return nil, err
	}
	return h, nil
}

// Close releases the watcher, the client and the lab, in that order.
func (s *seededHost) Close() {
	if s.watch != nil {
		s.watch.Close()
	}
	if s.cli != nil {
		_ = s.cli.Close()
	}
	if s.lab != nil {
		_ = s.lab.Close()
	}
}
