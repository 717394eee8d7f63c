package etcdv3

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
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
	// (the backend's codec made it: backend/leasedata.Codec.Encode), written
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
// that re-claims the same subnet if the key disappears. Each job is a type
// of its own: held is the lease's state (read by readiness), nodeClaim the
// node ID's liveness key, acquirer the choice and adoption of a lease, and
// keeper the keepalive, the own-key watch and the re-claim.
type Manager struct {
	*lessee
	held *held
	node *nodeClaim
	acq  *acquirer
	keep *keeper
}

// lessee is what every part of a Manager reads and none changes: the
// registry, the network, this host and the options.
type lessee struct {
	reg  *Registry
	cfg  *subnet.Config
	host subnet.Host
	opts ManagerOptions
	log  *slog.Logger
}

// NewManager returns a Manager for host in the network cfg.
func NewManager(reg *Registry, cfg *subnet.Config, host Host, opts ManagerOptions) *Manager {
	return newManager(reg, cfg, host.subnetHost(cfg), opts)
}

// subnetHost is h as the lease source takes it: the lease value it
// publishes in cfg, with the backend's data of each family's device.
func (h Host) subnetHost(cfg *subnet.Config) subnet.Host {
	return subnet.Host{NodeID: h.NodeID, Hostname: h.Hostname, PublicIP: h.PublicIP, PublicIPv6: h.PublicIPv6, Previous: h.Previous}.
		Publishing(cfg, h.BackendData, h.BackendV6Data)
}

func newManager(reg *Registry, cfg *subnet.Config, host subnet.Host, opts ManagerOptions) *Manager {
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
	l := &lessee{reg: reg, cfg: cfg, host: host, opts: opts, log: opts.Logger}
	h := &held{}
	acq := &acquirer{lessee: l, held: h}
	k := &keeper{acquirer: acq}
	k.epoch, _ = reg.head.rebaseSignal()
	return &Manager{lessee: l, held: h, node: &nodeClaim{lessee: l}, acq: acq, keep: k}
}

// Lease returns the lease currently held.
func (m *Manager) Lease() subnet.Lease { return m.held.Lease() }

// Created reports whether Acquire (or AcquireFrom) created this host's
// lease key: no key named this host, and it claimed a free subnet. A lease
// it adopted, resumed or re-keyed (adding or dropping the IPv6 subnet of a
// lease this host held) is not created: pods may hold addresses from it.
func (m *Manager) Created() bool { return m.held.Created() }

// Expires returns when the held lease expires unless renewed; zero for a
// reservation, which never expires.
func (m *Manager) Expires() time.Time { return m.held.Expires() }

// Alive reports whether the liveness key is held right now.
func (m *Manager) Alive() bool {
	alive, _ := m.Liveness()
	return alive
}

// Liveness reports whether the liveness key is held and, if not, why: nil
// before it was first written, else the error that lost it.
func (m *Manager) Liveness() (bool, error) { return m.node.liveness() }

// KeyProblem says why the lease key is not known to hold this host's lease
// right now (deleted, overwritten, its etcd lease gone) while the manager
// re-claims it; nil while it is held.
func (m *Manager) KeyProblem() error { return m.held.KeyProblem() }

// ClaimNodeID makes this process the holder of the node ID (nodeClaim.claim).
// A caller that gives up before Run (a later start-up step failed) calls
// ReleaseClaim, so that the node ID is free at once, not after the TTL.
func (m *Manager) ClaimNodeID(ctx context.Context) error { return m.node.claim(ctx) }

// ReleaseClaim gives up the node ID claimed by ClaimNodeID if Run has not
// taken the claim over: the keepalive stops and the liveness key goes at
// once. Once Run has it, Run releases it when it returns; then, and
// without a claim, ReleaseClaim does nothing.
func (m *Manager) ReleaseClaim(ctx context.Context) { m.node.release(ctx) }

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
func (m *Manager) Acquire(ctx context.Context) (subnet.Lease, subnet.Snapshot, error) {
	for range maxAcquireAttempts {
		snap, err := m.reg.List(ctx)
		if err != nil {
			return subnet.Lease{}, subnet.Snapshot{}, err
		}
		l, err := m.acq.tryAcquire(ctx, snap)
		if errors.Is(err, ErrTaken) || errors.Is(err, ErrConflict) {
			m.log.Debug("lost a race for a subnet, retrying", "err", err)
			continue
		}
		if err != nil {
			return subnet.Lease{}, subnet.Snapshot{}, err
		}
		m.held.setLease(l)
		m.held.setSeen(max(snap.Revision, l.ModRevision))
		m.log.Info("lease acquired", "subnets", l.Subnets(), "reserved", l.Reserved, "public_ip", m.host.PublicIP)
		return l, snap, nil
	}
	return subnet.Lease{}, subnet.Snapshot{}, fmt.Errorf("acquire a subnet: lost %d races in a row for free subnets; is something writing %s in a loop?", maxAcquireAttempts, m.reg.Keys.SubnetsPrefix())
}

// Release gives the lease up for good (overlayd teardown): it deletes the
// lease key if it is still ours and revokes the etcd lease. A reservation's
// key is kept, since an operator made it.
func (m *Manager) Release(ctx context.Context) error {
	l := m.held.Lease()
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
