package etcdv3

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sync"
	"testing"

	"github.com/overlaynet/overlay/subnet"
)

// acquireAll starts n hosts acquiring at once against reg and returns the
// subnet each got.
func acquireAll(t *testing.T, reg *Registry, cfg *subnet.Config, n int, seed uint64, before func(i int)) []netip.Prefix {
	t.Helper()
	got := make([]netip.Prefix, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			m := NewManager(reg, cfg, host(i), ManagerOptions{Rand: rand.New(rand.NewPCG(seed, uint64(i)))})
			<-start
			if before != nil {
				before(i)
			}
			l, _, err := m.Acquire(ctx(t))
			got[i], errs[i] = l.Subnet, err
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("seed %d: host %d: %v", seed, i, err)
		}
	}
	return got
}

// assertNoDuplicates checks what the hosts were told and what etcd holds.
func assertNoDuplicates(t *testing.T, reg *Registry, got []netip.Prefix, seed uint64) {
	t.Helper()
	owner := map[netip.Prefix]int{}
	for i, p := range got {
		if j, dup := owner[p]; dup {
			t.Fatalf("seed %d: hosts %d and %d were both given %s", seed, j, i, p)
		}
		owner[p] = i
	}
	snap, err := reg.List(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range snap.Leases {
		i, ok := owner[l.Subnet]
		if !ok {
			continue // e.g. an unclaimed reservation
		}
		if l.Attrs.NodeID != host(i).NodeID {
			t.Fatalf("seed %d: etcd says %s belongs to %q, host %d was told it is its own", seed, l.Subnet, l.Attrs.NodeID, i)
		}
	}
}

// 100 hosts acquiring at once, 20 seeded runs: never a duplicate subnet.
func TestRaceManyHostsNeverShareASubnet(t *testing.T) {
	srv := newFixture(t, testNetwork)
	const runs, hosts = 20, 100
	for run := range runs {
		seed := uint64(run) + 1
		reg := NewRegistry(srv.cli, fmt.Sprintf("/race/%d", run))
		// A /24 network with /30 subnets: 63 subnets would be too few, so
		// use /16 but a narrow range to force collisions.
		cfg, err := reg.PutConfig(ctx(t), []byte(`{"Network":"10.244.0.0/16","SubnetMin":"10.244.1.0","SubnetMax":"10.244.140.0"}`))
		if err != nil {
			t.Fatal(err)
		}
		got := acquireAll(t, reg, cfg, hosts, seed, nil)
		assertNoDuplicates(t, reg, got, seed)
	}
	t.Logf("%d runs x %d hosts: no duplicates", runs, hosts)
}

// Reservations made while hosts are acquiring go to the host they name, or
// stay reserved; no other host ever takes a reserved subnet.
func TestRaceReservationsDuringAcquisition(t *testing.T) {
	f := newFixture(t, testNetwork)
	for run := range 5 {
		seed := uint64(run) + 100
		reg := NewRegistry(f.cli, fmt.Sprintf("/resv/%d", run))
		cfg, err := reg.PutConfig(ctx(t), []byte(`{"Network":"10.244.0.0/16","SubnetMin":"10.244.1.0","SubnetMax":"10.244.80.0"}`))
		if err != nil {
			t.Fatal(err)
		}
		reserved := map[netip.Prefix]string{}
		var mu sync.Mutex
		got := acquireAll(t, reg, cfg, 40, seed, func(i int) {
			if i%4 != 0 {
				return
			}
			// Every fourth host gets a reservation made just as it starts.
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(200 + i/4), 0}), 24)
			if _, err := reg.Create(ctx(t), subnet.Subnets{IPv4: p}, subnet.LeaseAttrs{PublicIP: host(i).PublicIP.String(), NodeID: host(i).NodeID}, 0); err == nil {
				mu.Lock()
				reserved[p] = host(i).NodeID
				mu.Unlock()
			}
		})
		assertNoDuplicates(t, reg, got, seed)
		for p, node := range reserved {
			l, err := reg.Get(ctx(t), subnet.Subnets{IPv4: p})
			if err != nil {
				t.Fatalf("seed %d: reservation %s vanished: %v", seed, p, err)
			}
			if !l.Reserved || l.Attrs.NodeID != node {
				t.Fatalf("seed %d: reservation %s for %s is now %+v", seed, p, node, l)
			}
			for i, g := range got {
				if g == p && host(i).NodeID != node {
					t.Fatalf("seed %d: host %d took %s reserved for %s", seed, i, p, node)
				}
			}
		}
	}
}
