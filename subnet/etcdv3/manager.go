package etcdv3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/subnet"
)

// Defaults for keeping a lease.
const (
	DefaultLeaseTTL    = 24 * time.Hour
	DefaultLivenessTTL = 15 * time.Second
	// maxAcquireAttempts bounds the retries of a host that keeps losing
	// create races; each attempt re-lists, so this is plenty even for
	// hundreds of hosts starting at once.
	maxAcquireAttempts = 64
)

var (
	// ErrLeaseLost means this host's subnet now belongs to another host.
	// Pods already hold addresses from it, so the daemon must stop loudly.
	ErrLeaseLost = errors.New("lease lost to another host")
	// ErrDuplicateNode means a live overlayd on another host uses this
	// node ID; going on would hijack its lease.
	ErrDuplicateNode = errors.New("node ID in use by another live host")
	// ErrStranded means a lease naming this host lies outside the network
	// config (the config changed under it): taking another would leave
	// this host holding two subnets.
	ErrStranded = errors.New("this host's lease is outside the network config")
)

// Host is this host's identity as written into its lease.
type Host struct {
	NodeID   string
	Hostname string
	PublicIP netip.Addr
	// BackendData is what this host's data plane publishes of its device
	// (the backend's codec made it: backend/vxlan.Codec.Encode), written
	// into the lease as it is.
	BackendData json.RawMessage
	// PublicIPv6 and BackendV6Data are the IPv6 device's, used in a
	// network that carries IPv6.
	PublicIPv6    netip.Addr
	BackendV6Data json.RawMessage
	// Previous names the subnets from an old subnet.env, each reused if
	// still free.
	Previous subnet.Subnets
}

// ManagerOptions tune a Manager; zero values mean the defaults.
type ManagerOptions struct {
	LeaseTTL    time.Duration
	LivenessTTL time.Duration
	Logger      *slog.Logger
	// Rand picks free subnets; tests seed it.
	Rand *rand.Rand
	// RetryInterval is the pause between attempts to reach etcd again.
	RetryInterval time.Duration
	// ProgressInterval and StallTimeout detect a stalled watch of the own
	// lease key, as in WatchOptions (defaults 5 s each): a stalled watch
	// would hide a deletion of the key from the re-claim.
	ProgressInterval time.Duration
	StallTimeout     time.Duration
	// OnWait, if set, is told why ClaimNodeID is waiting (for readiness).
	OnWait func(reason string)
}

// Manager acquires this host's lease and keeps it: one etcd lease kept alive
// for the lease key, a short-TTL liveness key, and a watch on the lease key
// that re-claims the same subnet if the key disappears.
type Manager struct {
	reg  *Registry
	cfg  *subnet.Config
	host Host
	opts ManagerOptions
	log  *slog.Logger
	// epoch is the re-creations of etcd's store known (storeHead), read
	// and written by the lease keeper only.
	epoch uint64

	mu    sync.Mutex
	lease subnet.Lease
	// seen is a revision at which the lease key was known to hold lease;
	// the key's watch resumes after it. The key's own ModRevision will not
	// do: it is usually old, and once history is compacted past it a watch
	// from there fails at once, every time.
	seen      int64
	etcdLease clientv3.LeaseID
	expires   time.Time  // when the etcd lease runs out unless renewed
	claim     *liveClaim // the liveness key ClaimNodeID wrote, until Run takes it over
	liveSince time.Time  // zero while the liveness key is not held
	liveErr   error      // why the liveness key is not held, once it was lost
	keyErr    error      // why the lease key is not known to be ours, while re-claiming
	created   bool       // Acquire created the lease key (Created)
}

// NewManager returns a Manager for host in the network cfg.
func NewManager(reg *Registry, cfg *subnet.Config, host Host, opts ManagerOptions) *Manager {
	if opts.LeaseTTL <= 0 {
		opts.LeaseTTL = DefaultLeaseTTL
	}
	if opts.LivenessTTL <= 0 {
		opts.LivenessTTL = DefaultLivenessTTL
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Rand == nil {
		opts.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = time.Second
	}
	if opts.ProgressInterval <= 0 {
		opts.ProgressInterval = DefaultProgressInterval
	}
	if opts.StallTimeout <= 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	m := &Manager{reg: reg, cfg: cfg, host: host, opts: opts, log: opts.Logger}
	m.epoch, _ = reg.head.rebaseSignal()
	return m
}

// Lease returns the lease currently held.
func (m *Manager) Lease() subnet.Lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lease
}

