package vxlantest

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"syscall"

	"github.com/overlaynet/overlay/backend/vxlan"
)

// View is the fake seen from outside the backend (see External). Its
// Netlink methods change the same state as the Fake's.
type View struct {
	f      *Fake
	ext    bool
	notify bool
}

var _ vxlan.Netlink = (*View)(nil)

// begin checks faults and counts a write; it runs the write hook first.
func (v *View) begin(op, key string, write bool) error {
	if v.ext {
		return nil
	}
	f := v.f
	f.mu.Lock()
	hook := f.onWrite
	f.mu.Unlock()
	if write && hook != nil {
		hook(op, key)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if write {
		f.writes++
		f.opLog = append(f.opLog, op+" "+key)
	}
	for i, ft := range f.faults {
		if ft.Op != op || (ft.Match != "" && ft.Match != key) {
			continue
		}
		if ft.Times > 0 {
			ft.Times--
			if ft.Times == 0 {
				f.faults = slices.Delete(f.faults, i, i+1)
			}
		}
		return fmt.Errorf("fake %s %s: %w", op, key, ft.Err)
	}
	return nil
}

// emit sends an event to subscribers if this is a notifying external View.
// Called with f.mu held; subscribers' fn must not block (the contract).
func (v *View) emit(e vxlan.Event) {
	if !v.ext || !v.notify {
		return
	}
	for s := range v.f.subs {
		s.fn(e)
	}
}

func idx(i int) string { return strconv.Itoa(i) }

// Write implements vxlan.Netlink the way the kernel does: each request in
// order, independently, so a fault injected into one leaves the others
// applied (rtnetlink processes a batch's requests one by one).
func (v *View) Write(batch []vxlan.Write) []error {
	errs := make([]error, len(batch))
	for i, w := range batch {
		switch w.Kind {
		case vxlan.RouteReplace:
			errs[i] = v.RouteReplace(w.Route)
		case vxlan.RouteDel:
			errs[i] = v.RouteDel(w.Route)
		case vxlan.NeighSet:
			errs[i] = v.NeighSet(w.Neigh)
		case vxlan.NeighDel:
			errs[i] = v.NeighDel(w.Neigh)
		case vxlan.FDBSet:
			errs[i] = v.FDBSet(w.FDB)
		case vxlan.FDBDel:
			errs[i] = v.FDBDel(w.FDB)
		default:
			errs[i] = fmt.Errorf("fake: no such write %v", w.Kind)
		}
	}
	return errs
}

func (v *View) LinkByName(name string) (vxlan.Link, error) {
	if err := v.begin("LinkByName", name, false); err != nil {
		return vxlan.Link{}, err
	}
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	for _, l := range v.f.links {
		if l.Name == name {
			return l, nil
		}
	}
	return vxlan.Link{}, fmt.Errorf("link %s: %w", name, vxlan.ErrLinkNotFound)
}

func (v *View) LinkByIndex(i int) (vxlan.Link, error) {
	if err := v.begin("LinkByIndex", idx(i), false); err != nil {
		return vxlan.Link{}, err
	}
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	if l, ok := v.f.links[i]; ok {
		return l, nil
	}
	return vxlan.Link{}, fmt.Errorf("link index %d: %w", i, vxlan.ErrLinkNotFound)
}

func (v *View) LinkList() ([]vxlan.Link, error) {
	if err := v.begin("LinkList", "", false); err != nil {
		return nil, err
	}
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	out := make([]vxlan.Link, 0, len(v.f.links))
	for _, l := range v.f.links {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b vxlan.Link) int { return cmp.Compare(a.Index, b.Index) })
	return out, nil
}

func (v *View) LinkAdd(l vxlan.Link) error {
	if err := v.begin("LinkAdd", l.Name, true); err != nil {
		return err
	}
	f := v.f
	f.mu.Lock()
	defer f.mu.Unlock()
	under, ok := f.links[l.UnderlayIndex]
	switch {
	case l.Kind != "vxlan":
		return syscall.EOPNOTSUPP
	case !ok:
		return syscall.ENODEV
	}
	for _, o := range f.links {
		if o.Name == l.Name {
			return syscall.EEXIST
		}
		if o.Kind == "vxlan" && o.VNI == l.VNI && o.Port == l.Port && o.Family() == l.Family() {
			return syscall.EEXIST // the kernel's "VNI in use"
		}
	}
	overhead := vxlan.Overhead
	if l.Family() == vxlan.IPv6 {
		overhead = vxlan.OverheadV6
	}
	if l.MTU == 0 {
		l.MTU = under.MTU - overhead
	}
	if l.MTU > under.MTU-overhead {
		return syscall.EINVAL
	}
	if l.MAC.IsZero() {
		f.nextMAC++
		l.MAC = vxlan.MAC{0x02, 0xaa, 0, 0, 0, f.nextMAC}
	}
	l.Index = f.nextIndex
	f.nextIndex++
	l.Up = false
	f.links[l.Index] = l
	v.emit(vxlan.Event{Kind: vxlan.EventLink, LinkIndex: l.Index, LinkName: l.Name})
	return nil
}

func (v *View) LinkDel(i int) error {
	if err := v.begin("LinkDel", idx(i), true); err != nil {
		return err
	}
	f := v.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.links[i]; !ok {
		return syscall.ENODEV
	}
	v.delLink(i)
	return nil
}

