package etcdv3_test

// Faults between the watcher or the lease manager and etcd that etcd itself
// cannot be made to show: a watch that goes silent without an error (a
// message-level proxy stalls it), and a connection cut while history is
// compacted. Each test fails if an event is lost or the lease is not kept.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/etcdclient"
	"github.com/overlaynet/overlay/internal/testing/etcdtest"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

const faultNetwork = `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":1}}`

func shortDir(t *testing.T) string {
	t.Helper()
	// Unix socket paths are limited to 108 bytes: t.TempDir may be longer.
	dir, err := os.MkdirTemp("/tmp", "ovl-fault-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// proxiedRegistry returns a registry whose client reaches etcd through the
// proxy at endpoint.
func proxiedRegistry(t *testing.T, endpoint string) *etcdv3.Registry {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return etcdv3.NewRegistry(cli, etcdv3.DefaultPrefix)
}

func startServer(t *testing.T, opts ...etcdtest.Option) (*etcdtest.Server, *clientv3.Client, *etcdv3.Registry, *subnet.Config) {
	t.Helper()
	srv := etcdtest.Start(t, opts...)
	direct := srv.Client(t)
	dreg := etcdv3.NewRegistry(direct, etcdv3.DefaultPrefix)
	cfg, err := dreg.PutConfig(tctx(t), []byte(faultNetwork))
	if err != nil {
		t.Fatal(err)
	}
	return srv, direct, dreg, cfg
}

// newProxy puts a lab.Proxy in front of the etcd at endpoint.
func newProxy(t *testing.T, endpoint string) *lab.Proxy {
	t.Helper()
	proxy, err := lab.NewProxy(filepath.Join(shortDir(t), "p.sock"), endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	return proxy
}

// countedRegistry returns a registry on overlayd's own client (gRPC
// keepalive included) to endpoint, and the counter of its streams.
func countedRegistry(t *testing.T, endpoint string) (*etcdv3.Registry, *etcdtest.StreamCounter) {
	t.Helper()
	var counter etcdtest.StreamCounter
	cli, err := etcdclient.New(etcdclient.Config{Endpoints: []string{endpoint},
		DialOptions: []grpc.DialOption{grpc.WithStreamInterceptor(counter.Interceptor)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return etcdv3.NewRegistry(cli, etcdv3.DefaultPrefix), &counter
}

// noProgressNotify turns off etcd's own progress notifications (every
// second on the test servers), so that only the stall checks' requests
// are answered, as on a production etcd between two of its notifications.
func noProgressNotify(c *embed.Config) { c.WatchProgressNotifyInterval = time.Hour }

func tctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), testenv.Deadline(60*time.Second))
	t.Cleanup(cancel)
	return c
}

func peerAttrs(i int) subnet.LeaseAttrs {
	mac := net.HardwareAddr{0x0e, 0xfa, 0, 0, byte(i >> 8), byte(i)}
	return vxlanAttrs(netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)}), 1, mac, fmt.Sprintf("peer-%d", i), "")
}

func peerSubnet(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24)
}

// me is the host the tests' lease managers run as. Its subnet is pinned to
// one no peer of the tests uses: picked at random, it collided now and then
// with a peer a test adds later ("subnet already leased").
func me() etcdv3.Host {
	return etcdv3.Host{NodeID: "me", PublicIP: netip.MustParseAddr("198.18.0.1"), BackendData: vxlanData(net.HardwareAddr{0x0e, 1, 1, 1, 1, 1}),
		Previous: subnet.Subnets{IPv4: peerSubnet(50)}}
}

// runManager runs m until the test ends and returns the context it runs
// in.
func runManager(t *testing.T, m *etcdv3.Manager) context.Context {
	t.Helper()
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	return runCtx
}

// collector gathers a watch's batches into the lease set it describes.
type collector struct {
	mu      sync.Mutex
	known   map[netip.Prefix]string // subnet -> VTEP MAC
	resyncs int
}

