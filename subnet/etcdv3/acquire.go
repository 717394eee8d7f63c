package etcdv3

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/subnet"
)

// acquirer chooses this host's lease and adopts it: one that names this
// host already (its etcd lease kept, its key re-keyed for the network's
// families), the previous subnet.env's if free, or a random free subnet.
// Acquire and AcquireFrom use it at start-up, the keeper when it re-claims.
type acquirer struct {
	*lessee
	held *held
}

func (m *acquirer) tryAcquire(ctx context.Context, snap Snapshot) (subnet.Lease, error) {
	taken := m.listed(snap)
	var own *subnet.Lease
	for i, l := range snap.Leases {
		switch {
		case !l.Attrs.OwnedBy(m.host.NodeID, m.host.PublicIP, m.host.PublicIPv6):
		case !m.fits(l):
			return subnet.Lease{}, m.stranded(l)
		case own == nil:
			own = &snap.Leases[i]
		}
	}
	if own != nil {
		return m.adopt(ctx, *own, &taken)
	}
	want, err := m.pick(subnet.Subnets{}, &taken)
	if err != nil {
		return subnet.Lease{}, err
	}
	id, err := m.ensureEtcdLease(ctx)
	if err != nil {
		return subnet.Lease{}, err
	}
	attrs := m.host.Attrs
	rev, err := m.reg.Create(ctx, want, attrs, int64(id))
	if err != nil {
		return subnet.Lease{}, err
	}
	m.held.markCreated()
	return subnet.Lease{Subnet: want.IPv4, IPv6Subnet: want.IPv6, Attrs: attrs, EtcdLease: int64(id), ModRevision: rev}, nil
}

// takenSubnets are the subnets of each family some key names.
type takenSubnets struct{ v4, v6 map[netip.Prefix]bool }

// listed notes the subnets of every key of the listing snap, a key whose
// value is garbage included (it still occupies its subnets). Each
// family's map is sized for the listing if the network carries that
// family, and is left empty otherwise: a map grown key by key to 10,000
// keys allocates twice what it ends up holding, and one sized for a family
// the network does not carry is as much again for nothing, both at the
// start-up's peak.
func (m *acquirer) listed(snap Snapshot) takenSubnets {
	n := len(snap.Leases) + len(snap.Invalid)
	var taken takenSubnets
	if m.cfg.EnableIPv4 {
		taken.v4 = make(map[netip.Prefix]bool, n)
	}
	if m.cfg.EnableIPv6 {
		taken.v6 = make(map[netip.Prefix]bool, n)
	}
	for _, l := range snap.Leases {
		taken.add(l.Subnets())
	}
	for _, inv := range snap.Invalid {
		if s, err := m.reg.ParseKey(inv.Key); err == nil {
			taken.add(s)
		}
	}
	return taken
}

// add notes the subnets of s of each family t has a map for (pick never
// looks at the other family's).
func (t *takenSubnets) add(s subnet.Subnets) {
	if s.IPv4.IsValid() && t.v4 != nil {
		t.v4[s.IPv4] = true
	}
	if s.IPv6.IsValid() && t.v6 != nil {
		t.v6[s.IPv6] = true
	}
}

// pick completes have (the subnets a lease already holds, zero if none)
// with a subnet of each family the network carries: the previous
// subnet.env's if free, else a random free one. A subnet of a family the
// network does not carry is dropped.
func (m *acquirer) pick(have subnet.Subnets, taken *takenSubnets) (subnet.Subnets, error) {
	choose := func(have, previous netip.Prefix, pool *subnet.Pool, taken map[netip.Prefix]bool) (netip.Prefix, error) {
		switch {
		case have.IsValid():
			return have, nil
		case pool.InRange(previous) && !taken[previous]:
			return previous, nil
		}
		return pool.PickFree(taken, m.opts.Rand)
	}
	var want subnet.Subnets
	var err error
	if m.cfg.EnableIPv4 {
		if want.IPv4, err = choose(have.IPv4, m.host.Previous.IPv4, &m.cfg.Pool, taken.v4); err != nil {
			return want, err
		}
	}
	if m.cfg.EnableIPv6 {
		if want.IPv6, err = choose(have.IPv6, m.host.Previous.IPv6, &m.cfg.IPv6, taken.v6); err != nil {
			return want, err
		}
	}
	return want, nil
}

// fits reports whether the subnets of this host's lease l are in the
// network's pools; a missing or extra IPv6 subnet still fits (adopt adds
// or drops it).
func (m *acquirer) fits(l subnet.Lease) bool {
	return (!m.cfg.EnableIPv4 || m.cfg.Contains(l.Subnet)) &&
		(!m.cfg.EnableIPv6 || !l.IPv6Subnet.IsValid() || m.cfg.IPv6.Contains(l.IPv6Subnet))
}

