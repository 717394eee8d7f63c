package vxlan

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

const (
	tDev      = 10 // our device's index in the diff tests
	tUnderlay = 2
	tOther    = 7 // some other link, e.g. cni0
)

func tMAC(n int) MAC { return MAC{0x0e, 0, 0, 0, 0, byte(n)} }

func tSpec(n int) Peer {
	return Peer{
		Subnet:   netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", n)),
		PublicIP: netip.MustParseAddr(fmt.Sprintf("198.18.0.%d", n)),
		Data:     PeerData(tMAC(n)),
	}
}

// programmed is the kernel state a converged backend leaves for a peer.
func programmed(s Peer) kernelState {
	hop := s.Subnet.Addr()
	return kernelState{
		Routes: []Route{{Dst: s.Subnet, Gw: hop, LinkIndex: tDev, OnLink: true, Protocol: RouteProtocol, Priority: RouteMetric(s.Subnet)}},
		Neighs: []Neigh{{LinkIndex: tDev, IP: hop, MAC: PeerMAC(s), State: NUDPermanent}},
		FDBs:   []FDB{{LinkIndex: tDev, MAC: PeerMAC(s), Dst: s.PublicIP, State: NUDPermanent}},
	}
}

func merge(states ...kernelState) kernelState {
	var out kernelState
	for _, s := range states {
		out.Routes = append(out.Routes, s.Routes...)
		out.Neighs = append(out.Neighs, s.Neighs...)
		out.FDBs = append(out.FDBs, s.FDBs...)
	}
	return out
}

// underlayConnected is the kernel's route for the underlay's own subnet.
var underlayConnected = kernelState{Routes: []Route{
	{Dst: netip.MustParsePrefix("198.18.0.0/24"), LinkIndex: tUnderlay, Protocol: 2, Scope: scopeLink},
}}

// opStrings renders ops for comparison, leaving out the metric of routes
// that have the one RouteMetric gives their destination.
func opStrings(ops []op) []string {
	var s []string
	for _, o := range ops {
		if o.route.Priority == RouteMetric(o.route.Dst) {
			o.route.Priority = 0
		}
		s = append(s, o.String())
	}
	return s
}

// ourRoute is a route of ours as the reconciler writes it.
func ourRoute(dst, gw string, link int) Route {
	d := netip.MustParsePrefix(dst)
	return Route{Dst: d, Gw: netip.MustParseAddr(gw), LinkIndex: link, OnLink: link == tDev, Protocol: RouteProtocol, Priority: RouteMetric(d)}
}