func collect(ch <-chan etcdv3.Batch) *collector {
	c := &collector{known: map[netip.Prefix]string{}}
	go func() {
		for b := range ch {
			c.mu.Lock()
			if b.Resync {
				c.resyncs++
			}
			for _, ev := range b.Events {
				if ev.Type == subnet.Removed {
					delete(c.known, ev.Lease.Subnet)
					continue
				}
				d, _ := leaseData(ev.Lease.Attrs.BackendData)
				c.known[ev.Lease.Subnet] = d.VtepMAC
			}
			c.mu.Unlock()
		}
	}()
	return c
}

func (c *collector) has(p netip.Prefix, mac string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	got, ok := c.known[p]
	return ok && (mac == "" || got == mac)
}

func (c *collector) missing(p netip.Prefix) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.known[p]
	return !ok
}

// seedPeers writes peers 1–3 directly and lists them through reg.
func seedPeers(t *testing.T, dreg, reg *etcdv3.Registry) etcdv3.Snapshot {
	t.Helper()
	for i := 1; i <= 3; i++ {
		if _, err := dreg.Create(tctx(t), subnet.Subnets{IPv4: peerSubnet(i)}, peerAttrs(i), 0); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := reg.List(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return snap
}

// changeMeanwhile adds peer 5, deletes peer 1 and gives peer 2 a new VTEP
// MAC, which it returns.
func changeMeanwhile(t *testing.T, dreg *etcdv3.Registry) string {
	t.Helper()
	if _, err := dreg.Create(tctx(t), subnet.Subnets{IPv4: peerSubnet(5)}, peerAttrs(5), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := dreg.Delete(tctx(t), subnet.Subnets{IPv4: peerSubnet(1)}); err != nil {
		t.Fatal(err)
	}
	old, err := dreg.Get(tctx(t), subnet.Subnets{IPv4: peerSubnet(2)})
	if err != nil {
		t.Fatal(err)
	}
	changed := peerAttrs(200)
	if _, err := dreg.Update(tctx(t), old, changed, 0); err != nil {
		t.Fatal(err)
	}
	d, _ := leaseData(changed.BackendData)
	return d.VtepMAC
}

// changedMeanwhile reports whether the collector saw changeMeanwhile.
func (c *collector) changedMeanwhile(mac string) bool {
	return c.has(peerSubnet(5), "") && c.missing(peerSubnet(1)) && c.has(peerSubnet(2), mac)
}

// A watch stream that stays open but delivers nothing (stalled in a proxy,
// the connection healthy) is noticed by the progress check within
// ProgressInterval+StallTimeout; the lease set is re-listed, so the add,
// change and delete made meanwhile all arrive, and the watch goes on live
// on a new stream. Without the check nothing would arrive until the
// periodic re-list (30 min).
func TestWatchStallIsDetectedAndNothingIsLost(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	srv, _, dreg, _ := startServer(t)
	proxy, err := lab.NewGRPCProxy(filepath.Join(shortDir(t), "p.sock"), srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	reg := proxiedRegistry(t, proxy.Endpoint())
	snap := seedPeers(t, dreg, reg)
	const progress, stallTimeout = 500 * time.Millisecond, time.Second
	var reasons []string
	var mu sync.Mutex
	wctx, cancel := context.WithCancel(tctx(t))
	defer cancel()
	c := collect(reg.Watch(wctx, snap, etcdv3.WatchOptions{ProgressInterval: progress, StallTimeout: stallTimeout,
		OnRestart: func(r string) { mu.Lock(); reasons = append(reasons, r); mu.Unlock() }}))
	for i := 1; i <= 3; i++ {
		c.known[peerSubnet(i)] = "" // from the snapshot
	}

	if _, err := dreg.Create(tctx(t), subnet.Subnets{IPv4: peerSubnet(4)}, peerAttrs(4), 0); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, testenv.Slack, "a live add", func() bool { return c.has(peerSubnet(4), "") })
	testenv.WaitFor(t, testenv.Slack, "the watch stream to reach the proxy", func() bool { return proxy.Watches() > 0 })

	t.Logf("stalled %d watch stream(s)", proxy.StallWatches())
	// Meanwhile: an add, a delete and a change (a new VTEP MAC).
	mac := changeMeanwhile(t, dreg)
	bound := 2*(progress+stallTimeout) + testenv.Slack
	took := testenv.WaitFor(t, bound, "the add, delete and change made during the stall", func() bool { return c.changedMeanwhile(mac) })
	t.Logf("stall detected and every change applied %s after the stall (bound %s)", took.Round(time.Millisecond), bound)
	mu.Lock()
	got := strings.Join(reasons, "; ")
	mu.Unlock()
	if !strings.Contains(got, "stalled") {
		t.Errorf("restart reasons %q, want a stall", got)
	}

	// The watch is live again, on a new stream.
	if _, err := dreg.Create(tctx(t), subnet.Subnets{IPv4: peerSubnet(6)}, peerAttrs(6), 0); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, testenv.Slack, "a live add after the stall", func() bool { return c.has(peerSubnet(6), "") })
}

// The manager's watch of its own lease key can stall too — while open, or
// before etcd has even confirmed it (the etcd client waits for that before
// it returns the watch's channel, so the stall check must cover the wait).
// A forced revoke made meanwhile must still be noticed and the same subnet
// re-claimed, or peers would drop this host's routes for good.
func TestManagerNoticesRevokeThroughStalledWatch(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	for _, atCreation := range []bool{false, true} {
		t.Run(map[bool]string{false: "stalled while open", true: "stalled at creation"}[atCreation], func(t *testing.T) {
			srv, _, dreg, cfg := startServer(t)
			proxy, err := lab.NewGRPCProxy(filepath.Join(shortDir(t), "p.sock"), srv.Endpoint)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(proxy.Close)
			reg := proxiedRegistry(t, proxy.Endpoint())
			h := me()
			const progress, stallTimeout = 500 * time.Millisecond, time.Second
			m := etcdv3.NewManager(reg, cfg, h, etcdv3.ManagerOptions{ProgressInterval: progress, StallTimeout: stallTimeout, RetryInterval: 100 * time.Millisecond})
			l, _, err := m.Acquire(tctx(t))
			if err != nil {
				t.Fatal(err)
			}
			proxy.StallNewWatches(atCreation) // before Run opens its watch
			runManager(t, m)
			if !atCreation {
				testenv.WaitFor(t, testenv.Slack, "the lease watch to reach the proxy", func() bool { return proxy.Watches() > 0 })
				proxy.StallWatches()
			}
			if _, err := dreg.Delete(tctx(t), l.Subnets()); err != nil {
				t.Fatal(err)
			}
			// Each stall is noticed within progress+stallTimeout and
			// followed by a re-claim, which reads the key.
			took := testenv.WaitFor(t, progress+stallTimeout+testenv.Slack, "the same subnet to be re-claimed", func() bool {
				cur, err := dreg.Get(tctx(t), l.Subnets())
				return err == nil && cur.Attrs.OwnedBy(h.NodeID, h.PublicIP)
			})
			t.Logf("deletion during a stalled watch noticed and %s re-claimed after %s", l.Subnet, took.Round(time.Millisecond))
		})
	}
}

// The lease watcher's watch can stall before etcd confirms it, too: the
// stall is noticed and the lease set re-listed, so a lease added meanwhile
// still arrives.
func TestWatchStallAtCreationIsDetected(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	srv, _, dreg, _ := startServer(t)
	proxy, err := lab.NewGRPCProxy(filepath.Join(shortDir(t), "p.sock"), srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	reg := proxiedRegistry(t, proxy.Endpoint())
	snap, err := reg.List(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy.StallNewWatches(true)
	const progress, stallTimeout = 500 * time.Millisecond, time.Second
	wctx, cancel := context.WithCancel(tctx(t))
	defer cancel()
	const retry, relistSpread = 100 * time.Millisecond, 100 * time.Millisecond
	c := collect(reg.Watch(wctx, snap, etcdv3.WatchOptions{ProgressInterval: progress, StallTimeout: stallTimeout, RetryInterval: retry, RelistSpread: relistSpread}))
	if _, err := dreg.Create(tctx(t), subnet.Subnets{IPv4: peerSubnet(1)}, peerAttrs(1), 0); err != nil {
		t.Fatal(err)
	}
	// The first stall resumes the watch (it stalls again, noticed after
	// twice the StallTimeout: etcd may just be slow); the second in a row
	// re-lists, within RelistSpread.
	bound := (progress + stallTimeout) + (progress + 2*stallTimeout) + 2*retry + relistSpread + testenv.Slack
	testenv.WaitFor(t, bound, "a lease added while every watch stalls", func() bool { return c.has(peerSubnet(1), "") })
}

// When the connection to etcd breaks and history is compacted past the
// revision the lease key was last written at, the manager must resume
// watching its key from a revision that still exists. Resuming from the
// key's ModRevision would fail with "compacted" at once, every time: a busy
// loop of re-claims hammering etcd.
func TestManagerResumesAfterCompactionWithoutSpinning(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	srv, direct, dreg, cfg := startServer(t)
	proxy := newProxy(t, srv.Endpoint)
	reg := proxiedRegistry(t, proxy.Endpoint())
	interrupted := newLevelCounter("lease keeping interrupted")
	log := slog.New(interrupted)
	h := me()
	m := etcdv3.NewManager(reg, cfg, h, etcdv3.ManagerOptions{Logger: log, RetryInterval: 100 * time.Millisecond})
	l, _, err := m.Acquire(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	runManager(t, m)

	proxy.Set(lab.ProxyDown)
	for i := range 50 {
		if _, err := dreg.Create(tctx(t), subnet.Subnets{IPv4: peerSubnet(100 + i)}, peerAttrs(i), 0); err != nil {
			t.Fatal(err)
		}
	}
	srv.Compact(t, direct)
	proxy.Set(lab.ProxyUp)
	// Give the manager a few retry intervals to go wrong, by waiting for the
	// lease to be renewed through the proxy twice.
	// The client reconnects within its backoff (a few seconds at most).
	testenv.WaitFor(t, 10*time.Second+testenv.Slack, "the manager to be back", func() bool { return proxy.Conns() > 0 })
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && interrupted.total() < 100 {
		time.Sleep(50 * time.Millisecond)
	}
	if n := interrupted.total(); n > 5 {
		t.Fatalf("lease keeping was interrupted %d times within 3 s of reconnecting: a re-claim loop", n)
	}
	cur, err := dreg.Get(tctx(t), l.Subnets())
	if err != nil || !cur.Attrs.OwnedBy(h.NodeID, h.PublicIP) || cur.EtcdLease != l.EtcdLease {
		t.Fatalf("lease after the outage: %+v, %v; want %s with etcd lease %x", cur, err, l.Subnet, l.EtcdLease)
	}
	// And deletion is still noticed.
	if _, err := dreg.Delete(tctx(t), l.Subnets()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 100*time.Millisecond+testenv.Slack, "the same subnet to be re-claimed", func() bool {
		cur, err := dreg.Get(tctx(t), l.Subnets())
		return err == nil && cur.Attrs.OwnedBy(h.NodeID, h.PublicIP)
	})
	t.Logf("lease keeping interrupted %d time(s) by the outage and compaction", interrupted.total())
}

// levelCounter counts the log records whose message contains match, per
// level (repeats of a warning are logged at debug), and keeps the
// "failures" attribute of the last one of each level.
type levelCounter struct {
	slog.Handler
	match    string
	mu       *sync.Mutex
	n        map[slog.Level]int
	failures map[slog.Level]int64
}

func newLevelCounter(match string) levelCounter {
	return levelCounter{match: match, mu: new(sync.Mutex), n: map[slog.Level]int{}, failures: map[slog.Level]int64{}}
}

// total counts the records of every level.
func (h levelCounter) total() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.n {
		n += c
	}
	return n
}

func (h levelCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.match) {
		h.mu.Lock()
		h.n[r.Level]++
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "failures" {
				h.failures[r.Level] = a.Value.Int64()
			}
			return true
		})
		h.mu.Unlock()
	}
	return nil
}

func (h levelCounter) lastFailures(l slog.Level) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.failures[l]
}

