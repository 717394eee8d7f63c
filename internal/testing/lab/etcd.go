package lab

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// Etcd is the lab's etcd: a real server embedded in the lab's process,
// serving clients on a unix socket in the work directory. A unix socket is
// reachable from a process in any network namespace, so the simulated hosts
// reach etcd without any namespace being connected to the root namespace,
// and etcd sends no traffic over any network.
//
// Stop and Start keep the data directory: a restarted server holds the same
// keys, leases and revisions, as after a real etcd outage.
type Etcd struct {
	dir      string // data directory
	sock     string // client socket path
	logFile  string
	mu       sync.Mutex
	srv      *embed.Etcd
	endpoint string
}

func newEtcd(workDir string) *Etcd {
	return &Etcd{
		dir:      filepath.Join(workDir, "etcd"),
		sock:     filepath.Join(workDir, "etcd.sock"),
		logFile:  filepath.Join(workDir, "etcd.log"),
		endpoint: "unix://" + filepath.Join(workDir, "etcd.sock"),
	}
}

// Endpoint is the client URL, e.g. unix:///tmp/ovl-lab-1234-x/etcd.sock.
func (e *Etcd) Endpoint() string { return e.endpoint }

// LogFile is where the server logs (warnings and errors only).
func (e *Etcd) LogFile() string { return e.logFile }

// Running reports whether the server is started.
func (e *Etcd) Running() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.srv != nil
}

// Start starts the server (again, with its data) and returns once it serves.
// Starting a running server does nothing.
func (e *Etcd) Start(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv != nil {
		return nil
	}
	cfg := embed.NewConfig()
	cfg.Name = "lab"
	cfg.Dir = e.dir
	cfg.Logger = "zap"
	cfg.LogLevel = "warn"
	cfg.LogOutputs = []string{e.logFile}
	cfg.UnsafeNoFsync = true // lab data is thrown away
	client := url.URL{Scheme: "unix", Path: e.sock}
	cfg.ListenClientUrls = []url.URL{client}
	cfg.AdvertiseClientUrls = []url.URL{client}
	// A single member never talks to peers; the peer listener only has to
	// exist, on a loopback port the kernel picks.
	peer := url.URL{Scheme: "http", Host: "127.0.0.1:0"}
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.WatchProgressNotifyInterval = time.Second
	srv, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd in %s: %w (its log: %s)", e.dir, err, e.logFile)
	}
	select {
	case <-srv.Server.ReadyNotify():
	case err := <-srv.Err():
		srv.Close()
		return fmt.Errorf("etcd in %s failed: %w (its log: %s)", e.dir, err, e.logFile)
	case <-ctx.Done():
		srv.Close()
		return fmt.Errorf("etcd in %s not ready: %w (its log: %s)", e.dir, ctx.Err(), e.logFile)
	}
	e.srv = srv
	return nil
}

// Stop stops the server, keeping its data for Start. Clients see the
// socket vanish. Stopping a stopped server does nothing.
func (e *Etcd) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.srv == nil {
		return
	}
	e.srv.Close()
	e.srv = nil
	// etcd removes its socket on close; make sure no stale one is left
	// that clients would keep dialling.
	_ = os.Remove(e.sock)
}

// Client returns a new client of the lab's etcd; the caller closes it.
func (e *Etcd) Client() (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", e.endpoint, err)
	}
	return cli, nil
}

// putConfig stores the network config under the default prefix.
func (e *Etcd) putConfig(ctx context.Context, config string) error {
	cli, err := e.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	reg := etcdv3.NewRegistry(cli, etcdv3.DefaultPrefix)
	if _, err := reg.PutConfig(ctx, []byte(config)); err != nil {
		return fmt.Errorf("put the network config: %w", err)
	}
	return nil
}
