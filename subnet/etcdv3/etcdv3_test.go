package etcdv3

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/etcdtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const testNetwork = `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":1}}`

type fixture struct {
	srv *etcdtest.Server
	cli *clientv3.Client
	reg *Registry
	cfg *subnet.Config
}

func newFixture(t *testing.T, network string, opts ...etcdtest.Option) *fixture {
	t.Helper()
	srv := etcdtest.Start(t, opts...)
	cli := srv.Client(t)
	reg := NewRegistry(cli, DefaultPrefix)
	cfg, err := reg.PutConfig(ctx(t), []byte(network))
	if err != nil {
		t.Fatalf("PutConfig: %v", err)
	}
	return &fixture{srv: srv, cli: cli, reg: reg, cfg: cfg}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), testenv.Deadline(30*time.Second))
	t.Cleanup(cancel)
	return c
}

func host(i int) Host {
	return Host{
		NodeID:      fmt.Sprintf("node-%d", i),
		Hostname:    fmt.Sprintf("host-%d", i),
		PublicIP:    netip.AddrFrom4([4]byte{198, 18, byte(i / 250), byte(i%250 + 1)}),
		BackendData: vxlanData(net.HardwareAddr{0x0e, 0, 0, 0, byte(i >> 8), byte(i)}),
	}
}

func (f *fixture) manager(h Host, opts ManagerOptions) *Manager {
	return NewManager(f.reg, f.cfg, h, opts)
}

// winners counts the claims that succeeded in errs; each other one must
// have failed with lost.
func winners(t *testing.T, errs []error, lost error) int {
	t.Helper()
	won := 0
	for i, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, lost):
			t.Errorf("claim %d: %v, want success or %v", i, err, lost)
		}
	}
	return won
}

// countEtcdLeases returns how many etcd leases the cluster holds.
func (f *fixture) countEtcdLeases(t *testing.T) int {
	t.Helper()
	resp, err := f.cli.Leases(ctx(t))
	if err != nil {
		t.Fatalf("list etcd leases: %v", err)
	}
	return len(resp.Leases)
}

func TestConcurrentHostsGetDistinctSubnets(t *testing.T) {
	f := newFixture(t, testNetwork)
	const hosts = 50
	got := make([]netip.Prefix, hosts)
	errs := make([]error, hosts)
	var wg sync.WaitGroup
	for i := range hosts {
		wg.Go(func() {
			m := f.manager(host(i), ManagerOptions{Rand: rand.New(rand.NewPCG(uint64(i), 7))})
			l, _, err := m.Acquire(ctx(t))
			got[i], errs[i] = l.Subnet, err
		})
	}
	wg.Wait()
	seen := map[netip.Prefix]int{}
	for i := range hosts {
		if errs[i] != nil {
			t.Fatalf("host %d: %v", i, errs[i])
		}
		if j, dup := seen[got[i]]; dup {
			t.Fatalf("hosts %d and %d both hold %s", j, i, got[i])
		}
		seen[got[i]] = i
		if !f.cfg.InRange(got[i]) {
			t.Errorf("host %d got %s outside SubnetMin..SubnetMax", i, got[i])
		}
	}
	snap, err := f.reg.List(ctx(t))
	if err != nil || len(snap.Leases) != hosts {
		t.Fatalf("etcd holds %d leases (%v), want %d", len(snap.Leases), err, hosts)
	}
}

func TestFullPoolIsOutOfSubnets(t *testing.T) {
	f := newFixture(t, `{"Network":"10.1.2.0/24"}`) // three /26 subnets
	for i := range 3 {
		if _, _, err := f.manager(host(i), ManagerOptions{}).Acquire(ctx(t)); err != nil {
			t.Fatalf("host %d: %v", i, err)
		}
	}
	_, _, err := f.manager(host(3), ManagerOptions{}).Acquire(ctx(t))
	if !errors.Is(err, subnet.ErrOutOfSubnets) || !strings.Contains(err.Error(), "revoke stale leases") {
		t.Fatalf("fourth host: err = %v; want ErrOutOfSubnets with advice", err)
	}
}

