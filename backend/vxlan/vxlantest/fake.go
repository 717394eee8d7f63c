// Package vxlantest provides an in-memory vxlan.Netlink that behaves like
// the kernel where the backend depends on it (replace semantics, not-found
// errnos, links taking their entries with them), injects errors and counts
// writes; and a renderer that prints a namespace's overlay state as sorted
// text for golden comparisons, for the fake and the real kernel alike.
package vxlantest

import (
	"net/netip"
	"sync"

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