func TestDiff(t *testing.T) {
	p2, p3 := tSpec(2), tSpec(3)
	p2newMAC := p2
	p2newMAC.Data = PeerData(tMAC(0x22))
	p2newIP := p2
	p2newIP.PublicIP = netip.MustParseAddr("198.18.0.222")
	p3far := p3
	p3far.PublicIP = netip.MustParseAddr("203.0.113.3") // not on the underlay's subnet

	// The IPv6 overlay's peers.
	q2, q3 := tSpec6(2), tSpec6(3)
	q2newMAC := q2
	q2newMAC.Data = PeerData(tMAC(0x22))
	q3far := q3
	q3far.PublicIP = netip.MustParseAddr("2001:db8:ffff::3") // not on the underlay's subnet

	foreignOnDev := Route{Dst: netip.MustParsePrefix("10.250.0.0/24"), LinkIndex: tDev, Protocol: 4}
	foreignSameDst := Route{Dst: p3.Subnet, Gw: netip.MustParseAddr("192.0.2.1"), LinkIndex: tOther, Protocol: 4}
	oursElsewhere := ourRoute("10.244.9.0/24", "10.244.9.0", tOther)

	tests := []struct {
		name   string
		want   []Peer
		have   kernelState
		direct bool
		ops    []string
		confl  []netip.Prefix
	}{
		{
			name: "empty",
		},
		{
			name: "add two peers: neighbour, FDB, route in that order",
			want: []Peer{p2, p3},
			ops: []string{
				"neigh-set 10.244.2.0 lladdr 0e:00:00:00:00:02 dev 10 state 0x80",
				"neigh-set 10.244.3.0 lladdr 0e:00:00:00:00:03 dev 10 state 0x80",
				"fdb-set 0e:00:00:00:00:02 dst 198.18.0.2 dev 10 state 0x80",
				"fdb-set 0e:00:00:00:00:03 dst 198.18.0.3 dev 10 state 0x80",
				"route-set 10.244.2.0/24 via 10.244.2.0 dev 10 onlink proto 115",
				"route-set 10.244.3.0/24 via 10.244.3.0 dev 10 onlink proto 115",
			},
		},
		{
			name: "converged: nothing to do",
			want: []Peer{p2, p3},
			have: merge(programmed(p2), programmed(p3), underlayConnected),
		},
		{
			name: "remove a peer: route, FDB, neighbour in that order",
			want: []Peer{p2},
			have: merge(programmed(p2), programmed(p3)),
			ops: []string{
				"route-del 10.244.3.0/24 via 10.244.3.0 dev 10 onlink proto 115",
				"fdb-del 0e:00:00:00:00:03 dst 198.18.0.3 dev 10 state 0x80",
				"neigh-del 10.244.3.0 lladdr 0e:00:00:00:00:03 dev 10 state 0x80",
			},
		},
		{
			name: "MAC change replaces the neighbour and drops the old FDB entry",
			want: []Peer{p2newMAC},
			have: programmed(p2),
			ops: []string{
				"fdb-del 0e:00:00:00:00:02 dst 198.18.0.2 dev 10 state 0x80",
				"neigh-set 10.244.2.0 lladdr 0e:00:00:00:00:22 dev 10 state 0x80",
				"fdb-set 0e:00:00:00:00:22 dst 198.18.0.2 dev 10 state 0x80",
			},
		},
		{
			name: "public IP change rewrites the FDB entry only",
			want: []Peer{p2newIP},
			have: programmed(p2),
			ops:  []string{"fdb-set 0e:00:00:00:00:02 dst 198.18.0.222 dev 10 state 0x80"},
		},
		{
			name:   "DirectRouting on: peer on the underlay subnet gets a direct route, its VXLAN entries go",
			want:   []Peer{p2, p3far},
			have:   merge(programmed(p2), programmed(p3far), underlayConnected),
			direct: true,
			ops: []string{
				"fdb-del 0e:00:00:00:00:02 dst 198.18.0.2 dev 10 state 0x80",
				"neigh-del 10.244.2.0 lladdr 0e:00:00:00:00:02 dev 10 state 0x80",
				"route-set 10.244.2.0/24 via 198.18.0.2 dev 2 proto 115",
			},
		},
		{
			name: "DirectRouting off again: back to VXLAN",
			want: []Peer{p2},
			have: merge(underlayConnected, kernelState{Routes: []Route{
				ourRoute("10.244.2.0/24", "198.18.0.2", tUnderlay),
			}}),
			ops: []string{
				"neigh-set 10.244.2.0 lladdr 0e:00:00:00:00:02 dev 10 state 0x80",
				"fdb-set 0e:00:00:00:00:02 dst 198.18.0.2 dev 10 state 0x80",
				"route-set 10.244.2.0/24 via 10.244.2.0 dev 10 onlink proto 115",
			},
		},
		{
			name:   "DirectRouting converged",
			want:   []Peer{p2},
			direct: true,
			have: merge(underlayConnected, kernelState{Routes: []Route{
				ourRoute("10.244.2.0/24", "198.18.0.2", tUnderlay),
			}}),
		},
		{
			name: "stale entries on the device are removed, the kernel's own neighbours are not",
			want: []Peer{p2},
			have: merge(programmed(p2), kernelState{
				Routes: []Route{ourRoute("10.244.8.0/24", "10.244.8.0", tDev)},
				Neighs: []Neigh{
					{LinkIndex: tDev, IP: netip.MustParseAddr("10.244.8.0"), MAC: tMAC(8), State: NUDPermanent},
					{LinkIndex: tDev, IP: netip.MustParseAddr("10.244.9.9"), MAC: tMAC(9), State: 0x02}, // reachable
				},
				FDBs: []FDB{
					{LinkIndex: tDev, MAC: tMAC(8), Dst: netip.MustParseAddr("198.18.0.8"), State: NUDPermanent},
					{LinkIndex: tDev, MAC: MAC{}, Dst: netip.MustParseAddr("198.18.0.99"), State: NUDPermanent},
				},
			}),
			ops: []string{
				"route-del 10.244.8.0/24 via 10.244.8.0 dev 10 onlink proto 115",
				"fdb-del 00:00:00:00:00:00 dst 198.18.0.99 dev 10 state 0x80",
				"fdb-del 0e:00:00:00:00:08 dst 198.18.0.8 dev 10 state 0x80",
				"neigh-del 10.244.8.0 lladdr 0e:00:00:00:00:08 dev 10 state 0x80",
			},
		},
		{
			name: "other programs' routes, other links' entries, our protocol elsewhere: left alone",
			want: []Peer{p2},
			have: merge(programmed(p2), kernelState{
				Routes: []Route{foreignOnDev, oursElsewhere},
				Neighs: []Neigh{{LinkIndex: tOther, IP: netip.MustParseAddr("10.244.8.0"), MAC: tMAC(8), State: NUDPermanent}},
				FDBs:   []FDB{{LinkIndex: tOther, MAC: tMAC(8), Dst: netip.MustParseAddr("198.18.0.8"), State: NUDPermanent}},
			}),
		},
		{
			name:  "a foreign route holding a peer's subnet is a conflict, not overwritten",
			want:  []Peer{p3},
			have:  kernelState{Routes: []Route{foreignSameDst}},
			confl: []netip.Prefix{p3.Subnet},
			ops: []string{
				"neigh-set 10.244.3.0 lladdr 0e:00:00:00:00:03 dev 10 state 0x80",
				"fdb-set 0e:00:00:00:00:03 dst 198.18.0.3 dev 10 state 0x80",
			},
		},
		{
			name: "drift: wrong neighbour MAC, non-permanent FDB, route on the wrong gateway",
			want: []Peer{p2},
			have: kernelState{
				Routes: []Route{ourRoute("10.244.2.0/24", "10.244.2.1", tDev)},
				Neighs: []Neigh{{LinkIndex: tDev, IP: p2.Subnet.Addr(), MAC: tMAC(0x99), State: NUDPermanent}},
				FDBs:   []FDB{{LinkIndex: tDev, MAC: PeerMAC(p2), Dst: p2.PublicIP, State: 0x02}},
			},
			ops: []string{
				"neigh-set 10.244.2.0 lladdr 0e:00:00:00:00:02 dev 10 state 0x80",
				"fdb-set 0e:00:00:00:00:02 dst 198.18.0.2 dev 10 state 0x80",
				"route-set 10.244.2.0/24 via 10.244.2.0 dev 10 onlink proto 115",
			},
		},
		{
			name: "extra remotes appended to a wanted MAC are pruned after the set",
			want: []Peer{p2newIP},
			have: merge(programmed(p2), kernelState{FDBs: []FDB{
				{LinkIndex: tDev, MAC: PeerMAC(p2), Dst: netip.MustParseAddr("198.18.0.77"), State: NUDPermanent},
			}}),
			ops: []string{
				"fdb-set 0e:00:00:00:00:02 dst 198.18.0.222 dev 10 state 0x80",
				"fdb-prune 0e:00:00:00:00:02 dst 198.18.0.2 dev 10 state 0x80",
				"fdb-prune 0e:00:00:00:00:02 dst 198.18.0.77 dev 10 state 0x80",
			},
		},
		{
			name: "a second route of ours to a wanted destination is pruned",
			want: []Peer{p2},
			have: merge(programmed(p2), kernelState{Routes: []Route{
				{Dst: p2.Subnet, Gw: p2.Subnet.Addr(), LinkIndex: tDev, OnLink: true, Protocol: RouteProtocol, Priority: 100},
			}}),
			ops: []string{"route-prune 10.244.2.0/24 via 10.244.2.0 dev 10 onlink proto 115 metric 100"},
		},
		{
			name: "a route at an old metric is replaced: new one first, then the old one goes",
			want: []Peer{p2},
			have: kernelState{
				Routes: []Route{{Dst: p2.Subnet, Gw: p2.Subnet.Addr(), LinkIndex: tDev, OnLink: true, Protocol: RouteProtocol}},
				Neighs: programmed(p2).Neighs,
				FDBs:   programmed(p2).FDBs,
			},
			ops: []string{
				"route-set 10.244.2.0/24 via 10.244.2.0 dev 10 onlink proto 115",
				"route-prune 10.244.2.0/24 via 10.244.2.0 dev 10 onlink proto 115",
			},
		},
		{
			name: "another program's route with a higher metric does not conflict",
			want: []Peer{p3},
			have: merge(kernelState{Routes: []Route{{Dst: p3.Subnet, Gw: netip.MustParseAddr("192.0.2.1"), LinkIndex: tOther, Protocol: 4, Priority: 1 << 20}}}),
			ops: []string{
				"neigh-set 10.244.3.0 lladdr 0e:00:00:00:00:03 dev 10 state 0x80",
				"fdb-set 0e:00:00:00:00:03 dst 198.18.0.3 dev 10 state 0x80",
				"route-set 10.244.3.0/24 via 10.244.3.0 dev 10 onlink proto 115",
			},
		},
		{
			name:  "a conflict appearing next to our route: reported, both left alone",
			want:  []Peer{p3},
			have:  merge(programmed(p3), kernelState{Routes: []Route{foreignSameDst}}),
			confl: []netip.Prefix{p3.Subnet},
		},
		{
			name: "IPv6: add two peers: neighbour, FDB, route in that order",
			want: []Peer{q2, q3},
			ops: []string{
				"neigh-set fd00:10:244:2:: lladdr 0e:00:00:00:06:02 dev 10 state 0x80",
				"neigh-set fd00:10:244:3:: lladdr 0e:00:00:00:06:03 dev 10 state 0x80",
				"fdb-set 0e:00:00:00:06:02 dst 2001:db8::2 dev 10 state 0x80",
				"fdb-set 0e:00:00:00:06:03 dst 2001:db8::3 dev 10 state 0x80",
				"route-set fd00:10:244:2::/64 via fd00:10:244:2:: dev 10 onlink proto 115",
				"route-set fd00:10:244:3::/64 via fd00:10:244:3:: dev 10 onlink proto 115",
			},
		},
		{
			name: "IPv6: converged: nothing to do",
			want: []Peer{q2, q3},
			have: merge(programmed(q2), programmed(q3), underlayConnected6),
		},
		{
			name: "IPv6: remove a peer: route, FDB, neighbour; the kernel's own neighbours stay",
			want: []Peer{q2},
			have: merge(programmed(q2), programmed(q3), kernelState{Neighs: []Neigh{
				{LinkIndex: tDev, IP: netip.MustParseAddr("ff02::16"), MAC: MAC{0x33, 0x33, 0, 0, 0, 0x16}, State: 0x40}, // NOARP
			}}),
			ops: []string{
				"route-del fd00:10:244:3::/64 via fd00:10:244:3:: dev 10 onlink proto 115",
				"fdb-del 0e:00:00:00:06:03 dst 2001:db8::3 dev 10 state 0x80",
				"neigh-del fd00:10:244:3:: lladdr 0e:00:00:00:06:03 dev 10 state 0x80",
			},
		},
		{
			name: "IPv6: MAC change replaces the neighbour and drops the old FDB entry",
			want: []Peer{q2newMAC},
			have: programmed(q2),
			ops: []string{
				"fdb-del 0e:00:00:00:06:02 dst 2001:db8::2 dev 10 state 0x80",
				"neigh-set fd00:10:244:2:: lladdr 0e:00:00:00:00:22 dev 10 state 0x80",
				"fdb-set 0e:00:00:00:00:22 dst 2001:db8::2 dev 10 state 0x80",
			},
		},
		{
			name:   "IPv6 DirectRouting: a peer on the underlay's subnet (a connected route has no scope) is routed directly",
			want:   []Peer{q2, q3far},
			have:   merge(programmed(q2), programmed(q3far), underlayConnected6),
			direct: true,
			ops: []string{
				"fdb-del 0e:00:00:00:06:02 dst 2001:db8::2 dev 10 state 0x80",
				"neigh-del fd00:10:244:2:: lladdr 0e:00:00:00:06:02 dev 10 state 0x80",
				"route-set fd00:10:244:2::/64 via 2001:db8::2 dev 2 proto 115",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := diff(tt.want, viewOf(tt.have, diffEnv{Dev: tDev, Underlay: tUnderlay, DirectRouting: tt.direct}, 0))
			if d := cmp.Diff(tt.ops, opStrings(p.ops())); d != "" {
				t.Errorf("ops (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tt.confl, p.conflicts, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
				t.Errorf("conflicts (-want +got):\n%s", d)
			}
		})
	}
}

// TestDiffApplyConverges applies plans to a tiny model of the kernel and
// checks that a second diff is empty, for every pair of scenarios.
func TestDiffIsIdempotentAfterApply(t *testing.T) {
	sets := [][]Peer{nil, {tSpec(2)}, {tSpec(2), tSpec(3)}, {func() Peer { s := tSpec(2); s.Data = PeerData(tMAC(0x22)); return s }()}}
	for i, from := range sets {
		for j, to := range sets {
			t.Run(fmt.Sprintf("%d->%d", i, j), func(t *testing.T) {
				env := diffEnv{Dev: tDev, Underlay: tUnderlay}
				var k kernelState
				pf := diff(from, viewOf(k, env, 0))
				k = applyModel(k, pf.ops())
				pt := diff(to, viewOf(k, env, 0))
				k = applyModel(k, pt.ops())
				if p2 := diff(to, viewOf(k, env, 0)); len(p2.ops()) != 0 {
					ops := p2.ops()
					t.Fatalf("not converged, still: %v", opStrings(ops))
				}
			})
		}
	}
}

// The view is the one kernel model: after a plan's writes, the view they
// updated equals a fresh listing's, and a pass that diffs only the changed
// peers against it (a lease event) leaves the kernel as a full pass would.
func TestViewFollowsWritesAndScopedDiffConverges(t *testing.T) {
	moved := tSpec(3)
	moved.PublicIP = netip.MustParseAddr("198.18.9.9")
	remac := tSpec(2)
	remac.Data = PeerData(tMAC(0x22))
	moved6 := tSpec6(3)
	moved6.PublicIP = netip.MustParseAddr("2001:db8::99")
	remac6 := tSpec6(2)
	remac6.Data = PeerData(tMAC(0x22))
	setsOf := map[Family][][]Peer{
		IPv4: {nil, {tSpec(2)}, {tSpec(2), tSpec(3)}, {remac, moved, tSpec(4)}, {tSpec(4)}},
		IPv6: {nil, {tSpec6(2)}, {tSpec6(2), tSpec6(3)}, {remac6, moved6, tSpec6(0x10)}, {tSpec6(0x10)}},
	}
	env := diffEnv{Dev: tDev, Underlay: tUnderlay}
	cmpView := cmp.Options{cmp.AllowUnexported(view{}, vroute{}, vroute4{}, vneigh{}, vfdb{}, vfdb4{}, ip16{}, prefix16{}, prefix4{}), cmpopts.EquateEmpty(),
		cmp.Comparer(func(a, b netip.Prefix) bool { return a == b }), cmp.Comparer(func(a, b netip.Addr) bool { return a == b })}
	for fam, sets := range setsOf {
		for i, from := range sets {
			for j, to := range sets {
				t.Run(fmt.Sprintf("%v/%d->%d", fam, i, j), func(t *testing.T) {
					first := diff(from, viewOf(kernelState{}, env, 0))
					k := applyModel(kernelState{}, first.ops())
					v := viewOf(k, env, 0)
					gone, come := specDelta(from, to)
					scoped := diff(come, v.scoped(gone, come))
					for _, o := range scoped.ops() {
						k = applyModel(k, []op{o})
						v.record(o)
					}
					if d := cmp.Diff(viewOf(k, env, 0), v, cmpView); d != "" {
						t.Errorf("view after the writes differs from a listing (-listed +view):\n%s", d)
					}
					if again := diff(to, viewOf(k, env, 0)); len(again.ops()) != 0 {
						t.Errorf("a full pass after the scoped one still plans %v", opStrings(again.ops()))
					}
				})
			}
		}
	}
}

func applyModel(k kernelState, ops []op) kernelState {
	for _, o := range ops {
		switch o.kind {
		case opRouteSet:
			k.Routes = append(delRoute(k.Routes, o.route.Dst), o.route)
		case opRouteDel:
			k.Routes = delRoute(k.Routes, o.route.Dst)
		case opNeighSet, opNeighDel:
			var out []Neigh
			for _, n := range k.Neighs {
				if n.IP != o.neigh.IP {
					out = append(out, n)
				}
			}
			if o.kind == opNeighSet {
				out = append(out, o.neigh)
			}
			k.Neighs = out
		case opFDBSet, opFDBDel, opFDBPrune:
			var out []FDB
			for _, f := range k.FDBs {
				if f.MAC != o.fdb.MAC {
					out = append(out, f)
				}
			}
			if o.kind == opFDBSet {
				out = append(out, o.fdb)
			}
			k.FDBs = out
		}
	}
	return k
}

func delRoute(rs []Route, dst netip.Prefix) []Route {
	var out []Route
	for _, r := range rs {
		if r.Dst != dst {
			out = append(out, r)
		}
	}
	return out
}

// TestValidatePeers covers what the backend checks: this host and the set,
// for either family. The values of each peer are validated where the lease
// enters (subnet.TestPeerValidation: prefix length, public IP, MAC).
func TestValidatePeers(t *testing.T) {
	own := map[Family]netip.Prefix{IPv4: netip.MustParsePrefix("10.244.1.0/24"), IPv6: netip.MustParsePrefix("fd00:10:244:1::/64")}
	local := map[Family]netip.Addr{IPv4: netip.MustParseAddr("198.18.0.1"), IPv6: netip.MustParseAddr("2001:db8::1")}
	spec := map[Family]func(int) Peer{IPv4: tSpec, IPv6: tSpec6}
	mod := func(fam Family, n int, f func(*Peer)) Peer { p := spec[fam](n); f(&p); return p }
	tests := []struct {
		name   string
		fam    Family
		peer   Peer
		reason string
	}{
		{"IPv6 subnet", IPv4, mod(IPv4, 5, func(p *Peer) { p.Subnet = netip.MustParsePrefix("fd00::/64") }), "not an IPv4 peer with a VTEP MAC"},
		{"IPv6 peer", IPv4, tSpec6(5), "not an IPv4 peer with a VTEP MAC"},
		{"no public IP", IPv4, mod(IPv4, 5, func(p *Peer) { p.PublicIP = netip.Addr{} }), "not an IPv4 peer with a VTEP MAC"},
		{"no MAC", IPv4, mod(IPv4, 5, func(p *Peer) { p.Data = PeerData(MAC{}) }), "not an IPv4 peer with a VTEP MAC"},
		{"our public IP", IPv4, mod(IPv4, 5, func(p *Peer) { p.PublicIP = local[IPv4] }), "public IP is our own"},
		{"our subnet", IPv4, mod(IPv4, 5, func(p *Peer) { p.Subnet = own[IPv4] }), "subnet overlaps our own lease"},
		{"duplicate subnet", IPv4, mod(IPv4, 2, func(p *Peer) { p.Data = PeerData(tMAC(0x55)) }), "duplicate subnet"},
		{"same network address", IPv4, mod(IPv4, 2, func(p *Peer) {
			p.Subnet = netip.MustParsePrefix("10.244.2.0/25")
			p.Data = PeerData(tMAC(0x55))
		}), "network address used by another peer's subnet"},
		{"duplicate MAC", IPv4, mod(IPv4, 5, func(p *Peer) { p.Data = PeerData(tMAC(2)) }), "VTEP MAC used by another peer"},

		{"IPv4 peer", IPv6, tSpec(5), "not an IPv6 peer with a VTEP MAC"},
		{"IPv4 public IP", IPv6, mod(IPv6, 5, func(p *Peer) { p.PublicIP = netip.MustParseAddr("198.18.0.5") }), "not an IPv6 peer with a VTEP MAC"},
		{"IPv4-mapped public IP", IPv6, mod(IPv6, 5, func(p *Peer) { p.PublicIP = netip.MustParseAddr("::ffff:198.18.0.5") }), "not an IPv6 peer with a VTEP MAC"},
		{"IPv4-mapped subnet", IPv6, mod(IPv6, 5, func(p *Peer) { p.Subnet = netip.MustParsePrefix("::ffff:10.244.5.0/120") }), "not an IPv6 peer with a VTEP MAC"},
		{"zoned public IP", IPv6, mod(IPv6, 5, func(p *Peer) { p.PublicIP = netip.MustParseAddr("fe80::5%ul0") }), "not an IPv6 peer with a VTEP MAC"},
		{"no public IPv6", IPv6, mod(IPv6, 5, func(p *Peer) { p.PublicIP = netip.Addr{} }), "not an IPv6 peer with a VTEP MAC"},
		{"no subnet", IPv6, mod(IPv6, 5, func(p *Peer) { p.Subnet = netip.Prefix{} }), "not an IPv6 peer with a VTEP MAC"},
		{"no MAC on IPv6", IPv6, mod(IPv6, 5, func(p *Peer) { p.Data = PeerData(MAC{}) }), "not an IPv6 peer with a VTEP MAC"},
		{"our public IPv6", IPv6, mod(IPv6, 5, func(p *Peer) { p.PublicIP = local[IPv6] }), "public IP is our own"},
		{"our IPv6 subnet", IPv6, mod(IPv6, 5, func(p *Peer) { p.Subnet = own[IPv6] }), "subnet overlaps our own lease"},
		{"inside our IPv6 subnet", IPv6, mod(IPv6, 5, func(p *Peer) { p.Subnet = netip.MustParsePrefix("fd00:10:244:1:8000::/80") }), "subnet overlaps our own lease"},
		{"duplicate IPv6 subnet", IPv6, mod(IPv6, 2, func(p *Peer) { p.Data = PeerData(tMAC(0x55)) }), "duplicate subnet"},
		{"same IPv6 network address", IPv6, mod(IPv6, 2, func(p *Peer) {
			p.Subnet = netip.MustParsePrefix("fd00:10:244:2::/80")
			p.Data = PeerData(tMAC(0x55))
		}), "network address used by another peer's subnet"},
		{"duplicate MAC on IPv6", IPv6, mod(IPv6, 5, func(p *Peer) { p.Data = tSpec6(2).Data }), "VTEP MAC used by another peer"},
	}
	for _, tt := range tests {
		t.Run(tt.fam.String()+"/"+tt.name, func(t *testing.T) {
			good := spec[tt.fam]
			specs, rejected, _ := validatePeers([]Peer{good(3), good(2), tt.peer}, tt.fam, own[tt.fam], local[tt.fam])
			if d := cmp.Diff([]Peer{good(2), good(3)}, specs, cmp.Comparer(func(a, b Peer) bool { return a == b })); d != "" {
				t.Errorf("specs (-want +got):\n%s", d)
			}
			if len(rejected) != 1 {
				t.Fatalf("rejected = %v, want one", rejected)
			}
			for _, why := range rejected {
				if why != tt.reason {
					t.Errorf("reason = %q, want %q", why, tt.reason)
				}
			}
		})
	}
}

func TestCompareDevice(t *testing.T) {
	want := Link{Name: "overlay.1", Kind: "vxlan", MTU: 1450, MAC: tMAC(1), Up: true, VNI: 1, Port: 8472,
		Local: netip.MustParseAddr("198.18.0.1"), UnderlayIndex: 2}
	addr := netip.MustParsePrefix("10.244.1.0/32")
	other := netip.MustParsePrefix("10.244.9.0/32")
	mod := func(f func(*Link)) Link { l := want; l.Index = 5; f(&l); return l }
	tests := []struct {
		name   string
		have   Link
		addrs  []netip.Prefix
		want   deviceDiff
		reason string
	}{
		{"matches", mod(func(*Link) {}), []netip.Prefix{addr}, deviceDiff{}, ""},
		{"wrong kind", mod(func(l *Link) { l.Kind = "dummy" }), nil, deviceDiff{Recreate: "kind is dummy, want vxlan"}, "kind is dummy, want vxlan"},
		{"wrong port and VNI", mod(func(l *Link) { l.Port = 4789; l.VNI = 2 }), nil,
			deviceDiff{Recreate: "VNI is 2, want 1; port is 4789, want 8472"}, "VNI is 2, want 1; port is 4789, want 8472"},
		{"wrong local", mod(func(l *Link) { l.Local = netip.MustParseAddr("198.18.0.9") }), nil,
			deviceDiff{Recreate: "local address is 198.18.0.9, want 198.18.0.1"}, "local address is 198.18.0.9, want 198.18.0.1"},
		{"learning", mod(func(l *Link) { l.Learning = true }), nil, deviceDiff{Recreate: "learning is true, want false"}, "learning is true, want false"},
		{"underlay", mod(func(l *Link) { l.UnderlayIndex = 3 }), nil, deviceDiff{Recreate: "underlay link index is 3, want 2"}, "underlay link index is 3, want 2"},
		{"fixable: MTU, MAC, down, addresses", mod(func(l *Link) { l.MTU = 1400; l.MAC = tMAC(9); l.Up = false }), []netip.Prefix{other},
			deviceDiff{SetMTU: true, SetMAC: true, SetUp: true, AddAddr: true, DelAddr: []netip.Prefix{other}},
			"wrong MTU, wrong MAC, address missing, foreign addresses [10.244.9.0/32], down"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := compareDevice(want, tt.have, addr, tt.addrs)
			if d := cmp.Diff(tt.want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
				t.Errorf("diff (-want +got):\n%s", d)
			}
			if got.Reason() != tt.reason {
				t.Errorf("Reason() = %q, want %q", got.Reason(), tt.reason)
			}
		})
	}
}