func TestRestartAdoptsSameLeaseAndEtcdLease(t *testing.T) {
	f := newFixture(t, testNetwork)
	first, _, err := f.manager(host(1), ManagerOptions{}).Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	h := host(1)
	h.PublicIP = netip.MustParseAddr("198.18.0.99") // same node, new address
	again, _, err := f.manager(h, ManagerOptions{}).Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if again.Subnet != first.Subnet || again.EtcdLease != first.EtcdLease {
		t.Fatalf("restart got %s (etcd lease %x), want %s (etcd lease %x)", again.Subnet, again.EtcdLease, first.Subnet, first.EtcdLease)
	}
	stored, err := f.reg.Get(ctx(t), first.Subnets())
	if err != nil || stored.Attrs.PublicIP != "198.18.0.99" {
		t.Fatalf("stored lease = %+v, %v; want PublicIP updated to 198.18.0.99", stored, err)
	}
	if n := f.countEtcdLeases(t); n != 1 {
		t.Errorf("%d etcd leases after a restart, want 1", n)
	}
}

func TestFlannelLeaseIsAdoptedByPublicIP(t *testing.T) {
	f := newFixture(t, testNetwork)
	grant, err := f.cli.Grant(ctx(t), 3600)
	if err != nil {
		t.Fatal(err)
	}
	p := netip.MustParsePrefix("10.244.42.0/24")
	flannel := `{"PublicIP":"198.18.0.2","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:02"}}`
	if _, err := f.cli.Put(ctx(t), f.reg.LeaseKey(subnet.Subnets{IPv4: p}), flannel, clientv3.WithLease(grant.ID)); err != nil {
		t.Fatal(err)
	}
	l, _, err := f.manager(host(1), ManagerOptions{}).Acquire(ctx(t)) // host(1) is 198.18.0.2
	if err != nil || l.Subnet != p {
		t.Fatalf("Acquire = %+v, %v; want %s", l, err, p)
	}
	// flanneld's etcd lease had another TTL than --lease-ttl: the key moved
	// onto overlayd's (TestChangedLeaseTTLTakesEffectAtRestart).
	if _, granted, err := f.reg.ttls(ctx(t), l.EtcdLease); err != nil || granted != int64(DefaultLeaseTTL/time.Second) {
		t.Errorf("adopted lease on etcd lease %x granted %ds (%v), want %s", l.EtcdLease, granted, err, DefaultLeaseTTL)
	}
}

// A restart with another --lease-ttl moves the lease key onto an etcd
// lease of that TTL (the same subnet, the key never gone) and revokes the
// old one; a restart with the same TTL keeps its etcd lease.
func TestChangedLeaseTTLTakesEffectAtRestart(t *testing.T) {
	f := newFixture(t, testNetwork)
	first, _, err := f.manager(host(1), ManagerOptions{}).Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	same, _, err := f.manager(host(1), ManagerOptions{}).Acquire(ctx(t))
	if err != nil || same.EtcdLease != first.EtcdLease {
		t.Fatalf("restart with the same TTL: etcd lease %x (%v), want %x kept", same.EtcdLease, err, first.EtcdLease)
	}
	l, _, err := f.manager(host(1), ManagerOptions{LeaseTTL: time.Minute}).Acquire(ctx(t))
	if err != nil || l.Subnet != first.Subnet || l.EtcdLease == first.EtcdLease {
		t.Fatalf("restart with --lease-ttl 1m: %s on etcd lease %x (%v); want %s on a new etcd lease", l.Subnet, l.EtcdLease, err, first.Subnet)
	}
	stored, err := f.reg.Get(ctx(t), first.Subnets())
	if err != nil || stored.EtcdLease != l.EtcdLease {
		t.Fatalf("stored lease %+v, %v; want it on etcd lease %x", stored, err, l.EtcdLease)
	}
	if _, granted, err := f.reg.ttls(ctx(t), l.EtcdLease); err != nil || granted != 60 {
		t.Errorf("new etcd lease granted %ds (%v), want 60", granted, err)
	}
	if left, _, err := f.reg.ttls(ctx(t), first.EtcdLease); err != nil || left != -1 {
		t.Errorf("the old etcd lease: %ds left (%v), want it revoked", left, err)
	}
}

