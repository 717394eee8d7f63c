package daemon

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// TestUnderlayOfAnIPv6OnlyHost: without --iface, a host with no IPv4
// default route finds its underlay by the IPv6 default route, and its
// public IPv6 address on it (regression: "no IPv4 default route", so an
// IPv6-only host needed --iface). With neither route, the error names
// both families and what to set. All in a namespace of the test's own.
func TestUnderlayOfAnIPv6OnlyHost(t *testing.T) {
	n := testenv.NewNS(t)
	hns, err := netns.GetFromPath(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer hns.Close()
	h, err := netlink.NewHandleAt(hns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	ul := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0", MTU: 1500}, PeerName: "ul0peer"} // both ends in the namespace
	if err := h.LinkAdd(ul); err != nil {
		t.Fatal(err)
	}
	peer, err := h.LinkByName("ul0peer")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(peer); err != nil {
		t.Fatal(err)
	}
	link, err := h.LinkByName("ul0")
	if err != nil {
		t.Fatal(err)
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("2001:db8::7"), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
	if err := h.AddrAdd(link, addr); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}

	if _, err := DetectUnderlay(h, "", netip.Addr{}, netip.Addr{}); err == nil ||
		!strings.Contains(err.Error(), "no IPv4 or IPv6 default route") || !strings.Contains(err.Error(), "set --iface") {
		t.Errorf("without a default route: %v, want an error naming both families and --iface", err)
	}

	def := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
		Gw: net.ParseIP("2001:db8::1"), Table: unix.RT_TABLE_MAIN}
	if err := h.RouteAdd(def); err != nil {
		t.Fatal(err)
	}
	u, err := DetectUnderlay(h, "", netip.Addr{}, netip.Addr{})
	if err != nil || u.Iface != "ul0" || u.PublicIPv6 != netip.MustParseAddr("2001:db8::7") || u.PublicIP.IsValid() {
		t.Errorf("with only an IPv6 default route: %+v, %v; want ul0 with public IPv6 2001:db8::7", u, err)
	}
}
