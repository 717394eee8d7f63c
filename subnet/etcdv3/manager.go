package etcdv3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/overlaynet/overlay/subnet"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// Run keeps the lease until ctx ends (then it returns nil) or the subnet is
// lost to another host (ErrLeaseLost). It survives etcd outages: renewals and
// re-claims are retried until etcd answers again.
func (m *Manager) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wg.Go(func() { m.keepLiveness(ctx) })

	lost := make(chan error, 1)
	wg.Go(func() {
		if err := m.keepLease(ctx); err != nil {
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
func (m *Manager) keepLease(ctx context.Context) error {
	var warn repeatWarn
	for ctx.Err() == nil {
		held := time.Now()
		err := m.holdLease(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrDuplicateNode) {
			m.log.Error("lease taken over: pods on this host hold addresses from it; stopping", "subnet", m.Lease().Subnet, "err", err)
			return err
		}
		if kg := (keyGoneError{}); errors.As(err, &kg) {
			m.setKeyProblem(err)
		}
		// A hold that ends at once, again and again, must not become a
		// busy loop of re-claims against etcd.
		if time.Since(held) < m.opts.RetryInterval && !sleepCtx(ctx, m.opts.RetryInterval) {
			return nil
		}
		warn.warn(m.log, "lease keeping interrupted, re-claiming", "subnet", m.Lease().Subnet, "err", err)
		rctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
		err = m.reclaim(rctx)
		cancel()
		if err != nil {
			if errors.Is(err, ErrLeaseLost) {
				m.log.Error("lease lost to another host: pods on this host hold addresses from it; stopping", "subnet", m.Lease().Subnet, "err", err)
				return err
			}
			warn.warn(m.log, "re-claim failed, will retry", "subnet", m.Lease().Subnet, "err", err)
			if !sleepCtx(ctx, m.opts.RetryInterval) {
				return nil
			}
			continue
		}
		m.setKeyProblem(nil)
		warn.recovered(m.log, "lease keeping resumed", "subnet", m.Lease().Subnet)
	}
	return nil
}

// holdLease runs while the lease is intact: it drains KeepAlive responses and
// watches the lease key. It returns why it stopped holding.
func (m *Manager) holdLease(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	l := m.Lease()
	var kaCh <-chan *clientv3.LeaseKeepAliveResponse
	if !l.Reserved {
		var err error
		kaCh, err = m.reg.cli.KeepAlive(ctx, clientv3.LeaseID(l.EtcdLease))
		if err != nil {
			return fmt.Errorf("keep etcd lease %x alive: %w", l.EtcdLease, err)
		}
	}
	key := m.reg.LeaseKey(l.Subnet)
	wctx := ownStream(clientv3.WithRequireLeader(ctx), "lease")
	wch, err := openWatch(wctx, m.reg.cli, m.opts.ProgressInterval+m.opts.StallTimeout, key, clientv3.WithRev(m.seenRev()+1), clientv3.WithProgressNotify())
	if err != nil {
		return fmt.Errorf("watch of %s: %w", key, err)
	}
	stall := newStallCheck(m.reg.cli, wctx, wch, m.opts.ProgressInterval, m.opts.StallTimeout)
	defer stall.stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stall.C():
			if reason := stall.check(); reason != "" {
				return fmt.Errorf("watch of %s: %s", key, reason)
			}
		case ka, ok := <-kaCh:
			if !ok {
				m.clearEtcdLease()
				return keyGone("lease expired: etcd lease %x of %s was revoked or not renewed within its TTL (etcd unreachable?)", l.EtcdLease, key)
			}
			m.setEtcdLease(ka.ID, time.Duration(ka.TTL)*time.Second)
		case resp, ok := <-wch:
			stall.heard()
			if !ok || resp.Err() != nil {
				return fmt.Errorf("watch of %s broke: %v", key, resp.Err())
			}
			for _, ev := range resp.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return keyGone("lease key %s was deleted", key)
				}
				attrs, err := subnet.DecodeAttrs(ev.Kv.Value)
				switch {
				case err != nil || !attrs.OwnedBy(m.host.NodeID, m.host.PublicIP) && !attrs.NamesAHost():
					// Garbage is nobody's claim: reclaim restores ours.
					return keyGone("lease key %s was overwritten with a value naming no host", key)
				case !attrs.OwnedBy(m.host.NodeID, m.host.PublicIP):
					return fmt.Errorf("%w: %s was rewritten by someone else", ErrLeaseLost, key)
				case !subnet.SameAttrs(attrs, m.attrs()):
					return fmt.Errorf("%w: %s was rewritten with node ID %q from public IP %s: give every host its own --node-name",
						ErrDuplicateNode, key, attrs.NodeID, attrs.PublicIP)
				}
				l.ModRevision = ev.Kv.ModRevision
				m.setLease(l)
			}
			// Everything up to here has been seen: the last event's
			// revision, or a progress notification's.
			if n := len(resp.Events); n > 0 {
				m.setSeen(resp.Events[n-1].Kv.ModRevision)
			} else if resp.IsProgressNotify() {
				m.setSeen(resp.Header.Revision)
			}
		}
	}
}

