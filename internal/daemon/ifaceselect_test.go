package daemon

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// fakeHost is an ifaceFinder over a fixed set of interfaces, in index
// order, and one route per destination.
type fakeHost struct {
	links  []fakeLink
	routes map[netip.Addr]netlink.Route
	broken bool // LinkList fails
}

type fakeLink struct {
	name  string
	addrs []string
}

func (f *fakeHost) link(i int) netlink.Link {
	flags := net.FlagUp
	if f.links[i].name == "lo" {
		flags |= net.FlagLoopback
	}
	return &netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Index: i + 1, Name: f.links[i].name, Flags: flags}}
}

func (f *fakeHost) LinkByName(name string) (netlink.Link, error) {
	for i, l := range f.links {
		if l.name == name {
			return f.link(i), nil
		}
	}
	return nil, netlink.LinkNotFoundError{}
}

func (f *fakeHost) LinkByIndex(index int) (netlink.Link, error) {
	if index < 1 || index > len(f.links) {
		return nil, netlink.LinkNotFoundError{}
	}
	return f.link(index - 1), nil
}

func (f *fakeHost) LinkList() ([]netlink.Link, error) {
	if f.broken {
		return nil, errors.New("netlink: permission denied")
	}
	var out []netlink.Link
	for i := range f.links {
		out = append(out, f.link(i))
	}
	return out, nil
}

func (f *fakeHost) AddrList(link netlink.Link, family int) ([]netlink.Addr, error) {
	var out []netlink.Addr
	for _, s := range f.links[link.Attrs().Index-1].addrs {
		a := netip.MustParseAddr(s)
		if (family == unix.AF_INET) == a.Is4() {
			out = append(out, netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice()}})
		}
	}
	return out, nil
}

func (f *fakeHost) RouteListFiltered(int, *netlink.Route, uint64) ([]netlink.Route, error) {
	return nil, nil
}

func (f *fakeHost) RouteGet(dst net.IP) ([]netlink.Route, error) {
	a, _ := netip.AddrFromSlice(dst)
	if r, ok := f.routes[a.Unmap()]; ok {
		return []netlink.Route{r}, nil
	}
	return nil, unix.ENETUNREACH
}

func testHost() *fakeHost {
	return &fakeHost{
		links: []fakeLink{
			{"lo", []string{"127.0.0.1", "::1"}},
			{"eth0", []string{"198.18.0.7", "10.1.0.7", "2001:db8::7"}},
			{"ens5", []string{"169.254.3.3", "192.168.5.5"}},
			{"veth1", nil},
			{"bond0", []string{"fd00::9"}},
		},
		routes: map[netip.Addr]netlink.Route{
			netip.MustParseAddr("192.168.5.1"): {LinkIndex: 3, Src: net.ParseIP("192.168.5.5")},
			netip.MustParseAddr("2001:db8::1"): {LinkIndex: 2, Src: net.ParseIP("2001:db8::7")},
			netip.MustParseAddr("203.0.113.1"): {LinkIndex: 2}, // no preferred source
		},
	}
}

