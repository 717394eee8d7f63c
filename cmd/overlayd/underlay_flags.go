package main

import (
	"errors"
	"net/netip"
	"strings"

	"github.com/spf13/pflag"

	"github.com/overlaynet/overlay/internal/daemon"
)

// underlayFlags choose the underlay interface as flanneld's flags of the
// same names do (see daemon.IfaceSelection): --iface, repeatable, an
// interface name or an address it holds; --iface-regex, repeatable;
// --iface-can-reach. A host moving from flanneld keeps its interface and
// the public address its lease is found by. The choice is made once, by
// daemon.Config.ChooseUnderlay, in the namespace the daemon programs.
type underlayFlags struct {
	ifaces, regexes []string
	canReach        netip.Addr
}

func (u *underlayFlags) register(f *pflag.FlagSet) {
	f.Var(listValue{&u.ifaces}, "iface", "underlay interface for VXLAN traffic, by name or by an address it holds; repeat it to try each in order (default: the default route's interface)")
	f.Var(listValue{&u.regexes}, "iface-regex", "use the first interface with an address, else a name, this regular expression matches; repeat it to try each in order, after --iface")
	f.Var(addrValue{&u.canReach}, "iface-can-reach", "use the interface of the route to this `address`, as ip route get finds it, after --iface and --iface-regex")
	checkFlag(f, "iface", ifaceOrAddr)
	checkFlag(f, "iface-regex", ifaceRegex)
	checkFlag(f, "iface-can-reach", routableAddr)
	fromEnv(f, "iface-regex", "iface-can-reach")
}

func (u *underlayFlags) selection() daemon.IfaceSelection {
	return daemon.IfaceSelection{Ifaces: u.ifaces, Regexes: u.regexes, CanReach: u.canReach}
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