// Created reports whether Acquire (or AcquireFrom) created this host's
// lease key: no key named this host, and it claimed a free subnet. A lease
// it adopted, resumed or re-keyed (adding or dropping the IPv6 subnet of a
// lease this host held) is not created: pods may hold addresses from it.
func (m *Manager) Created() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.created
}

// Expires returns when the held lease expires unless renewed; zero for a
// reservation, which never expires.
func (m *Manager) Expires() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.expires
}

// Alive reports whether the liveness key is held right now.
func (m *Manager) Alive() bool {
	alive, _ := m.Liveness()
	return alive
}

// Liveness reports whether the liveness key is held and, if not, why: nil
// before it was first written, else the error that lost it.
func (m *Manager) Liveness() (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return !m.liveSince.IsZero(), m.liveErr
}

// KeyProblem says why the lease key is not known to hold this host's lease
// right now (deleted, overwritten, its etcd lease gone) while the manager
// re-claims it; nil while it is held.
func (m *Manager) KeyProblem() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.keyErr
}

func (m *Manager) setKeyProblem(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.keyErr = err
}

func (m *Manager) attrs() subnet.LeaseAttrs {
	a := subnet.LeaseAttrs{BackendType: subnet.DefaultBackendType, NodeID: m.host.NodeID, Hostname: m.host.Hostname}
	if m.cfg.EnableIPv4 {
		a = subnet.NewAttrs(m.host.PublicIP, subnet.DefaultBackendType, m.host.BackendData, m.host.NodeID, m.host.Hostname)
	}
	if m.cfg.EnableIPv6 {
		a = a.WithIPv6(m.host.PublicIPv6, m.host.BackendV6Data)
	}
	return a
}

// Acquire obtains a lease, in order of preference: one that already names this
// host (adopting its etcd lease, or keeping a reservation TTL-free), the
// subnet of the previous subnet.env if free, else a random free subnet.
// Call ClaimNodeID first: Acquire trusts that the node ID is this host's.
// A lease naming this host outside the network is ErrStranded.
//
// It also returns the listing it picked the subnet from. A daemon starting
// up seeds its peer set and its watch with it (the watch resumes from its
// revision, so what changed since, our own lease included, arrives as
// events) instead of listing every lease a second time.
func (m *Manager) Acquire(ctx context.Context) (subnet.Lease, Snapshot, error) {
	for range maxAcquireAttempts {
		snap, err := m.reg.List(ctx)
		if err != nil {
			return subnet.Lease{}, Snapshot{}, err
		}
		l, err := m.tryAcquire(ctx, snap)
		if errors.Is(err, ErrTaken) || errors.Is(err, ErrConflict) {
			m.log.Debug("lost a race for a subnet, retrying", "err", err)
			continue
		}
		if err != nil {
			return subnet.Lease{}, Snapshot{}, err
		}
		m.setLease(l)
		m.setSeen(max(snap.Revision, l.ModRevision))
		m.log.Info("lease acquired", "subnets", l.Subnets(), "reserved", l.Reserved, "public_ip", m.host.PublicIP)
		return l, snap, nil
	}
	return subnet.Lease{}, Snapshot{}, fmt.Errorf("acquire a subnet: lost %d races in a row for free subnets; is something writing %s in a loop?", maxAcquireAttempts, m.reg.SubnetsPrefix())
}