func (h levelCounter) count(l slog.Level) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[l]
}

func (h levelCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h levelCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h levelCounter) WithGroup(string) slog.Handler            { return h }

// An outage in which a re-claim failed ends when etcd answers the lease's
// keepalive again, even though no re-claim succeeds (the key and its etcd
// lease outlived the outage): "lease keeping resumed" is logged, and the
// next outage is warned of at once, its failures counted from one. Before,
// only a successful re-claim ended the run of failures: the next outage's
// warnings went on counting the last one's and were held back as repeats.
func TestOutageEndsWhenEtcdAnswersTheHold(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	srv, _, _, cfg := startServer(t)
	proxy := newProxy(t, srv.Endpoint)
	reg := proxiedRegistry(t, proxy.Endpoint())
	failed, interrupted, resumed := newLevelCounter("re-claim failed"), newLevelCounter("lease keeping interrupted"), newLevelCounter("lease keeping resumed")
	log := slog.New(multiHandler{failed, interrupted, resumed})
	// The stall check's window (10 s) outlasts the client's reconnect
	// after the outage, so the hold, not a re-claim, is what etcd answers.
	m := etcdv3.NewManager(reg, cfg, me(), etcdv3.ManagerOptions{Logger: log, RetryInterval: 100 * time.Millisecond,
		ProgressInterval: 5 * time.Second, StallTimeout: 5 * time.Second})
	if _, _, err := m.Acquire(tctx(t)); err != nil {
		t.Fatal(err)
	}
	runManager(t, m)

	proxy.Set(lab.ProxyDown)
	// A re-claim is bounded by etcdv3.DefaultRequestTimeout; the failures
	// after the first warning are logged at debug.
	testenv.WaitFor(t, 10*time.Second+etcdv3.DefaultRequestTimeout+testenv.Slack, "a re-claim to fail while etcd is out of reach",
		func() bool { return failed.total() > 0 })
	proxy.Set(lab.ProxyUp)
	testenv.WaitFor(t, 10*time.Second+testenv.Slack, "lease keeping resumed to be logged", func() bool { return resumed.count(slog.LevelInfo) == 1 })

	warned := interrupted.count(slog.LevelWarn)
	proxy.Set(lab.ProxyDown)
	// The stall check may wait longer after an outage (slow answers are
	// not stalls), so the second outage takes up to 30 s to be noticed. Its
	// first failure is news: a warning (the repeats after it are at debug)
	// that counts from one.
	testenv.WaitFor(t, 30*time.Second+testenv.Slack, "the second outage to be warned of",
		func() bool { return interrupted.count(slog.LevelWarn) > warned })
	if n := interrupted.lastFailures(slog.LevelWarn); n != 1 {
		t.Errorf("the second outage's warning counts %d failures, want 1: the first outage's went on", n)
	}
	proxy.Set(lab.ProxyUp)
}

