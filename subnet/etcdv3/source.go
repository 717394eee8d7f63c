package etcdv3

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/subnet"
)

// SourceConfig is what the etcd lease source is told.
type SourceConfig struct {
	// Endpoints name the etcd members (for Where); Dial connects to them
	// and checks that they answer (overlayd's client settings:
	// internal/etcdclient.Connect).
	Endpoints []string
	Dial      func(context.Context) (*clientv3.Client, error)
	Prefix    string
	// JournalFile is where the lease journal is kept (JournalFile of the
	// subnet file); "" keeps none.
	JournalFile string
	// LeaseTTL and LivenessTTL are the Manager's (ManagerOptions).
	LeaseTTL, LivenessTTL time.Duration
	// Resync is how often the lease set is re-listed
	// (WatchOptions.ResyncInterval).
	Resync time.Duration
	// ConfigRetry is the config watch's pause after an error.
	ConfigRetry time.Duration
	Logger      *slog.Logger
}

// CatchUpReason is what a resumed start waits for, as readiness's start-up
// reason says it (Snapshot.Behind): the saved set's revision and etcd's
// when it was checked.
const CatchUpReason = "catching up with etcd: the saved lease set is at revision %d, etcd was at %d"

// Source is the etcd implementation of subnet.Source: flannel's schema
// under one prefix (Registry), this host's lease kept by a Manager (with
// the node-ID claim before it), every lease followed by a watch, and the
// lease journal beside the subnet file so that a restart resumes the
// watch instead of listing every lease. Its steps are called from one
// goroutine, in the order subnet.Source gives; Keep, Watch and
// WatchConfig then run on goroutines of their own.
type Source struct {
	cfg     SourceConfig
	cli     *clientv3.Client
	reg     *Registry // For the network, once Claim knows it
	mgr     *Manager  // once Claim made it
	journal *Journal  // nil if it cannot be kept; Watch's goroutine owns it from then on
	opened  bool      // the journal was opened (once, at the first Acquire)
	saved   Snapshot  // what it held, for every attempt of Acquire
}

var _ subnet.Source = (*Source)(nil)

// NewSource returns an etcd lease source; it connects in Connect.
func NewSource(cfg SourceConfig) *Source {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ConfigRetry <= 0 {
		cfg.ConfigRetry = time.Second
	}
	return &Source{cfg: cfg}
}

// Where names the etcd endpoints.
func (s *Source) Where() string { return "etcd at " + strings.Join(s.cfg.Endpoints, ",") }

// Connect dials etcd and checks that it answers.
func (s *Source) Connect(ctx context.Context) error {
	cli, err := s.cfg.Dial(ctx)
	if err != nil {
		return err
	}
	s.cli, s.reg = cli, NewRegistry(cli, s.cfg.Prefix)
	return nil
}

// Config reads <prefix>/config.
func (s *Source) Config(ctx context.Context) (*subnet.Config, error) {
	cfg, _, err := s.reg.GetConfig(ctx)
	return cfg, err
}

// ConfigKey is <prefix>/config.
func (s *Source) ConfigKey() string { return s.reg.ConfigKey() }

// LeaseKeyPrefix is the prefix of the network's lease keys (subnets/, or
// subnets6/ for an IPv6-only network once Claim knows it).
func (s *Source) LeaseKeyPrefix() string { return s.reg.SubnetsPrefix() }

// Claim makes the Manager for host in cfg and claims the node ID
// (Manager.ClaimNodeID): it waits out another host's liveness key, bounded
// by that key's TTL.
func (s *Source) Claim(ctx context.Context, cfg *subnet.Config, host subnet.Host, onWait func(string)) error {
	if s.mgr == nil {
		// An IPv6-only network keeps its leases apart (under subnets6/).
		s.reg = s.reg.For(cfg)
		s.mgr = newManager(s.reg, cfg, host, ManagerOptions{
			LeaseTTL: s.cfg.LeaseTTL, LivenessTTL: s.cfg.LivenessTTL, Logger: s.cfg.Logger, OnWait: onWait})
	}
	return s.mgr.ClaimNodeID(ctx)
}

