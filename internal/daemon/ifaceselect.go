package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/subnet"
)

// IfaceSelection chooses the underlay interface the way flanneld v0.28
// does (its main.go and pkg/ipmatch), so that a host keeps the interface —
// and the public address, by which flanneld's lease is found again — it
// had under flanneld: each of Ifaces in order (an interface name, or an
// address an interface holds), then each of Regexes in order, then the
// interface of the route to CanReach. The first that finds an interface
// wins; when one is given and none finds an interface, that is an error
// (flanneld exits too), never a fall-back to the default route.
type IfaceSelection struct {
	Ifaces   []string   // --iface, repeated
	Regexes  []string   // --iface-regex, repeated
	CanReach netip.Addr // --iface-can-reach
}

// IsZero reports whether nothing is selected: the default applies (see
// DetectUnderlay).
func (s IfaceSelection) IsZero() bool {
	return len(s.Ifaces) == 0 && len(s.Regexes) == 0 && !s.CanReach.IsValid()
}

// IfaceChoice is the interface a selection found, and the address that
// found it: the address given as --iface, the one --iface-regex matched,
// or the source address of the route to --iface-can-reach. flanneld
// publishes that address, not the interface's first one; Addr is zero
// when the interface was found by its name.
type IfaceChoice struct {
	Iface string
	Addr  netip.Addr
}

// ifaceFinder is what selection needs of a netlink handle: detection's
// listing, and the kernel's route lookup for --iface-can-reach.
type ifaceFinder interface {
	linkLister
	RouteGet(destination net.IP) ([]netlink.Route, error)
}

// UnderlayFlags are what the command line says of the underlay, each
// zero when not given: how to find the interface (--iface, --iface-regex,
// --iface-can-reach) and this host's public addresses on it
// (--public-ip, --public-ipv6).
type UnderlayFlags struct {
	Selection            IfaceSelection
	PublicIP, PublicIPv6 netip.Addr
}

// UnderlayChoice is the underlay UnderlayFlags choose: the interface
// ("" for the default route's, found at start) and the public addresses
// (zero: the interface's first of the family, found at start).
type UnderlayChoice struct {
	Iface                string
	PublicIP, PublicIPv6 netip.Addr
}

// ChooseUnderlay makes the choice of f once, before anything else
// happens, in the namespace the daemon programs (through c's Kernel: the
// real one in c.NetNS unless c.Kernel is set), and records it in
// c.Iface, c.PublicIP and c.PublicIPv6 for Run or Teardown. An error
// names the flag at fault and what to do; the caller reports it as a
// mistake in the command line.
func (c *Config) ChooseUnderlay(f UnderlayFlags) error {
	k := c.Kernel
	if k == nil {
		ns := c.NetNS
		if ns == 0 {
			ns = netns.None()
		}
		k = hostKernel{ns: ns}
	}
	u, err := k.ChooseUnderlay(f)
	if err != nil {
		return err
	}
	c.Iface, c.PublicIP, c.PublicIPv6 = u.Iface, u.PublicIP, u.PublicIPv6
	return nil
}

func (k hostKernel) ChooseUnderlay(f UnderlayFlags) (UnderlayChoice, error) {
	if f.Selection.IsZero() && !f.PublicIP.IsValid() && !f.PublicIPv6.IsValid() {
		return UnderlayChoice{}, nil // no netlink needed
	}
	h, err := netlinkHandle(k.ns)
	if err != nil {
		return UnderlayChoice{}, err
	}
	defer h.Close()
	return chooseUnderlay(h, f)
}

