package etcdtest

import (
	"context"
	"sync"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
)

// StreamCounter counts, on a client's streams, the watch progress requests
// sent and the lease keepalive replies received, noting the progress count
// at each keepalive reply. Give the client Interceptor with
// grpc.WithStreamInterceptor.
type StreamCounter struct {
	mu          sync.Mutex
	progress    int
	atKeepAlive []int // progress at the i-th keepalive reply
}

// Interceptor is a grpc.StreamClientInterceptor that counts.
func (c *StreamCounter) Interceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	return countingStream{s, c}, err
}

type countingStream struct {
	grpc.ClientStream
	c *StreamCounter
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

// QuietFor reports whether no progress request went out over the last n
// keepalive replies, and how many went out in all.
func (c *StreamCounter) QuietFor(n int) (bool, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := len(c.atKeepAlive)
	return k > n && c.atKeepAlive[k-1] == c.atKeepAlive[k-1-n] && c.progress == c.atKeepAlive[k-1], c.progress
}

// KeepAlives is the number of keepalive replies received so far.
func (c *StreamCounter) KeepAlives() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.atKeepAlive)
}
