package etcdv3

import (
	"context"
	"net"
	"net/netip"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/overlaynet/overlay/subnet"
)

// A progress answer that arrives as the stall timer fires is waiting in the
// watch channel when the select happens to pick the timer: not a stall.
func TestStallCheckHeedsAnAnswerWaitingBesideTheTimer(t *testing.T) {
	wch := make(chan clientv3.WatchResponse, 1)
	s := newStallCheck(nil, t.Context(), wch, nil, func() int64 { return 0 }, time.Hour, time.Hour)
	defer s.stop()
	s.asked = time.Now().Add(-2 * time.Hour) // a progress request went unanswered past the timeout...
	wch <- clientv3.WatchResponse{}          // ...but its answer is here
	if reason := s.check(); reason != "" {
		t.Fatalf("check() = %q with an answer waiting, want no stall", reason)
	}
	<-wch
	s.heard()
	s.asked = time.Now().Add(-2 * time.Hour)
	if reason := s.check(); reason == "" {
		t.Fatal("check() found no stall with nothing waiting and the request overdue")
	}
}

// A periodic re-list moves the watcher to the listing's revision while
// responses from before it may still wait in the watch channel: their
// events must not be applied again, or a batch goes backwards (stale
// values programmed for a moment, and a lease journal that can never be
// read back). The re-list is fired while the watcher is held in a send
// with two more changes queued behind it; which of the two it then takes
// first is the select's random choice, so each of the cycles has about an
// even chance of the order that went wrong.
func TestPeriodicRelistNeverSendsABatchBackwards(t *testing.T) {
	f := newFixture(t, testNetwork)
	key := f.reg.LeaseKey(subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.7.0/24")})
	put := func(i int) int64 {
		mac := net.HardwareAddr{0x0e, 0, 0, 0, byte(i >> 8), byte(i)}
		val, _ := vxlanAttrs(netip.MustParseAddr("198.18.0.7"), 1, mac, "node-7", "h7").Marshal()
		resp, err := f.cli.Put(ctx(t), key, string(val))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	put(0)
	snap, err := f.reg.List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	opts := WatchOptions{}
	opts.defaults()
	w := &watcher{reg: f.reg, opts: opts, log: opts.Logger, rev: snap.Revision, known: map[subnet.ID]subnet.Known{}}
	for _, l := range snap.Leases {
		w.known[l.ID()] = subnet.KnownOf(l)
	}
	wctx, cancel := context.WithCancel(ctx(t))
	out := make(chan Batch)
	resync := time.NewTimer(time.Hour)
	done := make(chan struct{})
	go func() { defer close(done); w.follow(wctx, out, resync, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	// A second watch tells when etcd has sent the changes out.
	seen := f.cli.Watch(wctx, key, clientv3.WithRev(snap.Revision+1))

	last := snap.Revision
	readUntil := func(rev int64) {
		t.Helper()
		for last < rev {
			select {
			case b := <-out:
				if b.Revision < last {
					t.Fatalf("batch at revision %d after one at %d: %+v", b.Revision, last, b)
				}
				last = b.Revision
			case <-wctx.Done():
				t.Fatalf("no batch up to revision %d (last %d)", rev, last)
			}
		}
	}
	sawUpTo := func(rev int64) {
		t.Helper()
		for {
			select {
			case wr := <-seen:
				if n := len(wr.Events); n > 0 && wr.Events[n-1].Kv.ModRevision >= rev {
					return
				}
			case <-wctx.Done():
				t.Fatalf("the second watch did not see revision %d", rev)
			}
		}
	}
	for cycle := range 16 {
		i := 3 * (cycle + 1)
		put(i) // the watcher takes it and waits to send its batch
		put(i + 1)
		end := put(i + 2)
		sawUpTo(end)
		resync.Reset(0)
		readUntil(end)
	}
	readUntil(put(1000)) // anything stale from the last cycle comes before
}

// A write's revision below one seen before, or a reply from another
// cluster, means etcd's store was re-created: every watch is told. A read
// may lag; only writes and the cluster ID are taken as evidence.
func TestStoreHeadNoticesARecreatedStore(t *testing.T) {
	h := &storeHead{}
	hdr := func(cluster uint64, rev int64) *etcdserverpb.ResponseHeader {
		return &etcdserverpb.ResponseHeader{ClusterId: cluster, Revision: rev}
	}
	h.observe(hdr(1, 300), time.Minute)
	epoch, rebased := h.rebaseSignal()
	if h.wrote(hdr(1, 301)) || h.wrote(hdr(1, 301)) {
		t.Fatal("a write at the store's head taken for a re-created store")
	}
	h.observe(hdr(1, 250), time.Minute) // a keepalive answered by a lagging member
	if e, _ := h.rebaseSignal(); e != epoch {
		t.Fatal("a lagging reply taken for a re-created store")
	}
	if !h.wrote(hdr(1, 5)) {
		t.Fatal("a write at revision 5 after 301, same cluster ID (wiped and bootstrapped alike): not noticed")
	}
	select {
	case <-rebased:
	default:
		t.Fatal("the re-creation was not signalled")
	}
	if e, _ := h.rebaseSignal(); e != epoch+1 || !h.notPast(5) {
		t.Fatalf("after the re-creation: epoch %d, notPast(5) %v; want %d and the new store's revision", e, h.notPast(5), epoch+1)
	}
	h.observe(hdr(2, 9), time.Minute) // restored from a backup: a new cluster ID
	if e, _ := h.rebaseSignal(); e != epoch+2 {
		t.Fatalf("a reply from another cluster: epoch %d, want %d", e, epoch+2)
	}
}