func TestVtepMAC(t *testing.T) {
	a1, a2, b := VtepMAC("node-a", 1), VtepMAC("node-a", 1), VtepMAC("node-b", 1)
	if a1.String() != a2.String() {
		t.Errorf("not stable: %s vs %s", a1, a2)
	}
	if a1.String() == b.String() || a1.String() == VtepMAC("node-a", 2).String() {
		t.Errorf("not distinct per node and VNI")
	}
	for _, m := range []net.HardwareAddr{a1, b} {
		if len(m) != 6 || m[0]&0x01 != 0 || m[0]&0x02 == 0 {
			t.Errorf("%s is not a locally administered unicast MAC", m)
		}
	}
}

func TestRetryDump(t *testing.T) {
	calls := 0
	flaky := func(fails int, err error) func() ([]int, error) {
		calls = 0
		return func() ([]int, error) {
			calls++
			if calls <= fails {
				return []int{-1}, err
			}
			return []int{1, 2}, nil
		}
	}
	if got, err := retryDump(flaky(maxDumpAttempts-1, ErrDumpInterrupted)); err != nil || len(got) != 2 {
		t.Errorf("interrupted %d times: got %v, %v; want the full listing", maxDumpAttempts-1, got, err)
	}
	if _, err := retryDump(flaky(maxDumpAttempts-1, syscall.EINTR)); err != nil {
		t.Errorf("EINTR is retried too: %v", err)
	}
	if _, err := retryDump(flaky(maxDumpAttempts, ErrDumpInterrupted)); !errors.Is(err, ErrDumpInterrupted) || calls != maxDumpAttempts {
		t.Errorf("always interrupted: err %v after %d calls, want ErrDumpInterrupted after %d", err, calls, maxDumpAttempts)
	}
	if _, err := retryDump(flaky(1, syscall.EPERM)); !errors.Is(err, syscall.EPERM) || calls != 1 {
		t.Errorf("EPERM: err %v after %d calls, want it at once", err, calls)
	}
}

