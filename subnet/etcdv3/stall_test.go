package etcdv3

import (
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/overlaynet/overlay/internal/testing/etcdtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// While nothing in etcd changes, a host's quiet watches cost etcd nothing
// but the keepalives: the stall checks see from the keepalive replies that
// the store has not moved past what the watches delivered. Once it moves
// (a write anywhere), they ask for progress again — which is what still
// catches a watch that stalled while missing that write.
func TestQuietWatchesAskNoProgressWhileTheStoreStandsStill(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	// etcd's own progress notifications (every 10 min by default; every
	// second on the test servers) would confirm the revision in the
	// checks' place: off, as on a production etcd between two of them.
	srv := etcdtest.Start(t, func(c *embed.Config) { c.WatchProgressNotifyInterval = time.Hour })
	writer := srv.Client(t)
	cfg, err := NewRegistry(writer, DefaultPrefix).PutConfig(ctx(t), []byte(testNetwork))
	if err != nil {
		t.Fatal(err)
	}
	var counter etcdtest.StreamCounter
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithStreamInterceptor(counter.Interceptor)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	reg := NewRegistry(cli, DefaultPrefix)
	// Keepalive replies every second; stall checks every 300 ms: three
	// checks of each of the two watches between two keepalives.
	const interval = 300 * time.Millisecond
	m := NewManager(reg, cfg, host(1), ManagerOptions{LivenessTTL: 3 * time.Second, ProgressInterval: interval, StallTimeout: time.Second, RetryInterval: 100 * time.Millisecond})
	_, snap, err := m.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, m)
	batches := reg.Watch(ctx(t), snap, WatchOptions{ProgressInterval: interval, StallTimeout: time.Second, Progress: true})
	var watched atomic.Int64 // the revision the lease watch has confirmed
	go func() {
		for b := range batches {
			watched.Store(max(watched.Load(), b.Revision))
		}
	}()

	// Four keepalive replies (about 4 s, 13 checks of each watch) without a
	// single progress request.
	settled := func(what string) {
		t.Helper()
		var total int
		took := testenv.WaitFor(t, 20*time.Second+testenv.Slack, what, func() bool {
			var quiet bool
			quiet, total = counter.QuietFor(4)
			return quiet
		})
		t.Logf("%s after %s; %d progress requests so far", what, took.Round(time.Millisecond), total)
	}
	settled("four keepalives without a progress request")

	// A write outside the lease prefix moves the store past both watches:
	// the checks ask again, and both watches confirm the new revision.
	// (Usually one request each; a watch whose check stalls on a loaded
	// machine confirms it by re-reading instead.)
	put, err := writer.Put(ctx(t), DefaultPrefix+"/elsewhere", "x")
	if err != nil {
		t.Fatal(err)
	}
	w := put.Header.Revision
	testenv.WaitFor(t, 10*time.Second+testenv.Slack, "both watches confirmed past the write", func() bool {
		return m.held.seenRev() >= w && watched.Load() >= w
	})
	settled("quiet again after the write")
}

// The stall timeout follows how long etcd takes to answer: never below the
// configured one, four smoothed answer times when etcd is slow, doubled
// after each stall while etcd answered keepalives, and never beyond
// maxStallFactor times the configured one, so that a watch that really
// stalled is still given up; the next answer (a watch opened again counts)
// ends the doubling, so that an outage long past does not slow the
// noticing of a new stall.
func TestStallTimeoutFollowsHowSlowlyEtcdAnswers(t *testing.T) {
	const base = 5 * time.Second
	var h storeHead
	want := func(what string, d time.Duration) {
		t.Helper()
		if got := h.stallTimeout(base); got != d {
			t.Fatalf("%s: stall timeout %s, want %s", what, got, d)
		}
	}
	want("no answer yet", base)
	h.answered(time.Now().Add(-10*time.Millisecond), base)
	want("prompt answers", base)
	h.stalled()
	want("one stall", 2*base)
	h.stalled()
	h.stalled()
	want("three stalls", 8*base)
	h.stalled()
	want("four stalls", 8*base)
	h.answered(time.Now().Add(-7*time.Second), base)
	want("an answer slower than the undoubled wait", 8*base)
	h.answered(time.Now().Add(-10*time.Millisecond), base)
	want("a prompt answer", base)
	for range 50 {
		h.answered(time.Now().Add(-3*time.Second), base)
	}
	if got := h.stallTimeout(base); got < 11*time.Second || got > 12*time.Second {
		t.Fatalf("answers in 3 s: stall timeout %s, want about four of them", got)
	}
	for range 50 {
		h.answered(time.Now().Add(-time.Minute), base)
	}
	want("answers in a minute", 8*base)

	// An answer that waited through a time etcd was out of reach measures
	// the outage: it is left out.
	asked := time.Now().Add(-time.Second)
	cut := storeHead{until: time.Now().Add(-time.Millisecond)} // the last reply's currency has run out
	cut.observe(&etcdserverpb.ResponseHeader{Revision: 1}, time.Minute)
	cut.answered(asked, base)
	if cut.answer != 0 {
		t.Fatalf("an answer that straddled an outage was taken: smoothed answer time %s", cut.answer)
	}
	cut.answered(time.Now(), base)
	if cut.answer <= 0 || cut.answer > time.Second {
		t.Fatalf("an answer asked after the outage: smoothed answer time %s, want it taken", cut.answer)
	}

	var none *storeHead // a registry without keepalives to go by
	none.answered(time.Now().Add(-time.Minute), base)
	none.stalled()
	if got := none.stallTimeout(base); got != base {
		t.Fatalf("nil head: stall timeout %s, want %s", got, base)
	}
}
