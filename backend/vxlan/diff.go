package vxlan

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
)

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
func diff(want []Peer, have kernelState, env diffEnv) plan {
	// Index the kernel state. Our routes are those of our protocol on the
	// device or the underlay, at their destination's metric; any other
	// route of ours there (a different metric, a duplicate) is stale.
	ours := make(map[netip.Prefix]Route, min(len(want), len(have.Routes)))
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
	neighs := make(map[netip.Addr]Neigh, min(len(want), len(have.Neighs)))
	for _, n := range have.Neighs {
		if n.LinkIndex == env.Dev {
			neighs[n.IP] = n
		}
	}
	fdbs := make(map[MAC]fdbSlot, min(len(want), len(have.FDBs)))
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

	p := plan{want: want, env: env, connected: connected}
	add := func(o op) { p.byKind[o.kind] = append(p.byKind[o.kind], o) }
	set := func(k opKind, i int) {
		if p.sets[k] == nil {
			p.sets[k] = make([]int32, 0, len(want))
		}
		p.sets[k] = append(p.sets[k], int32(i))
	}
	// What is wanted, only to tell which of the kernel's entries are stale:
	// not needed (nil: nothing is wanted) when there are none to check.
	var wantMACs map[MAC]bool
	var wantNeighs map[netip.Addr]bool
	var wantRoutes map[netip.Prefix]bool
	if len(fdbs) > 0 {
		wantMACs = make(map[MAC]bool, len(want))
	}
	if len(neighs) > 0 {
		wantNeighs = make(map[netip.Addr]bool, len(want))
	}
	if len(ours) > 0 || len(staleRoutes) > 0 {
		wantRoutes = make(map[netip.Prefix]bool, len(want))
	}

	for i, w := range want {
		if wantRoutes != nil {
			wantRoutes[w.Subnet] = true
		}
		route, neigh, _, encap := entriesOf(w, env, connected)
		if encap {
			hop := neigh.IP
			if wantNeighs != nil {
				wantNeighs[hop] = true
			}
			if wantMACs != nil {
				wantMACs[w.VtepMAC] = true
			}
			if n, ok := neighs[hop]; !ok || n.MAC != w.VtepMAC || n.State != NUDPermanent {
				set(opNeighSet, i)
			}

			slot, ok := fdbs[w.VtepMAC]
			switch {
			case !ok:
				set(opFDBSet, i)
			case slot.more == nil:
				if slot.first.Dst != w.PublicIP || slot.first.State != NUDPermanent {
					set(opFDBSet, i)
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
					set(opFDBSet, i)
				}
				for _, f := range append([]FDB{slot.first}, slot.more...) {
					if f.Dst != w.PublicIP {
						add(op{kind: opFDBPrune, peer: w.Subnet, fdb: f})
					}
				}
			}
		}

		if m, held := foreign[route.Dst]; held && m <= route.Priority {
			// Another program's route wins (lower metric) or has our
			// key (equal metric, a write would replace it): hands off.
			p.conflicts = append(p.conflicts, w.Subnet)
		} else if r, ok := ours[route.Dst]; !ok || !routeSame(r, route) {
			set(opRouteSet, i)
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

	return p
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
		neigh = Neigh{LinkIndex: env.Dev, IP: hop, MAC: w.VtepMAC, State: NUDPermanent}
		fdb = FDB{LinkIndex: env.Dev, MAC: w.VtepMAC, Dst: w.PublicIP, State: NUDPermanent}
		encap = true
	}
	route.Priority = RouteMetric(route.Dst)
	return route, neigh, fdb, encap
}

// outside is what a full listing tells about routes that are not ours and
// that a pass reading back only its own entries still needs: the lowest
// metric of other programs' routes by destination (conflicts) and, for
// DirectRouting, the underlay's connected subnets. It is what diff derives
// from the same listing.
type outside struct {
	foreign   map[netip.Prefix]int
	connected []netip.Prefix
}

func outsideOf(routes []Route, env diffEnv) outside {
	o := outside{foreign: map[netip.Prefix]int{}}
	for _, r := range routes {
		if r.Protocol == RouteProtocol {
			continue // ours, or another instance's: never foreign
		}
		if m, ok := o.foreign[r.Dst]; !ok || r.Priority < m {
			o.foreign[r.Dst] = r.Priority
		}
		if env.DirectRouting && r.LinkIndex == env.Underlay && !r.Gw.IsValid() && r.Scope == scopeLink {
			o.connected = append(o.connected, r.Dst)
		}
	}
	return o
}

// believed is the kernel state a pass that reads nothing back diffs
// against: the entries that the last successful pass left for the peers
// about to be replaced or removed (gone), the other programs' routes to
// the subnets of the peers about to be added (come), and the connected
// routes of the underlay, all as that pass's listing showed them.
func believed(gone, come []Peer, env diffEnv, out outside) kernelState {
	var s kernelState
	for _, g := range gone {
		route, neigh, fdb, encap := entriesOf(g, env, out.connected)
		s.Routes = append(s.Routes, route)
		if encap {
			s.Neighs = append(s.Neighs, neigh)
			s.FDBs = append(s.FDBs, fdb)
		}
	}
	for _, c := range come {
		if m, ok := out.foreign[c.Subnet]; ok {
			s.Routes = append(s.Routes, Route{Dst: c.Subnet, Priority: m})
		}
	}
	for _, c := range out.connected {
		s.Routes = append(s.Routes, Route{Dst: c, LinkIndex: env.Underlay, Scope: scopeLink, Protocol: 2})
	}
	return s
}

// specDelta compares two peer sets sorted by subnet (validated, so IPv4): gone holds the peers
// of old that new no longer has or has changed, come the peers of new that
// old lacks or had otherwise.
func specDelta(old, new []Peer) (gone, come []Peer) {
	i, j := 0, 0
	for i < len(old) || j < len(new) {
		switch {
		case j == len(new) || i < len(old) && prefixKey(old[i].Subnet) < prefixKey(new[j].Subnet):
			gone = append(gone, old[i])
			i++
		case i == len(old) || prefixKey(old[i].Subnet) > prefixKey(new[j].Subnet):
			come = append(come, new[j])
			j++
		default:
			if old[i] != new[j] {
				gone = append(gone, old[i])
				come = append(come, new[j])
			}
			i++
			j++
		}
	}
	return gone, come
}

func inAny(prefixes []netip.Prefix, a netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// prefixKey orders IPv4 prefixes as comparePrefix does.
func prefixKey(p netip.Prefix) uint64 {
	a := p.Addr().As4()
	return uint64(a[0])<<32 | uint64(a[1])<<24 | uint64(a[2])<<16 | uint64(a[3])<<8 | uint64(p.Bits())
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// peerIndex answers whether a kernel entry belongs to a desired peer, for
// the notification filter: specs are the desired peers sorted by subnet
// (so also by next hop, which is unique), macs their MACs sorted. Sorted
// slices rather than maps: far less memory per peer, and this index is
// rebuilt at every change of the peer set.
type peerIndex struct {
	specs []Peer
	macs  []uint64 // macKey of each
}

// macKey is a MAC as an integer, for sorting and searching.
func macKey(m MAC) uint64 {
	return uint64(m[0])<<40 | uint64(m[1])<<32 | uint64(m[2])<<24 | uint64(m[3])<<16 | uint64(m[4])<<8 | uint64(m[5])
}

func (x *peerIndex) hasSubnet(p netip.Prefix) bool {
	_, ok := slices.BinarySearchFunc(x.specs, p, func(s Peer, p netip.Prefix) int { return comparePrefix(s.Subnet, p) })
	return ok
}

func (x *peerIndex) hasHop(a netip.Addr) bool {
	_, ok := slices.BinarySearchFunc(x.specs, a, func(s Peer, a netip.Addr) int { return s.Subnet.Addr().Compare(a) })
	return ok
}

func (x *peerIndex) hasMAC(m MAC) bool {
	_, ok := slices.BinarySearch(x.macs, macKey(m))
	return ok
}

// validatePeers sorts the daemon's peers by subnet and indexes them. Each
// peer's values were validated where the lease entered (subnet.Config.Peer);
// what is checked here needs this host or the whole set: a peer must not
// overlap our lease or use our address, and the first of two peers claiming
// one subnet, next hop or MAC (in subnet order) wins. A Peer that is not
// IPv4 at all (a zero value from a caller's bug) is refused too, since the
// sort below depends on it. Rejected peers are returned with the reason.
func validatePeers(peers []Peer, own netip.Prefix, local netip.Addr) (specs []Peer, rejected map[string]string, idx peerIndex) {
	reject := func(p Peer, why string) {
		if rejected == nil {
			rejected = make(map[string]string)
		}
		rejected[fmt.Sprintf("%v %v %v", p.Subnet, p.PublicIP, p.VtepMAC)] = why
	}
	if len(peers) >= 1<<24 {
		// More peers than the sort below can number (a /8 of /24s is
		// 65,536): refuse them all rather than mis-sort.
		for _, p := range peers {
			reject(p, "too many peers")
		}
		return nil, rejected, peerIndex{}
	}
	// The valid peers, by subnet and then position: every subnet left is
	// IPv4, so the order of comparePrefix is that of a 40-bit integer, and
	// with the position in the low 24 bits one plain sort of integers
	// orders them, equal subnets as given. This runs at every lease event,
	// so it sorts 8-byte keys rather than stable-sorting the wide specs
	// (Documentation/benchmarks.md, "events").
	keys := make([]uint64, 0, len(peers))
	for i, p := range peers {
		switch {
		case !p.Subnet.Addr().Is4() || !p.PublicIP.Is4() || p.VtepMAC.IsZero():
			reject(p, "not an IPv4 peer with a VTEP MAC")
		case local.IsValid() && p.PublicIP == local:
			reject(p, "public IP is our own")
		case own.IsValid() && p.Subnet.Overlaps(own):
			reject(p, "subnet overlaps our own lease")
		default:
			keys = append(keys, prefixKey(p.Subnet)<<24|uint64(i))
		}
	}
	slices.Sort(keys)
	// Subnets and next hops (network addresses) are unique among the
	// accepted peers if each differs from the last accepted one: equal
	// ones are adjacent in this order. MACs are not: a set remembers them.
	specs = make([]Peer, 0, len(keys))
	seenMAC := make(map[MAC]struct{}, len(keys))
	var last netip.Prefix
	for _, k := range keys {
		p := peers[k&(1<<24-1)]
		_, dupMAC := seenMAC[p.VtepMAC]
		switch {
		case last.IsValid() && p.Subnet == last:
			reject(p, "duplicate subnet")
		case last.IsValid() && p.Subnet.Addr() == last.Addr():
			reject(p, "network address used by another peer's subnet")
		case dupMAC:
			reject(p, "VTEP MAC used by another peer")
		default:
			last = p.Subnet
			seenMAC[p.VtepMAC] = struct{}{}
			specs = append(specs, p)
		}
	}
	idx = peerIndex{specs: specs, macs: make([]uint64, len(specs))}
	for i, s := range specs {
		idx.macs[i] = macKey(s.VtepMAC)
	}
	slices.Sort(idx.macs)
	return specs, rejected, idx
}
