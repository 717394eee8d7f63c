package subnet

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/netip"
	"time"
)

// Source is where overlayd's leases come from: this host's own, which it
// acquires and keeps, and every other host's, which it follows. The daemon
// consumes only this interface (and the types below), so a second store —
// the Kubernetes API, where a Node's podCIDR is its lease — is a second
// implementation, not a change to the daemon's loop. subnet/etcdv3.Source
// is the etcd one (flannel's schema), subnet/kube.Source the Kubernetes
// API's (flanneld's kube subnet manager).
//
// Start-up calls, in order, each until it succeeds or fails with an error
// waiting cannot fix (IsFatal): Connect, Config, then — once the daemon
// has checked the config against the host — Claim and Acquire. After that
// Keep, Watch and WatchConfig run until ctx ends. Whatever belongs to one
// store alone happens inside its steps: etcd's node-ID claim is Claim, its
// lease journal is kept by Acquire (which resumes from it) and Watch
// (which appends to it), its catch-up from a resumed revision is Watch's
// CaughtUp.
type Source interface {
	// Where names the store for readiness and logs, e.g. "etcd at
	// 127.0.0.1:2379" (the start-up step reads "trying to reach <Where>").
	Where() string
	// Name is the store's short name: readiness's condition of this host's
	// liveness in it (etcd: "etcd", whose reason reads "etcd session
	// lost: …").
	Name() string
	// Connect reaches the store.
	Connect(ctx context.Context) error
	// Config reads and validates the stored network config.
	Config(ctx context.Context) (*Config, error)
	// ConfigKey names where the network config is kept, for messages.
	ConfigKey() string
	// LeaseName is the store's name of the lease on s (etcd: its key,
	// <prefix>/subnets/<s.Key()>), so that messages name a lease as the
	// store does, as Invalid.Key does.
	LeaseName(s Subnets) string

	// Claim makes this process the holder of host's identity in the
	// network cfg (etcd: the node-ID claim, which waits out another
	// host's key), before any lease is looked at; it bounds its own waits.
	// A source without such a claim returns nil. onWait, if set, is told
	// why it waits.
	Claim(ctx context.Context, cfg *Config, host Host, onWait func(reason string)) error
	// Acquire obtains this host's lease (the one naming the host, the
	// previous subnet.env's if free, else a free one; a source that saved
	// the lease set at the last run resumes from it) and returns it with
	// the lease set that seeds the peers and Watch.
	Acquire(ctx context.Context) (Lease, Snapshot, error)
	// Keep keeps the lease until ctx ends (returning nil) or it is lost
	// for good (the error says why). The daemon calls it once the data
	// path is in place (the devices up, subnet.env written): a store
	// that is told so does it here (Kubernetes: the Node's
	// NetworkUnavailable condition set to false).
	Keep(ctx context.Context) error
	// Watch follows every lease after snap (Acquire's), delivering batches
	// until ctx ends; then the channel closes.
	Watch(ctx context.Context, snap Snapshot, opts WatchOptions) <-chan Batch
	// WatchConfig delivers the stored network config, then each change of
	// it, until ctx ends; then the channel closes.
	WatchConfig(ctx context.Context) <-chan ConfigUpdate
	// Held is the state of this host's lease, for readiness and metrics;
	// nil before Claim.
	Held() LeaseState
	// Release gives up a lease Acquire created (never one it adopted,
	// resumed or re-keyed: pods may hold addresses from it), so that a
	// start that failed before the data path was in place leaves no lease
	// behind; it reports whether there was one to release.
	Release(ctx context.Context) (bool, error)
	// IsFatal reports whether a start-up step's error is one retrying
	// cannot fix, Connect's included (etcd: bad client settings, the lease
	// lost, a duplicate node ID, a stranded lease; the daemon itself
	// checks for no free subnet).
	IsFatal(err error) bool
	// Close ends what the source holds (its claim if Keep never took it
	// over, its connection). Call it once every goroutine using the source
	// has returned.
	Close()
}

// WatchOptions are what the consumer of a lease watch tells it.
type WatchOptions struct {
	// Logger logs the watch's faults (nil: none).
	Logger *slog.Logger
	// OnRestart, if set, is called each time the watch has to be
	// re-established.
	OnRestart func(reason string)
}

// LeaseState is this host's lease as its keeper holds it now.
type LeaseState interface {
	// Lease returns the lease currently held.
	Lease() Lease
	// Expires returns when the lease expires unless renewed; zero for a
	// reservation.
	Expires() time.Time
	// KeyProblem says why the lease is not known to be this host's right
	// now (deleted, overwritten, expired) while it is re-claimed; nil
	// while it is held.
	KeyProblem() error
	// Liveness reports whether the host's liveness in the store is held
	// and, if not, why: nil before it was first written.
	Liveness() (bool, error)
}

