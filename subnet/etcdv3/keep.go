package etcdv3

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/subnet"
)

// keeper keeps the lease Acquire obtained: it renews the etcd lease,
// watches the lease key and re-claims the same subnet whenever the key or
// its etcd lease disappears (or etcd's store was re-created).
type keeper struct {
	*acquirer
	// epoch is the re-creations of etcd's store known (storeHead), read
	// and written by the keeper only.
	epoch uint64
}

// Run keeps the lease until ctx ends (then it returns nil) or the subnet is
// lost to another host (ErrLeaseLost). It survives etcd outages: renewals and
// re-claims are retried until etcd answers again.
func (m *Manager) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { m.node.keep(ctx) })

	lost := make(chan error, 1)
	wg.Go(func() {
		if err := m.keep.keepLease(ctx); err != nil {
			lost <- err
		}
	})
	select {
	case <-ctx.Done():
		return nil
	case err := <-lost:
		return err
	}
}

// keepLease renews the etcd lease and watches the lease key, re-claiming the
// same subnet whenever the key or its etcd lease disappears.
func (m *keeper) keepLease(ctx context.Context) error {
	var warn repeatWarn
	for ctx.Err() == nil {
		held := time.Now()
		// etcd answering the hold ends a run of failures, whether or not
		// a re-claim was needed: the next outage is news again.
		err := m.holdLease(ctx, func() { warn.recovered(m.log, "lease keeping resumed", "subnets", m.held.Lease().Subnets()) })
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrDuplicateNode) {
			m.log.Error("lease taken over: pods on this host hold addresses from it; stopping", "subnets", m.held.Lease().Subnets(), "err", err)
			return err
		}
		if kg := (keyGoneError{}); errors.As(err, &kg) {
			m.held.setKeyProblem(err)
		}
		// A hold that ends at once, again and again, must not become a
		// busy loop of re-claims against etcd.
		if time.Since(held) < m.opts.RetryInterval && !sleepCtx(ctx, m.opts.RetryInterval) {
			return nil
		}
		warn.warn(m.log, "lease keeping interrupted, re-claiming", "subnets", m.held.Lease().Subnets(), "err", err)
		rctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
		err = m.reclaim(rctx)
		cancel()
		if err != nil {
			if errors.Is(err, ErrLeaseLost) {
				m.log.Error("lease lost to another host: pods on this host hold addresses from it; stopping", "subnets", m.held.Lease().Subnets(), "err", err)
				return err
			}
			warn.warn(m.log, "re-claim failed, will retry", "subnets", m.held.Lease().Subnets(), "err", err)
			if !sleepCtx(ctx, m.opts.RetryInterval) {
				return nil
			}
			continue
		}
		m.held.setKeyProblem(nil)
		warn.recovered(m.log, "lease keeping resumed", "subnets", m.held.Lease().Subnets())
	}
	return nil
}

