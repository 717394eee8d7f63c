package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
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

func (r *recorder) apply(b etcdv3.Batch) {
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

// simHost is one host's control plane: its own etcd client, the production
// Manager (lease, liveness key, keepalives, own-key watch), Registry.Watch
// of all leases and the config watch, as internal/daemon wires them.
type simHost struct {
	idx    int
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

func (h *simHost) host() etcdv3.Host {
	ip := netip.AddrFrom4([4]byte{100, 64 + byte(h.idx>>16), byte(h.idx >> 8), byte(h.idx)})
	return etcdv3.Host{
		NodeID:      fmt.Sprintf("sim-%05d", h.idx),
		Hostname:    fmt.Sprintf("sim-%05d", h.idx),
		PublicIP:    ip,
		BackendData: vxlan.Codec{VNI: 1}.Encode(net.HardwareAddr{0x02, 0x5c, 0, byte(h.idx >> 16), byte(h.idx >> 8), byte(h.idx)}),
		Previous:    subnet.Subnets{IPv4: h.lease},
	}
}

// start connects and acquires the lease; the host then runs in the
// background until stop. It is long (over 80 lines) because it replays
// overlayd's start-up steps in overlayd's order, each timed (lap) and
// retried as overlayd retries it; split, the timings would lose their
// shared clock.
func (h *simHost) start(ctx context.Context) error {
	t := time.Now()
	lap := func(i int) {
		stepTime[i].Add(int64(time.Since(t)))
		t = time.Now()
	}
	// overlayd's own client settings (gRPC keepalive, reconnect backoff).
	cli, err := etcdclient.New(etcdclient.Config{Endpoints: h.eps, DialTimeout: 30 * time.Second, DialOptions: h.cnt.dialOptions()})
	if err != nil {
		return err
	}
	lap(0)
	reg := etcdv3.NewRegistry(cli, prefix)
	// Each step is retried as overlayd retries it at start-up.
	step := func(f func(ctx context.Context) error) error {
		b := daemon.StartupBackoff()
		for {
			rctx, cancel := context.WithTimeout(ctx, b.Timeout())
			err := f(rctx)
			cancel()
			if err == nil || ctx.Err() != nil {
				return err
			}
			h.log.Warn("start-up step failed, retrying", "err", err)
			time.Sleep(b.Failed(err))
		}
	}
	var cfg *subnet.Config
	if err := step(func(ctx context.Context) (err error) { cfg, _, err = reg.GetConfig(ctx); return err }); err != nil {
		_ = cli.Close()
		return err
	}
	lap(1)
	mgr := etcdv3.NewManager(reg, cfg, h.host(), etcdv3.ManagerOptions{Logger: h.log})
	if err := step(mgr.ClaimNodeID); err != nil {
		_ = cli.Close()
		return err
	}
	lap(2)
	journal, saved, err := etcdv3.OpenJournal(h.journal, reg)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		h.log.Warn("ignoring the lease journal; listing every lease instead", "err", err)
	}
	var lease subnet.Lease
	var snap etcdv3.Snapshot
	if err := step(func(ctx context.Context) (err error) { lease, snap, err = mgr.AcquireFrom(ctx, saved); return err }); err != nil {
		mgr.ReleaseClaim(context.Background())
		_ = journal.Close()
		_ = cli.Close()
		return err
	}
	lap(3)
	if err := journal.Start(snap); err != nil {
		h.log.Warn("cannot keep the lease journal", "err", err)
		_ = journal.Close()
		journal = nil
	}
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
	batches := reg.Watch(hctx, snap, etcdv3.WatchOptions{Logger: h.log, Progress: journal != nil})
	configs := reg.WatchConfig(hctx, time.Second)
	var wg sync.WaitGroup
	wg.Go(func() { _ = mgr.Run(hctx) })
	wg.Go(func() {
		for b := range batches {
			if journal != nil {
				if err := journal.Apply(b); err != nil {
					h.log.Warn("stopped keeping the lease journal", "err", err)
					_ = journal.Close()
					journal = nil
				}
			}
			h.rec.apply(b)
		}
		if journal != nil {
			_ = journal.Close()
		}
	})
	wg.Go(func() {
		for range configs {
		}
	})
	go func() {
		wg.Wait()
		_ = cli.Close()
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
