package vxlantest

import (
	"cmp"
	"net/netip"
	"slices"
	"syscall"

	"github.com/overlaynet/overlay/backend/vxlan"
)

// The routing, neighbour and FDB tables of the fake namespace.

func (v *View) RouteList() ([]vxlan.Route, error) { return v.RouteListFamily(vxlan.IPv4) }

// RouteListFamily implements vxlan.Netlink; its faults are RouteList's.
func (v *View) RouteListFamily(fam vxlan.Family) ([]vxlan.Route, error) {
	if err := v.begin("RouteList", "", false); err != nil {
		return nil, err
	}
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	out := make([]vxlan.Route, 0, len(v.f.routes))
	for _, r := range v.f.routes {
		if familyOf(r.Dst.Addr()) == fam {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b vxlan.Route) int {
		return cmp.Or(a.Dst.Addr().Compare(b.Dst.Addr()), cmp.Compare(a.Dst.Bits(), b.Dst.Bits()), cmp.Compare(a.Priority, b.Priority))
	})
	return out, nil
}

func (v *View) RouteReplace(r vxlan.Route) error {
	if err := v.begin("RouteReplace", r.Dst.String(), true); err != nil {
		return err
	}
	f := v.f
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.links[r.LinkIndex]
	if !ok {
		return syscall.ENODEV
	}
	if r.Gw.IsValid() {
		if !l.Up {
			return syscall.ENETDOWN
		}
		if !r.OnLink && !f.connected(r.LinkIndex, r.Gw) {
			return syscall.ENETUNREACH
		}
	}
	f.routes[routeKey{dst: r.Dst, prio: r.Priority}] = r
	return nil
}

func (f *Fake) connected(link int, a netip.Addr) bool {
	for _, r := range f.routes {
		if r.LinkIndex == link && !r.Gw.IsValid() && (r.Scope == 253 || r.Dst.Addr().Is6()) && r.Dst.Contains(a) {
			return true
		}
	}
	return false
}

func (v *View) RouteDel(r vxlan.Route) error {
	if err := v.begin("RouteDel", r.Dst.String(), true); err != nil {
		return err
	}
	f := v.f
	f.mu.Lock()
	defer f.mu.Unlock()
	// Like the kernel: every attribute given must match; metric 0 matches
	// any metric. The lowest metric goes first.
	var victim *routeKey
	for k, have := range f.routes {
		if k.dst != r.Dst ||
			(r.Priority != 0 && have.Priority != r.Priority) ||
			(r.Protocol != 0 && have.Protocol != r.Protocol) ||
			(r.LinkIndex != 0 && have.LinkIndex != r.LinkIndex) ||
			(r.Gw.IsValid() && have.Gw != r.Gw) {
			continue
		}
		if victim == nil || k.prio < victim.prio {
			victim = &k
		}
	}
	if victim == nil {
		return syscall.ESRCH
	}
	have := f.routes[*victim]
	delete(f.routes, *victim)
	v.emit(vxlan.Event{Kind: vxlan.EventRouteDel, LinkIndex: have.LinkIndex, Protocol: have.Protocol, Dst: have.Dst})
	return nil
}

func (v *View) NeighList(i int) ([]vxlan.Neigh, error) { return v.NeighListFamily(i, vxlan.IPv4) }

// NeighListFamily implements vxlan.Netlink; its faults are NeighList's.
func (v *View) NeighListFamily(i int, fam vxlan.Family) ([]vxlan.Neigh, error) {
	if err := v.begin("NeighList", idx(i), false); err != nil {
		return nil, err
	}
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	var out []vxlan.Neigh
	for k, n := range v.f.neighs {
		if k.link == i && familyOf(n.IP) == fam {
			out = append(out, n)
		}
	}
	slices.SortFunc(out, func(a, b vxlan.Neigh) int { return a.IP.Compare(b.IP) })
	return out, nil
}

func (v *View) NeighSet(n vxlan.Neigh) error {
	if err := v.begin("NeighSet", n.IP.String(), true); err != nil {
		return err
	}
	f := v.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.links[n.LinkIndex]; !ok {
		return syscall.ENODEV
	}
	f.neighs[neighKey{n.LinkIndex, n.IP}] = n
	return nil
}

func (v *View) NeighDel(n vxlan.Neigh) error {
	if err := v.begin("NeighDel", n.IP.String(), true); err != nil {
		return err
	}
	f := v.f
	f.mu.Lock()
	defer f.mu.Unlock()
	k := neighKey{n.LinkIndex, n.IP}
	if _, ok := f.neighs[k]; !ok {
		return syscall.ENOENT
	}
	delete(f.neighs, k)
	v.emit(vxlan.Event{Kind: vxlan.EventNeighDel, LinkIndex: n.LinkIndex, IP: n.IP})
	return nil
}

func (v *View) FDBList(i int) ([]vxlan.FDB, error) {
	if err := v.begin("FDBList", idx(i), false); err != nil {
		return nil, err
	}
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	var out []vxlan.FDB
	for _, e := range v.f.fdbs {
		if e.LinkIndex == i {
			out = append(out, e)
		}
	}
	return out, nil
}

// FDBSet follows the kernel's NLM_F_CREATE|NLM_F_REPLACE on a VXLAN FDB:
// create the entry, or if the MAC has remotes, keep a matching one or
// rewrite the first.
func (v *View) FDBSet(e vxlan.FDB) error {
	if err := v.begin("FDBSet", e.MAC.String(), true); err != nil {
		return err
	}
	f := v.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.links[e.LinkIndex]; !ok {
		return syscall.ENODEV
	}
	first := -1
	for i, o := range f.fdbs {
		if o.LinkIndex != e.LinkIndex || o.MAC != e.MAC {
			continue
		}
		if o.Dst == e.Dst {
			f.fdbs[i].State = e.State
			return nil
		}
		if first < 0 {
			first = i
		}
	}
	if first >= 0 {
		f.fdbs[first] = e
	} else {
		f.fdbs = append(f.fdbs, e)
	}
	return nil
}

// FDBAppend adds a further remote for a MAC (`bridge fdb append`). Not part
// of vxlan.Netlink; use it on an External View.
func (v *View) FDBAppend(e vxlan.FDB) error {
	f := v.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fdbs = append(f.fdbs, e)
	return nil
}

func (v *View) FDBDel(e vxlan.FDB) error {
	if err := v.begin("FDBDel", e.MAC.String(), true); err != nil {
		return err
	}
	f := v.f
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.fdbs)
	f.fdbs = slices.DeleteFunc(f.fdbs, func(o vxlan.FDB) bool {
		return o.LinkIndex == e.LinkIndex && o.MAC == e.MAC && (!e.Dst.IsValid() || o.Dst == e.Dst)
	})
	if len(f.fdbs) == n {
		return syscall.ENOENT
	}
	v.emit(vxlan.Event{Kind: vxlan.EventNeighDel, LinkIndex: e.LinkIndex, FDB: true, MAC: e.MAC})
	return nil
}

func (v *View) Subscribe(done <-chan struct{}, fn func(vxlan.Event)) (<-chan struct{}, error) {
	return v.f.Subscribe(done, fn)
}