func TestWriteErrorUnwraps(t *testing.T) {
	err := error(&WriteError{Failed: 1, Total: 3, First: fmt.Errorf("route-set x: %w", syscall.EBUSY)})
	if !errors.Is(err, syscall.EBUSY) || !strings.Contains(err.Error(), "1 of 3 kernel writes failed") {
		t.Errorf("err = %v", err)
	}
}

func TestSpecDelta(t *testing.T) {
	s2, s3, s4 := tSpec(2), tSpec(3), tSpec(4)
	s3b := s3
	s3b.Data = PeerData(tMAC(0x33))
	for _, tt := range []struct {
		name             string
		old, new         []Peer
		wantGone, wantIn []Peer
	}{
		{"same", []Peer{s2, s3}, []Peer{s2, s3}, nil, nil},
		{"from nothing", nil, []Peer{s2, s3}, nil, []Peer{s2, s3}},
		{"to nothing", []Peer{s2, s3}, nil, []Peer{s2, s3}, nil},
		{"one leaves, one comes, one changes", []Peer{s2, s3}, []Peer{s3b, s4}, []Peer{s2, s3}, []Peer{s3b, s4}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			gone, come := specDelta(tt.old, tt.new)
			if d := cmp.Diff(tt.wantGone, gone, cmp.Comparer(func(a, b Peer) bool { return a == b })); d != "" {
				t.Errorf("gone (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tt.wantIn, come, cmp.Comparer(func(a, b Peer) bool { return a == b })); d != "" {
				t.Errorf("come (-want +got):\n%s", d)
			}
		})
	}
}

