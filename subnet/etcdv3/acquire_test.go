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

// Acquiring a lease notes the subnet of every listed key: in maps sized for
// the listing, which then never grow (at 10,000 keys, growing them step by
// step allocated twice what they end up holding, at the start-up's peak).
func TestTakenSubnetsAreSizedForTheListing(t *testing.T) {
	const n = 4096
	subnets := make([]subnet.Subnets, n)
	for i := range subnets {
		subnets[i] = subnet.Subnets{IPv4: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)}
	}
	// MemStats counts every goroutine's allocations (an etcd server of
	// another test may still be stopping): the fewest of three rounds is
	// this code's.
	least := uint64(math.MaxUint64)
	for range 3 {
		taken := newTakenSubnets(n, 0)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for _, s := range subnets {
			taken.add(s)
		}
		runtime.ReadMemStats(&after)
		least = min(least, after.Mallocs-before.Mallocs)
	}
	if least > 4 {
		t.Errorf("%d subnets noted: %d allocations, want next to none", n, least)
	}
}