// multiHandler hands each record to every handler.
type multiHandler []slog.Handler

func (h multiHandler) Handle(ctx context.Context, r slog.Record) error {
	for _, x := range h {
		_ = x.Handle(ctx, r)
	}
	return nil
}

func (h multiHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h multiHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h multiHandler) WithGroup(string) slog.Handler            { return h }

// A watch cut off from etcd (a leader change, a partition, a restarted
// member) resumes from the last revision it saw once etcd is back: the add,
// delete and change made meanwhile arrive as events, and the lease set is
// not re-listed. A re-list per broken watch would make every host read
// every lease at the same moment after each leader change.
func TestBrokenWatchResumesWithoutRelist(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	srv, _, dreg, _ := startServer(t)
	proxy := newProxy(t, srv.Endpoint)
	reg := proxiedRegistry(t, proxy.Endpoint())
	snap := seedPeers(t, dreg, reg)
	restarts := make(chan string, 100)
	const retry = 100 * time.Millisecond
	wctx, cancel := context.WithCancel(tctx(t))
	defer cancel()
	c := collect(reg.Watch(wctx, snap, etcdv3.WatchOptions{RetryInterval: retry, OnRestart: func(r string) { restarts <- r }}))
	for i := 1; i <= 3; i++ {
		c.known[peerSubnet(i)] = "" // from the snapshot
	}
	if _, err := dreg.Create(tctx(t), subnet.Subnets{IPv4: peerSubnet(4)}, peerAttrs(4), 0); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, testenv.Slack, "a live add", func() bool { return c.has(peerSubnet(4), "") })

	proxy.Set(lab.ProxyDown)
	select {
	case r := <-restarts:
		t.Logf("watch broke: %s", r)
	case <-time.After(testenv.Deadline(etcdv3.DefaultProgressInterval + etcdv3.DefaultStallTimeout + testenv.Slack)):
		t.Fatal("the watch did not notice that etcd went away")
	}
	mac := changeMeanwhile(t, dreg)
	proxy.Set(lab.ProxyUp)
	// The client reconnects within its backoff (a few seconds at most).
	testenv.WaitFor(t, 10*time.Second+testenv.Slack, "the add, delete and change made while cut off", func() bool { return c.changedMeanwhile(mac) })
	c.mu.Lock()
	resyncs := c.resyncs
	c.mu.Unlock()
	if resyncs != 0 {
		t.Fatalf("%d re-list(s) after a broken watch whose history etcd still held; want the watch resumed from its revision", resyncs)
	}
}