// The notification filter: a deleted entry wakes a pass only if a desired
// peer needs it, or if the notification does not say which entry it was.
func TestWantsOnlyDesiredPeersEntries(t *testing.T) {
	p := tSpec(2)
	_, _, idx := validatePeers([]Peer{{Subnet: p.Subnet, PublicIP: p.PublicIP, Data: p.Data}}, IPv4, netip.Prefix{}, netip.Addr{})
	b := &Backend{}
	if b.wants(Event{Kind: EventRouteDel, Dst: p.Subnet}) {
		t.Errorf("no peers desired yet, but a deletion wants a pass")
	}
	b.wanted.Store(&idx)
	other := tSpec(9)
	for _, tt := range []struct {
		e    Event
		want bool
	}{
		{Event{Kind: EventRouteDel, Dst: p.Subnet}, true},
		{Event{Kind: EventRouteDel, Dst: other.Subnet}, false},
		{Event{Kind: EventNeighDel, IP: p.Subnet.Addr()}, true},
		{Event{Kind: EventNeighDel, IP: other.Subnet.Addr()}, false},
		{Event{Kind: EventNeighDel, FDB: true, MAC: PeerMAC(p)}, true},
		{Event{Kind: EventNeighDel, FDB: true, MAC: PeerMAC(other)}, false},
		{Event{Kind: EventRouteDel}, true},            // which route: unknown
		{Event{Kind: EventNeighDel, FDB: true}, true}, // which MAC: unknown
	} {
		if got := b.wants(tt.e); got != tt.want {
			t.Errorf("wants(%+v) = %v, want %v", tt.e, got, tt.want)
		}
	}
}

