package etcdv3

import (
	"context"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/etcdtest"
	"github.com/overlaynet/overlay/subnet"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// The periodic re-list of every lease by every host must cost etcd reads
// that grow as N, not N²: the interval stretches with the lease set.
func TestResyncIntervalGrowsWithLeaseSet(t *testing.T) {
	for _, n := range []int{0, 100, 3000, 10000, 50000} {
		got := resyncInterval(5*time.Minute, n)
		if got < 5*time.Minute {
			t.Errorf("%d leases: interval %s, shorter than the configured 5m", n, got)
		}
		// N hosts each reading n=N leases per interval: per second that is
		// N*N/interval reads; at most 10 per host, whatever N.
		perHost := float64(n) / got.Seconds()
		if perHost > 10.001 {
			t.Errorf("%d leases: every host reads %.1f leases a second from etcd (interval %s); want at most 10, so that etcd's load grows as N", n, perHost, got)
		}
	}
	if got := resyncInterval(5*time.Minute, 100); got != 5*time.Minute {
		t.Errorf("100 leases: interval %s, want the configured 5m", got)
	}
}

// List reads a large lease set in bounded pages, all at one revision: one
// unbounded range response per host, with thousands of hosts starting at
// once, would have etcd hold gigabytes of responses in memory.
func TestListReadsInPagesAtOneRevision(t *testing.T) {
	srv := etcdtest.Start(t)
	const n = 2*listPage + 500
	putLeases(t, srv.Client(t), n)
	var mu sync.Mutex
	var limits []int64
	revs := map[int64]bool{}
	counting, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if rr, ok := req.(*etcdserverpb.RangeRequest); ok {
				mu.Lock()
				limits = append(limits, rr.Limit)
				if resp, ok := reply.(*etcdserverpb.RangeResponse); ok && resp.Header != nil {
					revs[max(rr.Revision, resp.Header.Revision)] = true
				}
				mu.Unlock()
			}
			return err
		})}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = counting.Close() })
	snap, err := NewRegistry(counting, DefaultPrefix).List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Leases) != n || len(snap.Invalid) != 0 {
		t.Fatalf("List: %d leases, %d invalid; want %d leases", len(snap.Leases), len(snap.Invalid), n)
	}
	seen := map[netip.Prefix]bool{}
	for _, l := range snap.Leases {
		seen[l.Subnet] = true
	}
	if len(seen) != n {
		t.Fatalf("List returned %d distinct subnets, want %d", len(seen), n)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, l := range limits {
		if l == 0 || l > listPage {
			t.Fatalf("range requests with limits %v: want every one bounded by %d", limits, listPage)
		}
	}
	if len(revs) != 1 {
		t.Fatalf("pages read at revisions %v, want one", revs)
	}
}

// A re-list after a compaction (600 hosts at once at 2,000 hosts, in
// make scale) and the periodic one decode only the values that changed
// since the watcher saw them: decoding is most of a listing's CPU.
func TestRelistDecodesOnlyWhatChanged(t *testing.T) {
	srv := etcdtest.Start(t)
	cli := srv.Client(t)
	const n = listPage + 10 // two pages
	putLeases(t, cli, n)
	reg := NewRegistry(cli, DefaultPrefix)
	snap, err := reg.List(ctx(t))
	if err != nil || len(snap.Leases) != n {
		t.Fatalf("List: %d leases, %v", len(snap.Leases), err)
	}
	known := map[subnet.ID]subnet.Known{}
	for _, l := range snap.Leases {
		known[l.ID()] = subnet.KnownOf(l)
	}
	changed := snap.Leases[n-1]
	changed.Attrs.Hostname = "renamed"
	if _, err := reg.Update(ctx(t), changed, changed.Attrs, 0); err != nil {
		t.Fatal(err)
	}
	decoded, unchanged, err := reg.list(ctx(t), func(id subnet.ID, rev int64) bool { return known[id].ModRevision == rev })
	if err != nil {
		t.Fatal(err)
	}
	if len(decoded.Leases) != 1 || decoded.Leases[0].Attrs.Hostname != "renamed" || len(unchanged) != n-1 {
		t.Fatalf("re-list decoded %d leases and kept %d; want the one renamed decoded and %d kept", len(decoded.Leases), len(unchanged), n-1)
	}
	events, next := subnet.Diff(known, decoded.Leases, unchanged)
	if len(events) != 1 || events[0].Type != subnet.Changed || events[0].Lease.Subnets() != changed.Subnets() || len(next) != n {
		t.Fatalf("Diff of the re-list: %v (%d known); want one change of %s", events, len(next), changed.Subnets())
	}
}

