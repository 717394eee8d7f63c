package vxlan

import (
	"cmp"
	"net/netip"
	"slices"
)

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

// request is o as the wire layer's request: prunes are deletions.
func (o op) request() Write {
	switch o.kind {
	case opRouteSet:
		return Write{Kind: RouteReplace, Route: o.route}
	case opRouteDel, opRoutePrune:
		return Write{Kind: RouteDel, Route: o.route}
	case opNeighSet:
		return Write{Kind: NeighSet, Neigh: o.neigh}
	case opNeighDel:
		return Write{Kind: NeighDel, Neigh: o.neigh}
	case opFDBSet:
		return Write{Kind: FDBSet, FDB: o.fdb}
	default: // opFDBDel, opFDBPrune
		return Write{Kind: FDBDel, FDB: o.fdb}
	}
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

// plan is the outcome of diff: the writes of a pass, run kind after kind
// in opKind order.
type plan struct {
	// The writes that program a desired peer — its neighbour, FDB entry
	// and route, exactly as entriesOf spells them — are held as the peer's
	// index in want and built when they run (at): 4 bytes instead of a
	// 230-byte op, and a cold start with 5,000 peers plans 15,000 of them.
	// Removals and prunes are held as ops in byKind. A kind uses one or the
	// other.
	want      []Peer
	env       diffEnv
	connected []netip.Prefix
	sets      [numOpKinds][]int32
	byKind    [numOpKinds][]op
	// conflicts are desired peers whose destination is held by another
	// program's route with a lower or equal metric, which we leave alone.
	conflicts []netip.Prefix
}

// count is the number of writes of kind k.
func (p *plan) count(k opKind) int { return len(p.sets[k]) + len(p.byKind[k]) }

// at returns write i of kind k.
func (p *plan) at(k opKind, i int) op {
	if p.sets[k] == nil {
		return p.byKind[k][i]
	}
	w := p.want[p.sets[k][i]]
	route, neigh, fdb, _ := entriesOf(w, p.env, p.connected)
	o := op{kind: k, peer: w.Subnet}
	switch k {
	case opNeighSet:
		o.neigh = neigh
	case opFDBSet:
		o.fdb = fdb
	default:
		o.route = route
	}
	return o
}

// ops returns every write of the plan in the order they run.
func (p *plan) ops() []op {
	var out []op
	for k := range numOpKinds {
		for i := range p.count(k) {
			out = append(out, p.at(k, i))
		}
	}
	return out
}

func routeSame(a, b Route) bool {
	return a.Gw == b.Gw && a.LinkIndex == b.LinkIndex && a.OnLink == b.OnLink && a.Scope == b.Scope
}

// diff is the heart of the reconciler: a pure function from the desired
// peers (sorted by subnet, unique subnets, neighbour addresses and MACs) and
// the kernel as v holds it to the writes that make the kernel match. It
// returns no writes for a converged kernel. It only ever plans writes on our
// device, plus routes of our protocol on the underlay; other programs'
// routes are read only to avoid overwriting them and to learn the
// underlay's directly connected subnets.
func diff(want []Peer, v *view) plan {
	p := plan{want: want, env: v.env, connected: v.connected}
	wanted := newWantedSet(want, v)
	for i, w := range want {
		p.planPeer(i, w, v, &wanted)
	}
	p.planStale(v, &wanted)
	return p
}

// wantedSet holds the keys of the desired peers' entries, only to tell
// which of the view's entries are stale: a kind with no entries in the view
// has nothing to check and gets no map.
type wantedSet struct {
	macs   map[MAC]bool
	hops   map[netip.Addr]bool
	routes map[netip.Prefix]bool
}

func newWantedSet(want []Peer, v *view) wantedSet {
	var w wantedSet
	if v.fdbsLen() > 0 {
		w.macs = make(map[MAC]bool, len(want))
	}
	if v.neighsLen() > 0 {
		w.hops = make(map[netip.Addr]bool, len(want))
	}
	if v.oursLen() > 0 || len(v.extra) > 0 {
		w.routes = make(map[netip.Prefix]bool, len(want))
	}
	return w
}

func (p *plan) add(o op) { p.byKind[o.kind] = append(p.byKind[o.kind], o) }

// set plans write k for the peer at index i of want.
func (p *plan) set(k opKind, i int) {
	if p.sets[k] == nil {
		p.sets[k] = make([]int32, 0, len(p.want))
	}
	p.sets[k] = append(p.sets[k], int32(i))
}

// planPeer plans the writes that program desired peer w (want[i]).
func (p *plan) planPeer(i int, w Peer, v *view, wanted *wantedSet) {
	if wanted.routes != nil {
		wanted.routes[w.Subnet] = true
	}
	route, neigh, _, encap := entriesOf(w, v.env, v.connected)
	if encap {
		hop := neigh.IP
		if wanted.hops != nil {
			wanted.hops[hop] = true
		}
		if wanted.macs != nil {
			wanted.macs[PeerMAC(w)] = true
		}
		if n, ok := v.neigh(hop); !ok || n.MAC != PeerMAC(w) || n.State != NUDPermanent {
			p.set(opNeighSet, i)
		}
		p.planFDB(i, w, v)
	}
	if m, held := v.foreign[route.Dst]; held && m <= route.Priority {
		// Another program's route wins (lower metric) or has our key
		// (equal metric, a write would replace it): hands off.
		p.conflicts = append(p.conflicts, w.Subnet)
	} else if r, ok := v.route(route.Dst); !ok || !routeSame(r, route) {
		p.set(opRouteSet, i)
	}
}

// planFDB plans w's FDB entry: exactly one permanent remote, its public IP.
func (p *plan) planFDB(i int, w Peer, v *view) {
	first, ok := v.fdbFirst(PeerMAC(w))
	_, several := v.fdbMore[PeerMAC(w)]
	switch {
	case !ok:
		p.set(opFDBSet, i)
	case !several:
		if packIP(first.Dst) != packIP(w.PublicIP) || first.State != NUDPermanent {
			p.set(opFDBSet, i)
		}
	default:
		// Several remotes for one MAC (someone appended): keep exactly
		// the wanted one.
		all := v.fdbAll(PeerMAC(w))
		if !slices.ContainsFunc(all, func(f FDB) bool { return f.Dst == w.PublicIP && f.State == NUDPermanent }) {
			p.set(opFDBSet, i)
		}
		for _, f := range all {
			if f.Dst != w.PublicIP {
				p.add(op{kind: opFDBPrune, peer: w.Subnet, fdb: f})
			}
		}
	}
}

// planStale plans the removal of everything on our device (and of our
// routes on the underlay) that no desired peer wants: a peer that left
// while we were not looking, or a previous MAC or mode of a peer that is
// still here. Removals are sorted, so a plan does not depend on map order.
func (p *plan) planStale(v *view, wanted *wantedSet) {
	staleRoutes := slices.Clone(v.extra)
	for r := range v.allOurs() {
		if !wanted.routes[r.Dst] {
			staleRoutes = append(staleRoutes, r)
		}
	}
	slices.SortFunc(staleRoutes, func(a, b Route) int {
		return cmp.Or(comparePrefix(a.Dst, b.Dst), cmp.Compare(a.Priority, b.Priority), cmp.Compare(a.LinkIndex, b.LinkIndex))
	})
	for _, r := range staleRoutes {
		if wanted.routes[r.Dst] {
			// A second route of ours to a wanted destination (old metric,
			// duplicate): remove it only once the right one is in.
			p.add(op{kind: opRoutePrune, peer: r.Dst, route: r})
		} else {
			p.add(op{kind: opRouteDel, route: r})
		}
	}

	var staleFDB []FDB
	for f := range v.allFDBFirsts() {
		if !wanted.macs[f.MAC] {
			staleFDB = append(staleFDB, v.fdbAll(f.MAC)...)
		}
	}
	slices.SortFunc(staleFDB, func(a, b FDB) int {
		return cmp.Or(slices.Compare(a.MAC[:], b.MAC[:]), a.Dst.Compare(b.Dst))
	})
	for _, f := range staleFDB {
		p.add(op{kind: opFDBDel, fdb: f})
	}

	var staleNeigh []Neigh
	for n := range v.allNeighs() {
		// Only permanent entries are ever ours; the kernel's own
		// (reachable, stale, failed ...) entries come and go by themselves.
		if !wanted.hops[n.IP] && n.State&NUDPermanent != 0 {
			staleNeigh = append(staleNeigh, n)
		}
	}
	slices.SortFunc(staleNeigh, func(a, b Neigh) int { return a.IP.Compare(b.IP) })
	for _, n := range staleNeigh {
		p.add(op{kind: opNeighDel, neigh: n})
	}
}

const scopeLink = 253 // RT_SCOPE_LINK

// entriesOf returns the kernel entries peer w needs: its route and, when it
// is reached over VXLAN (encap), its neighbour and FDB entry. With
// DirectRouting a peer whose public IP is in one of the underlay's
// connected subnets gets a route over the underlay and nothing else.
func entriesOf(w Peer, env diffEnv, connected []netip.Prefix) (route Route, neigh Neigh, fdb FDB, encap bool) {
	if env.DirectRouting && env.Underlay > 0 && inAny(connected, w.PublicIP) {
		route = Route{Dst: w.Subnet, Gw: w.PublicIP, LinkIndex: env.Underlay, Protocol: RouteProtocol}
	} else {
		hop := w.Subnet.Addr()
		route = Route{Dst: w.Subnet, Gw: hop, LinkIndex: env.Dev, OnLink: true, Protocol: RouteProtocol}
		neigh = Neigh{LinkIndex: env.Dev, IP: hop, MAC: PeerMAC(w), State: NUDPermanent}
		fdb = FDB{LinkIndex: env.Dev, MAC: PeerMAC(w), Dst: w.PublicIP, State: NUDPermanent}
		encap = true
	}
	route.Priority = RouteMetric(route.Dst)
	return route, neigh, fdb, encap
}

func inAny(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
