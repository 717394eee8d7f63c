package vxlan

import (
	"iter"
	"net/netip"
	"slices"
)

// kernelState is what a full pass reads back from the kernel: one dump of
// each kind.
type kernelState struct {
	Routes []Route // every route of the main table of the backend's family
	Neighs []Neigh // neighbours of that family (any link; others are ignored)
	FDBs   []FDB   // forwarding entries (any link; others are ignored)
}

// diffEnv is what the diff needs to know about the devices.
type diffEnv struct {
	Family        Family // of the plane (the zero Family is IPv4)
	Dev           int    // index of our VXLAN device
	Underlay      int    // index of the underlay link
	DirectRouting bool
}

// view is the backend's one model of the kernel: the entries of ours on the
// device and the underlay, indexed the way the diff looks them up, and what
// the last listing showed of other programs' routes. A full pass replaces
// it with a fresh listing (viewOf); each successful write updates it
// (record); every pass diffs the desired peers against it. It belongs to
// whoever holds Backend.opMu — Run's loop, or a caller of EnsureDevice,
// Reconcile or Teardown — and is never shared.
//
// It holds an entry of each kind per peer for the daemon's lifetime, so
// it keeps them packed (vroute, vneigh, vfdb): what the type of the map
// already says (the key, our device, our protocol and metric) is not
// stored again, and nothing in them is a pointer for the collector to scan.
// An entry whose addresses are all IPv4 (every entry of the IPv4 plane's
// peers) goes in the maps of 4-byte addresses (ours4, neighs4, fdbs4);
// any other (IPv6, an IPv4 route via an IPv6 gateway, no address) in the
// 16-byte ones. A key is in one map of a pair at most; the methods below
// hide the split.
type view struct {
	env diffEnv
	// ours4 and ours hold our route to each destination at its metric (see
	// RouteMetric); extra the other routes of ours on our links (another
	// metric, a duplicate): stale by definition.
	ours4 map[prefix4]vroute4
	ours  map[prefix16]vroute
	extra []Route
	// foreign is the lowest metric of other programs' routes by
	// destination, connected the underlay's directly connected subnets
	// (read for DirectRouting only). Writes never change them; only a
	// listing does.
	foreign   map[netip.Prefix]int
	connected []netip.Prefix
	neighs4   map[[4]byte]vneigh // on our device
	neighs    map[ip16]vneigh
	// fdbs holds the first remote of each MAC on our device; fdbMore the
	// others, when someone appended remotes by hand (rare: usually nil).
	fdbs4   map[MAC]vfdb4
	fdbs    map[MAC]vfdb
	fdbMore map[MAC][]FDB
}

// ip16 is an address as the view keys and stores it: 16 bytes and its
// family, without the pointer a netip.Addr carries (for a zone).
type ip16 struct {
	b   [16]byte
	fam uint8 // 0 (no address), 4 or 6
}

func packIP(a netip.Addr) ip16 {
	switch {
	case a.Is4():
		return ip16{a.As16(), 4}
	case a.IsValid():
		return ip16{a.As16(), 6}
	}
	return ip16{}
}

func (a ip16) addr() netip.Addr {
	switch a.fam {
	case 4:
		return netip.AddrFrom16(a.b).Unmap()
	case 6:
		return netip.AddrFrom16(a.b)
	}
	return netip.Addr{}
}

// prefix16 is a route destination as the view keys it.
type prefix16 struct {
	ip   ip16
	bits uint8
}

func packPrefix(p netip.Prefix) prefix16 { return prefix16{packIP(p.Addr()), uint8(p.Bits())} }

func (p prefix16) prefix() netip.Prefix { return netip.PrefixFrom(p.ip.addr(), int(p.bits)) }

// vroute is one of our routes as the view keeps it: its destination is
// the key, its protocol ours and its metric RouteMetric's.
type vroute struct {
	gw     ip16
	scope  uint8
	onLink bool
	link   int32
}

// vneigh is a neighbour on our device; its address is the key.
type vneigh struct {
	mac   MAC
	state uint16
}

// vfdb is a remote of a MAC on our device; the MAC is the key.
type vfdb struct {
	dst   ip16
	state uint16
}

// prefix4, vroute4 and vfdb4 are prefix16, vroute and vfdb with IPv4
// addresses; a vroute4 without gateway has hasGw false.
type prefix4 struct {
	ip   [4]byte
	bits uint8
}

type vroute4 struct {
	gw     [4]byte
	hasGw  bool
	scope  uint8
	onLink bool
	link   int32
}

type vfdb4 struct {
	dst   [4]byte
	state uint16
}

func (v *view) packRoute(r Route) vroute {
	return vroute{gw: packIP(r.Gw), scope: uint8(r.Scope), onLink: r.OnLink, link: int32(r.LinkIndex)}
}