// Host is this host as its lease and its liveness name it.
type Host struct {
	NodeID   string
	Hostname string
	// PublicIP and PublicIPv6 are the underlay addresses (zero for a
	// family the host has none of); a lease naming either (or NodeID) is
	// this host's (LeaseAttrs.OwnedBy).
	PublicIP, PublicIPv6 netip.Addr
	// Attrs is the lease value this host publishes, backend data included.
	Attrs LeaseAttrs
	// Previous names the subnets of an old subnet.env, each reused if
	// still free.
	Previous Subnets
}

// Publishing is h with the lease value it publishes in the network cfg
// (Attrs): its public address, node ID and hostname, and the data plane's
// data of each family cfg carries (data for IPv4, data6 for IPv6, as the
// backend's codec made them; the other is not read). The one constructor
// of a host's lease value, for every source.
func (h Host) Publishing(cfg *Config, data, data6 json.RawMessage) Host {
	h.Attrs = LeaseAttrs{BackendType: DefaultBackendType, NodeID: h.NodeID, Hostname: h.Hostname}
	if cfg.EnableIPv4 {
		h.Attrs = NewAttrs(h.PublicIP, DefaultBackendType, data, h.NodeID, h.Hostname)
	}
	if cfg.EnableIPv6 {
		h.Attrs = h.Attrs.WithIPv6(h.PublicIPv6, data6)
	}
	return h
}

// Invalid is a lease key whose key or value could not be decoded.
type Invalid struct {
	// Key is the store's name of the lease (etcd: its key), for messages
	// and Batch.Deleted.
	Key string
	// Subnets are the subnets the lease is on, as the source tells them
	// (etcd: from its key); zero if Key names none. A consumer drops the
	// peer on them: an undecodable value replaces whatever was there.
	Subnets     Subnets
	ModRevision int64
	Err         error
}

// Snapshot is every lease at one point of the store's history.
type Snapshot struct {
	Leases  []Lease
	Invalid []Invalid
	// Revision is the store's revision the set is at (for logs; a
	// source's Watch continues after it).
	Revision int64
	// ClusterID is the etcd cluster's ID, which a lease journal checks
	// before it is used (etcd only).
	ClusterID uint64
	// Saved: read from what the last run saved (a lease journal), not from
	// the store.
	Saved bool
	// Head is, for a saved set that was resumed, the store's revision
	// when the set was checked: the set is current once the watch has
	// delivered that far (a batch with CaughtUp says when).
	Head int64
	// Behind, for a saved set the store has moved on from, says what the
	// daemon waits for before its first pass (readiness's start-up
	// reason): the watch's batches up to one with CaughtUp. "" for a
	// current set.
	Behind string
}

// Batch is what a lease watch delivers: the events of one store change (or
// of one re-list), the keys that failed to decode, the invalid keys that
// were deleted, and the revision the lease set is now at. A consumer
// applies a batch's Events, then its Deleted keys, then its Invalid keys;
// so that this order is always the order of the revisions, a key with an
// Invalid or Deleted entry never shares a batch with a later change of the
// same key (a store change holding both is delivered as two batches). A
// batch may hold nothing but a newer Revision.
type Batch struct {
	Events  []Event
	Invalid []Invalid
	// Deleted are keys deleted while they held an invalid value (or were
	// not lease keys at all): no lease was removed, but whoever counted
	// them invalid can stop.
	Deleted  []string
	Revision int64
	// Resync is true when the batch comes from a re-list (after a
	// compaction passed the watch, the store was re-created, or the
	// periodic check) rather than from watch events; Periodic too when it
	// was the periodic check. A re-list's Revision is the listing's: below
	// the batches before it when etcd's store was re-created.
	Resync, Periodic bool
	// ClusterID is the etcd cluster a re-list read (Resync only).
	ClusterID uint64
	// CaughtUp: with this batch, a watch from a saved set that was behind
	// (Snapshot.Behind) has delivered everything up to the store's head
	// when the set was checked.
	CaughtUp bool
}

// Empty reports whether b changes no lease (the store's revision moved
// on, or a watch caught up).
func (b Batch) Empty() bool { return len(b.Events) == 0 && len(b.Invalid) == 0 && len(b.Deleted) == 0 }

// ConfigUpdate is the stored network config as read after it changed:
// Config, or Err if it is gone or invalid.
type ConfigUpdate struct {
	Config *Config
	Err    error
}