func TestReservationIsAdoptedWithoutTTL(t *testing.T) {
	f := newFixture(t, testNetwork)
	p := netip.MustParsePrefix("10.244.200.0/24")
	h := host(5)
	if _, err := f.reg.Create(ctx(t), subnet.Subnets{IPv4: p}, subnet.LeaseAttrs{PublicIP: h.PublicIP.String()}, 0); err != nil {
		t.Fatal(err)
	}
	l, _, err := f.manager(h, ManagerOptions{}).Acquire(ctx(t))
	if err != nil || l.Subnet != p || !l.Reserved {
		t.Fatalf("Acquire = %+v, %v; want reserved %s", l, err, p)
	}
	resp, err := f.cli.Get(ctx(t), f.reg.LeaseKey(subnet.Subnets{IPv4: p}))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatal(err)
	}
	if resp.Kvs[0].Lease != 0 {
		t.Errorf("reservation gained etcd lease %x", resp.Kvs[0].Lease)
	}
	if !strings.Contains(string(resp.Kvs[0].Value), hostMAC(h)) {
		t.Errorf("reservation value %s was not filled with the host's VtepMAC", resp.Kvs[0].Value)
	}
	if n := f.countEtcdLeases(t); n != 0 {
		t.Errorf("%d etcd leases granted for a reserved host, want 0", n)
	}
}

func TestPreviousSubnetReusedOnlyWhenFree(t *testing.T) {
	f := newFixture(t, testNetwork)
	prev := netip.MustParsePrefix("10.244.77.0/24")
	h := host(1)
	h.Previous = subnet.Subnets{IPv4: prev}
	l, _, err := f.manager(h, ManagerOptions{}).Acquire(ctx(t))
	if err != nil || l.Subnet != prev {
		t.Fatalf("free previous subnet: got %v, %v; want %s", l.Subnet, err, prev)
	}
	other := host(2)
	other.Previous = subnet.Subnets{IPv4: prev} // e.g. a copied disk image: the subnet is held by host 1
	l2, _, err := f.manager(other, ManagerOptions{}).Acquire(ctx(t))
	if err != nil || l2.Subnet == prev {
		t.Fatalf("taken previous subnet: got %v, %v; want another subnet", l2.Subnet, err)
	}
}

func TestKeepAliveRenewsOneEtcdLease(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	f := newFixture(t, testNetwork)
	// Short TTLs so renewals come often, but not so short that a busy
	// machine delaying a keepalive by a few seconds lets a lease expire:
	// that would be the product working as designed, not a bug.
	const ttl = 6 * time.Second
	m := f.manager(host(1), ManagerOptions{LeaseTTL: ttl, LivenessTTL: ttl})
	l, _, err := m.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	stop := startRun(t, m)

	testenv.WaitFor(t, testenv.Slack, "liveness key", m.Alive)
	// Renewals push the expiry forward; watch it move several times (the
	// client renews every TTL/3) — past the original TTL.
	last := m.Expires()
	for renewals := 0; renewals < 4; {
		testenv.WaitFor(t, ttl/3+testenv.Slack, "a renewal", func() bool { return m.Expires().After(last) })
		last = m.Expires()
		renewals++
	}
	stored, err := f.reg.Get(ctx(t), l.Subnets())
	if err != nil || stored.EtcdLease != l.EtcdLease {
		t.Fatalf("lease key now on etcd lease %x (%v), want the original %x", stored.EtcdLease, err, l.EtcdLease)
	}
	if n := f.countEtcdLeases(t); n != 2 {
		t.Errorf("%d etcd leases, want exactly 2 (one for the subnet, one for liveness)", n)
	}
	alive, err := f.reg.AliveNodes(ctx(t))
	if err != nil || !alive["node-1"] {
		t.Errorf("AliveNodes = %v, %v; want node-1", alive, err)
	}
	if err := stop(); err != nil {
		t.Errorf("Run returned %v after cancel, want nil", err)
	}
	testenv.WaitFor(t, testenv.Slack, "liveness key removed on stop", func() bool {
		alive, err := f.reg.AliveNodes(ctx(t))
		return err == nil && !alive["node-1"]
	})
}