// holdLease runs while the lease is intact: it drains KeepAlive responses and
// watches the lease key. It calls answered once, at etcd's first answer
// (a keepalive reply, or a watch response for a reservation), and returns
// why it stopped holding.
func (m *keeper) holdLease(ctx context.Context, answered func()) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A store that was re-created (wiped, restored from a backup) holds
	// none of what this host wrote, and its revisions start over: the
	// key's watch would wait for a revision that is far ahead. Re-claim.
	epoch, rebased := m.reg.head.rebaseSignal()
	if epoch != m.epoch {
		return m.storeRecreated()
	}
	l := m.held.Lease()
	var kaCh <-chan *clientv3.LeaseKeepAliveResponse
	if !l.Reserved {
		var err error
		kaCh, err = m.reg.cli.KeepAlive(ctx, clientv3.LeaseID(l.EtcdLease))
		if err != nil {
			return fmt.Errorf("keep etcd lease %x alive: %w", l.EtcdLease, err)
		}
	}
	key := m.reg.LeaseKey(l.Subnets())
	wctx := ownStream(clientv3.WithRequireLeader(ctx), "lease")
	from := m.held.seenRev()
	wch, err := openWatch(wctx, m.reg.cli, m.reg.head, m.opts.ProgressInterval, m.opts.StallTimeout, key, clientv3.WithRev(answerableFrom(from)), clientv3.WithProgressNotify())
	if err != nil {
		return fmt.Errorf("watch of %s: %w", key, err)
	}
	stall := newStallCheck(m.reg.cli, wctx, wch, m.reg.head, m.held.seenRev, m.opts.ProgressInterval, m.opts.StallTimeout)
	defer stall.stop()
	once := sync.OnceFunc(answered)
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stall.C():
			if reason := stall.check(); reason != "" {
				return fmt.Errorf("watch of %s: %s", key, reason)
			}
		case <-rebased:
			return m.storeRecreated()
		case ka, ok := <-kaCh:
			if !ok {
				m.held.clearEtcdLease()
				return keyGone("lease expired: etcd lease %x of %s was revoked or not renewed within its TTL (etcd unreachable?)", l.EtcdLease, key)
			}
			m.held.setEtcdLease(ka.ID, time.Duration(ka.TTL)*time.Second)
			once()
		case resp, ok := <-wch:
			stall.heard()
			if !ok || resp.Err() != nil {
				return fmt.Errorf("watch of %s broke: %v", key, resp.Err())
			}
			if l.Reserved {
				once() // no etcd lease to renew: the watch is etcd's answer
			}
			for _, ev := range after(resp.Events, from) {
				if err := m.stillOurs(key, ev); err != nil {
					return err
				}
				l.ModRevision = ev.Kv.ModRevision
				m.held.setLease(l)
			}
			// Everything up to here has been seen: the last event's
			// revision, or a progress notification's.
			if n := len(resp.Events); n > 0 {
				m.held.setSeen(resp.Events[n-1].Kv.ModRevision)
				m.reg.head.delivered(resp.Events[n-1].Kv.ModRevision)
			} else if resp.IsProgressNotify() {
				m.held.setSeen(resp.Header.Revision)
			}
		}
	}
}

// stillOurs says why an event of the lease key means it no longer holds
// this host's lease (nil if it still does): deleted, overwritten with
// garbage (nobody's claim: reclaim restores ours), rewritten by another
// host, or by a clone of this one (the same node ID from elsewhere).
func (m *keeper) stillOurs(key string, ev *clientv3.Event) error {
	if ev.Type == clientv3.EventTypeDelete {
		return keyGone("lease key %s was deleted", key)
	}
	attrs, err := subnet.DecodeAttrs(ev.Kv.Value)
	switch {
	case err != nil || !attrs.OwnedBy(m.host.NodeID, m.host.PublicIP, m.host.PublicIPv6) && !attrs.NamesAHost():
		return keyGone("lease key %s was overwritten with a value naming no host", key)
	case !attrs.OwnedBy(m.host.NodeID, m.host.PublicIP, m.host.PublicIPv6):
		return fmt.Errorf("%w: %s was rewritten by someone else", ErrLeaseLost, key)
	case !subnet.SameAttrs(attrs, m.host.Attrs):
		return fmt.Errorf("%w: %s was rewritten with node ID %q from %s: give every host its own --node-name",
			ErrDuplicateNode, key, attrs.NodeID, publicAddrs(attrs))
	}
	return nil
}

// storeRecreated forgets the old store and says why the lease is
// re-claimed.
func (m *keeper) storeRecreated() error {
	m.epoch, _ = m.reg.head.rebaseSignal()
	m.held.forgetStore()
	return keyGone("etcd's store was re-created (wiped, or restored from a backup): re-claiming %s", m.held.Lease().Subnets())
}

// keyGoneError is a reason holdLease stopped that means the key no longer
// holds this host's lease: readiness says so until the re-claim succeeds.
type keyGoneError struct{ msg string }

func (e keyGoneError) Error() string { return e.msg }

