// Package etcdv3 stores the overlay's network config and leases in etcd v3
// with flannel's schema (DESIGN.md §3), so overlayd and flanneld hosts can
// share one prefix:
//
//	<prefix>/config                     network config JSON
//	<prefix>/subnets/10.244.7.0-24      a lease (with an etcd lease) or a reservation (without)
//	<prefix>/nodes/<node-id>            liveness of a running overlayd (short TTL)
//
// Registry is the thin typed layer over those keys; Manager acquires and keeps
// this host's lease; Watcher follows every lease.
package etcdv3

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strings"
	"time"

	"github.com/overlaynet/overlay/subnet"
	"go.etcd.io/etcd/api/v3/mvccpb"
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

// Registry reads and writes the keys under one prefix.
type Registry struct {
	cli    *clientv3.Client
	prefix string
	// ipv6Only: the network carries IPv6 only, and its leases live under
	// <prefix>/subnets6/ in the IPv6-only key form (see For).
	ipv6Only bool
}

// NewRegistry returns a registry for prefix (trailing slashes ignored).
func NewRegistry(cli *clientv3.Client, prefix string) *Registry {
	return &Registry{cli: cli, prefix: strings.TrimRight(prefix, "/")}
}

// For returns the registry for the leases of network cfg. An IPv6-only
// network keeps them under <prefix>/subnets6/, keyed by the IPv6 subnet
// alone (flannel's keys begin with an IPv4 subnet and cannot express it);
// the others under <prefix>/subnets/, where NewRegistry looks.
func (r *Registry) For(cfg *subnet.Config) *Registry {
	c := *r
	c.ipv6Only = !cfg.EnableIPv4
	return &c
}

// ParseKey decodes a lease key (the full key, under SubnetsPrefix).
func (r *Registry) ParseKey(key string) (subnet.Subnets, error) {
	suffix, ok := strings.CutPrefix(key, r.SubnetsPrefix())
	switch {
	case !ok:
		return subnet.Subnets{}, fmt.Errorf("%w: key %q is not under %s", subnet.ErrInvalidLease, key, r.SubnetsPrefix())
	case r.ipv6Only:
		return subnet.ParseIPv6OnlyKey(suffix)
	}
	return subnet.ParseLeaseKey(suffix)
}

// Client returns the etcd client the registry uses.
func (r *Registry) Client() *clientv3.Client { return r.cli }

// ConfigKey is the key of the network config.
func (r *Registry) ConfigKey() string { return r.prefix + "/config" }

// SubnetsPrefix is the key prefix of all leases, with a trailing slash.
func (r *Registry) SubnetsPrefix() string {
	if r.ipv6Only {
		return r.prefix + "/subnets6/"
	}
	return r.prefix + "/subnets/"
}

// LeaseKey is the key of the lease on s: one IPv4 subnet, or an IPv4 and
// an IPv6 subnet (a dual-stack lease).
func (r *Registry) LeaseKey(s subnet.Subnets) string { return r.SubnetsPrefix() + s.Key() }

// NodesPrefix is the key prefix of the liveness keys, with a trailing slash.
func (r *Registry) NodesPrefix() string { return r.prefix + "/nodes/" }

// NodeKey is the liveness key of one node.
func (r *Registry) NodeKey(nodeID string) string { return r.NodesPrefix() + nodeID }

// GetConfig reads and validates the network config; it returns the raw bytes
// too, unknown fields included, for printing.
func (r *Registry) GetConfig(ctx context.Context) (*subnet.Config, []byte, error) {
	resp, err := r.cli.Get(ctx, r.ConfigKey())
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", r.ConfigKey(), err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil, r.configErr(false, nil)
	}
	raw := resp.Kvs[0].Value
	cfg, err := subnet.ParseConfig(raw)
	return cfg, raw, r.configErr(true, err)
}

// configErr explains a missing or invalid config.
func (r *Registry) configErr(exists bool, err error) error {
	switch {
	case !exists:
		return fmt.Errorf("%w at %s: create one with `overlayd config put -f net.json`", ErrNoConfig, r.ConfigKey())
	case err != nil:
		return fmt.Errorf("%s: %w: fix it with `overlayd config put -f net.json`", r.ConfigKey(), err)
	}
	return nil
}

