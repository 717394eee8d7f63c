package etcdv3

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/subnet"
)

// AcquireFrom is Acquire for a host that saved the lease set it followed
// (LoadJournal): if etcd still holds that set at its revision and this
// host's lease in it is still this host's, the lease is adopted without
// listing every lease, and saved is returned to seed the peers and the
// watch, which resumes from saved.Revision. Otherwise it logs why and
// lists (Acquire). A zero saved is Acquire.
func (m *Manager) AcquireFrom(ctx context.Context, saved Snapshot) (subnet.Lease, Snapshot, error) {
	if saved.Revision == 0 {
		return m.Acquire(ctx)
	}
	l, rev, err := m.acq.resume(ctx, saved)
	var stale staleJournal
	if errors.As(err, &stale) {
		m.log.Info("saved lease set not used, listing every lease", "reason", stale.reason, "saved_revision", saved.Revision)
		return m.Acquire(ctx)
	}
	if err != nil {
		return subnet.Lease{}, Snapshot{}, err
	}
	m.held.setLease(l)
	m.held.setSeen(rev)
	m.log.Info("lease acquired", "subnets", l.Subnets(), "reserved", l.Reserved, "public_ip", m.host.PublicIP, "resumed_from", saved.Revision)
	saved.Head = rev
	return l, saved, nil
}

// staleJournal is why a saved lease set cannot be used.
type staleJournal struct{ reason string }

func (s staleJournal) Error() string { return "saved lease set not used: " + s.reason }

func stale(format string, args ...any) error { return staleJournal{fmt.Sprintf(format, args...)} }

// resume checks saved against etcd and adopts this host's lease in it. It
// returns the lease and a revision at which its key was as the lease says.
//
// etcd's MVCC store makes "the lease set at revision R" a fact that does
// not change, so one request tells whether saved is still usable: this
// host's key at R (which fails if R was compacted, or is beyond a
// re-created or restored cluster's head), as saved has it, and the
// cluster's ID. Each read is of one key: a fleet restart costs etcd N
// small reads, not N walks over N keys (counting the keys at R did: 9 %
// of the members' CPU in a profiled restart of 2,000 hosts). The journal's
// checksums catch a file changed since it was written; the periodic
// re-list catches what no cheap check could.
func (m *acquirer) resume(ctx context.Context, saved Snapshot) (subnet.Lease, int64, error) {
	taken := m.listed(saved)
	var own, atPrevious *subnet.Lease
	for i, l := range saved.Leases {
		if own == nil && l.Attrs.OwnedBy(m.host.NodeID, m.host.PublicIP, m.host.PublicIPv6) {
			own = &saved.Leases[i]
		}
		if l.Subnets() == m.host.Previous {
			atPrevious = &saved.Leases[i]
		}
	}
	// This host's key: the one the saved set names it in or, if the set was
	// saved before its own new lease arrived, the previous subnet.env's.
	var mine subnet.Subnets
	switch {
	case own != nil && m.fits(*own):
		mine = own.Subnets()
	case own != nil:
		return subnet.Lease{}, 0, stale("this host's lease %s is outside the network", own.Subnets())
	case !m.host.Previous.Primary().IsValid():
		return subnet.Lease{}, 0, stale("it holds no lease of this host, and there is no previous subnet file")
	case atPrevious != nil:
		return subnet.Lease{}, 0, stale("it names node %q as the holder of this host's previous subnet %s", atPrevious.Attrs.NodeID, m.host.Previous)
	default:
		mine = m.host.Previous
	}
	key := m.reg.LeaseKey(mine)
	resp, err := m.reg.cli.Txn(ctx).Then(
		clientv3.OpGet(key),
		clientv3.OpGet(key, clientv3.WithRev(saved.Revision)),
	).Commit()
	switch {
	case errors.Is(err, rpctypes.ErrCompacted):
		return subnet.Lease{}, 0, stale("etcd has compacted its revision %d", saved.Revision)
	case errors.Is(err, rpctypes.ErrFutureRev):
		return subnet.Lease{}, 0, stale("etcd is at a revision before its %d: a re-created or restored cluster", saved.Revision)
	case err != nil:
		return subnet.Lease{}, 0, fmt.Errorf("check the saved lease set against etcd: %w", err)
	case resp.Header.ClusterId != saved.ClusterID:
		return subnet.Lease{}, 0, stale("it was saved from etcd cluster %x; this is cluster %x", saved.ClusterID, resp.Header.ClusterId)
	}
	cur, then := resp.Responses[0].GetResponseRange(), resp.Responses[1].GetResponseRange()
	var heldMod, savedMod int64 // 0: absent
	if kvs := then.GetKvs(); len(kvs) > 0 {
		heldMod = kvs[0].ModRevision
	}
	if own != nil {
		savedMod = own.ModRevision
	}
	if heldMod != savedMod {
		return subnet.Lease{}, 0, stale("at revision %d etcd held this host's key %s as written at revision %d, the saved set as written at %d (0: absent)", saved.Revision, key, heldMod, savedMod)
	}
	if len(cur.GetKvs()) == 0 {
		return subnet.Lease{}, 0, stale("this host's lease key %s is gone", key)
	}
	kv := cur.Kvs[0]
	l, err := m.reg.decode(kv.Key, kv.Value, kv.Lease, kv.ModRevision)
	switch {
	case err != nil:
		return subnet.Lease{}, 0, stale("this host's lease key %s: %v", key, err)
	case !l.Attrs.OwnedBy(m.host.NodeID, m.host.PublicIP, m.host.PublicIPv6):
		return subnet.Lease{}, 0, stale("this host's lease key %s now names node %q", key, l.Attrs.NodeID)
	}
	l, err = m.adopt(ctx, l, &taken)
	if errors.Is(err, ErrTaken) || errors.Is(err, ErrConflict) {
		return subnet.Lease{}, 0, stale("adopting %s: %v", key, err)
	}
	return l, max(resp.Header.Revision, l.ModRevision), err
}
