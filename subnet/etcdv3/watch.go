package etcdv3

import (
	"context"
	"log/slog"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/internal/lib/backoff"
	"github.com/overlaynet/overlay/internal/lib/jitter"
	"github.com/overlaynet/overlay/subnet"
)

// Defaults of WatchOptions (and of ManagerOptions' stall detection).
const (
	DefaultResyncInterval   = 30 * time.Minute
	DefaultProgressInterval = 5 * time.Second
	DefaultStallTimeout     = 5 * time.Second
	DefaultRequestTimeout   = 10 * time.Second
	DefaultRelistSpread     = 5 * time.Second
)

// WatchOptions tune a watch; zero values mean the defaults.
type WatchOptions struct {
	// ResyncInterval is how often the whole lease set is re-listed and diffed
	// as a last line of defence; jittered by ±10%. Default 30 min; with
	// more than 18,000 leases, 100 ms per lease (see resyncPerLease).
	ResyncInterval time.Duration
	// ProgressInterval is how long the watch may be quiet (no event, no
	// progress notification) before the watcher asks etcd for a progress
	// notification — if it may be missing anything: a manager's liveness
	// keepalive replies beside it tell when the store has not moved past
	// what the watch delivered, and then it asks nothing. Default 5 s.
	ProgressInterval time.Duration
	// StallTimeout is how long the watch may stay silent after such a
	// request before it is declared stalled: it is then opened again on a
	// new stream (and after repeated stalls the lease set re-listed). A
	// stalled watch that misses a change is thus noticed within a
	// keepalive period plus ProgressInterval+StallTimeout (15 s by
	// default). When etcd answers slowly the wait grows with its answer
	// time, up to 8 StallTimeouts (see storeHead). Default 5 s.
	StallTimeout time.Duration
	// RequestTimeout bounds each re-list, so one sent over a dead
	// connection fails and is retried rather than hanging; a re-list
	// after a fault that ran out of time gets twice as long the next time
	// (up to 16 times), and the pauses between attempts grow the same
	// way from RetryInterval. Default 10 s.
	RequestTimeout time.Duration
	// RetryInterval is the pause before re-watching after an error,
	// spread by half of it either way.
	RetryInterval time.Duration
	// RelistSpread: after a compaction passed the watch's revision, the
	// re-list waits a random part of it, so the hosts that all see the
	// compaction at once do not all read every lease at once. Default 5 s.
	RelistSpread time.Duration
	// Progress: when etcd's revision moves on without a lease changing,
	// deliver an empty batch with the new revision, so that whoever saves
	// the lease set (Journal) saves a revision etcd still holds.
	Progress bool
	Logger   *slog.Logger
	// OnRestart is called each time the watch has to be re-established.
	OnRestart func(reason string)
	// Journal, if set, is started already (Journal.Start) and gets every
	// batch (Journal.Apply) before it is delivered; the watch owns it from
	// then on and closes it when it ends. After a failure (a full disk)
	// the journal stops, and what it holds, the lease set at an earlier
	// revision, is still true for a restart to resume from.
	Journal *Journal
}