// chooseUnderlay selects the interface (selectIface), refuses the
// loopback, takes the address that chose the interface as this host's
// public address of its family unless one is given (flanneld publishes
// it, and finds its lease again by it), and checks that each public
// address is this host's, on that interface: the daemon would otherwise
// refuse it only after reading its config.
func chooseUnderlay(h ifaceFinder, f UnderlayFlags) (UnderlayChoice, error) {
	c, err := selectIface(h, f.Selection)
	if err != nil {
		return UnderlayChoice{}, err
	}
	if err := refuseLoopback(h, f.Selection, c); err != nil {
		return UnderlayChoice{}, err
	}
	u := UnderlayChoice{Iface: c.Iface, PublicIP: f.PublicIP, PublicIPv6: f.PublicIPv6}
	switch {
	case c.Addr.Is4() && !u.PublicIP.IsValid():
		if err := subnet.CheckVTEPAddr(c.Addr); err != nil {
			return UnderlayChoice{}, fmt.Errorf("interface %s was chosen by its address %s, which cannot be this host's public address (%v): set --public-ip", c.Iface, c.Addr, err)
		}
		u.PublicIP = c.Addr
	case c.Addr.Is6() && !u.PublicIPv6.IsValid():
		if err := subnet.CheckVTEPAddr(c.Addr); err != nil {
			return UnderlayChoice{}, fmt.Errorf("interface %s was chosen by its address %s, which cannot be this host's public address (%v): set --public-ipv6", c.Iface, c.Addr, err)
		}
		u.PublicIPv6 = c.Addr
	}
	if err := checkPublicAddr(h, u.Iface, "public-ip", u.PublicIP, "ip -4 addr"); err != nil {
		return UnderlayChoice{}, err
	}
	return u, checkPublicAddr(h, u.Iface, "public-ipv6", u.PublicIPv6, "ip -6 addr")
}

// refuseLoopback refuses a choice of the loopback interface: VXLAN
// packets to other hosts cannot leave by it, and the daemon would find no
// address to publish on it only after it connected to etcd. It names the
// flag that chose it.
func refuseLoopback(h ifaceFinder, sel IfaceSelection, c IfaceChoice) error {
	if c.Iface == "" {
		return nil
	}
	link, err := h.LinkByName(c.Iface)
	if err != nil || link.Attrs().Flags&net.FlagLoopback == 0 {
		return nil // gone meanwhile: the daemon says so
	}
	flag := fmt.Sprintf("--iface-can-reach %s", sel.CanReach)
	switch {
	case slices.Contains(sel.Ifaces, c.Iface) || c.Addr.IsValid() && slices.Contains(sel.Ifaces, c.Addr.String()):
		flag = fmt.Sprintf("--iface %q", c.Iface)
		if c.Addr.IsValid() {
			flag = fmt.Sprintf("--iface %s", c.Addr)
		}
	case len(sel.Regexes) > 0:
		flag = fmt.Sprintf("--iface-regex %q", strings.Join(sel.Regexes, ","))
	}
	return fmt.Errorf("%s: chooses %s, the loopback interface: VXLAN packets to other hosts cannot leave by it; name the underlay interface, the one holding this host's address (see `ip route get ADDRESS-OF-ANOTHER-HOST`)", flag, c.Iface)
}

// checkPublicAddr checks that ip, the host's public address given with
// --flag (zero: none given), is an address of this host, on iface if one
// was chosen.
func checkPublicAddr(h ifaceFinder, iface, flag string, ip netip.Addr, listCmd string) error {
	if !ip.IsValid() {
		return nil
	}
	links, err := h.LinkList()
	if err != nil {
		return fmt.Errorf("list this host's interfaces: %w", err)
	}
	holder := ""
	for _, l := range links {
		if slices.Contains(addrsOf(h, l, family(ip)), ip) {
			holder = l.Attrs().Name
			break
		}
	}
	switch {
	case holder == "":
		return fmt.Errorf("--%s %s is not an address of this host: pass this host's underlay address (see `%s`)", flag, ip, listCmd)
	case iface != "" && holder != iface:
		return fmt.Errorf("--%s %s is on %s, not on --iface %s: pass the interface that holds it", flag, ip, holder, iface)
	}
	return nil
}

// CompileIfaceRegex compiles an --iface-regex; flanneld uses Go's regexp
// too, so a pattern means what it meant there (unanchored: "eth" also
// matches "veth0").
func CompileIfaceRegex(s string) (*regexp.Regexp, error) {
	re, err := regexp.Compile(s)
	if err != nil {
		return nil, fmt.Errorf("want a regular expression such as ^eth[0-9]+$ (%v)", err)
	}
	return re, nil
}

// A miss is an attempt that found no interface: selection goes on to the
// next. Any other error (netlink failing) ends it.
type miss string

func (m miss) Error() string { return string(m) }

