// Package etcdtest starts a real etcd server inside the test process
// (go.etcd.io/etcd/server/v3/embed) on loopback ports the kernel picks, with
// its data in a temporary directory. Integration tests use it instead of any
// mock registry: transactions, leases, watches and compaction behave exactly
// as in production.
package etcdtest

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Server is a running embedded etcd.
type Server struct {
	Etcd *embed.Etcd
	// Endpoint is the client URL, e.g. http://127.0.0.1:40123.
	Endpoint string
	dir      string
}

// Option adjusts the embed config before the server starts.
type Option func(*embed.Config)

// Start runs an etcd server for the life of t and returns it once it serves.
func Start(t testing.TB, opts ...Option) *Server {
	t.Helper()
	s, err := start(t.TempDir(), opts...)
	if err != nil {
		t.Fatalf("start embedded etcd: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

func start(dir string, opts ...Option) (*Server, error) {
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Logger = "zap"
	cfg.LogLevel = "fatal" // shutdown logs "server closed" at error level; failures surface in the tests
	cfg.LogOutputs = []string{"stderr"}
	cfg.UnsafeNoFsync = true // test data is thrown away; fsync only slows the suite
	local := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenClientUrls = []url.URL{local}
	cfg.AdvertiseClientUrls = []url.URL{local}
	cfg.ListenPeerUrls = []url.URL{local}
	cfg.AdvertisePeerUrls = []url.URL{local}
	cfg.InitialCluster = cfg.Name + "=" + local.String()
	cfg.WatchProgressNotifyInterval = time.Second
	for _, o := range opts {
		o(cfg)
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("etcd in %s not ready after 30s", dir)
	}
	scheme := "http"
	if !cfg.ClientTLSInfo.Empty() {
		scheme = "https"
	}
	return &Server{Etcd: e, Endpoint: scheme + "://" + e.Clients[0].Addr().String(), dir: dir}, nil
}

// Close stops the server; safe to call twice.
func (s *Server) Close() {
	if s.Etcd != nil {
		s.Etcd.Close()
		s.Etcd = nil
	}
}

// Client returns a plain client of the server, closed with t.
func (s *Server) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{s.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("etcd client for %s: %v", s.Endpoint, err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Compact compacts the server's history up to its current revision, so a
// watcher resuming from an older revision gets ErrCompacted.
func (s *Server) Compact(t testing.TB, cli *clientv3.Client) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, "compaction-probe")
	if err != nil {
		t.Fatalf("get revision: %v", err)
	}
	rev := resp.Header.Revision
	if _, err := cli.Compact(ctx, rev, clientv3.WithCompactPhysical()); err != nil {
		t.Fatalf("compact to %d: %v", rev, err)
	}
	return rev
}
