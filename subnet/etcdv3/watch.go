package etcdv3

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"strings"
	"time"

	"github.com/overlaynet/overlay/subnet"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Batch is what the watcher delivers: the events of one etcd watch response
// (or of one re-list), the keys that failed to decode, and the revision the
// lease set is now at.
type Batch struct {
	Events   []subnet.Event
	Invalid  []Invalid
	Revision int64
	// Resync is true when the batch comes from a re-list after a compaction,
	// a broken watch or the periodic check, rather than from watch events.
	Resync bool
}

// WatchOptions tune a watch; zero values mean the defaults.
type WatchOptions struct {
	// ResyncInterval is how often the whole lease set is re-listed and diffed
	// in case a watch stalled silently; jittered by up to 10%. Default 5 min.
	ResyncInterval time.Duration
	// RetryInterval is the pause before re-watching after an error.
	RetryInterval time.Duration
	Logger        *slog.Logger
	// OnRestart is called each time the watch has to be re-established.
	OnRestart func(reason string)
}

// Watch follows every lease starting after snap, delivering batches on the
// returned channel until ctx ends (then the channel closes). It watches from
// snap.Revision+1 with progress notifications; when the revision it needs has
// been compacted or the watch breaks, it re-lists and sends the difference —
// adds, removes and attribute changes — so the consumer never misses one.
func (r *Registry) Watch(ctx context.Context, snap Snapshot, opts WatchOptions) <-chan Batch {
	if opts.ResyncInterval <= 0 {
		opts.ResyncInterval = 5 * time.Minute
	}
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	w := &watcher{reg: r, opts: opts, log: opts.Logger, rev: snap.Revision, known: make(map[netip.Prefix]subnet.Lease, len(snap.Leases))}
	for _, l := range snap.Leases {
		w.known[l.Subnet] = l
	}
	out := make(chan Batch)
	go func() {
		defer close(out)
		w.run(ctx, out)
	}()
	return out
}

type watcher struct {
	reg   *Registry
	opts  WatchOptions
	log   *slog.Logger
	rev   int64
	known map[netip.Prefix]subnet.Lease
}

func (w *watcher) run(ctx context.Context, out chan<- Batch) {
	resync := time.NewTimer(jitter(w.opts.ResyncInterval))
	defer resync.Stop()
	for ctx.Err() == nil {
		reason := w.follow(ctx, out, resync)
		if ctx.Err() != nil {
			return
		}
		if w.opts.OnRestart != nil {
			w.opts.OnRestart(reason)
		}
		w.log.Warn("lease watch restarting", "reason", reason, "revision", w.rev)
		for ctx.Err() == nil {
			if err := w.relist(ctx, out); err == nil {
				break
			} else {
				w.log.Warn("re-list of leases failed, will retry", "err", err)
			}
			if !sleepCtx(ctx, w.opts.RetryInterval) {
				return
			}
		}
	}
}

// follow consumes one etcd watch until it breaks, returning why.
func (w *watcher) follow(ctx context.Context, out chan<- Batch, resync *time.Timer) string {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := w.reg.cli.Watch(clientv3.WithRequireLeader(wctx), w.reg.SubnetsPrefix(),
		clientv3.WithPrefix(), clientv3.WithRev(w.rev+1), clientv3.WithProgressNotify())
	for {
		select {
		case <-ctx.Done():
			return "stopped"
		case <-resync.C:
			resync.Reset(jitter(w.opts.ResyncInterval))
			if err := w.relist(ctx, out); err != nil {
				return "periodic re-list failed: " + err.Error()
			}
		case resp, ok := <-wch:
			switch {
			case !ok:
				return "watch channel closed"
			case resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted):
				return "revision compacted"
			case resp.Err() != nil:
				return "watch error: " + resp.Err().Error()
			case resp.Canceled:
				return "watch canceled by the server"
			case resp.IsProgressNotify():
				w.rev = resp.Header.Revision
				continue
			}
			if b := w.apply(resp.Events); len(b.Events) > 0 || len(b.Invalid) > 0 {
				b.Revision = resp.Header.Revision
				if !send(ctx, out, b) {
					return "stopped"
				}
			}
			w.rev = resp.Header.Revision
		}
	}
}

// apply folds watch events into the known set and returns the net events.
func (w *watcher) apply(events []*clientv3.Event) Batch {
	var b Batch
	for _, ev := range events {
		key := string(ev.Kv.Key)
		p, err := subnet.ParseKey(strings.TrimPrefix(key, w.reg.SubnetsPrefix()))
		if err != nil {
			if ev.Type == clientv3.EventTypePut {
				b.Invalid = append(b.Invalid, Invalid{Key: key, ModRevision: ev.Kv.ModRevision, Err: err})
			}
			continue
		}
		prev, had := w.known[p]
		if ev.Type == clientv3.EventTypeDelete {
			if had {
				delete(w.known, p)
				b.Events = append(b.Events, subnet.Event{Type: subnet.Removed, Lease: prev})
			}
			continue
		}
		l, err := w.reg.decode(ev.Kv.Key, ev.Kv.Value, ev.Kv.Lease, ev.Kv.ModRevision)
		if err != nil {
			// An unreadable value replaces whatever was there: stop using it.
			b.Invalid = append(b.Invalid, Invalid{Key: key, ModRevision: ev.Kv.ModRevision, Err: err})
			if had {
				delete(w.known, p)
				b.Events = append(b.Events, subnet.Event{Type: subnet.Removed, Lease: prev})
			}
			continue
		}
		w.known[p] = l
		switch {
		case !had:
			b.Events = append(b.Events, subnet.Event{Type: subnet.Added, Lease: l})
		case !subnet.SameAttrs(prev.Attrs, l.Attrs) || prev.Reserved != l.Reserved:
			b.Events = append(b.Events, subnet.Event{Type: subnet.Changed, Lease: l, Old: prev})
		}
	}
	return b
}

// relist reads the whole lease set and sends what differs from the known set.
func (w *watcher) relist(ctx context.Context, out chan<- Batch) error {
	snap, err := w.reg.List(ctx)
	if err != nil {
		return err
	}
	cur := make(map[netip.Prefix]subnet.Lease, len(snap.Leases))
	for _, l := range snap.Leases {
		cur[l.Subnet] = l
	}
	b := Batch{Events: subnet.Diff(w.known, cur), Invalid: snap.Invalid, Revision: snap.Revision, Resync: true}
	w.known, w.rev = cur, snap.Revision
	send(ctx, out, b)
	return nil
}

func send(ctx context.Context, out chan<- Batch, b Batch) bool {
	select {
	case out <- b:
		return true
	case <-ctx.Done():
		return false
	}
}

func jitter(d time.Duration) time.Duration {
	return d + time.Duration(rand.Int64N(int64(d)/10+1))
}