// The view packs addresses and prefixes of both families without loss:
// every entry it gives back is the one it was given.
func TestViewPacksAddressesOfBothFamilies(t *testing.T) {
	for _, s := range []string{"10.244.7.0", "0.0.0.0", "255.255.255.255", "fd00:10:244:7::", "::", "::ffff:10.1.2.3", "fe80::1"} {
		a := netip.MustParseAddr(s)
		if got := packIP(a).addr(); got != a {
			t.Errorf("packIP(%s).addr() = %s", a, got)
		}
		for _, bits := range []int{0, 24, a.BitLen()} {
			p := netip.PrefixFrom(a, bits)
			if got := packPrefix(p).prefix(); got != p {
				t.Errorf("packPrefix(%s).prefix() = %s", p, got)
			}
		}
	}
	if got := packIP(netip.Addr{}).addr(); got.IsValid() {
		t.Errorf("the zero address came back as %s", got)
	}
	v := newView(diffEnv{Dev: tDev, Underlay: tUnderlay}, 0, 0, 0)
	r := Route{Dst: netip.MustParsePrefix("fd00:10:244:7::/64"), Gw: netip.MustParseAddr("fd00:10:244:7::"), LinkIndex: tDev, OnLink: true,
		Protocol: RouteProtocol, Priority: RouteMetric(netip.MustParsePrefix("fd00:10:244:7::/64"))}
	v.record(op{kind: opRouteSet, route: r})
	if got, ok := v.route(r.Dst); !ok || got != r {
		t.Errorf("route back from the view: %v %v, want %v", got, ok, r)
	}
}