func (v *view) routeAt(k prefix16, r vroute) Route {
	dst := k.prefix()
	return Route{Dst: dst, Gw: r.gw.addr(), LinkIndex: int(r.link), OnLink: r.onLink, Protocol: RouteProtocol,
		Scope: int(r.scope), Priority: RouteMetric(dst)}
}

func (v *view) routeAt4(k prefix4, r vroute4) Route {
	dst := netip.PrefixFrom(netip.AddrFrom4(k.ip), int(k.bits))
	var gw netip.Addr
	if r.hasGw {
		gw = netip.AddrFrom4(r.gw)
	}
	return Route{Dst: dst, Gw: gw, LinkIndex: int(r.link), OnLink: r.onLink, Protocol: RouteProtocol,
		Scope: int(r.scope), Priority: RouteMetric(dst)}
}

// gw4 is a's 4 bytes, or none for no address.
func gw4(a netip.Addr) [4]byte {
	if !a.IsValid() {
		return [4]byte{}
	}
	return a.As4()
}

// fits4 reports whether r's destination and gateway (if any) are IPv4,
// i.e. whether ours4 can keep it.
func fits4(r Route) bool { return r.Dst.Addr().Is4() && (r.Gw.Is4() || !r.Gw.IsValid()) }

// route returns our route to dst at its metric.
func (v *view) route(dst netip.Prefix) (Route, bool) {
	if dst.Addr().Is4() {
		k := prefix4{dst.Addr().As4(), uint8(dst.Bits())}
		if r, ok := v.ours4[k]; ok {
			return v.routeAt4(k, r), true
		}
	}
	k := packPrefix(dst)
	r, ok := v.ours[k]
	if !ok {
		return Route{}, false
	}
	return v.routeAt(k, r), true
}

// putOurs makes r (isOurs) our route to its destination.
func (v *view) putOurs(r Route) {
	v.delOurs(r.Dst)
	if fits4(r) {
		v.ours4[prefix4{r.Dst.Addr().As4(), uint8(r.Dst.Bits())}] = vroute4{gw: gw4(r.Gw), hasGw: r.Gw.IsValid(),
			scope: uint8(r.Scope), onLink: r.OnLink, link: int32(r.LinkIndex)}
	} else {
		v.ours[packPrefix(r.Dst)] = v.packRoute(r)
	}
}

func (v *view) delOurs(dst netip.Prefix) {
	if dst.Addr().Is4() {
		delete(v.ours4, prefix4{dst.Addr().As4(), uint8(dst.Bits())})
	}
	delete(v.ours, packPrefix(dst))
}

func (v *view) oursLen() int { return len(v.ours4) + len(v.ours) }

// allOurs yields each of our routes at its metric, in no order.
func (v *view) allOurs() iter.Seq[Route] {
	return func(yield func(Route) bool) {
		for k, r := range v.ours4 {
			if !yield(v.routeAt4(k, r)) {
				return
			}
		}
		for k, r := range v.ours {
			if !yield(v.routeAt(k, r)) {
				return
			}
		}
	}
}

// isOurs reports whether r is a route the view keeps in ours (rather than
// in extra): of our protocol, on one of our links, at its metric, and
// representable packed.
func (v *view) isOurs(r Route) bool {
	return r.Protocol == RouteProtocol && r.Priority == RouteMetric(r.Dst) && r.Dst.IsValid() &&
		(r.LinkIndex == v.env.Dev || (v.env.Underlay > 0 && r.LinkIndex == v.env.Underlay)) && r.Scope >= 0 && r.Scope < 256
}

func (v *view) neigh(ip netip.Addr) (Neigh, bool) {
	if ip.Is4() {
		n, ok := v.neighs4[ip.As4()]
		return Neigh{LinkIndex: v.env.Dev, IP: ip, MAC: n.mac, State: int(n.state)}, ok
	}
	k := packIP(ip)
	n, ok := v.neighs[k]
	return v.neighAt(k, n), ok
}

func (v *view) neighAt(k ip16, n vneigh) Neigh {
	return Neigh{LinkIndex: v.env.Dev, IP: k.addr(), MAC: n.mac, State: int(n.state)}
}

func (v *view) putNeigh(n Neigh) {
	if n.IP.Is4() {
		v.neighs4[n.IP.As4()] = vneigh{mac: n.MAC, state: uint16(n.State)}
	} else {
		v.neighs[packIP(n.IP)] = vneigh{mac: n.MAC, state: uint16(n.State)}
	}
}

func (v *view) delNeigh(ip netip.Addr) {
	if ip.Is4() {
		delete(v.neighs4, ip.As4())
	} else {
		delete(v.neighs, packIP(ip))
	}
}

