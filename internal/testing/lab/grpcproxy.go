package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
)

// etcdWatchMethod is the gRPC method of etcd's watch streams.
const etcdWatchMethod = "/etcdserverpb.Watch/Watch"

// GRPCProxy is a message-level (layer 7) proxy for etcd's gRPC API on a
// unix socket: every call its clients make is made again to the server and
// every message passed through, without decoding it. It can stall the watch
// streams open at a moment — they stay open and healthy at the connection
// level (HTTP/2 pings are answered, unary calls work) but deliver nothing
// more in either direction: the failure of a watch that neither the client
// library nor gRPC keepalive can see, only an application-level progress
// check. Watches opened after the stall are served again.
type GRPCProxy struct {
	path string
	ln   net.Listener
	srv  *grpc.Server
	up   *grpc.ClientConn

	mu       sync.Mutex
	streams  map[*proxiedStream]bool
	stalled  int  // watch streams stalled so far
	stallAll bool // stall every watch stream from its first message on
}

type proxiedStream struct {
	stall chan struct{}
	once  sync.Once
}

func (s *proxiedStream) stop() { s.once.Do(func() { close(s.stall) }) }

// rawCodec passes messages through as bytes.
type rawCodec struct{}

type rawFrame struct{ b []byte }

func (rawCodec) Marshal(v any) ([]byte, error) {
	f, ok := v.(*rawFrame)
	if !ok {
		return nil, fmt.Errorf("grpc proxy: cannot marshal %T", v)
	}
	return f.b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	f, ok := v.(*rawFrame)
	if !ok {
		return fmt.Errorf("grpc proxy: cannot unmarshal into %T", v)
	}
	f.b = append(f.b[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// NewGRPCProxy serves on the unix socket path and forwards to the etcd
// endpoint target (unix:///path or http://host:port).
func NewGRPCProxy(path, target string) (*GRPCProxy, error) {
	network, addr, err := splitEndpoint(target)
	if err != nil {
		return nil, err
	}
	if network == "unix" {
		addr = "unix://" + addr
	}
	up, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})))
	if err != nil {
		return nil, fmt.Errorf("grpc proxy for %s: %w", target, err)
	}
	_ = os.Remove(path)
	ln, err := net.Listen("unix", path)
	if err != nil {
		_ = up.Close()
		return nil, fmt.Errorf("grpc proxy for %s: %w", target, err)
	}
	p := &GRPCProxy{path: path, ln: ln, up: up, streams: map[*proxiedStream]bool{}}
	p.srv = grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(p.handle))
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

// Endpoint is the proxy's etcd client URL.
func (p *GRPCProxy) Endpoint() string { return "unix://" + p.path }

// StallWatches stalls every watch stream open now and returns how many.
func (p *GRPCProxy) StallWatches() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for s := range p.streams {
		s.stop()
		delete(p.streams, s)
		n++
	}
	p.stalled += n
	return n
}

// StallNewWatches makes every watch stream opened from now on stall at once,
// before etcd can even confirm its watches (on) or be served again (off).
func (p *GRPCProxy) StallNewWatches(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stallAll = on
}

// Watches is the number of watch streams open and not stalled.
func (p *GRPCProxy) Watches() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.streams)
}

// Close stops the proxy, ending every call; safe to call twice.
func (p *GRPCProxy) Close() {
	p.srv.Stop()
	_ = p.up.Close()
}

// handle proxies one call of any method, unary or streaming. It is long
// (over 80 lines) on purpose: the two copying goroutines, the injected
// stall and the wait for either end share the call's context and error
// channels, which pieces would have to pass around; read it top to bottom
// as one call's life.
func (p *GRPCProxy) handle(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return errors.New("grpc proxy: no method")
	}
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	md, _ := metadata.FromIncomingContext(ss.Context())
	out := metadata.MD{}
	for k, v := range md {
		if strings.HasPrefix(k, ":") || k == "content-type" || k == "user-agent" || strings.HasPrefix(k, "grpc-") {
			continue
		}
		out[k] = v
	}
	ctx = metadata.NewOutgoingContext(ctx, out)
	cs, err := p.up.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method)
	if err != nil {
		return err
	}
	var stall chan struct{}
	if method == etcdWatchMethod {
		s := &proxiedStream{stall: make(chan struct{})}
		stall = s.stall
		p.mu.Lock()
		p.streams[s] = true
		if p.stallAll {
			s.stop()
			delete(p.streams, s)
			p.stalled++
		}
		p.mu.Unlock()
		defer func() {
			p.mu.Lock()
			delete(p.streams, s)
			p.mu.Unlock()
		}()
	}
	stalled := func() bool {
		if stall == nil {
			return false
		}
		select {
		case <-stall:
			return true
		default:
			return false
		}
	}
	// Client to server.
	upErr := make(chan error, 1)
	go func() {
		for {
			f := &rawFrame{}
			if err := ss.RecvMsg(f); err != nil {
				if errors.Is(err, io.EOF) {
					_ = cs.CloseSend()
					upErr <- nil
					return
				}
				upErr <- err
				return
			}
			if stalled() {
				continue // dropped
			}
			if err := cs.SendMsg(f); err != nil {
				upErr <- nil // the server's side ends the call; its status comes below
				return
			}
		}
	}()
	// Server to client.
	downErr := make(chan error, 1)
	go func() {
		first := true
		for {
			f := &rawFrame{}
			if err := cs.RecvMsg(f); err != nil {
				if first {
					if h, herr := cs.Header(); herr == nil {
						_ = ss.SendHeader(h)
					}
				}
				ss.SetTrailer(cs.Trailer())
				if errors.Is(err, io.EOF) {
					downErr <- nil
				} else {
					downErr <- err
				}
				return
			}
			if first {
				first = false
				if h, herr := cs.Header(); herr == nil {
					if err := ss.SendHeader(h); err != nil {
						downErr <- err
						return
					}
				}
			}
			if stalled() {
				continue // dropped
			}
			if err := ss.SendMsg(f); err != nil {
				downErr <- err
				return
			}
		}
	}()
	for {
		select {
		case err := <-upErr:
			if err != nil {
				cancel()
				return err
			}
			upErr = nil
		case err := <-downErr:
			return err
		case <-stallOrNil(stall):
			// Hold the call open and silent until the client gives up.
			cancel()
			<-ss.Context().Done()
			return ss.Context().Err()
		}
	}
}

func stallOrNil(c chan struct{}) <-chan struct{} {
	if c == nil {
		return nil
	}
	return c
}
