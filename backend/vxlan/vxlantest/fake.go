// Package vxlantest provides an in-memory vxlan.Netlink that behaves like
// the kernel where the backend depends on it (replace semantics, not-found
// errnos, links taking their entries with them), injects errors and counts
// writes; and a renderer that prints a namespace's overlay state as sorted
// text for golden comparisons, for the fake and the real kernel alike.
package vxlantest

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"github.com/overlaynet/overlay/backend/vxlan"
)

// Fault makes matching calls fail.
type Fault struct {
	// Op is the Netlink method name, e.g. "RouteReplace", "FDBSet",
	// "NeighList", "LinkAdd", "Subscribe".
	Op string
	// Match restricts the fault to calls about one object, by its key:
	// the destination prefix for routes ("10.244.2.0/24"), the IP for
	// neighbours, the MAC for FDB entries, the name for LinkAdd and
	// LinkByName, the decimal index for other link and list calls. Empty
	// matches every call.
	Match string
	Err   error // e.g. syscall.EBUSY, vxlan.ErrDumpInterrupted
	// Times is how many matching calls fail; 0 means every one until
	// the fault is cleared.
	Times int
}

type routeKey struct {
	dst  netip.Prefix
	prio int
}

type neighKey struct {
	link int
	ip   netip.Addr
}

type subscription struct {
	fn    func(vxlan.Event)
	ended chan struct{}
	once  sync.Once
}

func (s *subscription) end() { s.once.Do(func() { close(s.ended) }) }

// Fake is an in-memory network namespace. The zero value is not usable;
// call NewFake. It is safe for concurrent use.
type Fake struct {
	mu        sync.Mutex
	links     map[int]vxlan.Link
	addrs     map[int][]netip.Prefix
	routes    map[routeKey]vxlan.Route
	neighs    map[neighKey]vxlan.Neigh
	fdbs      []vxlan.FDB
	nextIndex int
	nextMAC   byte

	faults  []*Fault
	writes  int
	opLog   []string
	subs    map[*subscription]bool
	onWrite func(op, key string)
}

var _ vxlan.Netlink = (*Fake)(nil)

// NewFake returns an empty namespace with only lo (index 1).
func NewFake() *Fake {
	f := &Fake{
		links:     map[int]vxlan.Link{1: {Index: 1, Name: "lo", Kind: "loopback", MTU: 65536, Up: true}},
		addrs:     map[int][]netip.Prefix{},
		routes:    map[routeKey]vxlan.Route{},
		neighs:    map[neighKey]vxlan.Neigh{},
		nextIndex: 2,
		subs:      map[*subscription]bool{},
	}
	return f
}

// AddUnderlay adds an up Ethernet link with an address and its connected
// route, as a host's uplink, and returns its index.
func (f *Fake) AddUnderlay(name string, mtu int, addr netip.Prefix) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	idx := f.nextIndex
	f.nextIndex++
	f.nextMAC++
	f.links[idx] = vxlan.Link{Index: idx, Name: name, Kind: "veth", MTU: mtu, Up: true, MAC: vxlan.MAC{0x02, 0xee, 0, 0, 0, f.nextMAC}}
	f.addAddr(idx, addr)
	return idx
}

// Inject adds a fault. Faults are checked in the order they were added.
func (f *Fake) Inject(ft Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = append(f.faults, &ft)
}

// ClearFaults removes every fault.
func (f *Fake) ClearFaults() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.faults = nil
}

// Writes returns how many write calls (create, change, delete; failed ones
// included) went through the Netlink interface.
func (f *Fake) Writes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.writes
}

// Ops returns the write calls so far, as "Method key", and forgets them.
func (f *Fake) Ops() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	ops := f.opLog
	f.opLog = nil
	return ops
}

// OnWrite installs a hook called (without locks held) before every write
// through the Netlink interface. It may block, to hold a pass mid-way.
func (f *Fake) OnWrite(hook func(op, key string)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.onWrite = hook
}

// Subscriptions is the number of live subscriptions to notifications.
func (f *Fake) Subscriptions() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.subs)
}

