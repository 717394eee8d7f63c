package etcdv3

// One attempt of the lease watch: open it, follow it until it breaks or
// stalls, deliver what each response says.

import (
	"context"
	"errors"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/internal/lib/jitter"
)

// follow consumes one etcd watch until it breaks or stalls, returning why
// and whether the revision it needed was compacted. It calls live once the
// watch delivers anything. It opens the watch, then waits for whichever
// comes first: a catch-up question to ask (catchUpAsker), a stall check,
// a re-created store, the periodic re-list, or a response (broken,
// deliver).
func (w *watcher) follow(ctx context.Context, out chan<- Batch, resync *time.Timer, live func()) (string, bool) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wctx = ownStream(clientv3.WithRequireLeader(wctx), "leases")
	epoch, rebased := w.reg.head.rebaseSignal()
	if epoch != w.epoch {
		return w.rebased(epoch), true
	}
	wch, err := openWatch(wctx, w.reg.cli, w.reg.head, w.opts.ProgressInterval, w.opts.StallTimeout, w.reg.SubnetsPrefix(),
		clientv3.WithPrefix(), clientv3.WithRev(answerableFrom(w.rev)), clientv3.WithProgressNotify())
	if err != nil {
		return err.Error(), false
	}
	// Events at or below floor are not news: the watch starts at w.rev
	// (answerableFrom: its events come again), and a periodic re-list
	// moves it to the listing's revision while older responses may still
	// wait in wch. A progress notification does not move it: etcd before
	// 3.4.25 and 3.5.8 could send one ahead of events still to come.
	floor := w.rev
	stall := newStallCheck(w.reg.cli, wctx, wch, w.reg.head, func() int64 { return w.rev }, w.opts.ProgressInterval, w.opts.StallTimeout)
	defer stall.stop()
	ask := w.newCatchUp()
	for {
		select {
		case <-ctx.Done():
			return "stopped", false
		case <-ask.c:
			ask.next(wctx, w)
		case <-stall.C():
			if reason := stall.check(); reason != "" {
				return reason, false
			}
		case <-rebased:
			epoch, _ := w.reg.head.rebaseSignal()
			return w.rebased(epoch), true
		case <-resync.C:
			resync.Reset(jitter.Spread(resyncInterval(w.opts.ResyncInterval, len(w.known))))
			if err := w.relist(ctx, out, w.opts.RequestTimeout, true); err != nil {
				return "periodic re-list failed: " + err.Error(), false
			}
			floor = w.rev
		case resp, ok := <-wch:
			stall.heard()
			if !ok {
				return "watch channel closed", false
			}
			if reason, compacted := broken(resp); reason != "" {
				return reason, compacted
			}
			if live != nil {
				live()
				live = nil
			}
			if !w.deliver(ctx, out, resp, floor) {
				return "stopped", false
			}
		}
	}
}

// broken says why a watch response ends the watch, and whether the
// revision it needed was compacted; "" if it does not.
func broken(resp clientv3.WatchResponse) (reason string, compacted bool) {
	switch {
	case resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted):
		return "revision compacted", true
	case resp.Err() != nil:
		return "watch error: " + resp.Err().Error(), false
	case resp.Canceled:
		return "watch canceled by the server", false
	}
	return "", false
}

// deliver sends what one watch response says: a progress notification as
// an empty batch if it must be reported, events as the batches apply
// makes of them. It returns false if ctx ended while sending.
func (w *watcher) deliver(ctx context.Context, out chan<- Batch, resp clientv3.WatchResponse, floor int64) bool {
	if resp.IsProgressNotify() {
		if w.reports(resp.Header.Revision) && !w.send(ctx, out, Batch{Revision: resp.Header.Revision}) {
			return false
		}
		w.rev = max(w.rev, resp.Header.Revision)
		return true
	}
	// Everything up to the last event has been delivered; not
	// necessarily up to the header's revision: a watch catching up
	// gets its backlog in parts, each headed with the store's
	// current revision. Only a progress notification vouches for
	// its header (the lease manager's own-key watch reads it so too).
	rev := resp.Header.Revision
	if n := len(resp.Events); n > 0 {
		rev = resp.Events[n-1].Kv.ModRevision
	}
	batches := w.apply(after(resp.Events, floor), rev)
	w.reg.head.delivered(rev)
	if len(batches) == 0 && w.reports(rev) {
		batches = []Batch{{Revision: rev}}
	}
	for _, b := range batches {
		if !w.send(ctx, out, b) {
			return false
		}
	}
	w.rev = max(w.rev, rev)
	return true
}

// catchUpAsker asks etcd, for a watch that starts behind a known head,
// whether it has caught up: etcd answers a progress request once the
// watch has delivered everything up to the store's revision (and drops it
// before), so the answer, not a quiet ProgressInterval, says when. The
// pause doubles after each request: a fleet that restarts at once must
// not flood an etcd that is slow to catch them all up.
type catchUpAsker struct {
	c    <-chan time.Time // nil once caught up, or for a watch not behind
	wait time.Duration
}

func (w *watcher) newCatchUp() catchUpAsker {
	a := catchUpAsker{wait: catchUpInterval}
	if w.rev < w.head {
		a.c = time.After(a.wait)
	}
	return a
}

// next asks once, unless w has caught up, and sets the next time to.
func (a *catchUpAsker) next(wctx context.Context, w *watcher) {
	if w.rev >= w.head {
		a.c = nil
		return
	}
	rctx, cancel := context.WithTimeout(wctx, w.opts.StallTimeout)
	_ = w.reg.cli.RequestProgress(rctx) // a failure shows as a stall
	cancel()
	a.wait = min(2*a.wait, maxCatchUpInterval)
	a.c = time.After(a.wait)
}