func selectIface(h ifaceFinder, sel IfaceSelection) (IfaceChoice, error) {
	if sel.IsZero() {
		return IfaceChoice{}, nil
	}
	var attempts []func() (IfaceChoice, error)
	for _, want := range sel.Ifaces {
		attempts = append(attempts, func() (IfaceChoice, error) { return byIface(h, want) })
	}
	for _, pattern := range sel.Regexes {
		attempts = append(attempts, func() (IfaceChoice, error) { return byRegex(h, pattern) })
	}
	if sel.CanReach.IsValid() {
		attempts = append(attempts, func() (IfaceChoice, error) { return byRoute(h, sel.CanReach) })
	}
	var misses []string
	for _, try := range attempts {
		c, err := try()
		var m miss
		switch {
		case err == nil:
			return c, nil
		case !errors.As(err, &m):
			return IfaceChoice{}, err
		}
		misses = append(misses, m.Error())
	}
	return IfaceChoice{}, errors.New(strings.Join(misses, "; "))
}

// byIface finds --iface: the interface of that name or, given an
// address, the interface holding it (of any scope, as flanneld matches).
func byIface(h ifaceFinder, want string) (IfaceChoice, error) {
	addr, err := netip.ParseAddr(want)
	if err != nil {
		link, err := h.LinkByName(want)
		var nf netlink.LinkNotFoundError
		switch {
		case errors.As(err, &nf):
			return IfaceChoice{}, miss(fmt.Sprintf("--iface %q: no such interface on this host (list them with `ip link`)", want))
		case err != nil:
			return IfaceChoice{}, fmt.Errorf("--iface %s: %w", want, err)
		}
		return IfaceChoice{Iface: link.Attrs().Name}, nil
	}
	addr = addr.Unmap()
	links, err := h.LinkList()
	if err != nil {
		return IfaceChoice{}, fmt.Errorf("list interfaces: %w", err)
	}
	for _, l := range links {
		for _, a := range addrsOf(h, l, family(addr)) {
			if a == addr {
				return IfaceChoice{Iface: l.Attrs().Name, Addr: addr}, nil
			}
		}
	}
	return IfaceChoice{}, miss(fmt.Sprintf("--iface %s: no interface of this host holds this address (see `ip addr`)", addr))
}

// byRegex finds --iface-regex as flanneld does: the first interface with
// an address the pattern matches — IPv4 addresses first, then IPv6 ones
// (flanneld matches the families its network carries, unknown here) —
// and only if no address matches, the first interface whose name does.
// Only global unicast addresses count: no other can be a VXLAN endpoint.
func byRegex(h ifaceFinder, pattern string) (IfaceChoice, error) {
	re, err := CompileIfaceRegex(pattern)
	if err != nil {
		return IfaceChoice{}, fmt.Errorf("--iface-regex %q: %w", pattern, err)
	}
	links, err := h.LinkList()
	if err != nil {
		return IfaceChoice{}, fmt.Errorf("list interfaces: %w", err)
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		for _, l := range links {
			for _, a := range addrsOf(h, l, fam) {
				if a.IsGlobalUnicast() && re.MatchString(a.String()) {
					return IfaceChoice{Iface: l.Attrs().Name, Addr: a}, nil
				}
			}
		}
	}
	for _, l := range links {
		if re.MatchString(l.Attrs().Name) {
			return IfaceChoice{Iface: l.Attrs().Name}, nil
		}
	}
	return IfaceChoice{}, miss(fmt.Sprintf("--iface-regex %q matches no interface's address or name (see `ip addr`)", pattern))
}

// byRoute finds --iface-can-reach: the interface `ip route get ADDR`
// names, with the route's source address.
func byRoute(h ifaceFinder, dst netip.Addr) (IfaceChoice, error) {
	routes, err := h.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 || routes[0].LinkIndex <= 0 {
		return IfaceChoice{}, miss(fmt.Sprintf("--iface-can-reach %s: no route to it (see `ip route get %s`)", dst, dst))
	}
	link, err := h.LinkByIndex(routes[0].LinkIndex)
	if err != nil {
		return IfaceChoice{}, fmt.Errorf("--iface-can-reach %s: interface %d of its route: %w", dst, routes[0].LinkIndex, err)
	}
	c := IfaceChoice{Iface: link.Attrs().Name}
	if src, ok := netip.AddrFromSlice(routes[0].Src); ok {
		c.Addr = src.Unmap()
	}
	return c, nil
}

// addrsOf lists l's addresses of family fam; an interface that vanished
// meanwhile has none.
func addrsOf(h ifaceFinder, l netlink.Link, fam int) []netip.Addr {
	addrs, err := h.AddrList(l, fam)
	if err != nil {
		return nil
	}
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out
}

func family(a netip.Addr) int {
	if a.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}
