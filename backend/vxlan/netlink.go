package vxlan

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"syscall"

	"github.com/vishvananda/netlink"

	"github.com/overlaynet/overlay/backend"
)

// Netlink is the narrow slice of rtnetlink the backend uses. KernelNetlink is
// the real implementation; vxlantest.Fake is an in-memory one that injects
// errors and counts writes. Values are plain comparable structs rather than
// the netlink package's types, so the reconciler can key maps by them and a
// fake needs no knowledge of wire formats.
//
// Every method is about one network namespace, the one the implementation
// was opened in. List methods may fail with netlink.ErrDumpInterrupted or
// EINTR, which callers retry.
type Netlink interface {
	// LinkByName and LinkByIndex return ErrLinkNotFound (wrapped) when
	// there is no such link.
	LinkByName(name string) (Link, error)
	LinkByIndex(index int) (Link, error)
	// LinkList lists every link; only used to explain a failed LinkAdd.
	LinkList() ([]Link, error)
	// LinkAdd creates the VXLAN device l describes (Kind must be "vxlan").
	LinkAdd(l Link) error
	LinkDel(index int) error
	LinkSetUp(index int) error
	LinkSetMTU(index, mtu int) error
	LinkSetMAC(index int, mac MAC) error

	// AddrList returns the IPv4 addresses of a link; AddrListFamily
	// those of either family. AddrReplace adds an IPv6 address without
	// duplicate address detection (IFA_F_NODAD), usable at once, and
	// without a prefix route (IFA_F_NOPREFIXROUTE).
	AddrList(index int) ([]netip.Prefix, error)
	AddrListFamily(index int, fam Family) ([]netip.Prefix, error)
	AddrReplace(index int, addr netip.Prefix) error
	AddrDel(index int, addr netip.Prefix) error

	// RouteList returns the IPv4 routes of the main table;
	// RouteListFamily those of either family.
	RouteList() ([]Route, error)
	RouteListFamily(fam Family) ([]Route, error)
	// NeighList returns the IPv4 neighbour entries of a link;
	// NeighListFamily those of either family.
	NeighList(index int) ([]Neigh, error)
	NeighListFamily(index int, fam Family) ([]Neigh, error)
	// FDBList returns the VXLAN forwarding entries of a link, one per
	// remote (an entry with two remotes is listed twice).
	FDBList(index int) ([]FDB, error)

	// Write applies independent route, neighbour and FDB writes in order
	// and returns each one's error (nil when it succeeded); a failed write
	// does not stop the others. It is the only way entries are written, so
	// the fake and the kernel share the reconciler's write path: the kernel
	// sends many requests per sendmsg, the fake applies them one by one.
	Write(batch []Write) []error

	// Subscribe calls fn for link changes, route deletions (of both
	// families) and neighbour deletions until done is closed or the
	// subscription breaks (for example when the socket buffer overflows);
	// the returned channel is closed then. fn must not block.
	Subscribe(done <-chan struct{}, fn func(Event)) (ended <-chan struct{}, err error)
}

// WriteKind is what a Write does.
type WriteKind uint8

const (
	RouteReplace WriteKind = iota // create or replace Write.Route
	RouteDel                      // delete Write.Route
	NeighSet                      // create or replace Write.Neigh
	NeighDel                      // delete Write.Neigh
	FDBSet                        // create or replace Write.FDB
	FDBDel                        // delete Write.FDB (the one remote it names)
)

var writeKindNames = [...]string{"route-replace", "route-del", "neigh-set", "neigh-del", "fdb-set", "fdb-del"}

func (k WriteKind) String() string {
	if int(k) < len(writeKindNames) {
		return writeKindNames[k]
	}
	return "write-" + strconv.Itoa(int(k))
}

// Write is one request of a Netlink.Write batch: Kind says which of Route,
// Neigh and FDB it carries. It is the wire layer's own request type; the
// reconciler's plan (op) is turned into it when it runs.
type Write struct {
	Kind  WriteKind
	Route Route
	Neigh Neigh
	FDB   FDB
}

// Family is backend.Family: a Backend programs either the IPv4 overlay or
// the IPv6 one, chosen by its Config (see Config.OwnSubnet), and lists and
// writes only entries of its family.
type Family = backend.Family

// The two families. The zero Family means IPv4 wherever one is expected.
const (
	IPv4 = backend.IPv4
	IPv6 = backend.IPv6
)

// familyOf is the family of a valid address (an IPv4-mapped IPv6 address
// is IPv6, as the kernel sees it).
func familyOf(a netip.Addr) Family {
	if a.Is4() {
		return IPv4
	}
	return IPv6
}

// ErrLinkNotFound is returned (wrapped) by LinkByName and LinkByIndex.
var ErrLinkNotFound = errors.New("link not found")