func TestDeletedLeaseIsReclaimedWithSameSubnet(t *testing.T) {
	f := newFixture(t, testNetwork)
	m := f.manager(host(1), ManagerOptions{RetryInterval: 50 * time.Millisecond})
	l, _, err := m.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, m)

	for round := range 3 {
		before := m.Lease().ModRevision
		if ok, err := f.reg.Delete(ctx(t), l.Subnets()); err != nil || !ok {
			t.Fatalf("round %d: delete: %v %v", round, ok, err)
		}
		// Readiness's view (KeyProblem) clears once it is back.
		testenv.WaitFor(t, 50*time.Millisecond+testenv.Slack, "the lease to be re-claimed", func() bool {
			got, err := f.reg.Get(ctx(t), l.Subnets())
			return err == nil && got.Attrs.NodeID == "node-1" && got.ModRevision > before && m.KeyProblem() == nil
		})
	}
	if got := m.Lease().Subnet; got != l.Subnet {
		t.Errorf("manager now holds %s, want %s", got, l.Subnet)
	}
}

func TestRevokedEtcdLeaseIsReclaimedWithSameSubnet(t *testing.T) {
	f := newFixture(t, testNetwork)
	m := f.manager(host(1), ManagerOptions{RetryInterval: 50 * time.Millisecond})
	l, _, err := m.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, m)

	if _, err := f.cli.Revoke(ctx(t), clientv3.LeaseID(l.EtcdLease)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 50*time.Millisecond+testenv.Slack, "the subnet to be re-claimed on a new etcd lease", func() bool {
		got, err := f.reg.Get(ctx(t), l.Subnets())
		return err == nil && got.Attrs.NodeID == "node-1" && got.EtcdLease != l.EtcdLease && got.EtcdLease != 0
	})
}

func TestLeaseTakenByAnotherHostStopsRun(t *testing.T) {
	f := newFixture(t, testNetwork)
	m := f.manager(host(1), ManagerOptions{RetryInterval: 50 * time.Millisecond})
	l, _, err := m.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx(t)) }()
	other := host(2)
	val, _ := subnet.NewAttrs(other.PublicIP, subnet.DefaultBackendType, other.BackendData, other.NodeID, "").Marshal()
	if _, err := f.cli.Put(ctx(t), f.reg.LeaseKey(l.Subnets()), string(val)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Run = %v, want ErrLeaseLost", err)
		}
	case <-time.After(testenv.Deadline(testenv.Slack)):
		t.Fatal("Run did not stop after its subnet was taken")
	}
}