// keyGoneError is a reason holdLease stopped that means the key no longer
// holds this host's lease: readiness says so until the re-claim succeeds.
type keyGoneError struct{ msg string }

func (e keyGoneError) Error() string { return e.msg }

func keyGone(format string, args ...any) error { return keyGoneError{fmt.Sprintf(format, args...)} }

func (m *Manager) clearEtcdLease() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.etcdLease = 0
}

// reclaim restores this host's claim on the same subnet: it re-creates the
// key if it is gone, re-attaches a fresh etcd lease if the old one expired,
// and reports ErrLeaseLost if another host now holds the subnet.
func (m *Manager) reclaim(ctx context.Context) error {
	want := m.Lease()
	cur, rev, err := m.current(ctx, want.Subnet)
	if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, subnet.ErrInvalidLease) {
		// Whatever happens to the key after rev, the watch will see.
		defer m.setSeen(rev)
	}
	switch {
	case errors.Is(err, ErrNotFound):
		id := clientv3.LeaseID(0)
		if !want.Reserved {
			if id, err = m.ensureEtcdLease(ctx); err != nil {
				return err
			}
		}
		rev, err := m.reg.Create(ctx, want.Subnet, m.attrs(), int64(id))
		if errors.Is(err, ErrTaken) {
			return m.reclaim(ctx) // someone wrote it just now: look at what they wrote
		}
		if err != nil {
			return err
		}
		m.setLease(subnet.Lease{Subnet: want.Subnet, Attrs: m.attrs(), Reserved: id == 0, EtcdLease: int64(id), ModRevision: rev})
		m.log.Info("lease re-claimed", "subnet", want.Subnet)
		return nil
	case errors.Is(err, subnet.ErrInvalidLease) && cur.ModRevision != 0,
		err == nil && !cur.Attrs.OwnedBy(m.host.NodeID, m.host.PublicIP) && !cur.Attrs.NamesAHost():
		// Our key holds a value naming no host: nobody's claim. Overwrite
		// it, keeping the kind of claim we had (the writer may have dropped
		// the etcd lease).
		m.log.Warn("own lease key held a value naming no host; restoring it", "subnet", want.Subnet, "err", err)
		cur.Attrs, cur.Reserved, cur.EtcdLease = subnet.LeaseAttrs{}, want.Reserved, want.EtcdLease
	case err != nil:
		return err
	case !cur.Attrs.OwnedBy(m.host.NodeID, m.host.PublicIP):
		return fmt.Errorf("%w: %s is now held by node %q (public IP %s)", ErrLeaseLost, want.Subnet, cur.Attrs.NodeID, cur.Attrs.PublicIP)
	}
	l, err := m.adopt(ctx, cur)
	if err != nil {
		return err
	}
	m.setLease(l)
	return nil
}