func (o *WatchOptions) defaults() {
	if o.ResyncInterval <= 0 {
		o.ResyncInterval = DefaultResyncInterval
	}
	if o.ProgressInterval <= 0 {
		o.ProgressInterval = DefaultProgressInterval
	}
	if o.StallTimeout <= 0 {
		o.StallTimeout = DefaultStallTimeout
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.RetryInterval <= 0 {
		o.RetryInterval = time.Second
	}
	if o.RelistSpread <= 0 {
		o.RelistSpread = DefaultRelistSpread
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Watch follows every lease starting after snap, delivering batches on the
// returned channel until ctx ends (then the channel closes). It watches from
// snap.Revision+1 with progress notifications. When the watch breaks or
// stalls it resumes from the last revision seen, so what changed meanwhile
// arrives as events; only when that revision has been compacted does it
// re-list and send the difference — adds, removes and attribute changes —
// so the consumer never misses one. A watch from a saved set that
// AcquireFrom resumed (snap.Head beyond snap.Revision) says when it has
// caught up: a batch with a Revision of at least Head arrives as soon as
// it has, an empty one if no lease changed.
func (r *Registry) Watch(ctx context.Context, snap Snapshot, opts WatchOptions) <-chan Batch {
	opts.defaults()
	w := &watcher{reg: r, opts: opts, log: opts.Logger, rev: snap.Revision, head: snap.Head, known: make(map[subnet.ID]subnet.Known, len(snap.Leases)),
		journal: opts.Journal}
	if snap.Head > snap.Revision {
		w.catchUp = snap.Head
	}
	w.epoch, _ = r.head.rebaseSignal()
	for _, l := range snap.Leases {
		w.known[l.ID()] = subnet.KnownOf(l)
	}
	w.setInvalid(snap.Invalid)
	out := make(chan Batch)
	go func() {
		defer close(out)
		defer w.stopJournal()
		w.run(ctx, out)
	}()
	return out
}

type watcher struct {
	reg  *Registry
	opts WatchOptions
	log  *slog.Logger
	rev  int64
	// head is a revision the consumer must be told it has reached (a
	// saved set's Snapshot.Head): until then the watch asks etcd for
	// progress (after catchUpInterval, then less often), and a progress notification
	// past rev is delivered as an empty batch.
	head int64
	// known holds each lease's fingerprint and revision (subnet.Known),
	// not the lease: what the consumer needs of a value it gets in the
	// event, and at thousands of leases the values would be most of the
	// host's memory.
	known map[subnet.ID]subnet.Known
	// invalid holds the keys whose current value is invalid (nil while
	// there are none, as in a healthy cluster), so that their deletion can
	// be reported.
	invalid map[string]bool
	// epoch is the re-creations of etcd's store known (storeHead): after
	// one, nothing at rev or below means anything, and only a re-list can
	// tell what the new store holds.
	epoch uint64
	// catchUp is the head a watch from a saved set must reach before the
	// set is current (Snapshot.Head), 0 once a batch said so (CaughtUp).
	catchUp int64
	// journal gets each batch before it is sent; nil if none is kept.
	journal *Journal
}

// setInvalid replaces the invalid keys with a listing's.
func (w *watcher) setInvalid(inv []Invalid) {
	w.invalid = nil
	for _, i := range inv {
		w.markInvalid(i.Key)
	}
}

func (w *watcher) markInvalid(key string) {
	if w.invalid == nil {
		w.invalid = map[string]bool{}
	}
	w.invalid[key] = true
}

func (w *watcher) run(ctx context.Context, out chan<- Batch) {
	resync := time.NewTimer(jitter.Spread(resyncInterval(w.opts.ResyncInterval, len(w.known))))
	defer resync.Stop()
	var warn repeatWarn
	quiet := 0 // watches in a row that delivered nothing
	live := func() {
		quiet = -1
		warn.recovered(w.log, "lease watch restored", "revision", w.rev)
	}
	for ctx.Err() == nil {
		reason, compacted := w.follow(ctx, out, resync, live)
		if ctx.Err() != nil {
			return
		}
		// Watches that keep stalling make the watch path suspect, and a
		// re-list the way to learn what changed — unless the keepalives
		// stopped being answered too: then etcd is out of reach (a
		// partition), a re-list could not get through either, and once
		// etcd is back, resuming from the revision is all that is needed.
		if !strings.HasPrefix(reason, stalledPrefix) || !w.reg.head.outOfReach() {
			quiet++
		}
		if w.opts.OnRestart != nil {
			w.opts.OnRestart(reason)
		}
		// Each fault is logged when it begins; while etcd stays away, the
		// failed attempts repeat the news at most every WarnEvery.
		warn.warn(w.log, "lease watch restarting", "reason", reason, "revision", w.rev)
		if !compacted && (quiet < 2 || !strings.HasPrefix(reason, stalledPrefix)) {
			// etcd still holds every revision after w.rev: the watch
			// resumes there and delivers what changed meanwhile as
			// events, without re-reading every lease. A leader change
			// breaks every host's watch at once; the spread pause keeps
			// them from all coming back at the same moment. Only when
			// watches keep stalling without delivering anything is the
			// watch path itself suspect, and the re-list below the way
			// to learn what changed.
			if !sleepCtx(ctx, jitter.Wide(w.opts.RetryInterval)) {
				return
			}
			continue
		}
		// The history after w.rev is gone (or out of reach): only a
		// re-list can tell what changed. A compaction reaches every host's
		// watch together, so each waits a random part of RelistSpread.
		// A listing that runs out of time gets longer the next time:
		// every host re-listing at once is what makes etcd slow.
		b := backoff.New(w.opts.RequestTimeout, 16*w.opts.RequestTimeout, w.opts.RetryInterval, 16*w.opts.RetryInterval)
		wait := jitter.Upto(w.opts.RelistSpread)
		for ctx.Err() == nil {
			if !sleepCtx(ctx, wait) {
				return
			}
			err := w.relist(ctx, out, b.Timeout(), false)
			if err == nil {
				live()
				quiet = 0
				break
			}
			warn.warn(w.log, "re-list of leases failed, will retry", "err", err)
			wait = b.Failed(err)
		}
	}
}

// rebased forgets what refers to the old store's revisions — the head a
// resumed watch was to catch up with, the revision each known lease was
// written at (a re-list compares them with the new store's) — and says why
// the watch ends: as after a compaction, only a re-list can tell what
// changed.
func (w *watcher) rebased(epoch uint64) string {
	w.epoch, w.head = epoch, 0
	for id, k := range w.known {
		k.ModRevision = 0
		w.known[id] = k
	}
	return "etcd's store was re-created (wiped, or restored from a backup)"
}

// reports says whether reaching rev without a lease changing is delivered
// as an empty batch: when asked to (Progress), and until the head is
// reached.
func (w *watcher) reports(rev int64) bool {
	return (w.opts.Progress || w.rev < w.head) && rev > w.rev
}

// apply folds watch events into the known set and returns the net events
// (the response was at revision rev), in batches that keep the order Batch
// promises: a change to a key that has an Invalid or Deleted entry in the
// current batch starts a new one. (Applied after the events, a stale
// invalid value would otherwise mark the key invalid again and drop the
// lease that replaced it.)
func (w *watcher) apply(events []*clientv3.Event, rev int64) []Batch {
	var out []Batch
	var b Batch
	pending := map[string]bool{} // keys with an Invalid or Deleted entry in b
	for i, ev := range events {
		key := string(ev.Kv.Key)
		if pending[key] {
			b.Revision = events[i-1].Kv.ModRevision
			out = append(out, b)
			b = Batch{}
			clear(pending)
		}
		invalid := func(err error) {
			b.Invalid = append(b.Invalid, Invalid{Key: key, ModRevision: ev.Kv.ModRevision, Err: err})
			pending[key] = true
			w.markInvalid(key)
		}
		p, err := w.reg.ParseKey(key)
		id := p.ID()
		prev, had := w.known[id]
		gone := subnet.Event{Type: subnet.Removed, Lease: subnet.Lease{Subnet: p.IPv4, IPv6Subnet: p.IPv6}}
		switch {
		case ev.Type == clientv3.EventTypeDelete && had:
			delete(w.known, id)
			b.Events = append(b.Events, gone)
			continue
		case ev.Type == clientv3.EventTypeDelete:
			if w.invalid[key] {
				delete(w.invalid, key)
				b.Deleted = append(b.Deleted, key)
				pending[key] = true
			}
			continue
		case err != nil:
			invalid(err)
			continue
		}
		l, err := w.reg.decode(ev.Kv.Key, ev.Kv.Value, ev.Kv.Lease, ev.Kv.ModRevision)
		if err != nil {
			// An unreadable value replaces whatever was there: stop using it.
			invalid(err)
			if had {
				delete(w.known, id)
				b.Events = append(b.Events, gone)
			}
			continue
		}
		delete(w.invalid, key)
		k := subnet.KnownOf(l)
		w.known[id] = k
		switch {
		case !had:
			b.Events = append(b.Events, subnet.Event{Type: subnet.Added, Lease: l})
		case k.Fingerprint != prev.Fingerprint:
			b.Events = append(b.Events, subnet.Event{Type: subnet.Changed, Lease: l})
		}
	}
	if len(b.Events) > 0 || len(b.Invalid) > 0 || len(b.Deleted) > 0 {
		b.Revision = rev
		out = append(out, b)
	}
	return out
}

// relist reads the whole lease set and sends what differs from the known
// set. Values it has at the listed revision already are not decoded again:
// after a compaction most leases are the ones it knew.
func (w *watcher) relist(ctx context.Context, out chan<- Batch, timeout time.Duration, periodic bool) error {
	lctx, cancel := context.WithTimeout(ctx, timeout)
	snap, unchanged, err := w.reg.list(lctx, func(id subnet.ID, rev int64) bool {
		k, ok := w.known[id]
		return ok && k.ModRevision == rev
	})
	cancel()
	if err != nil {
		return err
	}
	events, known := subnet.Diff(w.known, snap.Leases, unchanged)
	b := Batch{Events: events, Invalid: snap.Invalid, Revision: snap.Revision, Resync: true, Periodic: periodic, ClusterID: snap.ClusterID}
	w.known, w.rev = known, snap.Revision
	w.setInvalid(snap.Invalid)
	w.send(ctx, out, b)
	return nil
}

// send journals b, marks it CaughtUp if it is the first to reach a
// resumed watch's head, and delivers it.
func (w *watcher) send(ctx context.Context, out chan<- Batch, b Batch) bool {
	if w.journal != nil {
		if err := w.journal.Apply(b); err != nil {
			w.log.Warn("stopped keeping the lease journal; a restart will resume from an older revision", "err", err)
			w.stopJournal()
		}
	}
	if w.catchUp > 0 && b.Revision >= w.catchUp {
		b.CaughtUp, w.catchUp = true, 0
	}
	select {
	case out <- b:
		return true
	case <-ctx.Done():
		return false
	}
}

// stopJournal closes the journal, if one is kept.
func (w *watcher) stopJournal() {
	if w.journal != nil {
		_ = w.journal.Close()
		w.journal = nil
	}
}

// A watch that starts behind a known head first asks etcd whether it has
// caught up after catchUpInterval, then after pauses that double up to
// maxCatchUpInterval.
const (
	catchUpInterval    = 100 * time.Millisecond
	maxCatchUpInterval = 1600 * time.Millisecond
)

// resyncPerLease stretches the periodic re-list with the size of the lease
// set. Every host re-reads every lease each interval, so a fixed interval
// costs etcd N² lease reads per interval — 50,000 hosts at 30 min would
// read 1.4 million leases a second; this way the cost grows as N (10
// leases a second per host at most), and nothing changes up to 18,000
// leases at the default interval.
const resyncPerLease = 100 * time.Millisecond

// resyncInterval is how long to wait between periodic re-lists of n leases:
// the configured interval, or longer for large lease sets.
func resyncInterval(configured time.Duration, n int) time.Duration {
	return max(configured, time.Duration(n)*resyncPerLease)
}