func TestWatchReportsAddDeleteAndChange(t *testing.T) {
	f := newFixture(t, testNetwork)
	snap, err := f.reg.List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	ch := f.reg.Watch(wctx, snap, WatchOptions{})

	l, _, err := f.manager(host(1), ManagerOptions{}).Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	expect(t, ch, subnet.Added, l.Subnet, "")

	h := host(1)
	h.BackendData = vxlanData(net.HardwareAddr{0x0e, 1, 2, 3, 4, 5})
	if _, _, err := f.manager(h, ManagerOptions{}).Acquire(ctx(t)); err != nil {
		t.Fatal(err)
	}
	expect(t, ch, subnet.Changed, l.Subnet, "0e:01:02:03:04:05")

	if _, err := f.reg.Delete(ctx(t), l.Subnets()); err != nil {
		t.Fatal(err)
	}
	expect(t, ch, subnet.Removed, l.Subnet, "")

	// Garbage is reported as invalid, never as a lease.
	if _, err := f.cli.Put(ctx(t), f.reg.SubnetsPrefix()+"10.244.9.0-24", "{not json"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.cli.Put(ctx(t), f.reg.SubnetsPrefix()+"not-a-key", "{}"); err != nil {
		t.Fatal(err)
	}
	var invalid []Invalid
	for len(invalid) < 2 {
		b := recv(t, ch)
		if len(b.Events) != 0 {
			t.Fatalf("invalid writes produced events %+v", b.Events)
		}
		invalid = append(invalid, b.Invalid...)
	}
}

// A watch response holding a key's undecodable value and then a good one
// delivers them as two batches, in that order: a consumer applies a batch's
// events before its invalid keys, and would otherwise end with the key
// marked invalid and the lease that replaced the garbage dropped.
func TestUndecodableThenGoodValueArriveInOrder(t *testing.T) {
	f := newFixture(t, testNetwork)
	snap, err := f.reg.List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	key := f.reg.SubnetsPrefix() + "10.244.9.0-24"
	good := `{"PublicIP":"198.18.0.9","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:09"}}`
	for _, v := range []string{"{not json", good} {
		if _, err := f.cli.Put(ctx(t), key, v); err != nil {
			t.Fatal(err)
		}
	}
	// Both writes are history when the watch starts: one response.
	wctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	ch := f.reg.Watch(wctx, snap, WatchOptions{})
	invalidAt, addedAt := -1, -1
	for i := 0; addedAt < 0; i++ {
		b := recv(t, ch)
		for _, inv := range b.Invalid {
			if inv.Key == key {
				invalidAt = i
			}
		}
		for _, ev := range b.Events {
			if ev.Type == subnet.Added && ev.Lease.Subnet == netip.MustParsePrefix("10.244.9.0/24") {
				addedAt = i
			}
		}
	}
	if invalidAt < 0 || invalidAt >= addedAt {
		t.Errorf("the undecodable value came in batch %d, the good one in batch %d: want the undecodable one in an earlier batch", invalidAt, addedAt)
	}
}

// An invalid key that is deleted is reported in Deleted, and the watcher
// keeps the order a consumer relies on (a batch's Events, then its Deleted,
// then its Invalid keys are the revisions' order): whoever counts the
// invalid keys (the daemon's overlay_leases_invalid) must neither keep
// counting a deleted one until the next re-list nor forget one that is
// invalid again.
func TestDeletedInvalidKeysAreReportedInOrder(t *testing.T) {
	f := newFixture(t, testNetwork)
	key := func(s string) string { return f.reg.SubnetsPrefix() + s }
	lease, notALease, other, again := key("10.244.9.0-24"), key("not-a-key"), key("10.244.11.0-24"), key("10.244.12.0-24")
	// Invalid before the watch starts: the snapshot knows them.
	for _, k := range []string{lease, notALease, again} {
		if _, err := f.cli.Put(ctx(t), k, "{not json"); err != nil {
			t.Fatal(err)
		}
	}
	snap, err := f.reg.List(ctx(t))
	if err != nil || len(snap.Invalid) != 3 {
		t.Fatalf("List: %d invalid, %v; want 3", len(snap.Invalid), err)
	}
	// Then, all in one watch response.
	put := func(k, v string) func() error {
		return func() error { _, err := f.cli.Put(ctx(t), k, v); return err }
	}
	del := func(k string) func() error {
		return func() error { _, err := f.cli.Delete(ctx(t), k); return err }
	}
	for _, op := range []func() error{
		del(lease), del(notALease), put(lease, "[]"), // deleted, then garbage again
		put(other, "null"), del(other), // garbage, then deleted
		del(key("10.244.10.0-24")), // never held anything: nothing to say
		// Deleted, then a value that decodes (a lease the daemon rejects
		// for its multicast address, but an event here).
		del(again), put(again, `{"PublicIP":"239.1.2.3","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:0c"}}`),
	} {
		if err := op(); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	ch := f.reg.Watch(wctx, snap, WatchOptions{})
	// Flattened in the order a consumer applies them.
	var seen []string
	for len(seen) < 7 {
		b := recv(t, ch)
		for _, ev := range b.Events {
			seen = append(seen, "event "+key(subnet.Key(ev.Lease.Subnet)))
		}
		for _, k := range b.Deleted {
			seen = append(seen, "deleted "+k)
		}
		for _, i := range b.Invalid {
			seen = append(seen, "invalid "+i.Key)
		}
	}
	want := []string{"deleted " + lease, "deleted " + notALease, "invalid " + lease, "invalid " + other, "deleted " + other,
		"deleted " + again, "event " + again}
	if !slices.Equal(seen, want) {
		t.Errorf("watch reported, in a consumer's order:\n%q\nwant\n%q", seen, want)
	}
}

func TestWatchResumesAcrossCompaction(t *testing.T) {
	f := newFixture(t, testNetwork)
	a, _, _ := f.manager(host(1), ManagerOptions{}).Acquire(ctx(t))
	b, _, _ := f.manager(host(2), ManagerOptions{}).Acquire(ctx(t))
	snap, err := f.reg.List(ctx(t))
	if err != nil || len(snap.Leases) != 2 {
		t.Fatalf("List: %d leases, %v", len(snap.Leases), err)
	}
	// While "disconnected" (no watcher), a is deleted, b gets a new MAC, c is
	// added; then history is compacted past the snapshot's revision.
	if _, err := f.reg.Delete(ctx(t), a.Subnets()); err != nil {
		t.Fatal(err)
	}
	hb := host(2)
	hb.BackendData = vxlanData(net.HardwareAddr{0x0e, 9, 9, 9, 9, 9})
	if _, _, err := f.manager(hb, ManagerOptions{}).Acquire(ctx(t)); err != nil {
		t.Fatal(err)
	}
	c, _, _ := f.manager(host(3), ManagerOptions{}).Acquire(ctx(t))
	f.srv.Compact(t, f.cli)

	restarts := make(chan string, 4)
	ch := f.reg.Watch(ctx(t), snap, WatchOptions{OnRestart: func(r string) { restarts <- r }})
	batch := recv(t, ch)
	if !batch.Resync {
		t.Fatalf("first batch after compaction is not a resync: %+v", batch)
	}
	got := map[netip.Prefix]subnet.EventType{}
	for _, ev := range batch.Events {
		got[ev.Lease.Subnet] = ev.Type
	}
	want := map[netip.Prefix]subnet.EventType{a.Subnet: subnet.Removed, b.Subnet: subnet.Changed, c.Subnet: subnet.Added}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events after compaction = %v, want %v", got, want)
	}
	if r := <-restarts; !strings.Contains(r, "compacted") {
		t.Errorf("restart reason %q, want compaction", r)
	}
	// And the watch goes on live after the resync.
	d, _, _ := f.manager(host(4), ManagerOptions{}).Acquire(ctx(t))
	expect(t, ch, subnet.Added, d.Subnet, "")
}

// startRun runs m until the returned stop is called (or the test ends) and
// returns Run's result.
func startRun(t *testing.T, m *Manager) (stop func() error) {
	runCtx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(runCtx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { cancel(); err = <-done })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func recv(t *testing.T, ch <-chan Batch) Batch {
	t.Helper()
	select {
	case b, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return b
	case <-time.After(testenv.Deadline(testenv.Slack)):
		t.Fatal("no watch batch in time")
	}
	return Batch{}
}

// expect reads batches until one carries an event for p, and checks it.
func expect(t *testing.T, ch <-chan Batch, typ subnet.EventType, p netip.Prefix, mac string) {
	t.Helper()
	for range 10 {
		for _, ev := range recv(t, ch).Events {
			if ev.Lease.Subnet != p {
				continue
			}
			if ev.Type != typ {
				t.Fatalf("event for %s is %s, want %s", p, ev.Type, typ)
			}
			if mac != "" {
				d, err := leaseData(ev.Lease.Attrs.BackendData)
				if err != nil || d.VtepMAC != mac {
					t.Fatalf("event for %s carries MAC %q (%v), want %s", p, d.VtepMAC, err, mac)
				}
			}
			return
		}
	}
	t.Fatalf("no %s event for %s", typ, p)
}

func TestDuplicateNodeIDFailsLoudly(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	f := newFixture(t, testNetwork)
	// The first host's liveness key must outlive a keepalive delayed by a
	// busy machine; the clone waits out its remaining TTL before failing.
	first := f.manager(host(1), ManagerOptions{LivenessTTL: 6 * time.Second})
	l, _, err := first.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	startRun(t, first)
	testenv.WaitFor(t, testenv.Slack, "liveness", first.Alive)

	clone := host(1)
	clone.PublicIP = netip.MustParseAddr("198.18.0.200") // another machine, same node ID
	err = f.manager(clone, ManagerOptions{LivenessTTL: 2 * time.Second}).ClaimNodeID(ctx(t))
	if !errors.Is(err, ErrDuplicateNode) || !strings.Contains(err.Error(), "--node-name") {
		t.Fatalf("second host with the same node ID: %v, want ErrDuplicateNode with advice", err)
	}
	stored, err := f.reg.Get(ctx(t), l.Subnets())
	if err != nil || stored.Attrs.PublicIP != host(1).PublicIP.String() || stored.ModRevision != l.ModRevision {
		t.Fatalf("the first host's lease was touched: %+v, %v", stored, err)
	}
}

func TestRestartAfterCrashIsNotADuplicate(t *testing.T) {
	f := newFixture(t, testNetwork)
	// A crashed overlayd of this same host left its liveness key behind, on
	// a lease far longer than the test's deadline: waiting for it to expire
	// would fail Acquire rather than pass slowly.
	grant, err := f.cli.Grant(ctx(t), int64(time.Hour/time.Second))
	if err != nil {
		t.Fatal(err)
	}
	val := fmt.Sprintf(`{"PublicIP":%q,"Hostname":"h","Since":"x"}`, host(1).PublicIP)
	if _, err := f.cli.Put(ctx(t), f.reg.NodeKey("node-1"), val, clientv3.WithLease(grant.ID)); err != nil {
		t.Fatal(err)
	}
	if err := f.manager(host(1), ManagerOptions{}).ClaimNodeID(ctx(t)); err != nil {
		t.Fatalf("restart on the same host: %v", err)
	}
}

func TestDeadHostsNodeIDIsFreedWhenItsKeyExpires(t *testing.T) {
	t.Parallel() // mostly waits on timers; it has its own etcd
	f := newFixture(t, testNetwork)
	grant, err := f.cli.Grant(ctx(t), 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.cli.Put(ctx(t), f.reg.NodeKey("node-1"), `{"PublicIP":"198.18.0.250"}`, clientv3.WithLease(grant.ID)); err != nil {
		t.Fatal(err)
	}
	// Nobody renews it: it expires within its TTL and the new host goes on.
	if err := f.manager(host(1), ManagerOptions{}).ClaimNodeID(ctx(t)); err != nil {
		t.Fatalf("after the dead host's key expired: %v", err)
	}
}

func TestLeaseRewrittenByCloneStopsRun(t *testing.T) {
	f := newFixture(t, testNetwork)
	m := f.manager(host(1), ManagerOptions{RetryInterval: 50 * time.Millisecond})
	l, _, err := m.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx(t)) }()
	clone := host(1)
	clone.PublicIP = netip.MustParseAddr("198.18.0.200")
	val, _ := subnet.NewAttrs(clone.PublicIP, subnet.DefaultBackendType, clone.BackendData, clone.NodeID, "").Marshal()
	if _, err := f.cli.Put(ctx(t), f.reg.LeaseKey(l.Subnets()), string(val)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrDuplicateNode) {
			t.Fatalf("Run = %v, want ErrDuplicateNode", err)
		}
	case <-time.After(testenv.Deadline(testenv.Slack)):
		t.Fatal("Run did not stop when a clone rewrote its lease")
	}
}

func TestGarbageOverOwnLeaseIsRestored(t *testing.T) {
	f := newFixture(t, testNetwork)
	m := f.manager(host(1), ManagerOptions{RetryInterval: 50 * time.Millisecond})
	l, _, err := m.Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	stop := startRun(t, m)
	for _, garbage := range []string{"{not json", "", "null", `{"PublicIP":7}`, `{"PublicIP":"239.1.2.3","BackendType":"vxlan"}`, `{"PublicIP":"0.0.0.0"}`} {
		if _, err := f.cli.Put(ctx(t), f.reg.LeaseKey(l.Subnets()), garbage); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 50*time.Millisecond+testenv.Slack, fmt.Sprintf("the lease to be restored after %q", garbage), func() bool {
			got, err := f.reg.Get(ctx(t), l.Subnets())
			return err == nil && got.Attrs.NodeID == "node-1" && got.EtcdLease == l.EtcdLease
		})
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v after garbage was written over its lease, want nil", err)
	}
}