// Claiming the node ID bounds each request: with etcd out of reach,
// start-up gets an error it retries on (and reports), not a hang.
func TestClaimNodeIDGivesUpOnAnUnreachableEtcd(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	srv, _, _, cfg := startServer(t)
	proxy := newProxy(t, srv.Endpoint)
	reg := proxiedRegistry(t, proxy.Endpoint())
	proxy.Set(lab.ProxyBlackhole)
	done := make(chan error, 1)
	go func() {
		done <- etcdv3.NewManager(reg, cfg, me(), etcdv3.ManagerOptions{}).ClaimNodeID(context.Background())
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("ClaimNodeID succeeded through a blackholed etcd")
		}
		t.Logf("ClaimNodeID: %v", err)
	case <-time.After(testenv.Deadline(etcdv3.DefaultRequestTimeout + testenv.Slack)):
		t.Fatalf("ClaimNodeID still waiting after %s with etcd out of reach", etcdv3.DefaultRequestTimeout+testenv.Slack)
	}
}

// A partition cuts a host off from etcd altogether: its watches stall one
// after another, but so do its keepalives, so the stalls say "out of
// reach", not "the watch path is broken". Once etcd answers again the
// watch resumes from its revision; re-listing every lease — every cut-off
// host at once, at heal time — would add nothing.
func TestStallsWhileEtcdIsOutOfReachEndInAResumeNotARelist(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	srv, _, dreg, cfg := startServer(t)
	proxy := newProxy(t, srv.Endpoint)
	// overlayd's client: gRPC keepalive drops the blackholed connections.
	reg, counter := countedRegistry(t, proxy.Endpoint())
	snap := seedPeers(t, dreg, reg)
	const retry = 100 * time.Millisecond
	m := etcdv3.NewManager(reg, cfg, me(),
		etcdv3.ManagerOptions{LivenessTTL: 3 * time.Second, RetryInterval: retry})
	if _, _, err := m.Acquire(tctx(t)); err != nil {
		t.Fatal(err)
	}
	runManager(t, m)
	var stalls atomic.Int32
	wctx, cancel := context.WithCancel(tctx(t))
	defer cancel()
	c := collect(reg.Watch(wctx, snap, etcdv3.WatchOptions{ProgressInterval: 300 * time.Millisecond, StallTimeout: 500 * time.Millisecond,
		RequestTimeout: time.Second, RetryInterval: retry, OnRestart: func(r string) {
			if strings.Contains(r, "stalled") {
				stalls.Add(1)
			}
		}}))
	for i := 1; i <= 3; i++ {
		c.known[peerSubnet(i)] = "" // from the snapshot
	}
	if _, err := dreg.Create(tctx(t), subnet.Subnets{IPv4: peerSubnet(4)}, peerAttrs(4), 0); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, testenv.Slack, "a live add", func() bool { return c.has(peerSubnet(4), "") })
	// The manager's liveness keepalives are answered: what tells the
	// watcher whether etcd is in reach.
	testenv.WaitFor(t, testenv.Slack, "two liveness keepalive replies", func() bool { return counter.KeepAlives() >= 2 })

	proxy.Set(lab.ProxyBlackhole)
	// Three stalls in a row: two were enough to re-list before.
	testenv.WaitFor(t, 20*time.Second+testenv.Slack, "three stalled watches while cut off", func() bool { return stalls.Load() >= 3 })
	mac := changeMeanwhile(t, dreg)
	proxy.Set(lab.ProxyUp)
	// gRPC keepalive drops the silent connections within 15 s; the client
	// reconnects within its backoff.
	took := testenv.WaitFor(t, 20*time.Second+testenv.Slack, "the add, delete and change made while cut off", func() bool { return c.changedMeanwhile(mac) })
	c.mu.Lock()
	resyncs := c.resyncs
	c.mu.Unlock()
	t.Logf("%d stalls while cut off; the changes arrived %s after the partition healed, with %d re-lists", stalls.Load(), took.Round(time.Millisecond), resyncs)
	if resyncs != 0 {
		t.Fatalf("%d re-list(s) after a partition etcd's history outlasted; want the watch resumed from its revision", resyncs)
	}
}