func (v *view) neighsLen() int { return len(v.neighs4) + len(v.neighs) }

// allNeighs yields each neighbour on our device, in no order.
func (v *view) allNeighs() iter.Seq[Neigh] {
	return func(yield func(Neigh) bool) {
		for k, n := range v.neighs4 {
			if !yield(Neigh{LinkIndex: v.env.Dev, IP: netip.AddrFrom4(k), MAC: n.mac, State: int(n.state)}) {
				return
			}
		}
		for k, n := range v.neighs {
			if !yield(v.neighAt(k, n)) {
				return
			}
		}
	}
}

// fdbFirst returns the first remote of mac on our device.
func (v *view) fdbFirst(mac MAC) (FDB, bool) {
	if f, ok := v.fdbs4[mac]; ok {
		return FDB{LinkIndex: v.env.Dev, MAC: mac, Dst: netip.AddrFrom4(f.dst), State: int(f.state)}, true
	}
	f, ok := v.fdbs[mac]
	if !ok {
		return FDB{}, false
	}
	return FDB{LinkIndex: v.env.Dev, MAC: mac, Dst: f.dst.addr(), State: int(f.state)}, true
}

// putFDBFirst makes f the first remote of its MAC, leaving the others.
func (v *view) putFDBFirst(f FDB) {
	if f.Dst.Is4() {
		delete(v.fdbs, f.MAC)
		v.fdbs4[f.MAC] = vfdb4{dst: f.Dst.As4(), state: uint16(f.State)}
	} else {
		delete(v.fdbs4, f.MAC)
		v.fdbs[f.MAC] = vfdb{dst: packIP(f.Dst), state: uint16(f.State)}
	}
}

func (v *view) fdbsLen() int { return len(v.fdbs4) + len(v.fdbs) }

// allFDBFirsts yields the first remote of each MAC on our device, in no
// order.
func (v *view) allFDBFirsts() iter.Seq[FDB] {
	return func(yield func(FDB) bool) {
		for m, f := range v.fdbs4 {
			if !yield(FDB{LinkIndex: v.env.Dev, MAC: m, Dst: netip.AddrFrom4(f.dst), State: int(f.state)}) {
				return
			}
		}
		for m, f := range v.fdbs {
			if !yield(FDB{LinkIndex: v.env.Dev, MAC: m, Dst: f.dst.addr(), State: int(f.state)}) {
				return
			}
		}
	}
}

// fdbAll returns every remote of mac on our device.
func (v *view) fdbAll(mac MAC) []FDB {
	f, ok := v.fdbFirst(mac)
	if !ok {
		return nil
	}
	return append([]FDB{f}, v.fdbMore[mac]...)
}

// setFDBs makes all the remotes of mac on our device.
func (v *view) setFDBs(mac MAC, all []FDB) {
	if len(all) == 0 {
		delete(v.fdbs4, mac)
		delete(v.fdbs, mac)
		delete(v.fdbMore, mac)
		return
	}
	v.putFDBFirst(FDB{MAC: mac, Dst: all[0].Dst, State: all[0].State})
	if len(all) == 1 {
		delete(v.fdbMore, mac)
		return
	}
	if v.fdbMore == nil {
		v.fdbMore = map[MAC][]FDB{}
	}
	v.fdbMore[mac] = slices.Clone(all[1:])
}

// newView returns an empty view with room for routes, neighs and fdbs
// entries in the maps its family's peers' entries go to.
func newView(env diffEnv, routes, neighs, fdbs int) *view {
	v := &view{env: env, foreign: map[netip.Prefix]int{}}
	if env.Family == IPv6 {
		v.ours4, v.neighs4, v.fdbs4 = map[prefix4]vroute4{}, map[[4]byte]vneigh{}, map[MAC]vfdb4{}
		v.ours, v.neighs, v.fdbs = make(map[prefix16]vroute, routes), make(map[ip16]vneigh, neighs), make(map[MAC]vfdb, fdbs)
	} else {
		v.ours4, v.neighs4, v.fdbs4 = make(map[prefix4]vroute4, routes), make(map[[4]byte]vneigh, neighs), make(map[MAC]vfdb4, fdbs)
		v.ours, v.neighs, v.fdbs = map[prefix16]vroute{}, map[ip16]vneigh{}, map[MAC]vfdb{}
	}
	return v
}

