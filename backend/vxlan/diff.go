package vxlan

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
)

// peerSpec is a validated peer: IPv4 subnet in canonical form, IPv4 public
// address, unicast MAC.
type peerSpec struct {
	Subnet   netip.Prefix
	PublicIP netip.Addr
	MAC      MAC
}

// kernelState is what one pass read back from the kernel: one dump of each
// kind.
type kernelState struct {
	Routes []Route // every IPv4 route of the main table
	Neighs []Neigh // IPv4 neighbours (any link; others are ignored)
	FDBs   []FDB   // forwarding entries (any link; others are ignored)
}

// diffEnv is what the diff needs to know about the devices.
type diffEnv struct {
	Dev           int // index of our VXLAN device
	Underlay      int // index of the underlay link
	DirectRouting bool
}

// opKind is a kind of kernel write. The values order a plan: removals run
// route, FDB, neighbour (the reverse of creation) so a stale peer's route
// never points at a missing neighbour, then additions run neighbour, FDB,
// route so a new route is only installed once its next hop resolves.
type opKind uint8

const (
	opRouteDel opKind = iota
	opFDBDel
	opNeighDel
	opNeighSet
	opFDBSet
	opFDBPrune // drop extra remotes of a wanted MAC, after its FDBSet
	opRouteSet
	opRoutePrune // drop an extra route of ours to a wanted destination, after its RouteSet
	numOpKinds
)

var opNames = [numOpKinds]string{"route-del", "fdb-del", "neigh-del", "neigh-set", "fdb-set", "fdb-prune", "route-set", "route-prune"}

func (k opKind) String() string { return opNames[k] }

func (k opKind) isDelete() bool {
	return k == opRouteDel || k == opFDBDel || k == opNeighDel || k == opFDBPrune
}

// op is one idempotent kernel write.
type op struct {
	kind opKind
	// peer is the desired peer this write programs, or the zero prefix
	// for the removal of an entry no desired peer wants.
	peer  netip.Prefix
	route Route
	neigh Neigh
	fdb   FDB
}

func (o op) String() string {
	switch o.kind {
	case opRouteDel, opRouteSet, opRoutePrune:
		return o.kind.String() + " " + o.route.String()
	case opNeighDel, opNeighSet:
		return o.kind.String() + " " + o.neigh.String()
	default:
		return o.kind.String() + " " + o.fdb.String()
	}
}

// plan is the outcome of diff.
type plan struct {
	ops []op
	// conflicts are desired peers whose destination is held by another
	// program's route with a lower or equal metric, which we leave alone.
	conflicts []netip.Prefix
}

func routeSame(a, b Route) bool {
	return a.Gw == b.Gw && a.LinkIndex == b.LinkIndex && a.OnLink == b.OnLink && a.Scope == b.Scope
}

type fdbSlot struct {
	first FDB
	more  []FDB // further remotes of the same MAC; rare
}

