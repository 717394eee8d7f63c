package vxlan_test

import (
	"context"
	"net"
	"net/netip"
	"testing"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan"
)

// A host taken over from flanneld keeps flannel's device and MAC, and the
// routes flanneld left on it (protocol boot, metric 0) become ours without
// a moment in which a peer has no route: adopted in place, then replaced
// by ours at our metric; one to a host that is gone is removed, and routes
// of other devices are not touched.
func TestAdoptFlannelDeviceAndRoutes(t *testing.T) {
	f, cfg := fakeHost(t)
	flannelMAC := net.HardwareAddr{0x0e, 0xfa, 0, 0, 0, 1}
	mac, _ := backend.MACFrom(flannelMAC)
	// flannel.1 as flanneld leaves it.
	ul, err := f.LinkByName("ul0")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.LinkAdd(vxlan.Link{Name: "flannel.1", Kind: "vxlan", MTU: 1450, MAC: mac, Up: true, VNI: 1, Port: 8472, Local: localIP, UnderlayIndex: ul.Index}); err != nil {
		t.Fatal(err)
	}
	fl, _ := f.LinkByName("flannel.1")
	if err := f.LinkSetUp(fl.Index); err != nil {
		t.Fatal(err)
	}
	if err := f.AddrReplace(fl.Index, netip.PrefixFrom(ownSubnet.Addr(), 32)); err != nil {
		t.Fatal(err)
	}
	flannelRoute := func(n int) vxlan.Route {
		p := peer(n)
		return vxlan.Route{Dst: p.Subnet, Gw: p.Subnet.Addr(), LinkIndex: fl.Index, OnLink: true, Protocol: 3}
	}
	other := vxlan.Route{Dst: netip.MustParsePrefix("192.0.2.0/24"), Gw: netip.MustParseAddr("198.18.0.254"), LinkIndex: ul.Index, Protocol: 3}
	for _, r := range []vxlan.Route{flannelRoute(2), flannelRoute(3), flannelRoute(9), other} {
		if err := f.RouteReplace(r); err != nil {
			t.Fatal(err)
		}
	}

	cfg.DeviceName, cfg.VtepMAC = "flannel.1", flannelMAC
	b := newBackend(t, cfg, f)
	info, err := b.EnsureDevice(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "flannel.1" || info.Index != fl.Index || info.MAC.String() != flannelMAC.String() {
		t.Fatalf("EnsureDevice = %+v, want flannel.1 (index %d) kept with its MAC %s", info, fl.Index, flannelMAC)
	}
	n, err := b.AdoptRoutes(context.Background())
	if err != nil || n != 3 {
		t.Fatalf("AdoptRoutes = %d, %v; want the 3 routes on flannel.1", n, err)
	}
	// Every peer has a route at every moment from here on.
	f.OnWrite(func(op, key string) {
		routes, _ := f.RouteList()
		for _, want := range []netip.Prefix{peer(2).Subnet, peer(3).Subnet} {
			found := false
			for _, r := range routes {
				found = found || r.Dst == want && r.LinkIndex == fl.Index
			}
			if !found {
				t.Errorf("after %s %s: no route to %s", op, key, want)
			}
		}
	})
	b.SetPeers(peers(2, 3))
	reconcile(t, b)
	f.OnWrite(nil)
	routes, _ := f.RouteList()
	got := map[netip.Prefix]vxlan.Route{}
	for _, r := range routes {
		if r.LinkIndex == fl.Index {
			if _, dup := got[r.Dst]; dup {
				t.Errorf("two routes to %s on flannel.1", r.Dst)
			}
			got[r.Dst] = r
		}
	}
	for _, n := range []int{2, 3} {
		r, ok := got[peer(n).Subnet]
		if !ok || r.Protocol != vxlan.RouteProtocol || r.Priority != vxlan.RouteMetric(peer(n).Subnet) {
			t.Errorf("route to peer %d: %+v (found %v), want ours at metric %d", n, r, ok, vxlan.RouteMetric(peer(n).Subnet))
		}
	}
	if r, ok := got[peer(9).Subnet]; ok {
		t.Errorf("flannel's route to a host that is gone was kept: %+v", r)
	}
	found := false
	for _, r := range routes {
		found = found || r == other
	}
	if !found {
		t.Errorf("a route on another device was touched: %v", routes)
	}
}

func TestDeviceNameAndMACOverridesAreChecked(t *testing.T) {
	f, cfg := fakeHost(t)
	for name, mod := range map[string]func(*vxlan.Config){
		"slash in the name":  func(c *vxlan.Config) { c.DeviceName = "flannel/1" },
		"name too long":      func(c *vxlan.Config) { c.DeviceName = "a-name-longer-than-15" },
		"multicast MAC":      func(c *vxlan.Config) { c.VtepMAC = net.HardwareAddr{0x01, 0, 0x5e, 0, 0, 1} },
		"zero MAC":           func(c *vxlan.Config) { c.VtepMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0} },
		"MAC of eight bytes": func(c *vxlan.Config) { c.VtepMAC = net.HardwareAddr{0x0e, 0, 0, 0, 0, 0, 0, 1} },
	} {
		c := cfg
		mod(&c)
		if _, err := vxlan.New(c, f); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
}
