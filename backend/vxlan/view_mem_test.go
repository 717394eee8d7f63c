package vxlan

import (
	"net/netip"
	"runtime"
	"slices"
	"testing"
)

// viewBytesPerPeer is the live heap a view holds per peer once a cold
// start has written the n peers of family fam (an entry of each kind per
// peer, recorded as the writes succeed).
func viewBytesPerPeer(tb testing.TB, fam Family, n int) float64 {
	own, local := netip.MustParsePrefix("10.244.1.0/24"), netip.MustParseAddr("198.18.0.1")
	if fam == IPv6 {
		own, local = netip.MustParsePrefix("fd00:10:244:1::/64"), netip.MustParseAddr("2001:db8::1")
	}
	want, _, _ := validatePeers(benchPeers(fam, n), fam, own, local)
	if len(want) != n {
		tb.Fatalf("%d of %d %v peers are valid", len(want), n, fam)
	}
	env := diffEnv{Family: fam, Dev: tDev, Underlay: tUnderlay}
	first := diff(want, viewOf(kernelState{}, env, 0))
	ops := first.ops()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	v := viewOf(kernelState{}, env, n)
	for _, o := range ops {
		v.record(o)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(v)
	runtime.KeepAlive(ops)
	return float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
}

// A view of the IPv4 plane keeps its peers' addresses in 4 bytes: its
// memory per peer stays well under what 16-byte addresses cost (about 190
// bytes per peer at 10,000 peers).
func TestViewMemoryPerPeer(t *testing.T) {
	const n = 10000
	got := viewBytesPerPeer(t, IPv4, n)
	t.Logf("view of %d IPv4 peers: %.0f bytes per peer; IPv6: %.0f", n, got, viewBytesPerPeer(t, IPv6, n))
	if got > 120 {
		t.Errorf("a view of %d IPv4 peers holds %.0f bytes per peer, want at most 120", n, got)
	}
}

// BenchmarkViewMemory reports the live heap per peer of a view of 10,000
// peers of each family.
func BenchmarkViewMemory(b *testing.B) {
	for _, fam := range []Family{IPv4, IPv6} {
		b.Run(fam.String(), func(b *testing.B) {
			var per float64
			for b.Loop() {
				per = viewBytesPerPeer(b, fam, 10000)
			}
			b.ReportMetric(per, "B/peer")
		})
	}
}

// A view of either plane gives back every entry as it was listed or
// written, including those that do not fit in 4 bytes on the IPv4 plane
// (an IPv6 neighbour or FDB destination, an IPv4 route via an IPv6
// gateway, a 4-in-6 address, no address) and a MAC whose remotes move
// between families.
func TestViewKeepsEntriesOfEitherWidth(t *testing.T) {
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	ours := func(dst, gw string, link, scope int, onLink bool) Route {
		r := Route{Dst: pfx(dst), LinkIndex: link, OnLink: onLink, Protocol: RouteProtocol, Scope: scope, Priority: RouteMetric(pfx(dst))}
		if gw != "" {
			r.Gw = addr(gw)
		}
		return r
	}
	routes := []Route{
		ours("10.244.7.0/24", "10.244.7.0", tDev, 0, true),
		ours("10.244.8.0/24", "", tDev, scopeLink, false),
		ours("10.244.9.0/24", "fe80::1", tDev, 0, true),
		ours("10.244.10.0/24", "198.18.0.10", tUnderlay, 0, false),
		ours("::ffff:10.244.11.0/120", "::ffff:10.244.11.0", tDev, 0, true),
		ours("fd00:10:244:7::/64", "fd00:10:244:7::", tDev, 0, true),
	}
	odd := ours("10.244.12.0/24", "10.244.12.0", tDev, 0, true)
	odd.Priority++
	dup := routes[0]
	dup.OnLink = false
	neighs := []Neigh{
		{LinkIndex: tDev, IP: addr("10.244.7.0"), MAC: tMAC(1), State: NUDPermanent},
		{LinkIndex: tDev, IP: addr("fe80::1"), MAC: tMAC(2), State: 0x02},
		{LinkIndex: tDev, IP: addr("::ffff:10.244.11.0"), MAC: tMAC(3), State: NUDPermanent},
		{LinkIndex: tDev, MAC: tMAC(4), State: NUDPermanent},
	}
	fdbs := []FDB{
		{LinkIndex: tDev, MAC: tMAC(1), Dst: addr("198.18.0.7"), State: NUDPermanent},
		{LinkIndex: tDev, MAC: tMAC(2), Dst: addr("2001:db8::7"), State: NUDPermanent},
		{LinkIndex: tDev, MAC: tMAC(3), State: NUDPermanent},
		{LinkIndex: tDev, MAC: tMAC(5), Dst: addr("2001:db8::5"), State: NUDPermanent},
		{LinkIndex: tDev, MAC: tMAC(5), Dst: addr("198.18.0.5"), State: 0x02},
	}
	for _, fam := range []Family{IPv4, IPv6} {
		v := viewOf(kernelState{Routes: append(slices.Clone(routes), odd, dup), Neighs: neighs, FDBs: fdbs},
			diffEnv{Family: fam, Dev: tDev, Underlay: tUnderlay}, 10)
		for _, r := range routes {
			if got, ok := v.route(r.Dst); !ok || got != r {
				t.Errorf("%v: route(%s) = %+v %v, want %+v", fam, r.Dst, got, ok, r)
			}
		}
		if !slices.Equal(v.extra, []Route{odd, dup}) || v.oursLen() != len(routes) || len(slices.Collect(v.allOurs())) != len(routes) {
			t.Errorf("%v: extra %+v and %d routes of ours, want %+v and %d", fam, v.extra, v.oursLen(), []Route{odd, dup}, len(routes))
		}
		for _, n := range neighs {
			if got, ok := v.neigh(n.IP); !ok || got != n {
				t.Errorf("%v: neigh(%s) = %+v %v, want %+v", fam, n.IP, got, ok, n)
			}
		}
		if v.neighsLen() != len(neighs) || len(slices.Collect(v.allNeighs())) != len(neighs) {
			t.Errorf("%v: %d neighbours, want %d", fam, v.neighsLen(), len(neighs))
		}
		for _, f := range fdbs[:3] {
			if got := v.fdbAll(f.MAC); !slices.Equal(got, []FDB{f}) {
				t.Errorf("%v: fdbAll(%s) = %+v, want %+v", fam, f.MAC, got, f)
			}
		}
		if got := v.fdbAll(tMAC(5)); !slices.Equal(got, fdbs[3:]) {
			t.Errorf("%v: fdbAll(%s) = %+v, want %+v", fam, tMAC(5), got, fdbs[3:])
		}

		// A MAC's remote moves from an IPv4 to an IPv6 address and back;
		// a route's gateway changes family; entries go.
		to6 := FDB{LinkIndex: tDev, MAC: tMAC(1), Dst: addr("2001:db8::8"), State: NUDPermanent}
		v.record(op{kind: opFDBSet, fdb: to6})
		if got := v.fdbAll(tMAC(1)); !slices.Equal(got, []FDB{to6}) || v.fdbsLen() != 4 {
			t.Errorf("%v: after a move to %s: fdbAll = %+v, %d MACs", fam, to6.Dst, got, v.fdbsLen())
		}
		v.record(op{kind: opFDBSet, fdb: fdbs[0]})
		if got := v.fdbAll(tMAC(1)); !slices.Equal(got, fdbs[:1]) || v.fdbsLen() != 4 {
			t.Errorf("%v: after a move back: fdbAll = %+v, %d MACs", fam, got, v.fdbsLen())
		}
		via6 := routes[0]
		via6.Gw = addr("fe80::2")
		v.record(op{kind: opRouteSet, route: via6})
		if got, ok := v.route(via6.Dst); !ok || got != via6 || v.oursLen() != len(routes) {
			t.Errorf("%v: route(%s) after its gateway changed = %+v %v (%d routes)", fam, via6.Dst, got, ok, v.oursLen())
		}
		v.record(op{kind: opRouteDel, route: via6})
		v.record(op{kind: opNeighDel, neigh: neighs[1]})
		v.record(op{kind: opFDBDel, fdb: FDB{LinkIndex: tDev, MAC: tMAC(5)}})
		_, routeOK := v.route(via6.Dst)
		_, neighOK := v.neigh(neighs[1].IP)
		if routeOK || neighOK || v.fdbAll(tMAC(5)) != nil || v.oursLen() != len(routes)-1 || v.neighsLen() != len(neighs)-1 || v.fdbsLen() != 3 {
			t.Errorf("%v: deleted entries remain: route %v, neighbour %v, FDB %+v", fam, routeOK, neighOK, v.fdbAll(tMAC(5)))
		}
	}
}
