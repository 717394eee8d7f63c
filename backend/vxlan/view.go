package vxlan

import (
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
	Dev           int // index of our VXLAN device
	Underlay      int // index of the underlay link
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
type view struct {
	env diffEnv
	// ours holds our route to each destination at its metric (see
	// RouteMetric); extra the other routes of ours on our links (another
	// metric, a duplicate): stale by definition.
	ours  map[prefix16]vroute
	extra []Route
	// foreign is the lowest metric of other programs' routes by
	// destination, connected the underlay's directly connected subnets
	// (read for DirectRouting only). Writes never change them; only a
	// listing does.
	foreign   map[netip.Prefix]int
	connected []netip.Prefix
	neighs    map[ip16]vneigh // on our device
	// fdbs holds the first remote of each MAC on our device; fdbMore the
	// others, when someone appended remotes by hand (rare: usually nil).
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

func (v *view) packRoute(r Route) vroute {
	return vroute{gw: packIP(r.Gw), scope: uint8(r.Scope), onLink: r.OnLink, link: int32(r.LinkIndex)}
}

func (v *view) routeAt(k prefix16, r vroute) Route {
	dst := k.prefix()
	return Route{Dst: dst, Gw: r.gw.addr(), LinkIndex: int(r.link), OnLink: r.onLink, Protocol: RouteProtocol,
		Scope: int(r.scope), Priority: RouteMetric(dst)}
}

// route returns our route to dst at its metric.
func (v *view) route(dst netip.Prefix) (Route, bool) {
	k := packPrefix(dst)
	r, ok := v.ours[k]
	if !ok {
		return Route{}, false
	}
	return v.routeAt(k, r), true
}

// isOurs reports whether r is a route the view keeps in ours (rather than
// in extra): of our protocol, on one of our links, at its metric, and
// representable packed.
func (v *view) isOurs(r Route) bool {
	return r.Protocol == RouteProtocol && r.Priority == RouteMetric(r.Dst) && r.Dst.IsValid() &&
		(r.LinkIndex == v.env.Dev || (v.env.Underlay > 0 && r.LinkIndex == v.env.Underlay)) && r.Scope >= 0 && r.Scope < 256
}

func (v *view) neigh(ip netip.Addr) (Neigh, bool) {
	k := packIP(ip)
	n, ok := v.neighs[k]
	return v.neighAt(k, n), ok
}

func (v *view) neighAt(k ip16, n vneigh) Neigh {
	return Neigh{LinkIndex: v.env.Dev, IP: k.addr(), MAC: n.mac, State: int(n.state)}
}

func (v *view) putNeigh(n Neigh) { v.neighs[packIP(n.IP)] = vneigh{mac: n.MAC, state: uint16(n.State)} }

// fdbAll returns every remote of mac on our device.
func (v *view) fdbAll(mac MAC) []FDB {
	f, ok := v.fdbs[mac]
	if !ok {
		return nil
	}
	return append([]FDB{v.fdbAt(mac, f)}, v.fdbMore[mac]...)
}

func (v *view) fdbAt(mac MAC, f vfdb) FDB {
	return FDB{LinkIndex: v.env.Dev, MAC: mac, Dst: f.dst.addr(), State: int(f.state)}
}

// setFDBs makes all the remotes of mac on our device.
func (v *view) setFDBs(mac MAC, all []FDB) {
	if len(all) == 0 {
		delete(v.fdbs, mac)
		delete(v.fdbMore, mac)
		return
	}
	v.fdbs[mac] = vfdb{dst: packIP(all[0].Dst), state: uint16(all[0].State)}
	if len(all) == 1 {
		delete(v.fdbMore, mac)
		return
	}
	if v.fdbMore == nil {
		v.fdbMore = map[MAC][]FDB{}
	}
	v.fdbMore[mac] = slices.Clone(all[1:])
}

func newView(env diffEnv, routes, neighs, fdbs int) *view {
	return &view{env: env, ours: make(map[prefix16]vroute, routes), foreign: map[netip.Prefix]int{},
		neighs: make(map[ip16]vneigh, neighs), fdbs: make(map[MAC]vfdb, fdbs)}
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
			if _, dup := v.ours[packPrefix(r.Dst)]; dup || !v.isOurs(r) {
				v.extra = append(v.extra, r)
			} else {
				v.ours[packPrefix(r.Dst)] = v.packRoute(r)
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
		if _, ok := v.fdbs[f.MAC]; ok {
			v.setFDBs(f.MAC, append(v.fdbAll(f.MAC), f))
		} else {
			v.fdbs[f.MAC] = vfdb{dst: packIP(f.Dst), state: uint16(f.State)}
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
			if r, ok := v.ours[packPrefix(p.Subnet)]; ok {
				s.ours[packPrefix(p.Subnet)] = r
			}
			if n, ok := v.neighs[packIP(p.Subnet.Addr())]; ok {
				s.neighs[packIP(p.Subnet.Addr())] = n
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
			v.ours[packPrefix(o.route.Dst)] = v.packRoute(o.route)
		} else {
			v.extra = append(v.extra, o.route)
		}
	case opRouteDel, opRoutePrune:
		if r, ok := v.route(o.route.Dst); ok && r == o.route {
			delete(v.ours, packPrefix(o.route.Dst))
		} else {
			v.extra = slices.DeleteFunc(v.extra, func(r Route) bool { return r == o.route })
		}
	case opNeighSet:
		v.putNeigh(o.neigh)
	case opNeighDel:
		delete(v.neighs, packIP(o.neigh.IP))
	case opFDBSet:
		more, ok := v.fdbMore[o.fdb.MAC]
		if !ok { // one remote or none: the write makes it the only one
			v.fdbs[o.fdb.MAC] = vfdb{dst: packIP(o.fdb.Dst), state: uint16(o.fdb.State)}
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
