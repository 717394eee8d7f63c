package etcdv3

import (
	"context"
	"sync"
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

// streamCounter counts, on a client's streams, the progress requests sent
// and the keepalive replies received, noting the progress count at each
// keepalive reply.
type streamCounter struct {
	mu          sync.Mutex
	progress    int
	atKeepAlive []int // progress at the i-th keepalive reply
}

func (c *streamCounter) interceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	return countingStream{s, c}, err
}

type countingStream struct {
	grpc.ClientStream
	c *streamCounter
}

func (s countingStream) SendMsg(m any) error {
	if r, ok := m.(*etcdserverpb.WatchRequest); ok && r.GetProgressRequest() != nil {
		s.c.mu.Lock()
		s.c.progress++
		s.c.mu.Unlock()
	}
	return s.ClientStream.SendMsg(m)
}

func (s countingStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if _, ok := m.(*etcdserverpb.LeaseKeepAliveResponse); ok && err == nil {
		s.c.mu.Lock()
		s.c.atKeepAlive = append(s.c.atKeepAlive, s.c.progress)
		s.c.mu.Unlock()
	}
	return err
}

// quietFor reports whether no progress request went out over the last n
// keepalive replies, and how many went out in all.
func (c *streamCounter) quietFor(n int) (bool, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := len(c.atKeepAlive)
	return k > n && c.atKeepAlive[k-1] == c.atKeepAlive[k-1-n] && c.progress == c.atKeepAlive[k-1], c.progress
}

// While nothing in etcd changes, a host's quiet watches cost etcd nothing
// but the keepalives: the stall checks see from the keepalive replies that
// the store has not moved past what the watches delivered. Once it moves
// (a write anywhere), they ask for progress again — which is what still
// catches a watch that stalled while missing that write.
func TestQuietWatchesAskNoProgressWhileTheStoreStandsStill(t *testing.T) {
	// etcd's own progress notifications (every 10 min by default; every
	// second on the test servers) would confirm the revision in the
	// checks' place: off, as on a production etcd between two of them.
	srv := etcdtest.Start(t, func(c *embed.Config) { c.WatchProgressNotifyInterval = time.Hour })
	writer := srv.Client(t)
	cfg, err := NewRegistry(writer, DefaultPrefix).PutConfig(ctx(t), []byte(testNetwork))
	if err != nil {
		t.Fatal(err)
	}
	var counter streamCounter
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithStreamInterceptor(counter.interceptor)}})
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
	batches := reg.Watch(ctx(t), snap, WatchOptions{ProgressInterval: interval, StallTimeout: time.Second})
	go func() {
		for range batches {
		}
	}()

	// Four keepalive replies (about 4 s, 13 checks of each watch) without a
	// single progress request.
	settled := func(what string) int {
		t.Helper()
		var total int
		took := testenv.WaitFor(t, 20*time.Second+testenv.Slack, what, func() bool {
			var quiet bool
			quiet, total = counter.quietFor(4)
			return quiet
		})
		t.Logf("%s after %s; %d progress requests so far", what, took.Round(time.Millisecond), total)
		return total
	}
	before := settled("four keepalives without a progress request")

	// A write outside the lease prefix moves the store past both watches.
	if _, err := writer.Put(ctx(t), DefaultPrefix+"/elsewhere", "x"); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second+testenv.Slack, "progress requests on both watches after a write", func() bool {
		_, n := counter.quietFor(0)
		return n >= before+2
	})
	settled("quiet again after the write")
}