// delLink removes a link with everything on it, and the VXLAN devices
// stacked on it, as the kernel does.
func (v *View) delLink(i int) {
	f := v.f
	l := f.links[i]
	delete(f.links, i)
	delete(f.addrs, i)
	f.flushRoutes(i)
	f.flushNeighs(i)
	f.fdbs = slices.DeleteFunc(f.fdbs, func(e vxlan.FDB) bool { return e.LinkIndex == i })
	v.emit(vxlan.Event{Kind: vxlan.EventLink, LinkIndex: i, LinkName: l.Name, Deleted: true})
	for _, o := range f.links {
		if o.Kind == "vxlan" && o.UnderlayIndex == i {
			v.delLink(o.Index)
		}
	}
}

func (f *Fake) flushRoutes(link int) {
	for k, r := range f.routes {
		if r.LinkIndex == link {
			delete(f.routes, k)
		}
	}
}

func (f *Fake) flushNeighs(link int) {
	for k := range f.neighs {
		if k.link == link {
			delete(f.neighs, k)
		}
	}
}

func (v *View) setLink(op string, i int, change func(*vxlan.Link)) error {
	if err := v.begin(op, idx(i), true); err != nil {
		return err
	}
	f := v.f
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.links[i]
	if !ok {
		return syscall.ENODEV
	}
	change(&l)
	f.links[i] = l
	v.emit(vxlan.Event{Kind: vxlan.EventLink, LinkIndex: i, LinkName: l.Name})
	return nil
}

func (v *View) LinkSetUp(i int) error {
	return v.setLink("LinkSetUp", i, func(l *vxlan.Link) {
		if !l.Up {
			l.Up = true
			for _, a := range v.f.addrs[i] {
				v.f.addConnected(i, a)
			}
		}
	})
}

// LinkSetDown is not part of vxlan.Netlink (the backend never takes a link
// down); on an External View it emulates `ip link set down`, which flushes
// the link's routes and neighbours.
func (v *View) LinkSetDown(i int) error {
	return v.setLink("LinkSetDown", i, func(l *vxlan.Link) {
		l.Up = false
		v.f.flushRoutes(i)
		v.f.flushNeighs(i)
	})
}

func (v *View) LinkSetMTU(i, mtu int) error {
	return v.setLink("LinkSetMTU", i, func(l *vxlan.Link) { l.MTU = mtu })
}

func (v *View) LinkSetMAC(i int, m vxlan.MAC) error {
	return v.setLink("LinkSetMAC", i, func(l *vxlan.Link) { l.MAC = m })
}

func (v *View) AddrList(i int) ([]netip.Prefix, error) { return v.AddrListFamily(i, vxlan.IPv4) }

// AddrListFamily implements vxlan.Netlink; its faults are AddrList's.
func (v *View) AddrListFamily(i int, fam vxlan.Family) ([]netip.Prefix, error) {
	if err := v.begin("AddrList", idx(i), false); err != nil {
		return nil, err
	}
	v.f.mu.Lock()
	defer v.f.mu.Unlock()
	var out []netip.Prefix
	for _, a := range v.f.addrs[i] {
		if familyOf(a.Addr()) == fam {
			out = append(out, a)
		}
	}
	return out, nil
}

// familyOf is the family of a valid address.
func familyOf(a netip.Addr) vxlan.Family {
	if a.Is4() {
		return vxlan.IPv4
	}
	return vxlan.IPv6
}

func (f *Fake) addAddr(i int, a netip.Prefix) {
	if !slices.Contains(f.addrs[i], a) {
		f.addrs[i] = append(f.addrs[i], a)
	}
	if f.links[i].Up {
		f.addConnected(i, a)
	}
}

// addConnected adds the kernel's route for an address's subnet, none for a
// host address (the backend adds its IPv6 one without a prefix route). An
// IPv4 one has link scope and metric 0, an IPv6 one no scope (universe)
// and metric 256, as the kernel's.
func (f *Fake) addConnected(i int, a netip.Prefix) {
	if a.Bits() >= a.Addr().BitLen() {
		return
	}
	r := vxlan.Route{Dst: a.Masked(), LinkIndex: i, Protocol: 2, Scope: 253}
	if a.Addr().Is6() {
		r.Scope, r.Priority = 0, 256
	}
	f.routes[routeKey{dst: r.Dst, prio: r.Priority}] = r
}

func (v *View) AddrReplace(i int, a netip.Prefix) error {
	if err := v.begin("AddrReplace", idx(i), true); err != nil {
		return err
	}
	f := v.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.links[i]; !ok {
		return syscall.ENODEV
	}
	f.addAddr(i, a)
	return nil
}

func (v *View) AddrDel(i int, a netip.Prefix) error {
	if err := v.begin("AddrDel", idx(i), true); err != nil {
		return err
	}
	f := v.f
	f.mu.Lock()
	defer f.mu.Unlock()
	n := len(f.addrs[i])
	f.addrs[i] = slices.DeleteFunc(f.addrs[i], func(p netip.Prefix) bool { return p == a })
	if len(f.addrs[i]) == n {
		return syscall.EADDRNOTAVAIL
	}
	for k, r := range f.routes {
		if r.LinkIndex == i && r.Protocol == 2 && r.Dst == a.Masked() && a.Bits() < a.Addr().BitLen() {
			delete(f.routes, k)
		}
	}
	return nil
}