func keyGone(format string, args ...any) error { return keyGoneError{fmt.Sprintf(format, args...)} }

// reclaim restores this host's claim on the same subnet: it re-creates the
// key if it is gone, re-attaches a fresh etcd lease if the old one expired,
// and reports ErrLeaseLost if another host now holds the subnet.
func (m *keeper) reclaim(ctx context.Context) error {
	want := m.held.Lease()
	cur, rev, err := m.current(ctx, want.Subnets())
	if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, subnet.ErrInvalidLease) {
		// Whatever happens to the key after rev, the watch will see.
		defer m.held.setSeen(rev)
	}
	switch {
	case errors.Is(err, ErrNotFound):
		id := clientv3.LeaseID(0)
		if !want.Reserved {
			if id, err = m.ensureEtcdLease(ctx); err != nil {
				return err
			}
		}
		rev, err := m.reg.Create(ctx, want.Subnets(), m.host.Attrs, int64(id))
		if errors.Is(err, ErrHeldElsewhere) {
			return fmt.Errorf("%w: %w", ErrLeaseLost, err)
		}
		if errors.Is(err, ErrTaken) {
			return m.reclaim(ctx) // someone wrote it just now: look at what they wrote
		}
		if err != nil {
			return err
		}
		m.held.setLease(subnet.Lease{Subnet: want.Subnet, IPv6Subnet: want.IPv6Subnet, Attrs: m.host.Attrs, Reserved: id == 0, EtcdLease: int64(id), ModRevision: rev})
		m.log.Info("lease re-claimed", "subnets", want.Subnets())
		return nil
	case errors.Is(err, subnet.ErrInvalidLease) && cur.ModRevision != 0,
		err == nil && !cur.Attrs.OwnedBy(m.host.NodeID, m.host.PublicIP, m.host.PublicIPv6) && !cur.Attrs.NamesAHost():
		// Our key holds a value naming no host: nobody's claim. Overwrite
		// it, keeping the kind of claim we had (the writer may have dropped
		// the etcd lease).
		m.log.Warn("own lease key held a value naming no host; restoring it", "subnets", want.Subnets(), "err", err)
		cur.Attrs, cur.Reserved, cur.EtcdLease = subnet.LeaseAttrs{}, want.Reserved, want.EtcdLease
	case err != nil:
		return err
	case !cur.Attrs.OwnedBy(m.host.NodeID, m.host.PublicIP, m.host.PublicIPv6):
		return fmt.Errorf("%w: %s is now held by node %q (%s)", ErrLeaseLost, want.Subnets(), cur.Attrs.NodeID, publicAddrs(cur.Attrs))
	}
	l, err := m.adopt(ctx, cur, &takenSubnets{})
	if err != nil {
		return err
	}
	m.held.setLease(l)
	return nil
}

// current reads the lease key like Registry.Get, and also returns the
// revision it was read at.
func (m *keeper) current(ctx context.Context, s subnet.Subnets) (subnet.Lease, int64, error) {
	key := m.reg.LeaseKey(s)
	resp, err := m.reg.cli.Get(ctx, key)
	if err != nil {
		return subnet.Lease{}, 0, fmt.Errorf("read %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return subnet.Lease{}, resp.Header.Revision, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	kv := resp.Kvs[0]
	l, err := m.reg.decode(kv.Key, kv.Value, kv.Lease, kv.ModRevision)
	return l, resp.Header.Revision, err
}

// publicAddrs names a lease's public addresses for a message (as anyone
// wrote them to etcd: subnet.ShownAddr).
func publicAddrs(a subnet.LeaseAttrs) string {
	switch {
	case a.PublicIPv6 == "":
		return "public IP " + subnet.ShownAddr(a.PublicIP)
	case a.PublicIP == "":
		return "public IPv6 " + subnet.ShownAddr(a.PublicIPv6)
	}
	return "public IPs " + subnet.ShownAddr(a.PublicIP) + " and " + subnet.ShownAddr(a.PublicIPv6)
}
