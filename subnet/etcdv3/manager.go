package etcdv3

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
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
	VtepMAC  net.HardwareAddr
	// Previous is the subnet from an old subnet.env, reused if still free.
	Previous netip.Prefix
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
	// OnWait, if set, is told why CheckNodeID is waiting (for readiness).
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

	mu    sync.Mutex
	lease subnet.Lease
	// seen is a revision at which the lease key was known to hold lease;
	// the key's watch resumes after it. The key's own ModRevision will not
	// do: it is usually old, and once history is compacted past it a watch
	// from there fails at once, every time.
	seen      int64
	etcdLease clientv3.LeaseID
	expires   time.Time // when the etcd lease runs out unless renewed
	liveSince time.Time // zero while the liveness key is not held
	liveErr   error     // why the liveness key is not held, once it was lost
	keyErr    error     // why the lease key is not known to be ours, while re-claiming
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
	return &Manager{reg: reg, cfg: cfg, host: host, opts: opts, log: opts.Logger}
}

// Lease returns the lease currently held.
func (m *Manager) Lease() subnet.Lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lease
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
	return subnet.NewVXLANAttrs(m.host.PublicIP, m.cfg.Backend.VNI, m.host.VtepMAC, m.host.NodeID, m.host.Hostname)
}

// Acquire obtains a lease, in order of preference: one that already names this
// host (adopting its etcd lease, or keeping a reservation TTL-free), the
// subnet of the previous subnet.env if free, else a random free subnet.
// Call CheckNodeID first: Acquire trusts that the node ID is this host's.
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
		m.log.Info("lease acquired", "subnet", l.Subnet, "reserved", l.Reserved, "public_ip", m.host.PublicIP)
		return l, snap, nil
	}
	return subnet.Lease{}, Snapshot{}, fmt.Errorf("acquire a subnet: lost %d races in a row for free subnets; is something writing %s in a loop?", maxAcquireAttempts, m.reg.SubnetsPrefix())
}

func (m *Manager) tryAcquire(ctx context.Context, snap Snapshot) (subnet.Lease, error) {
	taken := make(map[netip.Prefix]bool, len(snap.Leases)+len(snap.Invalid))
	var own *subnet.Lease
	for i, l := range snap.Leases {
		taken[l.Subnet] = true
		switch {
		case !l.Attrs.OwnedBy(m.host.NodeID, m.host.PublicIP):
		case !m.cfg.Contains(l.Subnet):
			return subnet.Lease{}, m.stranded(l)
		case own == nil:
			own = &snap.Leases[i]
		}
	}
	if own != nil {
		return m.adopt(ctx, *own)
	}
	for _, inv := range snap.Invalid {
		// A key whose value is garbage still occupies its subnet.
		if p, err := subnet.ParseKey(inv.Key[len(m.reg.SubnetsPrefix()):]); err == nil {
			taken[p] = true
		}
	}
	want := m.host.Previous
	if !m.cfg.InRange(want) || taken[want] {
		var err error
		if want, err = m.cfg.PickFree(taken, m.opts.Rand); err != nil {
			return subnet.Lease{}, err
		}
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
	return subnet.Lease{Subnet: want, Attrs: attrs, EtcdLease: int64(id), ModRevision: rev}, nil
}

// stranded explains a lease of this host that the network config no longer
// contains, and what to do about it.
func (m *Manager) stranded(l subnet.Lease) error {
	fix := "restore the previous network config (`overlayd config put -f old.json`), or release it with `overlayd teardown` on this host and start again"
	if l.Reserved {
		fix = "restore the previous network config, or replace the reservation: `overlayd lease revoke " + l.Subnet.String() + "` and `overlayd lease reserve` a subnet of the new network"
	}
	return fmt.Errorf("%w: %s (key %s) names node %q but is not a /%d inside Network %s: %s",
		ErrStranded, l.Subnet, m.reg.LeaseKey(l.Subnet), m.host.NodeID, m.cfg.SubnetLen, m.cfg.Network, fix)
}

// adopt takes over a lease that already names this host. A reservation stays
// TTL-free; a leased key keeps its etcd lease if it is still alive, so a
// restart never multiplies etcd leases.
func (m *Manager) adopt(ctx context.Context, l subnet.Lease) (subnet.Lease, error) {
	id := clientv3.LeaseID(0)
	if !l.Reserved {
		ttl, err := m.reg.TTL(ctx, l.EtcdLease)
		if err != nil {
			return subnet.Lease{}, err
		}
		if ttl > 0 {
			m.setEtcdLease(clientv3.LeaseID(l.EtcdLease), time.Duration(ttl)*time.Second)
			id = clientv3.LeaseID(l.EtcdLease)
		} else if id, err = m.ensureEtcdLease(ctx); err != nil {
			return subnet.Lease{}, err
		}
	}
	attrs := m.attrs()
	if subnet.SameAttrs(attrs, l.Attrs) && int64(id) == l.EtcdLease {
		return l, nil
	}
	rev, err := m.reg.Update(ctx, l, attrs, int64(id))
	if err != nil {
		return subnet.Lease{}, err
	}
	return subnet.Lease{Subnet: l.Subnet, Attrs: attrs, Reserved: l.Reserved, EtcdLease: int64(id), ModRevision: rev}, nil
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
	if !l.Subnet.IsValid() {
		return nil
	}
	if !l.Reserved {
		if _, err := m.reg.DeleteIfOwned(ctx, l.Subnet, l.ModRevision); err != nil {
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