// ErrDumpInterrupted is what a list returns when the kernel's table changed
// during the dump (NLM_F_DUMP_INTR); the listing is retried.
var ErrDumpInterrupted = netlink.ErrDumpInterrupted

// MAC is backend.MAC, an Ethernet address as a comparable value.
type MAC = backend.MAC

// Link is a network device as far as the backend cares. For non-VXLAN links
// only Index, Name, Kind, MTU, MAC and Up are meaningful.
type Link struct {
	Index int
	Name  string
	Kind  string // "vxlan", "veth", "dummy", ...
	MTU   int
	MAC   MAC
	Up    bool // administratively up (IFF_UP)

	// VXLAN attributes.
	VNI           int
	Port          int        // UDP destination port
	Local         netip.Addr // source address of encapsulated packets
	UnderlayIndex int        // the underlying device (IFLA_VXLAN_LINK)
	Learning      bool
	External      bool       // collect-metadata ("external") mode
	Group         netip.Addr // default remote or multicast group, if any
}

// Family is the family of a VXLAN device's underlay: that of its local
// address, else of its default remote; IPv4 without either, as for the
// kernel. The kernel lets one VXLAN device of each family use a VNI and
// port.
func (l Link) Family() Family {
	switch {
	case l.Local.IsValid():
		return familyOf(l.Local)
	case l.Group.IsValid():
		return familyOf(l.Group)
	}
	return IPv4
}

// Route is a route of the main table, IPv4 or IPv6.
type Route struct {
	Dst       netip.Prefix
	Gw        netip.Addr // zero for a directly connected route
	LinkIndex int
	OnLink    bool // RTNH_F_ONLINK: the gateway is on the link, no check
	Protocol  int  // RTPROT_*; ours is RouteProtocol
	Scope     int  // RT_SCOPE_*; 0 universe, 253 link
	Priority  int  // metric
}

func (r Route) String() string {
	s := r.Dst.String()
	if r.Gw.IsValid() {
		s += " via " + r.Gw.String()
	}
	s += fmt.Sprintf(" dev %d", r.LinkIndex)
	if r.OnLink {
		s += " onlink"
	}
	if r.Protocol != 0 {
		s += fmt.Sprintf(" proto %d", r.Protocol)
	}
	if r.Scope != 0 {
		s += fmt.Sprintf(" scope %d", r.Scope)
	}
	if r.Priority != 0 {
		s += fmt.Sprintf(" metric %d", r.Priority)
	}
	return s
}

// NUDPermanent is the neighbour state (NUD_*) of every entry we write.
const NUDPermanent = 0x80

// Neigh is a neighbour entry: ARP for IPv4, NDP for IPv6.
type Neigh struct {
	LinkIndex int
	IP        netip.Addr
	MAC       MAC
	State     int // NUD_*
}

func (n Neigh) String() string {
	return fmt.Sprintf("%s lladdr %s dev %d state %#x", n.IP, n.MAC, n.LinkIndex, n.State)
}

// FDB is one remote of a VXLAN forwarding entry: frames for MAC are
// encapsulated and sent to Dst.
type FDB struct {
	LinkIndex int
	MAC       MAC
	Dst       netip.Addr
	State     int // NUD_*; ours are NUDPermanent
}

func (f FDB) String() string {
	return fmt.Sprintf("%s dst %s dev %d state %#x", f.MAC, f.Dst, f.LinkIndex, f.State)
}

// EventKind says what an Event is about.
type EventKind uint8

// Kinds of Event.
const (
	EventLink     EventKind = iota + 1 // a link was added, changed or deleted
	EventRouteDel                      // a route (IPv4 or IPv6) was deleted
	EventNeighDel                      // a neighbour or FDB entry was deleted
)

// Event is a kernel notification, reduced to what decides whether to wake
// the reconciler.
type Event struct {
	Kind      EventKind
	LinkIndex int
	LinkName  string // EventLink only
	Deleted   bool   // EventLink: RTM_DELLINK
	Protocol  int    // EventRouteDel only

	// What was deleted, when the notification says: the route's
	// destination (EventRouteDel); the neighbour's address, or for an FDB
	// entry (FDB set) its MAC (EventNeighDel). A zero value means unknown:
	// the reconciler then assumes the entry was one it wants.
	Dst netip.Prefix
	IP  netip.Addr
	MAC MAC
	FDB bool
}

// isNotFound reports whether err means the object to delete is already gone.
func isNotFound(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ESRCH) ||
		errors.Is(err, syscall.ENODEV) || errors.Is(err, ErrLinkNotFound)
}

// isInterrupted reports whether a dump must be retried.
func isInterrupted(err error) bool {
	return errors.Is(err, netlink.ErrDumpInterrupted) || errors.Is(err, syscall.EINTR)
}