// viewOf indexes a listing. Our routes are those of our protocol on the
// device or the underlay; routes of our protocol on other links belong to
// another instance (or an old underlay) and are nobody's business here.
// sizeHint is the number of peers the view is about to hold (a cold start
// lists an empty kernel, then writes an entry of each kind per peer).
func viewOf(have kernelState, env diffEnv, sizeHint int) *view {
	v := newView(env, max(len(have.Routes)/2, sizeHint), max(len(have.Neighs), sizeHint), max(len(have.FDBs), sizeHint))
	for _, r := range have.Routes {
		onOurLinks := r.LinkIndex == env.Dev || (env.Underlay > 0 && r.LinkIndex == env.Underlay)
		switch {
		case r.Protocol == RouteProtocol && onOurLinks:
			if _, dup := v.route(r.Dst); dup || !v.isOurs(r) {
				v.extra = append(v.extra, r)
			} else {
				v.putOurs(r)
			}
		case r.Protocol == RouteProtocol:
		default:
			if m, ok := v.foreign[r.Dst]; !ok || r.Priority < m {
				v.foreign[r.Dst] = r.Priority
			}
			if env.DirectRouting && r.LinkIndex == env.Underlay && isConnected(r) {
				v.connected = append(v.connected, r.Dst)
			}
		}
	}
	for _, n := range have.Neighs {
		if n.LinkIndex == env.Dev {
			v.putNeigh(n)
		}
	}
	for _, f := range have.FDBs {
		if f.LinkIndex != env.Dev {
			continue
		}
		if _, ok := v.fdbFirst(f.MAC); ok {
			v.setFDBs(f.MAC, append(v.fdbAll(f.MAC), f))
		} else {
			v.putFDBFirst(f)
		}
	}
	return v
}

// isConnected reports whether r is a directly connected route: no gateway,
// and for IPv4 link scope. IPv6 routes carry no scope (all are universe),
// so a route without gateway is all it takes.
func isConnected(r Route) bool {
	return !r.Gw.IsValid() && (r.Scope == scopeLink || r.Dst.Addr().Is6())
}

// scoped is the part of v that concerns peers: the entries at their
// subnets, next hops and MACs, with the same picture of other programs'
// routes. Diffing a set of changed peers against it plans exactly their
// writes and the removal of what they leave behind, without a look at the
// entries of the peers that did not change.
func (v *view) scoped(peers ...[]Peer) *view {
	s := newView(v.env, 0, 0, 0)
	s.foreign, s.connected = v.foreign, v.connected
	for _, set := range peers {
		for _, p := range set {
			if r, ok := v.route(p.Subnet); ok {
				s.putOurs(r)
			}
			if n, ok := v.neigh(p.Subnet.Addr()); ok {
				s.putNeigh(n)
			}
			if all := v.fdbAll(PeerMAC(p)); all != nil {
				s.setFDBs(PeerMAC(p), all)
			}
		}
	}
	if len(v.extra) > 0 { // rare: only someone else's meddling leaves them
		in := map[netip.Prefix]bool{}
		for _, set := range peers {
			for _, p := range set {
				in[p.Subnet] = true
			}
		}
		for _, r := range v.extra {
			if in[r.Dst] {
				s.extra = append(s.extra, r)
			}
		}
	}
	return s
}

// record updates v for a write the kernel accepted, the way the kernel
// applies it: FDBSet keeps a remote with the same destination or rewrites
// the MAC's first remote (NLM_F_REPLACE on a VXLAN FDB).
func (v *view) record(o op) {
	switch o.kind {
	case opRouteSet:
		if v.isOurs(o.route) {
			v.putOurs(o.route)
		} else {
			v.extra = append(v.extra, o.route)
		}
	case opRouteDel, opRoutePrune:
		if r, ok := v.route(o.route.Dst); ok && r == o.route {
			v.delOurs(o.route.Dst)
		} else {
			v.extra = slices.DeleteFunc(v.extra, func(r Route) bool { return r == o.route })
		}
	case opNeighSet:
		v.putNeigh(o.neigh)
	case opNeighDel:
		v.delNeigh(o.neigh.IP)
	case opFDBSet:
		more, ok := v.fdbMore[o.fdb.MAC]
		if !ok { // one remote or none: the write makes it the only one
			v.putFDBFirst(o.fdb)
			return
		}
		all := v.fdbAll(o.fdb.MAC)
		if i := slices.IndexFunc(more, func(f FDB) bool { return f.Dst == o.fdb.Dst }); i >= 0 && all[0].Dst != o.fdb.Dst {
			all[i+1] = o.fdb
		} else {
			all[0] = o.fdb
		}
		v.setFDBs(o.fdb.MAC, all)
	case opFDBDel, opFDBPrune:
		all := v.fdbAll(o.fdb.MAC)
		v.setFDBs(o.fdb.MAC, slices.DeleteFunc(all, func(f FDB) bool { return !o.fdb.Dst.IsValid() || f.Dst == o.fdb.Dst }))
	}
}