// An etcd that answers slowly (overloaded) is not a stalled watch: after a
// stall or two the checks wait as long as etcd has been taking, and stop
// re-opening — and then re-listing — a watch that works. Under load at
// 2,000 hosts, every false stall added a re-open or a re-list to the load.
func TestSlowAnswersAreNotTakenForAStalledWatch(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	srv, _, dreg, _ := startServer(t, noProgressNotify)
	proxy := newProxy(t, srv.Endpoint)
	reg, counter := countedRegistry(t, proxy.Endpoint())
	snap := seedPeers(t, dreg, reg)

	var mu sync.Mutex
	stalls, askedAtStall := 0, 0 // progress requests sent before the last stall
	wctx, cancel := context.WithCancel(tctx(t))
	defer cancel()
	// No manager beside the watch: without keepalive replies to say the
	// store stood still, every quiet 200 ms ends in a progress request.
	c := collect(reg.Watch(wctx, snap, etcdv3.WatchOptions{ProgressInterval: 200 * time.Millisecond, StallTimeout: 500 * time.Millisecond,
		RetryInterval: 100 * time.Millisecond, OnRestart: func(r string) {
			if strings.Contains(r, "stalled") {
				_, asked := counter.QuietFor(0)
				mu.Lock()
				stalls, askedAtStall = stalls+1, asked
				mu.Unlock()
			}
		}}))
	if _, err := dreg.Create(tctx(t), subnet.Subnets{IPv4: peerSubnet(4)}, peerAttrs(4), 0); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, testenv.Slack, "a live add", func() bool { return c.has(peerSubnet(4), "") })

	// Every answer now takes a second: two StallTimeouts. Once the checks
	// have learnt that, they wait four seconds: room for a busy machine.
	proxy.SetAnswerDelay(time.Second)
	took := testenv.WaitFor(t, 60*time.Second+testenv.Slack, "five progress requests in a row answered without a stall", func() bool {
		_, asked := counter.QuietFor(0)
		mu.Lock()
		defer mu.Unlock()
		return stalls > 0 && asked-askedAtStall >= 5
	})
	mu.Lock()
	t.Logf("settled after %s and %d stalls", took.Round(time.Millisecond), stalls)
	mu.Unlock()
	// And the slow watch still delivers.
	if _, err := dreg.Create(tctx(t), subnet.Subnets{IPv4: peerSubnet(5)}, peerAttrs(5), 0); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second+testenv.Slack, "an add through the slow watch", func() bool { return c.has(peerSubnet(5), "") })
}

