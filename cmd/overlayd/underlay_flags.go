package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/overlaynet/overlay/internal/daemon"
)

// underlayFlags choose the underlay interface as flanneld's flags of the
// same names do (see daemon.IfaceSelection): --iface, repeatable, an
// interface name or an address it holds; --iface-regex, repeatable;
// --iface-can-reach. A host moving from flanneld keeps its interface and
// the public address its lease is found by.
type underlayFlags struct {
	ifaces, regexes []string
	canReach        string
}

func (u *underlayFlags) register(f *pflag.FlagSet) {
	f.Var(listValue{&u.ifaces}, "iface", "underlay interface for VXLAN traffic, by name or by an address it holds; repeat it to try each in order (default: the default route's interface)")
	f.Var(listValue{&u.regexes}, "iface-regex", "use the first interface with an address, else a name, this regular expression matches; repeat it to try each in order, after --iface")
	f.StringVar(&u.canReach, "iface-can-reach", "", "use the interface of the route to this `address`, as ip route get finds it, after --iface and --iface-regex")
	checkFlag(f, "iface", ifaceOrAddr)
	checkFlag(f, "iface-regex", ifaceRegex)
	checkFlag(f, "iface-can-reach", routableAddr)
	fromEnv(f, "iface-regex", "iface-can-reach")
}

func (u *underlayFlags) selection() daemon.IfaceSelection {
	sel := daemon.IfaceSelection{Ifaces: u.ifaces, Regexes: u.regexes}
	if u.canReach != "" {
		sel.CanReach = netip.MustParseAddr(u.canReach) // checked when set
	}
	return sel
}

// selectUnderlay resolves the underlay flags to one interface, h.iface.
// When an address chose it, that address is the host's public address
// (of its family) unless --public-ip (--public-ipv6) says otherwise:
// flanneld publishes it, and finds its lease again by it.
func (h *hostFlags) selectUnderlay() error {
	c, err := daemon.SelectIface(h.underlay.selection())
	if err != nil {
		return err
	}
	if err := h.underlay.notLoopback(c); err != nil {
		return err
	}
	return h.use(c)
}

// notLoopback refuses a choice of the loopback interface: VXLAN packets
// to other hosts cannot leave by it, and the daemon would find no address
// to publish on it only after it connected to etcd (exit 1). It names the
// flag that chose it.
func (u *underlayFlags) notLoopback(c daemon.IfaceChoice) error {
	if c.Iface == "" {
		return nil
	}
	ifc, err := net.InterfaceByName(c.Iface)
	if err != nil || ifc.Flags&net.FlagLoopback == 0 {
		return nil // gone meanwhile: the daemon says so
	}
	flag := fmt.Sprintf("--iface-can-reach %s", u.canReach)
	switch {
	case slices.Contains(u.ifaces, c.Iface) || c.Addr.IsValid() && slices.Contains(u.ifaces, c.Addr.String()):
		flag = fmt.Sprintf("--iface %q", c.Iface)
		if c.Addr.IsValid() {
			flag = fmt.Sprintf("--iface %s", c.Addr)
		}
	case len(u.regexes) > 0:
		flag = fmt.Sprintf("--iface-regex %q", strings.Join(u.regexes, ","))
	}
	return fmt.Errorf("%s: chooses %s, the loopback interface: VXLAN packets to other hosts cannot leave by it; name the underlay interface, the one holding this host's address (see `ip route get ADDRESS-OF-ANOTHER-HOST`)", flag, c.Iface)
}

func (h *hostFlags) use(c daemon.IfaceChoice) error {
	h.iface = c.Iface
	switch {
	case c.Addr.Is4() && h.publicIP == "":
		if err := hostIPv4(c.Addr.String()); err != nil {
			return fmt.Errorf("interface %s was chosen by its address %s, which cannot be this host's public address (%v): set --public-ip", c.Iface, c.Addr, err)
		}
		h.publicIP = c.Addr.String()
	case c.Addr.Is6() && h.publicIPv6 == "":
		if err := hostIPv6(c.Addr.String()); err != nil {
			return fmt.Errorf("interface %s was chosen by its address %s, which cannot be this host's public address (%v): set --public-ipv6", c.Iface, c.Addr, err)
		}
		h.publicIPv6 = c.Addr.String()
	}
	return nil
}

// listValue is a flag that may be repeated: each value is kept, in order.
type listValue struct{ vals *[]string }

func (v listValue) Set(s string) error {
	if s != "" { // an empty variable sets nothing
		*v.vals = append(*v.vals, s)
	}
	return nil
}

func (v listValue) String() string { return strings.Join(*v.vals, ",") }
func (v listValue) Type() string   { return "strings" }

// ifaceOrAddr accepts an interface name, or an address an interface holds
// that can be a VXLAN endpoint.
func ifaceOrAddr(s string) error {
	if ip, err := netip.ParseAddr(s); err == nil && ip.Zone() == "" {
		if ip.Is4() {
			return hostIPv4(s)
		}
		return hostIPv6(s)
	}
	if ifaceName(s) != nil {
		return errors.New("want an interface name such as eth0 (at most 15 characters, no '/', ':' or spaces) or an address it holds, such as 198.18.0.7")
	}
	return nil
}

func ifaceRegex(s string) error {
	_, err := daemon.CompileIfaceRegex(s)
	return err
}

// routableAddr accepts an address to look the route to up ("" unsets).
func routableAddr(s string) error {
	if s == "" {
		return nil
	}
	ip, err := netip.ParseAddr(s)
	if err != nil || ip.Zone() != "" || ip.IsUnspecified() || ip.IsMulticast() {
		return errors.New("want an IP address another host has, such as 198.18.0.1")
	}
	return nil
}