func TestSelectIfaceFlannelOrder(t *testing.T) {
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name string
		sel  IfaceSelection
		want IfaceChoice
	}{
		{"by name", IfaceSelection{Ifaces: []string{"ens5"}}, IfaceChoice{Iface: "ens5"}},
		{"by address: the address is the choice's", IfaceSelection{Ifaces: []string{"10.1.0.7"}}, IfaceChoice{"eth0", a("10.1.0.7")}},
		{"by IPv6 address", IfaceSelection{Ifaces: []string{"fd00::9"}}, IfaceChoice{"bond0", a("fd00::9")}},
		{"by a link-local address, as flanneld", IfaceSelection{Ifaces: []string{"169.254.3.3"}}, IfaceChoice{"ens5", a("169.254.3.3")}},
		{"first --iface that exists wins", IfaceSelection{Ifaces: []string{"nope0", "198.51.100.1", "veth1", "eth0"}}, IfaceChoice{Iface: "veth1"}},
		{"--iface before --iface-regex", IfaceSelection{Ifaces: []string{"bond0"}, Regexes: []string{"eth"}}, IfaceChoice{Iface: "bond0"}},
		{"--iface-regex after a missing --iface", IfaceSelection{Ifaces: []string{"nope0"}, Regexes: []string{"^ens"}}, IfaceChoice{Iface: "ens5"}},
		{"regex matches addresses before names", IfaceSelection{Regexes: []string{"^192\\.168\\."}}, IfaceChoice{"ens5", a("192.168.5.5")}},
		{"an address match wins over an earlier name match", IfaceSelection{Regexes: []string{"5"}}, IfaceChoice{"ens5", a("192.168.5.5")}},
		{"IPv4 addresses before IPv6 ones", IfaceSelection{Regexes: []string{"7"}}, IfaceChoice{"eth0", a("198.18.0.7")}},
		{"an IPv6 address", IfaceSelection{Regexes: []string{"^fd00:"}}, IfaceChoice{"bond0", a("fd00::9")}},
		{"only global unicast addresses", IfaceSelection{Regexes: []string{"^127\\.|^169\\.254"}}, IfaceChoice{}},
		{"then names, unanchored as flanneld's", IfaceSelection{Regexes: []string{"eth"}}, IfaceChoice{Iface: "eth0"}},
		{"regexes in order", IfaceSelection{Regexes: []string{"^wlan", "^bond", "^eth"}}, IfaceChoice{Iface: "bond0"}},
		{"--iface-can-reach: the route's interface and source", IfaceSelection{CanReach: a("192.168.5.1")}, IfaceChoice{"ens5", a("192.168.5.5")}},
		{"--iface-can-reach over IPv6", IfaceSelection{CanReach: a("2001:db8::1")}, IfaceChoice{"eth0", a("2001:db8::7")}},
		{"--iface-can-reach without a source", IfaceSelection{CanReach: a("203.0.113.1")}, IfaceChoice{Iface: "eth0"}},
		{"--iface-can-reach last", IfaceSelection{Regexes: []string{"^nothing$"}, CanReach: a("192.168.5.1")}, IfaceChoice{"ens5", a("192.168.5.5")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := selectIface(testHost(), tc.sel)
			if tc.want == (IfaceChoice{}) {
				if err == nil {
					t.Fatalf("selected %+v, want no match", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("selectIface(%+v) = %+v, %v; want %+v", tc.sel, got, err, tc.want)
			}
		})
	}
}

// When nothing matches, the error says what each flag found, in one line.
func TestSelectIfaceMissesNameEveryAttempt(t *testing.T) {
	sel := IfaceSelection{
		Ifaces:   []string{"nope0", "198.51.100.1"},
		Regexes:  []string{"^wlan"},
		CanReach: netip.MustParseAddr("192.0.2.1"),
	}
	_, err := selectIface(testHost(), sel)
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{
		`--iface "nope0": no such interface on this host (list them with ` + "`ip link`)",
		"--iface 198.51.100.1: no interface of this host holds this address",
		`--iface-regex "^wlan" matches no interface's address or name`,
		"--iface-can-reach 192.0.2.1: no route to it",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("error %q is not one line", err)
	}
}

func TestSelectIfaceErrors(t *testing.T) {
	if c, err := selectIface(testHost(), IfaceSelection{}); err != nil || c != (IfaceChoice{}) {
		t.Errorf("empty selection: %+v, %v; want nothing chosen", c, err)
	}
	if _, err := selectIface(testHost(), IfaceSelection{Regexes: []string{"("}}); err == nil || !strings.Contains(err.Error(), "want a regular expression") {
		t.Errorf("bad regex: %v", err)
	}
	broken := testHost()
	broken.broken = true
	// A netlink failure ends the selection: it is not a miss.
	_, err := selectIface(broken, IfaceSelection{Ifaces: []string{"10.1.0.7", "eth0"}})
	if err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("listing failed: %v", err)
	}
}

// In a namespace of its own, the kernel answers --iface-can-reach's route
// lookup and lists the interfaces for --iface and --iface-regex.
func TestSelectIfaceInNamespace(t *testing.T) {
	ns := testenv.NewNS(t)
	nsh, err := netns.GetFromPath(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for i, l := range []struct{ name, addr string }{{"under0", "198.18.0.7/24"}, {"under1", "10.9.0.7/16"}} {
		link := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: l.name}} // an empty bridge: no module beyond the lab's
		if err := h.LinkAdd(link); err != nil {
			t.Fatalf("add %s: %v", l.name, err)
		}
		addr, _ := netlink.ParseAddr(l.addr)
		if err := h.AddrAdd(link, addr); err != nil {
			t.Fatal(err)
		}
		if err := h.LinkSetUp(link); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			// A route beyond under1's subnet, through a gateway on it.
			_, dst, _ := net.ParseCIDR("203.0.113.0/24")
			if err := h.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Dst: dst, Gw: net.ParseIP("10.9.0.1")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	a := netip.MustParseAddr
	for _, tc := range []struct {
		sel  IfaceSelection
		want IfaceChoice
	}{
		{IfaceSelection{CanReach: a("203.0.113.9")}, IfaceChoice{"under1", a("10.9.0.7")}},
		{IfaceSelection{CanReach: a("198.18.0.99")}, IfaceChoice{"under0", a("198.18.0.7")}},
		{IfaceSelection{Ifaces: []string{"10.9.0.7"}}, IfaceChoice{"under1", a("10.9.0.7")}},
		{IfaceSelection{Regexes: []string{"^198\\.18\\."}}, IfaceChoice{"under0", a("198.18.0.7")}},
		{IfaceSelection{Regexes: []string{"der1$"}}, IfaceChoice{Iface: "under1"}},
	} {
		got, err := selectIface(h, tc.sel)
		if err != nil || got != tc.want {
			t.Errorf("selectIface(%+v) = %+v, %v; want %+v", tc.sel, got, err, tc.want)
		}
	}
	if _, err := selectIface(h, IfaceSelection{CanReach: a("192.0.2.1")}); err == nil || !strings.Contains(err.Error(), "no route to it") {
		t.Errorf("unroutable --iface-can-reach: %v", err)
	}

	// The CLI's way in: Config.ChooseUnderlay, through the real Kernel in
	// Config.NetNS, records the choice where Run and Teardown read it.
	cfg := Config{NetNS: nsh}
	if err := cfg.ChooseUnderlay(UnderlayFlags{Selection: IfaceSelection{Ifaces: []string{"198.18.0.7"}}}); err != nil || cfg.Iface != "under0" || cfg.PublicIP != a("198.18.0.7") {
		t.Errorf("ChooseUnderlay(--iface 198.18.0.7) = %v: iface %q, public IP %s; want under0, 198.18.0.7", err, cfg.Iface, cfg.PublicIP)
	}
	for _, tc := range []struct {
		f    UnderlayFlags
		want string
	}{
		{UnderlayFlags{Selection: IfaceSelection{Ifaces: []string{"under0"}}, PublicIP: a("10.9.0.7")}, "--public-ip 10.9.0.7 is on under1, not on --iface under0"},
		{UnderlayFlags{Selection: IfaceSelection{Ifaces: []string{"lo"}}}, `--iface "lo": chooses lo, the loopback interface`},
	} {
		cfg := Config{NetNS: nsh}
		if err := cfg.ChooseUnderlay(tc.f); err == nil || !strings.Contains(err.Error(), tc.want) || cfg.Iface != "" {
			t.Errorf("ChooseUnderlay(%+v) = %v, iface %q; want %q and nothing recorded", tc.f, err, cfg.Iface, tc.want)
		}
	}
}

