package etcdv3

import (
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/subnet"
)

// Keys names the keys under one prefix and decodes what is read from them:
// pure, so the journal, the watch and the admin commands name and decode a
// lease one way. Registry embeds it.
type Keys struct {
	prefix string
	// ipv6Only: the network carries IPv6 only, and its leases live under
	// <prefix>/subnets6/ in the IPv6-only key form (see Registry.For).
	ipv6Only bool
	// subnets is SubnetsPrefix, spelt out once: it is asked for at
	// every key of a listing.
	subnets string
}

func newKeys(prefix string) Keys {
	k := Keys{prefix: strings.TrimRight(prefix, "/")}
	k.subnets = k.subnetsPrefix()
	return k
}

// forFamilies is k for the leases of network cfg (Registry.For).
func (k Keys) forFamilies(cfg *subnet.Config) Keys {
	k.ipv6Only = !cfg.EnableIPv4
	k.subnets = k.subnetsPrefix()
	return k
}

// ParseKey decodes a lease key (the full key, under SubnetsPrefix).
func (k Keys) ParseKey(key string) (subnet.Subnets, error) {
	suffix, ok := strings.CutPrefix(key, k.SubnetsPrefix())
	switch {
	case !ok:
		return subnet.Subnets{}, fmt.Errorf("%w: key %q is not under %s", subnet.ErrInvalidLease, key, k.SubnetsPrefix())
	case k.ipv6Only:
		return subnet.ParseIPv6OnlyKey(suffix)
	}
	return subnet.ParseLeaseKey(suffix)
}

// ConfigKey is the key of the network config.
func (k Keys) ConfigKey() string { return k.prefix + "/config" }

// SubnetsPrefix is the key prefix of all leases, with a trailing slash.
func (k Keys) SubnetsPrefix() string { return k.subnets }

func (k Keys) subnetsPrefix() string {
	if k.ipv6Only {
		return k.prefix + "/subnets6/"
	}
	return k.prefix + "/subnets/"
}

// LeaseKey is the key of the lease on s: one IPv4 subnet, or an IPv4 and
// an IPv6 subnet (a dual-stack lease).
func (k Keys) LeaseKey(s subnet.Subnets) string { return k.SubnetsPrefix() + s.Key() }

// NodesPrefix is the key prefix of the liveness keys, with a trailing slash.
func (k Keys) NodesPrefix() string { return k.prefix + "/nodes/" }

// NodeKey is the liveness key of one node.
func (k Keys) NodeKey(nodeID string) string { return k.NodesPrefix() + nodeID }

// decode is the lease a key and its value name, as etcd held them: the one
// place a lease read from etcd (or from the journal, which keeps etcd's
// bytes) is decoded.
func (k Keys) decode(key, value []byte, etcdLease, modRev int64) (subnet.Lease, error) {
	s, err := k.ParseKey(string(key))
	if err != nil {
		return subnet.Lease{}, err
	}
	l := subnet.Lease{Subnet: s.IPv4, IPv6Subnet: s.IPv6, Reserved: etcdLease == 0, EtcdLease: etcdLease, ModRevision: modRev}
	if l.Attrs, err = subnet.DecodeAttrs(value); err == nil {
		l.Value = value
	}
	return l, err
}

// unchangedSince holds when no lease key was written after revision rev
// (deletions do not count: they only free subnets).
func (k Keys) unchangedSince(rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(k.SubnetsPrefix()), "<", rev+1).WithPrefix()
}