// ConfigUpdate is the network config as read after <prefix>/config changed:
// Config, or Err if it is gone (ErrNoConfig) or invalid.
type ConfigUpdate struct {
	Config *subnet.Config
	Err    error
}

// WatchConfig delivers the network config as it is now, then again each
// time <prefix>/config changes, until ctx ends (then the channel closes).
// A broken watch is re-established after retry, delivering the config as
// read then, so a change made meanwhile is not missed.
func (r *Registry) WatchConfig(ctx context.Context, retry time.Duration) <-chan ConfigUpdate {
	out := make(chan ConfigUpdate)
	go func() {
		defer close(out)
		for ctx.Err() == nil {
			rctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
			resp, err := r.cli.Get(rctx, r.ConfigKey())
			cancel()
			if err == nil {
				if !sendConfig(ctx, out, r.configUpdate(resp.Kvs)) {
					return
				}
				r.followConfig(ctx, resp.Header.Revision, out)
			}
			if !sleepCtx(ctx, retry) {
				return
			}
		}
	}()
	return out
}

// followConfig sends each change of the config key after rev until the
// watch breaks or ctx ends.
func (r *Registry) followConfig(ctx context.Context, rev int64, out chan<- ConfigUpdate) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for wr := range r.cli.Watch(ownStream(clientv3.WithRequireLeader(wctx), "config"), r.ConfigKey(), clientv3.WithRev(rev+1)) {
		if wr.Err() != nil || wr.Canceled {
			return
		}
		for _, ev := range wr.Events {
			var kvs []*mvccpb.KeyValue
			if ev.Type == clientv3.EventTypePut {
				kvs = []*mvccpb.KeyValue{ev.Kv}
			}
			if !sendConfig(ctx, out, r.configUpdate(kvs)) {
				return
			}
		}
	}
}

func (r *Registry) configUpdate(kvs []*mvccpb.KeyValue) ConfigUpdate {
	if len(kvs) == 0 {
		return ConfigUpdate{Err: r.configErr(false, nil)}
	}
	cfg, err := subnet.ParseConfig(kvs[0].Value)
	if err != nil {
		return ConfigUpdate{Err: r.configErr(true, err)}
	}
	return ConfigUpdate{Config: cfg}
}

func sendConfig(ctx context.Context, out chan<- ConfigUpdate, u ConfigUpdate) bool {
	select {
	case out <- u:
		return true
	case <-ctx.Done():
		return false
	}
}

// PutConfig validates raw and stores it unchanged (unknown fields kept).
func (r *Registry) PutConfig(ctx context.Context, raw []byte) (*subnet.Config, error) {
	cfg, err := subnet.ParseConfig(raw)
	if err != nil {
		return nil, err
	}
	if _, err := r.cli.Put(ctx, r.ConfigKey(), string(raw)); err != nil {
		return nil, fmt.Errorf("write %s: %w", r.ConfigKey(), err)
	}
	return cfg, nil
}

// Invalid is a key under subnets/ that could not be decoded.
type Invalid struct {
	Key         string
	ModRevision int64
	Err         error
}

// Snapshot is every lease at one etcd revision.
type Snapshot struct {
	Leases   []subnet.Lease
	Invalid  []Invalid
	Revision int64
}

// listPage is how many leases one range request of List reads. etcd
// builds each response in memory: with every host cold-starting at once,
// unbounded responses (a few MB each at 10,000 leases) would add up to
// gigabytes in the members.
const listPage = 1000