// etcd drops a progress request while a watch on the stream starts beyond
// its current revision. A watch resumed just past what it confirmed, on a
// store that has not moved since, could never answer one: each check that
// had to ask ended in a stall. Resumed at the confirmed revision, it
// answers every time.
func TestQuietStoreAnswersEveryProgressRequest(t *testing.T) {
	srv, _, dreg, _ := startServer(t, noProgressNotify)
	reg, counter := countedRegistry(t, srv.Endpoint)
	snap := seedPeers(t, dreg, reg) // the last write: nothing changes from here on
	var stalls atomic.Int32
	wctx, cancel := context.WithCancel(tctx(t))
	defer cancel()
	// No manager: every quiet 100 ms ends in a progress request. An
	// unanswerable one stalls after StallTimeout, however generous.
	collect(reg.Watch(wctx, snap, etcdv3.WatchOptions{ProgressInterval: 100 * time.Millisecond, StallTimeout: testenv.Slack,
		RetryInterval: 100 * time.Millisecond, OnRestart: func(r string) { stalls.Add(1); t.Logf("restart: %s", r) }}))
	testenv.WaitFor(t, 2*testenv.Slack, "ten progress requests", func() bool {
		_, asked := counter.QuietFor(0)
		return asked >= 10 || stalls.Load() > 0
	})
	if n := stalls.Load(); n > 0 {
		t.Fatalf("%d stall(s) of a healthy watch on a quiet store: its progress requests went unanswered", n)
	}
}