// Acquire resumes from the lease set the journal saved, if etcd still
// holds it, or else lists every lease (Manager.AcquireFrom).
func (s *Source) Acquire(ctx context.Context) (subnet.Lease, subnet.Snapshot, error) {
	saved := s.savedLeases()
	l, snap, err := s.mgr.AcquireFrom(ctx, saved)
	if err != nil {
		return l, snap, err
	}
	s.saved = Snapshot{} // the caller has it now; with many leases it is megabytes
	if snap.Head > snap.Revision {
		snap.Behind = fmt.Sprintf(CatchUpReason, snap.Revision, snap.Head)
	}
	return l, snap, nil
}

// savedLeases opens the lease journal, once, and returns the lease set the
// last run saved in it, or zero if there is none to use (AcquireFrom then
// lists, as a first start does). The journal lets a restart resume the
// lease watch where the last run left it instead of listing every lease:
// with every host of a large cluster restarting at once, those listings
// are what keeps etcd busy. It lives beside the subnet file, which the
// host lock makes this daemon's alone.
func (s *Source) savedLeases() Snapshot {
	if s.opened || s.cfg.JournalFile == "" {
		return s.saved
	}
	s.opened = true
	j, saved, err := OpenJournal(s.cfg.JournalFile, s.reg)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.cfg.Logger.Warn("ignoring the lease journal; listing every lease instead", "err", err)
	}
	s.journal, s.saved = j, saved
	return saved
}

// Keep keeps the lease and the liveness key (Manager.Run).
func (s *Source) Keep(ctx context.Context) error { return s.mgr.Run(ctx) }

// Watch makes the journal hold snap, then follows every lease after it
// (Registry.Watch), appending each batch to the journal before it is
// delivered. Without a journal the watch works as well; the next start
// just lists.
func (s *Source) Watch(ctx context.Context, snap subnet.Snapshot, opts subnet.WatchOptions) <-chan subnet.Batch {
	log := opts.Logger
	if log == nil {
		log = s.cfg.Logger
	}
	j := s.journal
	if j != nil {
		if err := j.Start(snap); err != nil {
			log.Warn("cannot keep the lease journal; a restart will list every lease", "err", err)
			_ = j.Close()
			j = nil
		}
	}
	s.journal = nil // the watch's from here on
	return s.reg.Watch(ctx, snap, WatchOptions{ResyncInterval: s.cfg.Resync, Logger: log,
		OnRestart: opts.OnRestart, Progress: j != nil, Journal: j})
}

// WatchConfig follows <prefix>/config (Registry.WatchConfig).
func (s *Source) WatchConfig(ctx context.Context) <-chan subnet.ConfigUpdate {
	return s.reg.WatchConfig(ctx, s.cfg.ConfigRetry)
}

// Held is the Manager, nil before Claim.
func (s *Source) Held() subnet.LeaseState {
	if s.mgr == nil {
		return nil
	}
	return s.mgr
}

// Release releases the lease Acquire created, if it did.
func (s *Source) Release(ctx context.Context) (bool, error) {
	if s.mgr == nil || !s.mgr.Created() {
		return false, nil
	}
	return true, s.mgr.Release(ctx)
}

// IsFatal: the lease lost, a duplicate node ID, a stranded lease. (Bad
// client settings are Dial's to call fatal: the daemon checks them.)
func (s *Source) IsFatal(err error) bool {
	for _, fatal := range []error{ErrLeaseLost, ErrDuplicateNode, ErrStranded} {
		if errors.Is(err, fatal) {
			return true
		}
	}
	return false
}

// Close frees the node ID if Keep never took the claim over (a start-up
// that failed after Claim), closes a journal no watch took, and closes the
// etcd client.
func (s *Source) Close() {
	if s.mgr != nil {
		s.mgr.ReleaseClaim(context.Background())
	}
	if s.journal != nil {
		_ = s.journal.Close()
	}
	if s.cli != nil {
		_ = s.cli.Close()
	}
}