// BreakSubscriptions ends every subscription, as a socket overflow would.
func (f *Fake) BreakSubscriptions() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		s.end()
		delete(f.subs, s)
	}
}

// External returns a View of the namespace for changes made by someone
// else (an operator, another program): they bypass faults and write
// counting, and if notify is set they produce the events the kernel would
// send; without it they are silent drift that only a listing can find.
func (f *Fake) External(notify bool) *View { return &View{f: f, ext: true, notify: notify} }

// The Netlink methods of Fake count writes and apply faults.

func (f *Fake) LinkByName(name string) (vxlan.Link, error) { return f.v().LinkByName(name) }
func (f *Fake) LinkByIndex(i int) (vxlan.Link, error)      { return f.v().LinkByIndex(i) }
func (f *Fake) LinkList() ([]vxlan.Link, error)            { return f.v().LinkList() }
func (f *Fake) LinkAdd(l vxlan.Link) error                 { return f.v().LinkAdd(l) }
func (f *Fake) LinkDel(i int) error                        { return f.v().LinkDel(i) }
func (f *Fake) LinkSetUp(i int) error                      { return f.v().LinkSetUp(i) }
func (f *Fake) LinkSetMTU(i, mtu int) error                { return f.v().LinkSetMTU(i, mtu) }
func (f *Fake) LinkSetMAC(i int, m vxlan.MAC) error        { return f.v().LinkSetMAC(i, m) }
func (f *Fake) AddrList(i int) ([]netip.Prefix, error)     { return f.v().AddrList(i) }
func (f *Fake) AddrReplace(i int, a netip.Prefix) error    { return f.v().AddrReplace(i, a) }
func (f *Fake) AddrDel(i int, a netip.Prefix) error        { return f.v().AddrDel(i, a) }
func (f *Fake) RouteList() ([]vxlan.Route, error)          { return f.v().RouteList() }
func (f *Fake) RouteReplace(r vxlan.Route) error           { return f.v().RouteReplace(r) }
func (f *Fake) RouteDel(r vxlan.Route) error               { return f.v().RouteDel(r) }
func (f *Fake) NeighList(i int) ([]vxlan.Neigh, error)     { return f.v().NeighList(i) }
func (f *Fake) NeighSet(n vxlan.Neigh) error               { return f.v().NeighSet(n) }
func (f *Fake) NeighDel(n vxlan.Neigh) error               { return f.v().NeighDel(n) }
func (f *Fake) FDBList(i int) ([]vxlan.FDB, error)         { return f.v().FDBList(i) }
func (f *Fake) FDBSet(e vxlan.FDB) error                   { return f.v().FDBSet(e) }
func (f *Fake) FDBDel(e vxlan.FDB) error                   { return f.v().FDBDel(e) }
func (f *Fake) Write(batch []vxlan.Write) []error          { return f.v().Write(batch) }

// The listings of either family.

func (f *Fake) AddrListFamily(i int, fam vxlan.Family) ([]netip.Prefix, error) {
	return f.v().AddrListFamily(i, fam)
}

func (f *Fake) RouteListFamily(fam vxlan.Family) ([]vxlan.Route, error) {
	return f.v().RouteListFamily(fam)
}

func (f *Fake) NeighListFamily(i int, fam vxlan.Family) ([]vxlan.Neigh, error) {
	return f.v().NeighListFamily(i, fam)
}

// Subscribe implements vxlan.Netlink.
func (f *Fake) Subscribe(done <-chan struct{}, fn func(vxlan.Event)) (<-chan struct{}, error) {
	if err := f.v().begin("Subscribe", "", false); err != nil {
		return nil, err
	}
	s := &subscription{fn: fn, ended: make(chan struct{})}
	f.mu.Lock()
	f.subs[s] = true
	f.mu.Unlock()
	go func() {
		select {
		case <-done:
		case <-s.ended:
		}
		f.mu.Lock()
		delete(f.subs, s)
		f.mu.Unlock()
		s.end()
	}()
	return s.ended, nil
}

func (f *Fake) v() *View { return &View{f: f} }

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