// List reads every lease, in pages of listPage at one revision. Keys or
// values that do not decode are returned in Invalid rather than failing the
// whole list: one bad writer must not stop every host.
func (r *Registry) List(ctx context.Context) (Snapshot, error) {
	key, end := r.SubnetsPrefix(), clientv3.GetPrefixRangeEnd(r.SubnetsPrefix())
	var snap Snapshot
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(listPage)}
		if snap.Revision != 0 {
			// Every page at the first page's revision: one consistent set.
			opts = append(opts, clientv3.WithRev(snap.Revision))
		}
		resp, err := r.cli.Get(ctx, key, opts...)
		if err != nil {
			return Snapshot{}, fmt.Errorf("list %s: %w", r.SubnetsPrefix(), err)
		}
		if snap.Revision == 0 {
			snap = Snapshot{Revision: resp.Header.Revision, Leases: make([]subnet.Lease, 0, resp.Count)}
		}
		for _, kv := range resp.Kvs {
			l, err := r.decode(kv.Key, kv.Value, kv.Lease, kv.ModRevision)
			if err != nil {
				snap.Invalid = append(snap.Invalid, Invalid{Key: string(kv.Key), ModRevision: kv.ModRevision, Err: err})
				continue
			}
			snap.Leases = append(snap.Leases, l)
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return snap, nil
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

func (r *Registry) decode(key, value []byte, etcdLease, modRev int64) (subnet.Lease, error) {
	s, err := r.ParseKey(string(key))
	if err != nil {
		return subnet.Lease{}, err
	}
	l := subnet.Lease{Subnet: s.IPv4, IPv6Subnet: s.IPv6, Reserved: etcdLease == 0, EtcdLease: etcdLease, ModRevision: modRev}
	l.Attrs, err = subnet.DecodeAttrs(value)
	return l, err
}

// Create writes a lease on s only if no key names its IPv4 subnet (the
// plain key, or a dual-stack key with any IPv6 half) and, in a dual-stack
// lease, no key created before it names its IPv6 subnet: the rule that
// keeps two hosts from ever holding one subnet. etcdLease 0 writes a
// reservation. It returns the revision of the write, or ErrTaken.
func (r *Registry) Create(ctx context.Context, s subnet.Subnets, attrs subnet.LeaseAttrs, etcdLease int64) (int64, error) {
	key := r.LeaseKey(s)
	val, err := attrs.Marshal()
	if err != nil {
		return 0, fmt.Errorf("encode lease %s: %w", key, err)
	}
	free := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}
	if s.IPv4.IsValid() {
		v4 := r.LeaseKey(subnet.Subnets{IPv4: s.IPv4})
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
// prev changed, or ErrTaken if next is held.
func (r *Registry) Rekey(ctx context.Context, prev subnet.Lease, next subnet.Subnets, attrs subnet.LeaseAttrs, etcdLease int64) (int64, error) {
	key := r.LeaseKey(next)
	val, err := attrs.Marshal()
	if err != nil {
		return 0, fmt.Errorf("encode lease %s: %w", key, err)
	}
	old := r.LeaseKey(prev.Subnets())
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
	return r.keepIfFirst(ctx, next, resp.Header.Revision)
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
	key, end := r.SubnetsPrefix(), clientv3.GetPrefixRangeEnd(r.SubnetsPrefix())
	suffix := "&" + subnet.Key(s.IPv6)
	for {
		resp, err := r.cli.Get(ctx, key, clientv3.WithRange(end), clientv3.WithLimit(listPage), clientv3.WithKeysOnly())
		if err != nil {
			return "", err
		}
		for _, kv := range resp.Kvs {
			if k := string(kv.Key); strings.HasSuffix(k, suffix) && kv.CreateRevision < rev && k != r.LeaseKey(s) {
				return k, nil
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return "", nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
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
	resp, err := r.cli.TimeToLive(ctx, clientv3.LeaseID(etcdLease))
	if err != nil {
		return 0, fmt.Errorf("time-to-live of etcd lease %x: %w", etcdLease, err)
	}
	return resp.TTL, nil
}

func leaseOpt(etcdLease int64) []clientv3.OpOption {
	if etcdLease == 0 {
		return nil
	}
	return []clientv3.OpOption{clientv3.WithLease(clientv3.LeaseID(etcdLease))}
}

// unchangedSince holds when no lease key was written after revision rev
// (deletions do not count: they only free subnets).
func (r *Registry) unchangedSince(rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(r.SubnetsPrefix()), "<", rev+1).WithPrefix()
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

// PutConfigIfUnchanged validates raw and stores it unchanged only if
// neither the config nor any lease was written after revision rev, the
// revision of the listing the caller checked the change against.
func (r *Registry) PutConfigIfUnchanged(ctx context.Context, raw []byte, rev int64) (*subnet.Config, error) {
	cfg, err := subnet.ParseConfig(raw)
	if err != nil {
		return nil, err
	}
	resp, err := r.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(r.ConfigKey()), "<", rev+1), r.unchangedSince(rev)).
		Then(clientv3.OpPut(r.ConfigKey(), string(raw))).
		Commit()
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", r.ConfigKey(), err)
	}
	if !resp.Succeeded {
		return nil, fmt.Errorf("%w: the config or a lease was written while checking the change", ErrConflict)
	}
	return cfg, nil
}
