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
// confirmation the same bound a stall check gives an open watch; on a stall
// the caller must cancel ctx, which also ends the abandoned call.
func openWatch(ctx context.Context, cli *clientv3.Client, bound time.Duration, key string, opts ...clientv3.OpOption) (clientv3.WatchChan, error) {
	opened := make(chan clientv3.WatchChan, 1)
	go func() { opened <- cli.Watch(ctx, key, opts...) }()
	t := time.NewTimer(bound)
	defer t.Stop()
	select {
	case wch := <-opened:
		return wch, nil
	case <-t.C:
		return nil, fmt.Errorf(stalledPrefix+": etcd did not confirm the watch within %s", bound)
	}
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

// heard records that the watch delivered something.
func (s *stallCheck) heard() {
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
			s.timer.Reset(s.timeout)
			return ""
		}
		return fmt.Sprintf(stalledPrefix+": no event and no answer to a progress request for %s", time.Since(s.asked).Round(time.Millisecond))
	}
	if s.head.notPast(s.confirmed()) {
		s.timer.Reset(s.interval)
		return ""
	}
	s.asked = time.Now()
	// The request only queues on the stream; bound it all the same, with a
	// context carrying the watch's metadata so it reaches the same stream.
	rctx, cancel := context.WithTimeout(s.wctx, s.timeout)
	err := s.cli.RequestProgress(rctx)
	cancel()
	if err != nil && s.wctx.Err() == nil {
		return stalledPrefix + ": progress request failed: " + err.Error()
	}
	s.timer.Reset(s.timeout)
	return ""
}

func (s *stallCheck) stop() { s.timer.Stop() }

// storeHead is the newest store revision that the liveness keepalive
// replies have reported, and until when that is current. The replies come
// every third of the liveness TTL at no extra cost; the stall checks of
// quiet watches read them.
type storeHead struct {
	mu    sync.Mutex
	rev   int64
	until time.Time
}

// observe records a keepalive reply of a lease with ttl left: the next one
// is due within ttl/3, so the revision counts as current for two of those.
func (h *storeHead) observe(hdr *etcdserverpb.ResponseHeader, ttl time.Duration) {
	if h == nil || hdr == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.rev = max(h.rev, hdr.Revision)
	h.until = time.Now().Add(2 * ttl / 3)
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
