package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

const prefix = etcdv3.DefaultPrefix

// rpcCounter counts what the simulated hosts send to etcd: unary calls and
// every message sent on a stream (keepalives, watch creates, progress
// requests), by gRPC method.
type rpcCounter struct {
	mu sync.Mutex
	n  map[string]*atomic.Int64
}

func (c *rpcCounter) inc(method string) {
	c.mu.Lock()
	v := c.n[method]
	if v == nil {
		v = new(atomic.Int64)
		c.n[method] = v
	}
	c.mu.Unlock()
	v.Add(1)
}

func (c *rpcCounter) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.n))
	for k, v := range c.n {
		out[k] = v.Load()
	}
	return out
}

type countingStream struct {
	grpc.ClientStream
	c      *rpcCounter
	method string
}

func (s countingStream) SendMsg(m any) error {
	s.c.inc(s.method)
	return s.ClientStream.SendMsg(m)
}

func (c *rpcCounter) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.inc(method)
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			cs, err := streamer(ctx, desc, cc, method, opts...)
			if err != nil {
				return nil, err
			}
			return countingStream{cs, c, method}, nil
		}),
	}
}

// recorder stands in for the kernel side (the VXLAN backend): it keeps the
// peer set each host would program and notes when a watched subnet shows up.
type recorder struct {
	mu                sync.Mutex
	peers             map[netip.Prefix]struct{} // what the backend would program
	seen              map[netip.Prefix]int64    // unix ns a probe subnet was first seen
	rev               int64
	relists, periodic int
	// reported is relists at the last stats reply.
	reported int
}

func (r *recorder) apply(b subnet.Batch) {
	now := time.Now().UnixNano()
	r.mu.Lock()
	defer r.mu.Unlock()
	// The periodic re-lists are counted apart: they are spread evenly
	// over time, not caused by a scenario.
	switch {
	case b.Periodic:
		r.periodic++
	case b.Resync:
		r.relists++
	}
	for _, ev := range b.Events {
		switch ev.Type {
		case subnet.Removed:
			delete(r.peers, ev.Lease.Subnet)
		default:
			if _, ok := r.seen[ev.Lease.Subnet]; !ok && ev.Type == subnet.Added {
				r.seen[ev.Lease.Subnet] = now
			}
			r.peers[ev.Lease.Subnet] = struct{}{}
		}
	}
	r.rev = max(r.rev, b.Revision)
}

// simHost is one host's control plane: overlayd's lease source
// (etcdv3.Source: its own etcd client, the node-ID claim, the lease,
// liveness key, keepalives and own-key watch, the lease journal; or
// kube.Source: its own API client, the informer on Nodes, the annotations
// and the NetworkUnavailable condition), its watch of all leases and the
// config watch, as internal/daemon wires them.
type simHost struct {
	idx int
	// source builds the host's lease source (etcdSource, kubeSource).
	source func(*simHost) subnet.Source
	eps    []string
	cnt    *rpcCounter
	rec    *recorder
	cancel context.CancelFunc
	done   chan struct{}
	lease  netip.Prefix
	log    *slog.Logger
	// journal is the host's lease journal (etcdv3.Journal), as overlayd
	// keeps one beside subnet.env: a restart resumes from it.
	journal string
}

// host is this simulated host as its lease names it in the network cfg.
func (h *simHost) host(cfg *subnet.Config) subnet.Host {
	ip := netip.AddrFrom4([4]byte{100, 64 + byte(h.idx>>16), byte(h.idx >> 8), byte(h.idx)})
	name := simName(h.idx)
	mac := net.HardwareAddr{0x02, 0x5c, 0, byte(h.idx >> 16), byte(h.idx >> 8), byte(h.idx)}
	return subnet.Host{NodeID: name, Hostname: name, PublicIP: ip, Previous: subnet.Subnets{IPv4: h.lease}}.
		Publishing(cfg, leasedata.Codec{VNI: 1}.Encode(mac), nil)
}

// etcdSource is the etcd lease source as overlayd builds it: its own
// client with overlayd's settings (gRPC keepalive, reconnect backoff) and
// the host's lease journal.
func etcdSource(h *simHost) subnet.Source {
	dial := func(ctx context.Context) (*clientv3.Client, error) {
		return etcdclient.Connect(ctx, etcdclient.Config{Endpoints: h.eps, DialTimeout: 30 * time.Second, DialOptions: h.cnt.dialOptions()})
	}
	return etcdv3.NewSource(etcdv3.SourceConfig{Endpoints: h.eps, Dial: dial, Prefix: prefix, JournalFile: h.journal, ConfigRetry: time.Second, Logger: h.log})
}

// simName is host i's node ID (etcd) or Node name (Kubernetes).
func simName(i int) string { return fmt.Sprintf("sim-%05d", i) }

// start connects and acquires the lease through the host's lease source
// (etcdv3.Source or kube.Source, as overlayd runs them), each step timed (lap) and retried as overlayd
// retries it; the host then runs in the background until stop.
func (h *simHost) start(ctx context.Context) error {
	t := time.Now()
	lap := func(i int) {
		stepTime[i].Add(int64(time.Since(t)))
		t = time.Now()
	}
	src := h.source(h)
	// Each step is retried as overlayd retries it at start-up.
	step := func(f func(ctx context.Context) error) error {
		b := daemon.StartupBackoff()
		for {
			rctx, cancel := context.WithTimeout(ctx, b.Timeout())
			err := f(rctx)
			cancel()
			if err == nil || ctx.Err() != nil || src.IsFatal(err) {
				return err
			}
			h.log.Warn("start-up step failed, retrying", "err", err)
			time.Sleep(b.Failed(err))
		}
	}
	// Close frees the node ID if Keep never took it over, and the client.
	if err := step(src.Connect); err != nil {
		src.Close()
		return err
	}
	lap(0)
	var cfg *subnet.Config
	if err := step(func(ctx context.Context) (err error) { cfg, err = src.Config(ctx); return err }); err != nil {
		src.Close()
		return err
	}
	lap(1)
	if err := step(func(ctx context.Context) error { return src.Claim(ctx, cfg, h.host(cfg), nil) }); err != nil {
		src.Close()
		return err
	}
	lap(2)
	var lease subnet.Lease
	var snap subnet.Snapshot
	if err := step(func(ctx context.Context) (err error) { lease, snap, err = src.Acquire(ctx); return err }); err != nil {
		src.Close()
		return err
	}
	lap(3)
	h.lease = lease.Subnet
	h.rec.mu.Lock()
	h.rec.peers = make(map[netip.Prefix]struct{}, len(snap.Leases))
	for _, l := range snap.Leases {
		h.rec.peers[l.Subnet] = struct{}{}
	}
	h.rec.rev = snap.Revision
	h.rec.mu.Unlock()

	hctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan struct{})
	// The source keeps the lease journal from the watch's goroutine.
	batches := src.Watch(hctx, snap, subnet.WatchOptions{Logger: h.log})
	configs := src.WatchConfig(hctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = src.Keep(hctx) })
	wg.Go(func() {
		for b := range batches {
			h.rec.apply(b)
		}
	})
	wg.Go(func() {
		for range configs {
		}
	})
	go func() {
		wg.Wait()
		src.Close()
		close(h.done)
	}()
	return nil
}

// stepTime sums, over all starts, the time spent connecting, reading the
// config, checking the node ID and acquiring the lease.
var stepTime [4]atomic.Int64

func (h *simHost) stop() {
	if h.cancel != nil {
		h.cancel()
		<-h.done
		h.cancel = nil
	}
}