// current reads the lease key like Registry.Get, and also returns the
// revision it was read at.
func (m *Manager) current(ctx context.Context, p netip.Prefix) (subnet.Lease, int64, error) {
	key := m.reg.LeaseKey(p)
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

// livenessValue is the JSON of <prefix>/nodes/<node-id>.
type livenessValue struct {
	PublicIP string
	Hostname string
	Since    string
}

// livenessSlack is how long after its TTL etcd may take to revoke an
// expired lease (and so delete the liveness key it carries).
const livenessSlack = 3 * time.Second

// CheckNodeID refuses to start while another host's overlayd holds this
// node ID's liveness key. A key left by this host's own previous process
// (same public IP; a second live daemon on one host fails earlier, on its
// lock file) is not a duplicate. Another host's key may be a dead host's
// that has not expired yet: it is given its remaining TTL (plus slack) to
// vanish. The wait is bounded by that TTL, not by any per-request timeout,
// so it ends in nil, ErrDuplicateNode, ctx's error, or a request error
// (etcd unreachable: the caller may retry).
func (m *Manager) CheckNodeID(ctx context.Context) error {
	key := m.reg.NodeKey(m.host.NodeID)
	for {
		other, lease, rev, err := m.otherHolder(ctx, key)
		if err != nil || other == nil {
			return err
		}
		wait := m.opts.LivenessTTL + livenessSlack
		rctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
		if ttl, err := m.reg.TTL(rctx, lease); err == nil && ttl >= 0 {
			wait = time.Duration(ttl)*time.Second + livenessSlack
		}
		cancel()
		reason := fmt.Sprintf("duplicate node ID: %q is held by a live overlayd at %s (%s); waiting up to %s for its liveness key %s to expire",
			m.host.NodeID, other.PublicIP, other.Hostname, wait.Round(time.Second), key)
		m.log.Warn("another host holds this node ID's liveness key; waiting for it to expire", "other_public_ip", other.PublicIP, "wait", wait)
		if m.opts.OnWait != nil {
			m.opts.OnWait(reason)
		}
		deleted, err := m.waitDeleted(ctx, key, rev, wait)
		if err != nil {
			return err
		}
		if deleted {
			continue // gone: look again, another host may have started
		}
		// The wait is over: one last look decides.
		if other, _, _, err = m.otherHolder(ctx, key); err != nil || other == nil {
			return err
		}
		return fmt.Errorf("%w: node ID %q is held by a live overlayd at %s (%s): give every host its own --node-name (cloned machines share /etc/machine-id)",
			ErrDuplicateNode, m.host.NodeID, other.PublicIP, other.Hostname)
	}
}

// otherHolder reads the liveness key and returns its value if another host
// holds it (nil if nobody or this host does), with its etcd lease and the
// revision of the read.
func (m *Manager) otherHolder(ctx context.Context, key string) (*livenessValue, int64, int64, error) {
	rctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
	defer cancel()
	resp, err := m.reg.cli.Get(rctx, key)
	if err != nil {
		return nil, 0, 0, fmt.Errorf("read liveness key %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, resp.Header.Revision, nil
	}
	var v livenessValue
	if err := json.Unmarshal(resp.Kvs[0].Value, &v); err == nil && v.PublicIP == m.host.PublicIP.String() {
		return nil, 0, resp.Header.Revision, nil
	}
	return &v, resp.Kvs[0].Lease, resp.Header.Revision, nil
}

// waitDeleted watches key from after rev for up to wait and reports
// whether it was deleted. Only ctx's end is an error: a watch that breaks
// just ends the wait early, and the caller looks again.
func (m *Manager) waitDeleted(ctx context.Context, key string, rev int64, wait time.Duration) (bool, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	for wr := range m.reg.cli.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(rev+1)) {
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return true, nil
			}
		}
	}
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	if wctx.Err() == nil {
		// The watch broke before the wait was over: wait out the rest, so
		// a flapping watch cannot turn this into a tight loop.
		if !sleepCtx(ctx, time.Until(deadlineOf(wctx))) {
			return false, ctx.Err()
		}
	}
	return false, nil
}

