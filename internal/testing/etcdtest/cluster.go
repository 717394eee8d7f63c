package etcdtest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Cluster is a multi-member etcd cluster run in-process. Clients reach the
// members on unix sockets (reachable from any network namespace); a stopped
// member restarts at the same addresses with its data, as a real one would
// after a crash or reboot.
type Cluster struct {
	t         testing.TB
	dir       string
	names     []string
	initial   string
	mu        sync.Mutex
	members   []*embed.Etcd // nil while stopped
	peerPorts []int
}

// StartCluster starts an n-member cluster for the life of t.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	// Unix socket paths are limited to 108 bytes: keep the directory short.
	dir, err := os.MkdirTemp("/tmp", "etcd")
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, dir: dir, members: make([]*embed.Etcd, n)}
	if c.peerPorts, err = FreePorts(n); err != nil {
		t.Fatal(err)
	}
	var peers []string
	for i := range n {
		c.names = append(c.names, fmt.Sprintf("m%d", i))
		pu := c.peerURL(i)
		peers = append(peers, c.names[i]+"="+pu.String())
	}
	c.initial = strings.Join(peers, ",")
	t.Cleanup(func() {
		c.Close()
		_ = os.RemoveAll(dir)
	})
	// Members must start together: each waits for a quorum to be ready.
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() { errs[i] = c.start(i, "new") })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("start etcd member %d: %v", i, err)
		}
	}
	return c
}

func (c *Cluster) clientURL(i int) url.URL {
	return url.URL{Scheme: "unix", Path: filepath.Join(c.dir, c.names[i]+".sock")}
}

// peerURL is a loopback TCP address (etcd's peer transport does not dial
// unix sockets), picked once so a restarted member keeps it.
func (c *Cluster) peerURL(i int) url.URL {
	return url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(c.peerPorts[i])}
}

// FreePorts asks the kernel for n free loopback ports: all are held open
// until picked, so they differ, then released for whoever uses them.
func FreePorts(n int) ([]int, error) {
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			_ = ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Endpoints returns every member's client URL.
func (c *Cluster) Endpoints() []string {
	eps := make([]string, len(c.names))
	for i := range c.names {
		u := c.clientURL(i)
		eps[i] = u.String()
	}
	return eps
}

func (c *Cluster) start(i int, state string) error {
	cfg := embed.NewConfig()
	cfg.Name = c.names[i]
	cfg.Dir = filepath.Join(c.dir, c.names[i])
	cfg.Logger, cfg.LogLevel, cfg.LogOutputs = "zap", "fatal", []string{"stderr"}
	cfg.UnsafeNoFsync = true
	cu, pu := c.clientURL(i), c.peerURL(i)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{cu}, []url.URL{cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{pu}, []url.URL{pu}
	cfg.InitialCluster, cfg.ClusterState = c.initial, state
	cfg.WatchProgressNotifyInterval = time.Second
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return fmt.Errorf("member %s not ready after 30s", c.names[i])
	}
	c.mu.Lock()
	c.members[i] = e
	c.mu.Unlock()
	return nil
}

// Stop stops member i (its data stays).
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	e := c.members[i]
	c.members[i] = nil
	c.mu.Unlock()
	if e != nil {
		e.Close()
	}
}

// Restart starts a stopped member again with its data. Without a quorum of
// other members running it only becomes ready once enough members are up,
// so restarting into a quorum loss is done with RestartAsync.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	if err := c.start(i, "existing"); err != nil {
		c.t.Fatalf("restart etcd member %d: %v", i, err)
	}
}

// RestartAsync restarts member i in the background; the returned channel
// reports when it is ready (or failed).
func (c *Cluster) RestartAsync(i int) <-chan error {
	done := make(chan error, 1)
	go func() { done <- c.start(i, "existing") }()
	return done
}

// Close stops every member; safe to call twice.
func (c *Cluster) Close() {
	for i := range c.names {
		c.Stop(i)
	}
}

// Client returns a client of all members, closed with the test.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// WaitHealthy waits until a write through all endpoints succeeds.
func (c *Cluster) WaitHealthy(t testing.TB, cli *clientv3.Client) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := cli.Put(ctx, "etcdtest-health", "ok")
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd cluster not healthy after 30s: %v", err)
		}
	}
}