// stranded explains a lease of this host that the network config no longer
// contains, and what to do about it.
func (m *acquirer) stranded(l subnet.Lease) error {
	fix := "restore the previous network config (`overlayd config put -f old.json`), or release it with `overlayd teardown` on this host and start again"
	if l.Reserved {
		fix = "restore the previous network config, or replace the reservation: `overlayd lease revoke " + l.Subnets().Primary().String() + "` and `overlayd lease reserve` a subnet of the new network"
	}
	return fmt.Errorf("%w: %s (key %s) names node %q but is not inside the network's pools (%s): %s",
		ErrStranded, l.Subnets(), m.reg.LeaseKey(l.Subnets()), m.host.NodeID, m.pools(), fix)
}

// pools names the network's subnet pools, e.g. "/24 of 10.244.0.0/16".
func (m *acquirer) pools() string {
	var pools []string
	if m.cfg.EnableIPv4 {
		pools = append(pools, fmt.Sprintf("/%d of %s", m.cfg.SubnetLen, m.cfg.Network))
	}
	if m.cfg.EnableIPv6 {
		pools = append(pools, fmt.Sprintf("/%d of %s", m.cfg.IPv6.SubnetLen, m.cfg.IPv6.Network))
	}
	return strings.Join(pools, ", ")
}

// adopt takes over a lease that already names this host. A reservation stays
// TTL-free; a leased key keeps its etcd lease if it is still alive and was
// granted the TTL asked for now, so a restart never multiplies etcd leases
// (one granted another TTL — --lease-ttl changed — is replaced, and revoked
// once the key has moved). If the network started or stopped carrying IPv6
// since the lease was written, the key is replaced by one that adds or
// drops the IPv6 subnet (the IPv4 subnet, which pods hold addresses of, is
// kept).
func (m *acquirer) adopt(ctx context.Context, l subnet.Lease, taken *takenSubnets) (subnet.Lease, error) {
	id := clientv3.LeaseID(0)
	var replaced clientv3.LeaseID // an etcd lease of another TTL, revoked once the key has moved
	if !l.Reserved {
		left, granted, err := m.reg.ttls(ctx, l.EtcdLease)
		if err != nil {
			return subnet.Lease{}, err
		}
		asked := int64(m.opts.LeaseTTL / time.Second)
		switch {
		case left > 0 && granted == asked:
			m.held.setEtcdLease(clientv3.LeaseID(l.EtcdLease), time.Duration(left)*time.Second)
			id = clientv3.LeaseID(l.EtcdLease)
		case left > 0:
			m.log.Info("the lease's etcd lease was granted another TTL; moving the key onto one of the TTL asked for", "granted", time.Duration(granted)*time.Second, "lease_ttl", m.opts.LeaseTTL)
			replaced = clientv3.LeaseID(l.EtcdLease)
			m.held.forgetEtcdLease(replaced) // a new one is granted below, never this one again
		}
		if id == 0 {
			if id, err = m.ensureEtcdLease(ctx); err != nil {
				return subnet.Lease{}, err
			}
		}
	}
	want, err := m.pick(l.Subnets(), taken)
	if err != nil {
		return subnet.Lease{}, err
	}
	attrs := m.host.Attrs
	var rev int64
	switch {
	case want != l.Subnets():
		m.log.Info("replacing this host's lease key for the network's address families", "old", l.Subnets(), "new", want)
		rev, err = m.reg.Rekey(ctx, l, want, attrs, int64(id))
	case subnet.SameAttrs(attrs, l.Attrs) && int64(id) == l.EtcdLease:
		return l, nil
	default:
		rev, err = m.reg.Update(ctx, l, attrs, int64(id))
	}
	if err != nil {
		return subnet.Lease{}, err
	}
	if replaced != 0 && replaced != id {
		revoke(ctx, m.reg.cli, replaced) // it carries nothing now; else it would linger for its whole TTL
	}
	return subnet.Lease{Subnet: want.IPv4, IPv6Subnet: want.IPv6, Attrs: attrs, Reserved: l.Reserved, EtcdLease: int64(id), ModRevision: rev}, nil
}

// ensureEtcdLease grants this host's etcd lease once and reuses it.
func (m *acquirer) ensureEtcdLease(ctx context.Context) (clientv3.LeaseID, error) {
	if id := m.held.etcdLeaseID(); id != 0 {
		return id, nil
	}
	resp, err := m.reg.cli.Grant(ctx, int64(m.opts.LeaseTTL/time.Second))
	if err != nil {
		return 0, fmt.Errorf("grant an etcd lease of %s: %w", m.opts.LeaseTTL, err)
	}
	m.held.setEtcdLease(resp.ID, time.Duration(resp.TTL)*time.Second)
	return resp.ID, nil
}
