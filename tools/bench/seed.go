package main

import (
	"context"
	"encoding/json"
	"fmt"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"net/netip"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// benchNetwork is the cluster network of the control-plane benchmarks: a /8
// of /24s has room for 65,000 peers.
const benchNetwork = `{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}`

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

// synthPeers returns peers from..to-1.
func synthPeers(from, to int) []peerEntry {
	out := make([]peerEntry, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, synthPeer(i))
	}
	return out
}

// leaseValue is the flannel-compatible value of a synthetic lease.
func leaseValue(p peerEntry) string {
	data, _ := json.Marshal(subnet.VXLANData{VNI: 1, VtepMAC: p.MAC.String()})
	v, _ := json.Marshal(subnet.LeaseAttrs{PublicIP: p.PublicIP.String(), BackendType: "vxlan", BackendData: data})
	return string(v)
}

func leaseKey(p netip.Prefix) string {
	return etcdv3.DefaultPrefix + "/subnets/" + subnet.Key(p)
}

// putLeases writes peers' leases in transactions of up to maxTxnOps keys
// (one transaction, one watch response, when there are few enough) and
// returns the revision of the last.
func putLeases(ctx context.Context, cli *clientv3.Client, peers []peerEntry) (int64, error) {
	var rev int64
	for start := 0; start < len(peers); start += maxTxnOps {
		ops := make([]clientv3.Op, 0, maxTxnOps)
		for _, p := range peers[start:min(len(peers), start+maxTxnOps)] {
			ops = append(ops, clientv3.OpPut(leaseKey(p.Subnet), leaseValue(p)))
		}
		resp, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return 0, fmt.Errorf("write %d leases: %w", len(ops), err)
		}
		rev = resp.Header.Revision
	}
	return rev, nil
}

// deleteLeases deletes peers' leases the same way.
func deleteLeases(ctx context.Context, cli *clientv3.Client, peers []peerEntry) (int64, error) {
	var rev int64
	for start := 0; start < len(peers); start += maxTxnOps {
		ops := make([]clientv3.Op, 0, maxTxnOps)
		for _, p := range peers[start:min(len(peers), start+maxTxnOps)] {
			ops = append(ops, clientv3.OpDelete(leaseKey(p.Subnet)))
		}
		resp, err := cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return 0, fmt.Errorf("delete %d leases: %w", len(ops), err)
		}
		rev = resp.Header.Revision
	}
	return rev, nil
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
	peers []peerEntry
}

// seedHost builds a seededHost: a lab tagged tag, k peers, host name.
func (b *bench) seedHost(ctx context.Context, tag, name string, k int) (_ *seededHost, err error) {
	// h, not the named result: a failed step returns nil, and the cleanup
	// must still reach what was built so far.
	h := &seededHost{}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	if h.lab, err = b.newLab(ctx, tag, benchNetwork); err != nil {
		return nil, err
	}
	if h.cli, err = h.lab.Etcd.Client(); err != nil {
		return nil, err
	}
	h.peers = synthPeers(1, k+1)
	if _, err = putLeases(ctx, h.cli, h.peers); err != nil {
		return nil, err
	}
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