// The address that chose the interface is the public address of its
// family, unless --public-ip (--public-ipv6) is given; a given public
// address must be this host's, on the chosen interface; the loopback is
// refused, naming the flag that chose it.
func TestChooseUnderlay(t *testing.T) {
	a := netip.MustParseAddr
	for _, tc := range []struct {
		name string
		f    UnderlayFlags
		want UnderlayChoice
		err  string
	}{
		{"by name", UnderlayFlags{Selection: IfaceSelection{Ifaces: []string{"eth0"}}}, UnderlayChoice{Iface: "eth0"}, ""},
		{"by address", UnderlayFlags{Selection: IfaceSelection{Ifaces: []string{"198.18.0.7"}}}, UnderlayChoice{Iface: "eth0", PublicIP: a("198.18.0.7")}, ""},
		{"by address, --public-ip given", UnderlayFlags{Selection: IfaceSelection{Ifaces: []string{"198.18.0.7"}}, PublicIP: a("10.1.0.7")},
			UnderlayChoice{Iface: "eth0", PublicIP: a("10.1.0.7")}, ""},
		{"by IPv6 address, --public-ip given", UnderlayFlags{Selection: IfaceSelection{Ifaces: []string{"2001:db8::7"}}, PublicIP: a("10.1.0.7")},
			UnderlayChoice{Iface: "eth0", PublicIP: a("10.1.0.7"), PublicIPv6: a("2001:db8::7")}, ""},
		{"by route, its source address", UnderlayFlags{Selection: IfaceSelection{CanReach: a("192.168.5.1")}}, UnderlayChoice{Iface: "ens5", PublicIP: a("192.168.5.5")}, ""},
		{"nothing chosen, --public-ip given", UnderlayFlags{PublicIP: a("192.168.5.5")}, UnderlayChoice{PublicIP: a("192.168.5.5")}, ""},
		{"chosen by a link-local address", UnderlayFlags{Selection: IfaceSelection{Ifaces: []string{"169.254.3.3"}}}, UnderlayChoice{},
			"interface ens5 was chosen by its address 169.254.3.3, which cannot be this host's public address"},
		{"--public-ip on another interface", UnderlayFlags{Selection: IfaceSelection{Ifaces: []string{"eth0"}}, PublicIP: a("192.168.5.5")}, UnderlayChoice{},
			"--public-ip 192.168.5.5 is on ens5, not on --iface eth0: pass the interface that holds it"},
		{"--public-ipv6 not this host's", UnderlayFlags{PublicIPv6: a("2001:db8::77")}, UnderlayChoice{},
			"--public-ipv6 2001:db8::77 is not an address of this host: pass this host's underlay address (see `ip -6 addr`)"},
		{"the loopback by name", UnderlayFlags{Selection: IfaceSelection{Ifaces: []string{"lo"}}}, UnderlayChoice{}, `--iface "lo": chooses lo, the loopback interface`},
		{"the loopback by address", UnderlayFlags{Selection: IfaceSelection{Ifaces: []string{"127.0.0.1"}}}, UnderlayChoice{}, "--iface 127.0.0.1: chooses lo"},
		{"the loopback by regex", UnderlayFlags{Selection: IfaceSelection{Regexes: []string{"^l"}}}, UnderlayChoice{}, `--iface-regex "^l": chooses lo`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := chooseUnderlay(testHost(), tc.f)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("chooseUnderlay = %+v, %v; want an error saying %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("chooseUnderlay = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
