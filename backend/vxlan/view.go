package vxlan

import (
	"net/netip"
	"slices"
)

// kernelState is what a full pass reads back from the kernel: one dump of
// each kind.
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

// view is the backend's one model of the kernel: the entries of ours on the
// device and the underlay, indexed the way the diff looks them up, and what
// the last listing showed of other programs' routes. A full pass replaces
// it with a fresh listing (viewOf); each successful write updates it
// (record); every pass diffs the desired peers against it. It belongs to
// whoever holds Backend.opMu — Run's loop, or a caller of EnsureDevice,
// Reconcile or Teardown — and is never shared.
type view struct {
	env diffEnv
	// ours holds our route to each destination at its metric (see
	// RouteMetric); extra the other routes of ours on our links (another
	// metric, a duplicate): stale by definition.
	ours  map[netip.Prefix]Route
	extra []Route
	// foreign is the lowest metric of other programs' routes by
	// destination, connected the underlay's directly connected subnets
	// (read for DirectRouting only). Writes never change them; only a
	// listing does.
	foreign   map[netip.Prefix]int
	connected []netip.Prefix
	neighs    map[netip.Addr]Neigh // on our device
	fdbs      map[MAC]fdbSlot      // on our device, by MAC
}

// fdbSlot holds the remotes of one MAC: usually one; more only when
// someone appended remotes by hand.
type fdbSlot struct {
	first FDB
	more  []FDB
}

func (s fdbSlot) all() []FDB { return append([]FDB{s.first}, s.more...) }

// viewOf indexes a listing. Our routes are those of our protocol on the
// device or the underlay; routes of our protocol on other links belong to
// another instance (or an old underlay) and are nobody's business here.
func viewOf(have kernelState, env diffEnv) *view {
	v := &view{
		env:     env,
		ours:    make(map[netip.Prefix]Route, len(have.Routes)/2),
		foreign: make(map[netip.Prefix]int),
		neighs:  make(map[netip.Addr]Neigh, len(have.Neighs)),
		fdbs:    make(map[MAC]fdbSlot, len(have.FDBs)),
	}
	for _, r := range have.Routes {
		onOurLinks := r.LinkIndex == env.Dev || (env.Underlay > 0 && r.LinkIndex == env.Underlay)
		switch {
		case r.Protocol == RouteProtocol && onOurLinks:
			if _, dup := v.ours[r.Dst]; dup || r.Priority != RouteMetric(r.Dst) {
				v.extra = append(v.extra, r)
			} else {
				v.ours[r.Dst] = r
			}
		case r.Protocol == RouteProtocol:
		default:
			if m, ok := v.foreign[r.Dst]; !ok || r.Priority < m {
				v.foreign[r.Dst] = r.Priority
			}
			if env.DirectRouting && r.LinkIndex == env.Underlay && !r.Gw.IsValid() && r.Scope == scopeLink {
				v.connected = append(v.connected, r.Dst)
			}
		}
	}
	for _, n := range have.Neighs {
		if n.LinkIndex == env.Dev {
			v.neighs[n.IP] = n
		}
	}
	for _, f := range have.FDBs {
		if f.LinkIndex != env.Dev {
			continue
		}
		if s, ok := v.fdbs[f.MAC]; ok {
			s.more = append(s.more, f)
			v.fdbs[f.MAC] = s
		} else {
			v.fdbs[f.MAC] = fdbSlot{first: f}
		}
	}
	return v
}

// scoped is the part of v that concerns peers: the entries at their
// subnets, next hops and MACs, with the same picture of other programs'
// routes. Diffing a set of changed peers against it plans exactly their
// writes and the removal of what they leave behind, without a look at the
// entries of the peers that did not change.
func (v *view) scoped(peers ...[]Peer) *view {
	s := &view{env: v.env, foreign: v.foreign, connected: v.connected,
		ours: map[netip.Prefix]Route{}, neighs: map[netip.Addr]Neigh{}, fdbs: map[MAC]fdbSlot{}}
	for _, set := range peers {
		for _, p := range set {
			if r, ok := v.ours[p.Subnet]; ok {
				s.ours[p.Subnet] = r
			}
			if n, ok := v.neighs[p.Subnet.Addr()]; ok {
				s.neighs[n.IP] = n
			}
			if f, ok := v.fdbs[p.VtepMAC]; ok {
				s.fdbs[p.VtepMAC] = f
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
		v.ours[o.route.Dst] = o.route
	case opRouteDel, opRoutePrune:
		if r, ok := v.ours[o.route.Dst]; ok && r == o.route {
			delete(v.ours, o.route.Dst)
		} else {
			v.extra = slices.DeleteFunc(v.extra, func(r Route) bool { return r == o.route })
		}
	case opNeighSet:
		v.neighs[o.neigh.IP] = o.neigh
	case opNeighDel:
		delete(v.neighs, o.neigh.IP)
	case opFDBSet:
		s, ok := v.fdbs[o.fdb.MAC]
		switch {
		case !ok || s.first.Dst == o.fdb.Dst:
			s.first = o.fdb
		default:
			if i := slices.IndexFunc(s.more, func(f FDB) bool { return f.Dst == o.fdb.Dst }); i >= 0 {
				s.more[i] = o.fdb
			} else {
				s.first = o.fdb
			}
		}
		v.fdbs[o.fdb.MAC] = s
	case opFDBDel, opFDBPrune:
		s, ok := v.fdbs[o.fdb.MAC]
		if !ok {
			return
		}
		rest := slices.DeleteFunc(s.all(), func(f FDB) bool { return !o.fdb.Dst.IsValid() || f.Dst == o.fdb.Dst })
		if len(rest) == 0 {
			delete(v.fdbs, o.fdb.MAC)
		} else {
			v.fdbs[o.fdb.MAC] = fdbSlot{first: rest[0], more: rest[1:]}
		}
	}
}