// putLeases writes n leases of hosts 0..n-1, 100 to a transaction.
func putLeases(t testing.TB, cli *clientv3.Client, n int) {
	t.Helper()
	reg := NewRegistry(cli, DefaultPrefix)
	for i := 0; i < n; i += 100 {
		var ops []clientv3.Op
		for j := i; j < min(n, i+100); j++ {
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(j >> 8), byte(j), 0}), 24)
			h := host(j)
			val, _ := subnet.NewAttrs(h.PublicIP, subnet.DefaultBackendType, h.BackendData, h.NodeID, h.Hostname).Marshal()
			ops = append(ops, clientv3.OpPut(reg.LeaseKey(subnet.Subnets{IPv4: p}), string(val)))
		}
		if _, err := cli.Txn(t.Context()).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// BenchmarkList is what every host pays, client and server together (the
// member runs in this process), to read 2,000 leases: at start-up, after a
// compaction passed its watch, and at each periodic re-list.
func BenchmarkList(b *testing.B) {
	reg, _ := benchLeases(b, 2000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := reg.List(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRelist is BenchmarkList for a watcher that knows every lease
// already: a re-list after a compaction, or the periodic one.
func BenchmarkRelist(b *testing.B) {
	reg, snap := benchLeases(b, 2000)
	known := map[subnet.ID]subnet.Known{}
	for _, l := range snap.Leases {
		known[l.ID()] = subnet.KnownOf(l)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := reg.list(b.Context(), func(id subnet.ID, rev int64) bool { return known[id].ModRevision == rev }); err != nil {
			b.Fatal(err)
		}
	}
}

// benchLeases starts an etcd holding n leases and lists them once.
func benchLeases(b *testing.B, n int) (*Registry, Snapshot) {
	srv := etcdtest.Start(b)
	cli := srv.Client(b)
	putLeases(b, cli, n)
	reg := NewRegistry(cli, DefaultPrefix)
	snap, err := reg.List(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	return reg, snap
}

// BenchmarkOpenJournal is what a restarted host pays instead of
// BenchmarkList's listing: reading 2,000 leases back from its journal
// (every value decoded, as from etcd), with no work for etcd.
func BenchmarkOpenJournal(b *testing.B) {
	_, snap := benchLeases(b, 2000)
	reg := NewRegistry(nil, DefaultPrefix)
	path := filepath.Join(b.TempDir(), "subnet.env.leases")
	j, _, _ := OpenJournal(path, reg)
	if err := j.Start(snap); err != nil {
		b.Fatal(err)
	}
	j.Close()
	b.ReportAllocs()
	for b.Loop() {
		j, got, err := OpenJournal(path, reg)
		if err != nil || len(got.Leases) != 2000 {
			b.Fatalf("%d leases, %v", len(got.Leases), err)
		}
		j.Close()
	}
}

// BenchmarkResumeCheck is etcd's part of checking a saved lease set of
// 2,000 leases at its revision (AcquireFrom): reading this host's key at
// that revision, against counting every key there as the first version
// did — a walk over all N keys per restart.
func BenchmarkResumeCheck(b *testing.B) {
	reg, snap := benchLeases(b, 2000)
	key := reg.LeaseKey(snap.Leases[0].Subnets())
	for _, bc := range []struct {
		name string
		op   clientv3.Op
	}{
		{"own key", clientv3.OpGet(key, clientv3.WithRev(snap.Revision))},
		{"count of keys", clientv3.OpGet(reg.SubnetsPrefix(), clientv3.WithPrefix(), clientv3.WithRev(snap.Revision), clientv3.WithCountOnly())},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := reg.cli.Txn(b.Context()).Then(clientv3.OpGet(key), bc.op).Commit(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
