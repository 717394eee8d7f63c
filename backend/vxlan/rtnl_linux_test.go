package vxlan

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// rtnlTestNS opens a throwaway namespace with a VXLAN device on a veth
// underlay and returns an rtnlConn in it and the device's index.
func rtnlTestNS(t *testing.T) (*rtnlConn, int) {
	t.Helper()
	n := testenv.NewNS(t)
	ns, err := netns.GetFromPath(n.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close() })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0"}, PeerName: "ul0p"}); err != nil {
		t.Fatal(err)
	}
	ul, err := h.LinkByName("ul0")
	if err != nil {
		t.Fatal(err)
	}
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: "vx0"}, VxlanId: 1, VtepDevIndex: ul.Attrs().Index, Port: 8472}
	if err := h.LinkAdd(vx); err != nil {
		t.Fatal(err)
	}
	l, err := h.LinkByName("vx0")
	if err == nil { // an onlink route needs the device to have an address
		err = h.AddrAdd(l, &netlink.Addr{IPNet: ipNetOf(netip.MustParsePrefix("10.244.1.0/32"))})
	}
	if err == nil {
		err = h.LinkSetUp(l)
	}
	if err != nil {
		t.Fatal(err)
	}
	c, err := openRTNL(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, l.Attrs().Index
}

// A batch applies every write it can and reports each failure against the
// write that failed; the listings read back exactly what went in.
func TestRTNLBatchReportsEachWritesOutcome(t *testing.T) {
	c, dev := rtnlTestNS(t)
	mac := MAC{0x0e, 0, 0, 0, 0, 2}
	hop := netip.MustParseAddr("10.244.2.0")
	neigh := Neigh{LinkIndex: dev, IP: hop, MAC: mac, State: NUDPermanent}
	fdb := FDB{LinkIndex: dev, MAC: mac, Dst: netip.MustParseAddr("198.18.0.2"), State: NUDPermanent}
	route := Route{Dst: netip.MustParsePrefix("10.244.2.0/24"), Gw: hop, LinkIndex: dev, OnLink: true, Protocol: RouteProtocol,
		Priority: RouteMetric(netip.MustParsePrefix("10.244.2.0/24"))}
	bad := neigh
	bad.LinkIndex = 9999 // no such device
	errs := c.writeBatch([]Write{
		{Kind: NeighSet, Neigh: neigh},
		{Kind: NeighSet, Neigh: bad},
		{Kind: FDBSet, FDB: fdb},
		{Kind: RouteReplace, Route: route},
	})
	for i, want := range []error{nil, syscall.ENODEV, nil, nil} {
		if (want == nil) != (errs[i] == nil) || want != nil && !errors.Is(errs[i], want) {
			t.Errorf("write %d: %v, want %v", i, errs[i], want)
		}
	}
	neighs, err := c.neighList(dev, IPv4)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]Neigh{neigh}, neighs, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Errorf("neighbours (-want +got):\n%s", d)
	}
	fdbs, err := c.fdbList(dev)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]FDB{fdb}, fdbs, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Errorf("FDB (-want +got):\n%s", d)
	}
	routes, err := c.routeList(IPv4)
	if err != nil {
		t.Fatal(err)
	}
	var ours []Route
	for _, r := range routes {
		if r.Protocol == RouteProtocol {
			ours = append(ours, r)
		}
	}
	if d := cmp.Diff([]Route{route}, ours, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }),
		cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); d != "" {
		t.Errorf("our routes (-want +got):\n%s", d)
	}
	// Deleting what is gone fails with "not found", which the backend
	// counts as success; deleting the rest leaves nothing.
	errs = c.writeBatch([]Write{
		{Kind: RouteDel, Route: route},
		{Kind: FDBDel, FDB: fdb},
		{Kind: NeighDel, Neigh: neigh},
		{Kind: NeighDel, Neigh: neigh},
	})
	for i, err := range errs[:3] {
		if err != nil {
			t.Errorf("delete %d: %v", i, err)
		}
	}
	if !isNotFound(errs[3]) {
		t.Errorf("second delete of the neighbour: %v, want not found", errs[3])
	}
}

// A batch larger than one sendmsg's worth goes through in chunks.
func TestRTNLBatchLargerThanOneSend(t *testing.T) {
	c, dev := rtnlTestNS(t)
	var ops []Write
	for i := range 3*maxBatch + 5 {
		ip := netip.AddrFrom4([4]byte{10, 200, byte(i >> 8), byte(i)})
		ops = append(ops, Write{Kind: NeighSet, Neigh: Neigh{LinkIndex: dev, IP: ip, MAC: MAC{0x0e, 1, 0, 0, byte(i >> 8), byte(i)}, State: NUDPermanent}})
	}
	for i, err := range c.writeBatch(ops) {
		if err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	neighs, err := c.neighList(dev, IPv4)
	if err != nil {
		t.Fatal(err)
	}
	if len(neighs) != len(ops) {
		t.Errorf("%d neighbours listed, want %d", len(neighs), len(ops))
	}
}
