package etcdv3

// Claiming a subnet: the create-if-absent transactions that keep two
// hosts from ever holding one subnet, in either family.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/subnet"
)

// Create writes a lease on s only if no key names its IPv4 subnet (the
// plain key, or a dual-stack key with any IPv6 half) and, in a dual-stack
// lease, no key created before it names its IPv6 subnet: the rule that
// keeps two hosts from ever holding one subnet. etcdLease 0 writes a
// reservation. It returns the revision of the write, or ErrTaken.
func (r *Registry) Create(ctx context.Context, s subnet.Subnets, attrs subnet.LeaseAttrs, etcdLease int64) (int64, error) {
	key := r.Keys.LeaseKey(s)
	val, err := attrs.Marshal()
	if err != nil {
		return 0, fmt.Errorf("encode lease %s: %w", key, err)
	}
	free := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}
	if s.IPv4.IsValid() {
		v4 := r.Keys.LeaseKey(subnet.Subnets{IPv4: s.IPv4})
		free = []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(v4), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(v4+"&"), "=", 0).WithPrefix()}
	}
	resp, err := r.cli.Txn(ctx).
		If(free...).
		Then(clientv3.OpPut(key, string(val), leaseOpt(etcdLease)...)).
		Else(clientv3.OpGet(key, clientv3.WithKeysOnly())).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", key, err)
	}
	if !resp.Succeeded {
		if len(resp.Responses[0].GetResponseRange().Kvs) == 0 {
			return 0, fmt.Errorf("%w: %s is held by a key naming another IPv6 subnet or none", ErrHeldElsewhere, s.IPv4)
		}
		return 0, fmt.Errorf("%w: %s", ErrTaken, key)
	}
	return r.keepIfFirst(ctx, s, resp.Header.Revision)
}

// Rekey replaces the lease prev (still at its ModRevision) by a lease on
// next, in one transaction: how a host's lease gains or drops its IPv6
// subnet when the network config starts or stops carrying IPv6, keeping
// its IPv4 subnet. It returns the revision of the write, ErrConflict if
// prev changed, ErrTaken if next is held, or ErrHeldElsewhere if next's
// IPv6 subnet turned out to be claimed first under another key: then prev
// is written back (with a new ModRevision).
func (r *Registry) Rekey(ctx context.Context, prev subnet.Lease, next subnet.Subnets, attrs subnet.LeaseAttrs, etcdLease int64) (int64, error) {
	key := r.Keys.LeaseKey(next)
	val, err := attrs.Marshal()
	if err != nil {
		return 0, fmt.Errorf("encode lease %s: %w", key, err)
	}
	old := r.Keys.LeaseKey(prev.Subnets())
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(old), "=", prev.ModRevision),
			clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpDelete(old), clientv3.OpPut(key, string(val), leaseOpt(etcdLease)...)).
		Else(clientv3.OpGet(old, clientv3.WithKeysOnly())).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("replace %s by %s: %w", old, key, err)
	}
	if !resp.Succeeded {
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) == 0 || kvs[0].ModRevision != prev.ModRevision {
			return 0, fmt.Errorf("%w: %s", ErrConflict, old)
		}
		return 0, fmt.Errorf("%w: %s", ErrTaken, key)
	}
	rev, err := r.keepIfFirst(ctx, next, resp.Header.Revision)
	if errors.Is(err, ErrHeldElsewhere) {
		// The new key withdrew itself (an earlier claim holds its IPv6
		// subnet): put the lease it replaced back, or the host would lose
		// its IPv4 subnet, and its pods their addresses, to a race it
		// lost on the other family.
		if _, rerr := r.Create(ctx, prev.Subnets(), prev.Attrs, prev.EtcdLease); rerr != nil {
			err = errors.Join(err, fmt.Errorf("restore %s: %w", old, rerr))
		}
	}
	return rev, err
}

// keepIfFirst ends the claim of s written at revision rev. etcd cannot
// compare keys by their end, so a transaction cannot exclude a concurrent
// claim of the same IPv6 subnet under another IPv4 subnet; instead every
// claimer looks after writing, and the claim created later (which always
// sees the earlier one) deletes itself and reports ErrTaken.
func (r *Registry) keepIfFirst(ctx context.Context, s subnet.Subnets, rev int64) (int64, error) {
	if !s.IPv6.IsValid() {
		return rev, nil
	}
	earlier, err := r.heldBefore(ctx, s, rev)
	if err == nil && earlier == "" {
		return rev, nil
	}
	if _, derr := r.DeleteIfOwned(ctx, s, rev); derr != nil {
		err = errors.Join(err, fmt.Errorf("withdraw the claim: %w", derr))
	}
	if err != nil {
		return 0, fmt.Errorf("check that no other lease holds %s: %w", s.IPv6, err)
	}
	return 0, fmt.Errorf("%w: %s is held by %s", ErrHeldElsewhere, s.IPv6, earlier)
}

// heldBefore returns a key other than s's that names s's IPv6 subnet and
// was created before revision rev, or "". It reads keys only, in pages.
func (r *Registry) heldBefore(ctx context.Context, s subnet.Subnets, rev int64) (string, error) {
	key, end := r.Keys.SubnetsPrefix(), clientv3.GetPrefixRangeEnd(r.Keys.SubnetsPrefix())
	suffix := "&" + subnet.Key(s.IPv6)
	for {
		resp, err := r.cli.Get(ctx, key, clientv3.WithRange(end), clientv3.WithLimit(listPage), clientv3.WithKeysOnly())
		if err != nil {
			return "", err
		}
		for _, kv := range resp.Kvs {
			if k := string(kv.Key); strings.HasSuffix(k, suffix) && kv.CreateRevision < rev && k != r.Keys.LeaseKey(s) {
				return k, nil
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return "", nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