// etcd's store re-created behind the same endpoint (wiped and started
// again, or restored from a backup): none of what this host wrote is there
// and the revisions start over, below every one the host has seen. The
// host must notice — by its node ID claim's write, whose revision went back
// — re-claim its subnet in the new store and re-list the leases there; its
// watches, waiting for revisions far ahead, would otherwise sit silent
// while another host could take the subnet.
func TestRecreatedStoreIsNoticedAndRejoined(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	srv, _, dreg, cfg := startServer(t)
	proxy := newProxy(t, srv.Endpoint)
	reg := proxiedRegistry(t, proxy.Endpoint())
	h := me()
	m := etcdv3.NewManager(reg, cfg, h, etcdv3.ManagerOptions{LivenessTTL: 2 * time.Second, RetryInterval: 100 * time.Millisecond})
	if err := m.ClaimNodeID(tctx(t)); err != nil {
		t.Fatal(err)
	}
	l, snap, err := m.Acquire(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	runCtx := runManager(t, m)
	seen := collect(reg.Watch(runCtx, snap, etcdv3.WatchOptions{RetryInterval: 100 * time.Millisecond, RelistSpread: 100 * time.Millisecond}))
	testenv.WaitFor(t, testenv.Slack, "the liveness key held", m.Alive)
	// The old store runs far ahead of the new one, and the host's watches
	// are there: a peer's lease written 300 times.
	var last string
	for i := range 300 {
		a := peerAttrs(1000 + i)
		val, err := a.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := dreg.Client().Put(tctx(t), dreg.LeaseKey(subnet.Subnets{IPv4: peerSubnet(3)}), string(val)); err != nil {
			t.Fatal(err)
		}
		d, _ := leaseData(a.BackendData)
		last = d.VtepMAC
	}
	testenv.WaitFor(t, testenv.Slack, "the old store's last write seen", func() bool { return seen.has(peerSubnet(3), last) })

	srv2, _, dreg2, _ := startServer(t)
	if _, err := dreg2.Create(tctx(t), subnet.Subnets{IPv4: peerSubnet(7)}, peerAttrs(7), 0); err != nil {
		t.Fatal(err)
	}
	if err := proxy.Retarget(srv2.Endpoint); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	// The clients reconnect (gRPC's backoff: 1 s, 1.6 s, 2.6 s, … if a
	// first attempt fails), the liveness keepalive finds its lease gone
	// (within its 2 s TTL), the claim's write shows the revision went back.
	testenv.WaitFor(t, 3*2*time.Second+5*time.Second+testenv.Slack, "the lease re-claimed in the new store", func() bool {
		cur, err := dreg2.Get(tctx(t), l.Subnets())
		return err == nil && cur.Attrs.OwnedBy(h.NodeID, h.PublicIP)
	})
	testenv.WaitFor(t, testenv.Slack, "the new store's leases listed", func() bool { return seen.has(peerSubnet(7), "") })
	testenv.WaitFor(t, testenv.Slack, "the lease key known to be this host's again", func() bool { return m.KeyProblem() == nil })
	// And the key is watched again: a deletion in the new store is noticed.
	if _, err := dreg2.Delete(tctx(t), l.Subnets()); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, testenv.Slack, "the deleted key re-claimed", func() bool {
		cur, err := dreg2.Get(tctx(t), l.Subnets())
		return err == nil && cur.Attrs.OwnedBy(h.NodeID, h.PublicIP)
	})
}
