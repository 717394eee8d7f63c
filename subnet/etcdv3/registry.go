// Package etcdv3 stores the overlay's network config and leases in etcd v3
// with flannel's schema (DESIGN.md §3), so overlayd and flanneld hosts can
// share one prefix:
//
//	<prefix>/config                     network config JSON
//	<prefix>/subnets/10.244.7.0-24      a lease (with an etcd lease) or a reservation (without)
//	<prefix>/nodes/<node-id>            liveness of a running overlayd (short TTL)
//
// Source is the lease source the daemon consumes (subnet.Source). Beneath
// it, one job per type: Keys names the keys and decodes what they hold;
// Registry is the thin typed layer over them (reads, the claim
// transactions, the config); Manager acquires and keeps this host's lease
// (held, nodeClaim, acquirer, keeper); the watcher follows every lease;
// Journal saves what it followed for the next start.
package etcdv3

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"

	"github.com/overlaynet/overlay/subnet"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultPrefix is flannel's default etcd prefix.
const DefaultPrefix = "/coreos.com/network"

var (
	// ErrNoConfig means <prefix>/config does not exist.
	ErrNoConfig = errors.New("no network config")
	// ErrTaken means a create-if-absent lost: the key already exists.
	ErrTaken = errors.New("subnet already leased")
	// ErrHeldElsewhere means a create lost to another key that names one
	// of its subnets (a dual-stack key and an IPv4-only key, or two
	// dual-stack keys sharing a half). errors.Is(err, ErrTaken) holds too.
	ErrHeldElsewhere = fmt.Errorf("%w under another key", ErrTaken)
	// ErrConflict means the key changed since it was read.
	ErrConflict = errors.New("lease changed concurrently")
	// ErrNotFound means the lease key does not exist.
	ErrNotFound = errors.New("no such lease")
)

// Registry reads and writes the keys under one prefix. How a key is named
// and a value decoded is Keys' (pure); the claim transactions are in
// claim.go, the config in config.go, the lease watch in watch.go.
type Registry struct {
	Keys
	cli *clientv3.Client
	// head is shared by every copy (For): the manager's keepalives feed
	// it, the watches' stall checks read it.
	head *storeHead
}

// NewRegistry returns a registry for prefix (trailing slashes ignored).
func NewRegistry(cli *clientv3.Client, prefix string) *Registry {
	return &Registry{Keys: newKeys(prefix), cli: cli, head: &storeHead{}}
}

// For returns the registry for the leases of network cfg. An IPv6-only
// network keeps them under <prefix>/subnets6/, keyed by the IPv6 subnet
// alone (flannel's keys begin with an IPv4 subnet and cannot express it);
// the others under <prefix>/subnets/, where NewRegistry looks.
func (r *Registry) For(cfg *subnet.Config) *Registry {
	c := *r
	c.Keys = c.Keys.forFamilies(cfg)
	return &c
}

// Client returns the etcd client the registry uses.
func (r *Registry) Client() *clientv3.Client { return r.cli }

// Invalid, Snapshot, Batch and ConfigUpdate are the lease source's types,
// which the daemon consumes through subnet.Source; the names stay here for
// the registry's other users (the admin commands, the tools).
type (
	Invalid      = subnet.Invalid
	Snapshot     = subnet.Snapshot
	Batch        = subnet.Batch
	ConfigUpdate = subnet.ConfigUpdate
)

// listPage is how many leases one range request of List reads. etcd
// builds each response in memory: with every host cold-starting at once,
// unbounded responses (a few MB each at 10,000 leases) would add up to
// gigabytes in the members.
const listPage = 1000

// List reads every lease, in pages of listPage at one revision. Keys or
// values that do not decode are returned in Invalid rather than failing the
// whole list: one bad writer must not stop every host.
func (r *Registry) List(ctx context.Context) (Snapshot, error) {
	snap, _, err := r.list(ctx, nil)
	return snap, err
}

