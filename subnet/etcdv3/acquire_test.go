package etcdv3

import (
	"context"
	"math"
	"net/netip"
	"runtime"
	"slices"
	"testing"

	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

// Acquire hands over the listing it chose from, so a daemon seeds its peers
// and its watch without listing again: the listing holds the other hosts'
// leases, and a watch resumed from it delivers what came after — our own
// new lease first.
func TestAcquireReturnsTheListingItChoseFrom(t *testing.T) {
	f := newFixture(t, testNetwork)
	var others []netip.Prefix
	for i := range 2 {
		l, _, err := f.manager(host(i), ManagerOptions{}).Acquire(ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		others = append(others, l.Subnet)
	}
	own, snap, err := f.manager(host(2), ManagerOptions{}).Acquire(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	var listed []netip.Prefix
	for _, l := range snap.Leases {
		listed = append(listed, l.Subnet)
	}
	slices.SortFunc(listed, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	slices.SortFunc(others, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	if !slices.Equal(listed, others) {
		t.Fatalf("listing = %v, want the other hosts' leases %v", listed, others)
	}
	if own.ModRevision <= snap.Revision {
		t.Fatalf("own lease at revision %d, listing at %d: the claim must come after the listing", own.ModRevision, snap.Revision)
	}

	wctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	batches := f.reg.Watch(wctx, snap, WatchOptions{})
	seen := false
	testenv.WaitFor(t, testenv.Slack, "the watch resumed from the listing delivers our own lease", func() bool {
		select {
		case b := <-batches:
			for _, ev := range b.Events {
				seen = seen || ev.Type == subnet.Added && ev.Lease.Subnet == own.Subnet
			}
		default:
		}
		return seen
	})
	cancel()
	for range batches { // the watch's goroutine ends by closing its channel
	}
}

// Acquiring a lease (Acquire, and AcquireFrom resuming a saved set) notes
// the subnet of every listed key, in Manager.listed: in maps sized for the
// listing, which then never grow (at 10,000 keys, growing them step by step
// allocated twice what they end up holding, at the start-up's peak), and
// only for the families the network carries (a map sized for IPv6 subnets
// in an IPv4-only network was as much again, for nothing).
func TestTakenSubnetsAreSizedForTheListing(t *testing.T) {
	const n = 4096
	var v4, dual, v6 Snapshot
	for i := range n {
		s4 := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 4), byte(i << 4)}), 28)
		s6 := netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0x10, 0x44, 0, 0, byte(i >> 8), byte(i)}), 64)
		v4.Leases = append(v4.Leases, subnet.Lease{Subnet: s4})
		dual.Leases = append(dual.Leases, subnet.Lease{Subnet: s4, IPv6Subnet: s6})
		v6.Leases = append(v6.Leases, subnet.Lease{IPv6Subnet: s6})
	}
	// MemStats counts every goroutine's allocations: the least of three
	// rounds is this code's.
	measure := func(f func()) (mallocs, bytes uint64) {
		mallocs, bytes = math.MaxUint64, math.MaxUint64
		for range 3 {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			f()
			runtime.ReadMemStats(&after)
			mallocs, bytes = min(mallocs, after.Mallocs-before.Mallocs), min(bytes, after.TotalAlloc-before.TotalAlloc)
		}
		return mallocs, bytes
	}
	// What one family's map of n subnets takes, made for n.
	var sink map[netip.Prefix]bool
	oneMapMallocs, oneMap := measure(func() {
		sink = make(map[netip.Prefix]bool, n)
		for _, l := range v4.Leases {
			sink[l.Subnet] = true
		}
	})
	for _, c := range []struct {
		name, network string
		snap          Snapshot
		maps          uint64
	}{
		{"IPv4 only", `{"Network":"10.244.0.0/16","SubnetLen":28}`, v4, 1},
		{"dual stack", `{"Network":"10.244.0.0/16","SubnetLen":28,"EnableIPv6":true,"IPv6Network":"fd00:10:44::/48"}`, dual, 2},
		{"IPv6 only", `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:44::/48"}`, v6, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := subnet.ParseConfig([]byte(c.network))
			if err != nil {
				t.Fatal(err)
			}
			m := NewManager(NewRegistry(nil, DefaultPrefix).For(cfg), cfg, Host{}, ManagerOptions{})
			var taken takenSubnets
			mallocs, bytes := measure(func() { taken = m.acq.listed(c.snap) })
			t.Logf("%d allocations, %d bytes", mallocs, bytes)
			if len(taken.v4)+len(taken.v6) != int(c.maps)*n {
				t.Fatalf("noted %d IPv4 and %d IPv6 subnets, want %d subnets of each family the network carries", len(taken.v4), len(taken.v6), n)
			}
			// A map grown key by key allocates dozens of times more than
			// one made for n.
			if limit := c.maps*oneMapMallocs + 4; mallocs > limit {
				t.Errorf("%d keys noted: %d allocations, want at most %d (%d map(s) made for them, %d each): a map grown key by key?", n, mallocs, limit, c.maps, oneMapMallocs)
			}
			if limit := c.maps*oneMap + oneMap/4; bytes > limit {
				t.Errorf("%d keys noted: %d bytes allocated, want at most %d (%d map(s) of %d bytes): a map grown key by key, or one for a family the network does not carry?", n, bytes, limit, c.maps, oneMap)
			}
		})
	}
	_ = sink
	t.Logf("one map of %d subnets: %d allocations, %d bytes", n, oneMapMallocs, oneMap)
}