func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

// keepLiveness holds <prefix>/nodes/<node-id> on a short etcd lease so tools
// can tell a live owner from a dead one. After an outage long enough for the
// short lease to expire, or if someone deletes the key, it is written again.
func (m *Manager) keepLiveness(ctx context.Context) {
	var warn repeatWarn
	for ctx.Err() == nil {
		err := m.holdLiveness(ctx)
		m.mu.Lock()
		held := !m.liveSince.IsZero()
		m.liveSince, m.liveErr = time.Time{}, err
		m.mu.Unlock()
		if ctx.Err() != nil {
			return
		}
		if held {
			warn = repeatWarn{} // it was back: a new loss is news
		}
		warn.warn(m.log, "liveness key lost, re-creating", "err", err)
		if !sleepCtx(ctx, m.opts.RetryInterval) {
			return
		}
	}
}

func (m *Manager) holdLiveness(ctx context.Context) error {
	key := m.reg.NodeKey(m.host.NodeID)
	grant, err := m.reg.cli.Grant(ctx, int64(m.opts.LivenessTTL/time.Second))
	if err != nil {
		return fmt.Errorf("grant liveness lease: %w", err)
	}
	// Revoke on the way out so a clean stop shows "not alive" at once.
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_, _ = m.reg.cli.Revoke(rctx, grant.ID)
	}()
	val, _ := json.Marshal(livenessValue{PublicIP: m.host.PublicIP.String(), Hostname: m.host.Hostname, Since: time.Now().UTC().Format(time.RFC3339)})
	put, err := m.reg.cli.Put(ctx, key, string(val), clientv3.WithLease(grant.ID))
	if err != nil {
		return fmt.Errorf("write liveness key %s: %w", key, err)
	}
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel below: both goroutines end with kctx
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	kaCh, err := m.reg.cli.KeepAlive(kctx, grant.ID)
	if err != nil {
		return fmt.Errorf("keep liveness lease alive: %w", err)
	}
	// Two goroutines, so that neither can delay the other: the keepalive
	// drain must notice an expired lease within its TTL however long the
	// key's watch takes to come back (without quorum, re-opening a watch
	// blocks until etcd confirms it).
	lost := make(chan error, 2)
	wg.Go(func() {
		for range kaCh {
		}
		lost <- fmt.Errorf("liveness key %s: its %s etcd lease expired (etcd unreachable?)", key, m.opts.LivenessTTL)
	})
	wg.Go(func() {
		if err := m.watchLivenessKey(kctx, key, put.Header.Revision); err != nil {
			lost <- err
		}
	})
	m.mu.Lock()
	m.liveSince, m.liveErr = time.Now(), nil
	m.mu.Unlock()
	select {
	case err := <-lost:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// watchLivenessKey returns an error once the liveness key is deleted while
// its lease lives on (etcdctl del), and nil when ctx ends. A broken watch (a
// leader change, a failover) is no loss by itself — the keepalive says
// whether the session holds: it looks whether the key is still there, then
// watches again.
func (m *Manager) watchLivenessKey(ctx context.Context, key string, rev int64) error {
	for {
		wch := m.reg.cli.Watch(ownStream(clientv3.WithRequireLeader(ctx), "liveness"), key, clientv3.WithRev(rev+1))
		for wr := range wch {
			if wr.Err() != nil {
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return fmt.Errorf("liveness key %s was deleted", key)
				}
			}
		}
		if !sleepCtx(ctx, m.opts.RetryInterval) {
			return nil
		}
		rctx, cancel := context.WithTimeout(ctx, DefaultRequestTimeout)
		resp, err := m.reg.cli.Get(rctx, key)
		cancel()
		if err == nil {
			if len(resp.Kvs) == 0 {
				return fmt.Errorf("liveness key %s was deleted", key)
			}
			rev = resp.Header.Revision
		}
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