// list is List, but the leases for which have(ID, ModRevision) is true —
// those the caller has at that revision already — are not decoded (most of
// a listing's CPU): they are returned by ID in unchanged instead.
func (r *Registry) list(ctx context.Context, have func(subnet.ID, int64) bool) (snap Snapshot, unchanged []subnet.ID, err error) {
	key, end := r.SubnetsPrefix(), clientv3.GetPrefixRangeEnd(r.SubnetsPrefix())
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPage)}
		if snap.Revision != 0 {
			// Every page at the first page's revision: one consistent set.
			opts = append(opts, clientv3.WithRev(snap.Revision))
		}
		resp, err := r.cli.Get(ctx, key, opts...)
		if err != nil {
			return Snapshot{}, nil, fmt.Errorf("list %s: %w", r.SubnetsPrefix(), err)
		}
		if snap.Revision == 0 {
			snap = Snapshot{Revision: resp.Header.Revision, ClusterID: resp.Header.ClusterId}
			if have == nil {
				snap.Leases = make([]subnet.Lease, 0, resp.Count)
			}
		}
		for _, kv := range resp.Kvs {
			if have != nil {
				if s, err := r.ParseKey(string(kv.Key)); err == nil && have(s.ID(), kv.ModRevision) {
					unchanged = append(unchanged, s.ID())
					continue
				}
			}
			l, err := r.decode(kv.Key, kv.Value, kv.Lease, kv.ModRevision)
			if err != nil {
				snap.Invalid = append(snap.Invalid, Invalid{Key: string(kv.Key), ModRevision: kv.ModRevision, Err: err})
				continue
			}
			snap.Leases = append(snap.Leases, l)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return snap, unchanged, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// Get reads one lease; ErrNotFound if absent. If the value does not decode,
// the error wraps subnet.ErrInvalidLease and the lease still carries its
// subnet, ModRevision and etcd lease, so the owner can overwrite it.
func (r *Registry) Get(ctx context.Context, s subnet.Subnets) (subnet.Lease, error) {
	key := r.LeaseKey(s)
	resp, err := r.cli.Get(ctx, key)
	if err != nil {
		return subnet.Lease{}, fmt.Errorf("read %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return subnet.Lease{}, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	kv := resp.Kvs[0]
	return r.decode(kv.Key, kv.Value, kv.Lease, kv.ModRevision)
}

// Lookup finds the lease whose key names subnet p, of either family: the
// IPv4-only key, or the dual-stack key with p as one half. ErrNotFound if
// none; like Get, an undecodable value is returned with its error.
func (r *Registry) Lookup(ctx context.Context, p netip.Prefix) (subnet.Lease, error) {
	if r.ipv6Only {
		return r.Get(ctx, subnet.Subnets{IPv6: p})
	}
	if p.Addr().Is4() {
		l, err := r.Get(ctx, subnet.Subnets{IPv4: p})
		if !errors.Is(err, ErrNotFound) {
			return l, err
		}
		// At most one dual-stack key has this IPv4 half (Create sees to it).
		resp, err := r.cli.Get(ctx, r.LeaseKey(subnet.Subnets{IPv4: p})+"&", clientv3.WithPrefix(), clientv3.WithLimit(1))
		if err != nil {
			return subnet.Lease{}, fmt.Errorf("read %s: %w", r.LeaseKey(subnet.Subnets{IPv4: p}), err)
		}
		if len(resp.Kvs) == 0 {
			return subnet.Lease{}, fmt.Errorf("%w: no key names %s", ErrNotFound, p)
		}
		kv := resp.Kvs[0]
		return r.decode(kv.Key, kv.Value, kv.Lease, kv.ModRevision)
	}
	key, err := r.heldBefore(ctx, subnet.Subnets{IPv6: p}, math.MaxInt64)
	if err != nil {
		return subnet.Lease{}, fmt.Errorf("list %s: %w", r.SubnetsPrefix(), err)
	}
	if key == "" {
		return subnet.Lease{}, fmt.Errorf("%w: no key names %s", ErrNotFound, p)
	}
	s, err := r.ParseKey(key)
	if err != nil {
		return subnet.Lease{}, err
	}
	return r.Get(ctx, s)
}

// Update rewrites an existing lease if it is still at prev.ModRevision,
// attaching etcdLease (0 keeps it a reservation). It returns ErrConflict if
// someone else wrote or deleted the key since.
func (r *Registry) Update(ctx context.Context, prev subnet.Lease, attrs subnet.LeaseAttrs, etcdLease int64) (int64, error) {
	key := r.LeaseKey(prev.Subnets())
	val, err := attrs.Marshal()
	if err != nil {
		return 0, fmt.Errorf("encode lease %s: %w", key, err)
	}
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", prev.ModRevision)).
		Then(clientv3.OpPut(key, string(val), leaseOpt(etcdLease)...)).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("update %s: %w", key, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("%w: %s", ErrConflict, key)
	}
	return resp.Header.Revision, nil
}

// Delete removes a lease key; it reports whether the key existed.
func (r *Registry) Delete(ctx context.Context, s subnet.Subnets) (bool, error) {
	key := r.LeaseKey(s)
	resp, err := r.cli.Delete(ctx, key)
	if err != nil {
		return false, fmt.Errorf("delete %s: %w", key, err)
	}
	return resp.Deleted > 0, nil
}

// DeleteIfOwned removes a lease key only if it is still at modRev, so a
// host's teardown never deletes a lease another host took over meanwhile.
func (r *Registry) DeleteIfOwned(ctx context.Context, s subnet.Subnets, modRev int64) (bool, error) {
	key := r.LeaseKey(s)
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
		Then(clientv3.OpDelete(key)).
		Commit()
	if err != nil {
		return false, fmt.Errorf("delete %s: %w", key, err)
	}
	return resp.Succeeded, nil
}

// AliveNodes returns the node IDs whose liveness key exists.
func (r *Registry) AliveNodes(ctx context.Context) (map[string]bool, error) {
	resp, err := r.cli.Get(ctx, r.NodesPrefix(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", r.NodesPrefix(), err)
	}
	alive := make(map[string]bool, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		alive[strings.TrimPrefix(string(kv.Key), r.NodesPrefix())] = true
	}
	return alive, nil
}

// TTL returns the seconds left on an etcd lease, or -1 if it no longer exists.
func (r *Registry) TTL(ctx context.Context, etcdLease int64) (int64, error) {
	left, _, err := r.ttls(ctx, etcdLease)
	return left, err
}

// ttls returns the seconds left on an etcd lease (-1 if it no longer
// exists) and the TTL it was granted with.
func (r *Registry) ttls(ctx context.Context, etcdLease int64) (left, granted int64, err error) {
	resp, err := r.cli.TimeToLive(ctx, clientv3.LeaseID(etcdLease))
	if err != nil {
		return 0, 0, fmt.Errorf("time-to-live of etcd lease %x: %w", etcdLease, err)
	}
	return resp.TTL, resp.GrantedTTL, nil
}

func leaseOpt(etcdLease int64) []clientv3.OpOption {
	if etcdLease == 0 {
		return nil
	}
	return []clientv3.OpOption{clientv3.WithLease(clientv3.LeaseID(etcdLease))}
}

// Reserve writes a reservation (a key without an etcd lease) for s only if
// its key is free and no lease was written after revision rev, the revision of
// the listing the caller checked it against (no other lease for the same
// host, no other claim of either subnet). It returns ErrTaken if the key exists, ErrConflict if another lease was
// written meanwhile: list again and re-check.
func (r *Registry) Reserve(ctx context.Context, s subnet.Subnets, attrs subnet.LeaseAttrs, rev int64) (int64, error) {
	key := r.LeaseKey(s)
	val, err := attrs.Marshal()
	if err != nil {
		return 0, fmt.Errorf("encode lease %s: %w", key, err)
	}
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0), r.unchangedSince(rev)).
		Then(clientv3.OpPut(key, string(val))).
		Else(clientv3.OpGet(key, clientv3.WithKeysOnly())).
		Commit()
	if err != nil {
		return 0, fmt.Errorf("create %s: %w", key, err)
	}
	if !resp.Succeeded {
		if len(resp.Responses) > 0 && len(resp.Responses[0].GetResponseRange().Kvs) > 0 {
			return 0, fmt.Errorf("%w: %s", ErrTaken, key)
		}
		return 0, fmt.Errorf("%w: a lease under %s was written meanwhile", ErrConflict, r.SubnetsPrefix())
	}
	return resp.Header.Revision, nil
}