// diff is the heart of the reconciler: a pure function from the desired
// peers (sorted by subnet, unique subnets, neighbour addresses and MACs) and
// the kernel state to the writes that make the kernel match. It returns no
// writes for a converged kernel. It only ever plans writes on our device,
// plus routes of our protocol on the underlay; routes of other protocols are
// read only to avoid overwriting them and to learn the underlay's directly
// connected subnets.
func diff(want []peerSpec, have kernelState, env diffEnv) plan {
	// Index the kernel state. Our routes are those of our protocol on the
	// device or the underlay, at their destination's metric; any other
	// route of ours there (a different metric, a duplicate) is stale.
	ours := make(map[netip.Prefix]Route, len(want))
	var staleRoutes []Route
	foreign := make(map[netip.Prefix]int) // destination -> lowest metric
	var connected []netip.Prefix
	for _, r := range have.Routes {
		onOurLinks := r.LinkIndex == env.Dev || (env.Underlay > 0 && r.LinkIndex == env.Underlay)
		switch {
		case r.Protocol == RouteProtocol && onOurLinks:
			if _, dup := ours[r.Dst]; dup || r.Priority != RouteMetric(r.Dst) {
				staleRoutes = append(staleRoutes, r)
			} else {
				ours[r.Dst] = r
			}
		case r.Protocol == RouteProtocol:
			// Ours by protocol but on a link we do not own (another
			// instance, or an old underlay): not ours to touch.
		default:
			if m, ok := foreign[r.Dst]; !ok || r.Priority < m {
				foreign[r.Dst] = r.Priority
			}
			if env.DirectRouting && r.LinkIndex == env.Underlay && !r.Gw.IsValid() && r.Scope == scopeLink {
				connected = append(connected, r.Dst)
			}
		}
	}
	neighs := make(map[netip.Addr]Neigh, len(want))
	for _, n := range have.Neighs {
		if n.LinkIndex == env.Dev {
			neighs[n.IP] = n
		}
	}
	fdbs := make(map[MAC]fdbSlot, len(want))
	for _, f := range have.FDBs {
		if f.LinkIndex != env.Dev {
			continue
		}
		if s, ok := fdbs[f.MAC]; ok {
			s.more = append(s.more, f)
			fdbs[f.MAC] = s
		} else {
			fdbs[f.MAC] = fdbSlot{first: f}
		}
	}

	var byKind [numOpKinds][]op
	add := func(o op) { byKind[o.kind] = append(byKind[o.kind], o) }
	var p plan
	wantMACs := make(map[MAC]bool, len(want))
	wantNeighs := make(map[netip.Addr]bool, len(want))
	wantRoutes := make(map[netip.Prefix]bool, len(want))

	for _, w := range want {
		wantRoutes[w.Subnet] = true
		var route Route
		if env.DirectRouting && env.Underlay > 0 && inAny(connected, w.PublicIP) {
			route = Route{Dst: w.Subnet, Gw: w.PublicIP, LinkIndex: env.Underlay, Protocol: RouteProtocol}
		} else {
			hop := w.Subnet.Addr()
			wantNeighs[hop] = true
			wantMACs[w.MAC] = true
			route = Route{Dst: w.Subnet, Gw: hop, LinkIndex: env.Dev, OnLink: true, Protocol: RouteProtocol}

			neigh := Neigh{LinkIndex: env.Dev, IP: hop, MAC: w.MAC, State: NUDPermanent}
			if n, ok := neighs[hop]; !ok || n.MAC != w.MAC || n.State != NUDPermanent {
				add(op{kind: opNeighSet, peer: w.Subnet, neigh: neigh})
			}

			fdb := FDB{LinkIndex: env.Dev, MAC: w.MAC, Dst: w.PublicIP, State: NUDPermanent}
			slot, ok := fdbs[w.MAC]
			switch {
			case !ok:
				add(op{kind: opFDBSet, peer: w.Subnet, fdb: fdb})
			case slot.more == nil:
				if slot.first.Dst != w.PublicIP || slot.first.State != NUDPermanent {
					add(op{kind: opFDBSet, peer: w.Subnet, fdb: fdb})
				}
			default:
				// Several remotes for one MAC (someone appended): keep
				// exactly the wanted one.
				good := false
				for _, f := range append([]FDB{slot.first}, slot.more...) {
					if f.Dst == w.PublicIP && f.State == NUDPermanent {
						good = true
					}
				}
				if !good {
					add(op{kind: opFDBSet, peer: w.Subnet, fdb: fdb})
				}
				for _, f := range append([]FDB{slot.first}, slot.more...) {
					if f.Dst != w.PublicIP {
						add(op{kind: opFDBPrune, peer: w.Subnet, fdb: f})
					}
				}
			}
		}

		route.Priority = RouteMetric(route.Dst)
		if m, held := foreign[route.Dst]; held && m <= route.Priority {
			// Another program's route wins (lower metric) or has our
			// key (equal metric, a write would replace it): hands off.
			p.conflicts = append(p.conflicts, w.Subnet)
		} else if r, ok := ours[route.Dst]; !ok || !routeSame(r, route) {
			add(op{kind: opRouteSet, peer: w.Subnet, route: route})
		}
	}

	// Everything on our device (and our routes on the underlay) that no
	// desired peer wants is stale: a peer that left while we were not
	// looking, or a previous MAC or mode of a peer that is still here.
	for dst, r := range ours {
		if !wantRoutes[dst] {
			staleRoutes = append(staleRoutes, r)
		}
	}
	slices.SortFunc(staleRoutes, func(a, b Route) int {
		return cmp.Or(comparePrefix(a.Dst, b.Dst), cmp.Compare(a.Priority, b.Priority), cmp.Compare(a.LinkIndex, b.LinkIndex))
	})
	for _, r := range staleRoutes {
		if wantRoutes[r.Dst] {
			// A second route of ours to a wanted destination (old metric,
			// duplicate): remove it only once the right one is in.
			add(op{kind: opRoutePrune, peer: r.Dst, route: r})
		} else {
			add(op{kind: opRouteDel, route: r})
		}
	}

	var staleFDB []FDB
	for m, s := range fdbs {
		if !wantMACs[m] {
			staleFDB = append(staleFDB, s.first)
			staleFDB = append(staleFDB, s.more...)
		}
	}
	slices.SortFunc(staleFDB, func(a, b FDB) int {
		return cmp.Or(slices.Compare(a.MAC[:], b.MAC[:]), a.Dst.Compare(b.Dst))
	})
	for _, f := range staleFDB {
		add(op{kind: opFDBDel, fdb: f})
	}

	var staleNeigh []Neigh
	for ip, n := range neighs {
		// Only permanent entries are ever ours; the kernel's own
		// (reachable, stale, failed ...) entries come and go by themselves.
		if !wantNeighs[ip] && n.State&NUDPermanent != 0 {
			staleNeigh = append(staleNeigh, n)
		}
	}
	slices.SortFunc(staleNeigh, func(a, b Neigh) int { return a.IP.Compare(b.IP) })
	for _, n := range staleNeigh {
		add(op{kind: opNeighDel, neigh: n})
	}

	n := 0
	for _, ops := range byKind {
		n += len(ops)
	}
	if n > 0 {
		p.ops = make([]op, 0, n)
		for _, ops := range byKind {
			p.ops = append(p.ops, ops...)
		}
	}
	return p
}