func (m *Manager) tryAcquire(ctx context.Context, snap Snapshot) (subnet.Lease, error) {
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
	attrs := m.attrs()
	rev, err := m.reg.Create(ctx, want, attrs, int64(id))
	if err != nil {
		return subnet.Lease{}, err
	}
	m.mu.Lock()
	m.created = true
	m.mu.Unlock()
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
func (m *Manager) listed(snap Snapshot) takenSubnets {
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
func (m *Manager) pick(have subnet.Subnets, taken *takenSubnets) (subnet.Subnets, error) {
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
func (m *Manager) fits(l subnet.Lease) bool {
	return (!m.cfg.EnableIPv4 || m.cfg.Contains(l.Subnet)) &&
		(!m.cfg.EnableIPv6 || !l.IPv6Subnet.IsValid() || m.cfg.IPv6.Contains(l.IPv6Subnet))
}

// stranded explains a lease of this host that the network config no longer
// contains, and what to do about it.
func (m *Manager) stranded(l subnet.Lease) error {
	fix := "restore the previous network config (`overlayd config put -f old.json`), or release it with `overlayd teardown` on this host and start again"
	if l.Reserved {
		fix = "restore the previous network config, or replace the reservation: `overlayd lease revoke " + l.Subnets().Primary().String() + "` and `overlayd lease reserve` a subnet of the new network"
	}
	return fmt.Errorf("%w: %s (key %s) names node %q but is not inside the network's pools (%s): %s",
		ErrStranded, l.Subnets(), m.reg.LeaseKey(l.Subnets()), m.host.NodeID, m.pools(), fix)
}

// pools names the network's subnet pools, e.g. "/24 of 10.244.0.0/16".
func (m *Manager) pools() string {
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
func (m *Manager) adopt(ctx context.Context, l subnet.Lease, taken *takenSubnets) (subnet.Lease, error) {
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
			m.setEtcdLease(clientv3.LeaseID(l.EtcdLease), time.Duration(left)*time.Second)
			id = clientv3.LeaseID(l.EtcdLease)
		case left > 0:
			m.log.Info("the lease's etcd lease was granted another TTL; moving the key onto one of the TTL asked for", "granted", time.Duration(granted)*time.Second, "lease_ttl", m.opts.LeaseTTL)
			replaced = clientv3.LeaseID(l.EtcdLease)
			m.forgetEtcdLease(replaced) // a new one is granted below, never this one again
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
	attrs := m.attrs()
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
func (m *Manager) ensureEtcdLease(ctx context.Context) (clientv3.LeaseID, error) {
	m.mu.Lock()
	id := m.etcdLease
	m.mu.Unlock()
	if id != 0 {
		return id, nil
	}
	resp, err := m.reg.cli.Grant(ctx, int64(m.opts.LeaseTTL/time.Second))
	if err != nil {
		return 0, fmt.Errorf("grant an etcd lease of %s: %w", m.opts.LeaseTTL, err)
	}
	m.setEtcdLease(resp.ID, time.Duration(resp.TTL)*time.Second)
	return resp.ID, nil
}

func (m *Manager) setEtcdLease(id clientv3.LeaseID, ttl time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.etcdLease = id
	m.expires = time.Now().Add(ttl)
}

// setSeen records that the lease key was as m.lease says at revision rev.
func (m *Manager) setSeen(rev int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seen = max(m.seen, rev)
}

// forgetEtcdLease drops id if it is the etcd lease kept for reuse.
func (m *Manager) forgetEtcdLease(id clientv3.LeaseID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.etcdLease == id {
		m.etcdLease = 0
	}
}

// forgetStore drops what refers to a store that was re-created: the
// revisions seen (the new store's are lower) and the etcd lease (gone
// with it).
func (m *Manager) forgetStore() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.seen, m.lease.ModRevision, m.etcdLease = 0, 0, 0
}

func (m *Manager) seenRev() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return max(m.seen, m.lease.ModRevision)
}

func (m *Manager) setLease(l subnet.Lease) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lease = l
	if l.Reserved {
		m.expires = time.Time{}
	}
}

// Release gives the lease up for good (overlayd teardown): it deletes the
// lease key if it is still ours and revokes the etcd lease. A reservation's
// key is kept, since an operator made it.
func (m *Manager) Release(ctx context.Context) error {
	l := m.Lease()
	if !l.Subnets().Primary().IsValid() {
		return nil
	}
	if !l.Reserved {
		if _, err := m.reg.DeleteIfOwned(ctx, l.Subnets(), l.ModRevision); err != nil {
			return err
		}
		if _, err := m.reg.cli.Revoke(ctx, clientv3.LeaseID(l.EtcdLease)); err != nil {
			m.log.Debug("revoke etcd lease", "err", err)
		}
	}
	return nil
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
