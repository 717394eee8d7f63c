package etcdv3

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// stalledPrefix begins every reason a watch is given up as stalled.
const stalledPrefix = "watch stalled"

// streamSeq numbers the watch streams this process opens.
var streamSeq atomic.Uint64

// ownStream gives a watch its own gRPC stream. The etcd client multiplexes
// every watch whose context carries the same metadata onto one stream, so a
// watch re-opened after a stall with the same metadata would join the
// stalled stream again, and a progress request would be answered (or not)
// for every watch on it. A unique metadata value per attempt avoids both.
func ownStream(ctx context.Context, what string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "overlay-watch", what+"-"+strconv.FormatUint(streamSeq.Add(1), 10))
}

// openWatch opens a watch whose stream may stall before it is even set up.
// The etcd client returns a watch's channel only once the server has
// confirmed the watch, so a stream stuck in between would block the caller
// for good, before any stall check could start. openWatch gives the
// confirmation the bound a stall check gives an open watch (interval and
// the stall timeout head adapts from timeout); on a stall the caller must
// cancel ctx, which also ends the abandoned call.
func openWatch(ctx context.Context, cli *clientv3.Client, head *storeHead, interval, timeout time.Duration, key string, opts ...clientv3.OpOption) (clientv3.WatchChan, error) {
	opened := make(chan clientv3.WatchChan, 1)
	start := time.Now()
	go func() { opened <- cli.Watch(ctx, key, opts...) }()
	bound := interval + head.stallTimeout(timeout)
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case wch := <-opened:
		head.answered(start, timeout)
		return wch, nil
	case <-t.C:
		if !head.outOfReach() {
			head.stalled()
		}
		return nil, fmt.Errorf(stalledPrefix+": etcd did not confirm the watch within %s", bound)
	}
}

// answerableFrom is where a watch that has everything up to rev resumes:
// at rev itself, not rev+1. etcd drops a progress request while a watch on
// the stream starts beyond its current revision, so a watch resumed at
// rev+1 on a store that stayed at rev could never answer one, and every
// check that had to ask (no current keepalive reply) ended in a false
// stall. The events at rev come again: after drops them.
func answerableFrom(rev int64) int64 { return max(rev, 1) }

// after returns the events past rev (events come in revision order).
func after(events []*clientv3.Event, rev int64) []*clientv3.Event {
	for len(events) > 0 && events[0].Kv.ModRevision <= rev {
		events = events[1:]
	}
	return events
}

// stallCheck notices a watch that stopped delivering anything without
// failing: a stream stuck on the server or in a proxy while the connection
// itself is healthy, which neither the client nor gRPC keepalive report.
//
// When the watch has been quiet for interval, it first asks whether the
// watch can be missing anything at all: if a reply this host got anyway (a
// liveness keepalive's, every few seconds) recently reported the store at
// or below the revision the watch has confirmed, nothing changed that the
// watch has not delivered, and it asks etcd nothing — so an idle cluster
// costs its hosts no requests but their keepalives. Otherwise it asks etcd
// for a progress notification on the watch's stream (RequestProgress);
// etcd answers with the current revision on every watch of a synced
// stream. If nothing at all arrives within timeout of asking, the watch
// has stalled.
type stallCheck struct {
	cli       *clientv3.Client
	wctx      context.Context // the watch's context: it names its stream
	wch       clientv3.WatchChan
	head      *storeHead
	confirmed func() int64 // the revision up to which the watch delivered everything
	interval  time.Duration
	timeout   time.Duration
	timer     *time.Timer
	asked     time.Time // zero while no request is outstanding
}

func newStallCheck(cli *clientv3.Client, wctx context.Context, wch clientv3.WatchChan, head *storeHead, confirmed func() int64, interval, timeout time.Duration) *stallCheck {
	return &stallCheck{cli: cli, wctx: wctx, wch: wch, head: head, confirmed: confirmed,
		interval: interval, timeout: timeout, timer: time.NewTimer(interval)}
}

func (s *stallCheck) C() <-chan time.Time { return s.timer.C }

// heard records that the watch delivered something: after a progress
// request, that is its answer, and how long it took tells how slow etcd is.
func (s *stallCheck) heard() {
	if !s.asked.IsZero() {
		s.head.answered(s.asked, s.timeout)
	}
	s.asked = time.Time{}
	s.timer.Reset(s.interval)
}

// check runs when the timer fires: it asks for progress when the watch may
// be behind and reports a stall ("" otherwise) when the answer is overdue.
func (s *stallCheck) check() string {
	if !s.asked.IsZero() {
		// The answer may be waiting beside the timer: select picks either
		// when both are ready, and a late scheduler makes that common.
		if len(s.wch) > 0 {
			s.timer.Reset(s.head.stallTimeout(s.timeout))
			return ""
		}
		return s.stalled(fmt.Sprintf("no event and no answer to a progress request for %s", time.Since(s.asked).Round(time.Millisecond)))
	}
	if s.head.notPast(s.confirmed()) {
		s.timer.Reset(s.interval)
		return ""
	}
	s.asked = time.Now()
	wait := s.head.stallTimeout(s.timeout)
	// The request only queues on the stream; bound it all the same, with a
	// context carrying the watch's metadata so it reaches the same stream.
	rctx, cancel := context.WithTimeout(s.wctx, wait)
	err := s.cli.RequestProgress(rctx)
	cancel()
	if err != nil && s.wctx.Err() == nil {
		return s.stalled("progress request failed: " + err.Error())
	}
	s.timer.Reset(wait)
	return ""
}

// stalled reports a stall; if etcd answers this host's keepalives all the
// same, it may only be slow, and the next checks wait longer.
func (s *stallCheck) stalled(why string) string {
	if !s.head.outOfReach() {
		s.head.stalled()
	}
	return stalledPrefix + ": " + why
}