const scopeLink = 253 // RT_SCOPE_LINK

func inAny(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// validatePeers turns the daemon's peers into peerSpecs sorted by subnet.
// Peers that cannot be programmed safely are returned in rejected with the
// reason; the first of two peers claiming one subnet, next hop or MAC (in
// subnet order) wins.
func validatePeers(peers []Peer, own netip.Prefix, local netip.Addr) (specs []peerSpec, rejected map[string]string) {
	specs = make([]peerSpec, 0, len(peers))
	reject := func(p Peer, why string) {
		if rejected == nil {
			rejected = make(map[string]string)
		}
		rejected[fmt.Sprintf("%v %v %v", p.Subnet, p.PublicIP, p.VtepMAC)] = why
	}
	for _, p := range peers {
		mac, macOK := MACFrom(p.VtepMAC)
		switch {
		case !p.Subnet.IsValid() || !p.Subnet.Addr().Is4():
			reject(p, "subnet is not IPv4")
		case p.Subnet.Masked() != p.Subnet:
			reject(p, "subnet has host bits set")
		case !p.PublicIP.IsValid() || !p.PublicIP.Is4() || p.PublicIP.IsUnspecified() || p.PublicIP.IsMulticast() || p.PublicIP.IsLoopback():
			reject(p, "public IP is not a unicast IPv4 address")
		case local.IsValid() && p.PublicIP == local:
			reject(p, "public IP is our own")
		case !macOK || mac.IsZero() || mac[0]&1 != 0:
			reject(p, "VTEP MAC is not a unicast Ethernet address")
		case own.IsValid() && p.Subnet.Overlaps(own):
			reject(p, "subnet overlaps our own lease")
		default:
			specs = append(specs, peerSpec{Subnet: p.Subnet, PublicIP: p.PublicIP, MAC: mac})
		}
	}
	slices.SortStableFunc(specs, func(a, b peerSpec) int { return comparePrefix(a.Subnet, b.Subnet) })
	seenSubnet := make(map[netip.Prefix]bool, len(specs))
	seenHop := make(map[netip.Addr]bool, len(specs))
	seenMAC := make(map[MAC]bool, len(specs))
	out := specs[:0]
	for _, s := range specs {
		p := Peer{Subnet: s.Subnet, PublicIP: s.PublicIP, VtepMAC: s.MAC.HardwareAddr()}
		switch {
		case seenSubnet[s.Subnet]:
			reject(p, "duplicate subnet")
		case seenHop[s.Subnet.Addr()]:
			reject(p, "network address used by another peer's subnet")
		case seenMAC[s.MAC]:
			reject(p, "VTEP MAC used by another peer")
		default:
			seenSubnet[s.Subnet] = true
			seenHop[s.Subnet.Addr()] = true
			seenMAC[s.MAC] = true
			out = append(out, s)
		}
	}
	return out, rejected
}