func (s *stallCheck) stop() { s.timer.Stop() }

// storeHead is the newest store revision that the liveness keepalive
// replies have reported, and until when that is current. The replies come
// every third of the liveness TTL at no extra cost; the stall checks of
// quiet watches read them.
//
// It also keeps how long etcd takes to answer this host's progress
// requests and to confirm its watches, so that a slow etcd is not taken
// for a stalled watch: the way
// TCP's retransmission timer follows the round-trip time, a check waits
// four smoothed answer times (at least the configured StallTimeout), twice
// that after each stall while the keepalives were answered, and never more
// than maxStallFactor times StallTimeout. Under overload every false stall
// re-opened a healthy watch, and two in a row re-listed every lease:
// more load on the etcd that was already slow.
type storeHead struct {
	mu    sync.Mutex
	rev   int64
	until time.Time
	// cluster is the etcd cluster ID the replies came from; epoch counts
	// the times the store was found re-created (rebase), and rebased is
	// closed at the next one.
	cluster uint64
	epoch   uint64
	rebased chan struct{}

	regained  time.Time     // when keepalive replies came again after a gap
	answer    time.Duration // smoothed answer time of progress requests and watch creations
	doublings int           // stalls since the last answer, while etcd answered keepalives
}

// maxStallFactor bounds the adapted stall timeout: a watch that really
// stalls is still given up within 8 StallTimeouts (40 s by default) however
// slow etcd has been.
const maxStallFactor = 8

// stallTimeout is how long to wait for an answer to a progress request,
// base being the configured StallTimeout.
func (h *storeHead) stallTimeout(base time.Duration) time.Duration {
	if h == nil {
		return base
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return min(max(base, 4*h.answer)<<h.doublings, maxStallFactor*base)
}

// answered records that etcd answered a progress request, or confirmed a
// new watch, asked at since (base: the configured StallTimeout). Answers
// feed the smoothed answer time, by an eighth each; one that waited
// through a time etcd was out of reach measures the outage, not etcd, and
// is left out (as TCP leaves out retransmitted segments). An answer within
// the wait without doubling ends the doubling: taken on every watch opened
// too, so that the doubling does not outlive the slowness that caused it
// (the gate makes progress requests rare) and delay noticing a new stall.
func (h *storeHead) answered(since time.Time, base time.Duration) {
	if h == nil {
		return
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if since.Before(h.regained) || !h.until.IsZero() && now.After(h.until) {
		return
	}
	d := now.Sub(since)
	if h.answer == 0 {
		h.answer = d
	} else {
		h.answer += (d - h.answer) / 8
	}
	if d <= max(base, 4*h.answer) {
		h.doublings = 0
	}
}

// stalled records a stall while etcd still answered keepalives.
func (h *storeHead) stalled() {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.doublings = min(h.doublings+1, 3) // 2³ = maxStallFactor
}

// observe records a keepalive reply of a lease with ttl left: the next one
// is due within ttl/3, so the revision counts as current for two of those.
func (h *storeHead) observe(hdr *etcdserverpb.ResponseHeader, ttl time.Duration) {
	if h == nil || hdr == nil {
		return
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.until.IsZero() && now.After(h.until) {
		h.regained = now
	}
	if h.cluster != 0 && hdr.ClusterId != h.cluster {
		h.rebase(hdr)
	}
	h.rev, h.cluster = max(h.rev, hdr.Revision), hdr.ClusterId
	h.until = now.Add(2 * ttl / 3)
}

// delivered records a revision a watch delivered an event of: committed
// in this store, so a later write below it means a re-created store
// (wrote). The keepalive replies alone may not have reported it yet.
func (h *storeHead) delivered(rev int64) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rev = max(h.rev, rev)
}

// wrote records the header of a write's response: its revision is the
// store's newest, so one below a revision seen before (or another cluster
// ID) means the store was re-created — wiped, or restored from a backup —
// and it reports that. (A read could be answered by a member that lags;
// a write's revision never goes back in one store.)
func (h *storeHead) wrote(hdr *etcdserverpb.ResponseHeader) bool {
	if h == nil || hdr == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	re := hdr.Revision < h.rev || h.cluster != 0 && hdr.ClusterId != h.cluster
	if re {
		h.rebase(hdr)
	}
	h.rev, h.cluster = max(h.rev, hdr.Revision), hdr.ClusterId
	return re
}

// rebase starts over from hdr's store: every watch that follows the old
// one's revisions is told (rebaseSignal). h.mu is held.
func (h *storeHead) rebase(hdr *etcdserverpb.ResponseHeader) {
	h.rev = hdr.Revision
	h.epoch++
	if h.rebased != nil {
		close(h.rebased)
		h.rebased = nil
	}
}

// rebaseSignal returns how many times the store was found re-created and
// a channel closed at the next time.
func (h *storeHead) rebaseSignal() (uint64, <-chan struct{}) {
	if h == nil {
		return 0, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rebased == nil {
		h.rebased = make(chan struct{})
	}
	return h.epoch, h.rebased
}

// outOfReach reports whether keepalive replies came before but have
// stopped: etcd does not answer this host at all. (Without any reply so far
// — a watcher without a manager — it cannot tell, and says no.)
func (h *storeHead) outOfReach() bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.until.IsZero() && time.Now().After(h.until)
}

// notPast reports whether a current reply showed the store at rev or below:
// a watch that has delivered everything up to rev misses nothing. Without a
// current reply it cannot tell, and says no.
func (h *storeHead) notPast(rev int64) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return time.Now().Before(h.until) && h.rev <= rev
}
