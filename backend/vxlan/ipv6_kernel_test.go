package vxlan_test

// The IPv6 overlay against the real kernel, alone and beside the IPv4 one.
// Like kernel_test.go, every test works in network namespaces it creates
// and deletes, and no test namespace is connected to the one the tests run
// in.

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan"
)

// addAddr6 adds an IPv6 address to l without duplicate address detection
// and waits (bounded) until the kernel holds it usable: not tentative.
func (tn *testNS) addAddr6(t testing.TB, l netlink.Link, addr string) {
	t.Helper()
	a, err := netlink.ParseAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	a.Flags = unix.IFA_F_NODAD
	if err := tn.h.AddrAdd(l, a); err != nil {
		t.Fatalf("add %s to %s: %v", addr, l.Attrs().Name, err)
	}
	tn.waitAddrUsable(t, l.Attrs().Index, a.IP)
}

// waitAddrUsable waits until ip is on link index and neither tentative nor
// failed.
func (tn *testNS) waitAddrUsable(t testing.TB, index int, ip net.IP) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%s usable on link %d", ip, index), func() bool {
		as, err := tn.h.AddrList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: index}}, netlink.FAMILY_V6)
		if err != nil {
			return false
		}
		return slices.ContainsFunc(as, func(a netlink.Addr) bool {
			return a.IP.Equal(ip) && a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0
		})
	})
}

// withUnderlay6 is withUnderlay with 2001:db8::1/64 on ul0 as well.
func (tn *testNS) withUnderlay6(t testing.TB) *testNS {
	t.Helper()
	tn.withUnderlay(t)
	ul, err := tn.h.LinkByName("ul0")
	if err != nil {
		t.Fatal(err)
	}
	tn.addAddr6(t, ul, underlay6.String())
	return tn
}

func kernelConfig6(t testing.TB) vxlan.Config { return config6(kernelConfig(t)) }

// vtepMAC6 is the IPv6 VTEP MAC of the host with node ID id on VNI 1.
func vtepMAC6(id string) vxlan.MAC {
	m, _ := backend.MACFrom(vxlan.VtepMACv6(id, 1))
	return m
}

// TestKernelIPv6DeviceAndPeers checks the IPv6 device and the entries of
// its peers through the netlink package, independently of the code under
// test, and the rendering of both against the golden state.
func TestKernelIPv6DeviceAndPeers(t *testing.T) {
	tn := newTestNS(t).withUnderlay6(t)
	cfg := kernelConfig6(t)
	b := newBackend(t, cfg, tn.nl)
	info := ensure(t, b)

	l, err := tn.h.LinkByName(dev6)
	if err != nil {
		t.Fatalf("the device: %v", err)
	}
	ul, err := tn.h.LinkByName("ul0")
	if err != nil {
		t.Fatal(err)
	}
	vx, ok := l.(*netlink.Vxlan)
	switch {
	case !ok:
		t.Fatalf("%s is a %s, want vxlan", dev6, l.Type())
	case info.Index != vx.Index || info.Name != dev6:
		t.Errorf("EnsureDevice = %+v, the kernel has %s at index %d", info, vx.Name, vx.Index)
	case vx.VxlanId != 1 || vx.Port != 8472 || !vx.SrcAddr.Equal(localIP6.AsSlice()) || vx.Learning || vx.VtepDevIndex != ul.Attrs().Index:
		t.Errorf("VXLAN attributes: VNI %d port %d local %s learning %t underlay %d; want 1, 8472, %s, false, %d",
			vx.VxlanId, vx.Port, vx.SrcAddr, vx.Learning, vx.VtepDevIndex, localIP6, ul.Attrs().Index)
	case vx.MTU != 1500-vxlan.OverheadV6 || info.MTU != vx.MTU:
		t.Errorf("MTU %d (reported %d), want %d", vx.MTU, info.MTU, 1500-vxlan.OverheadV6)
	case vx.HardwareAddr.String() != vxlan.VtepMACv6("host-a", 1).String() || vx.HardwareAddr.String() == vxlan.VtepMAC("host-a", 1).String():
		t.Errorf("MAC %s, want VtepMACv6 %s", vx.HardwareAddr, vxlan.VtepMACv6("host-a", 1))
	case vx.Flags&net.FlagUp == 0:
		t.Errorf("device is down")
	}
	// The /128 address is usable at once: no duplicate address detection.
	addrs, err := tn.h.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(addrs, func(a netlink.Addr) bool { return a.IPNet.String() == "fd00:10:244:1::/128" })
	if i < 0 || addrs[i].Flags&unix.IFA_F_NODAD == 0 || addrs[i].Flags&unix.IFA_F_TENTATIVE != 0 {
		t.Errorf("addresses %v: want fd00:10:244:1::/128 with nodad, not tentative", addrs)
	}

	ps := append(peers6(2, 3), manyPeers6(50)...)
	b.SetPeers(ps)
	reconcile(t, b)
	checkState(t, tn.nl, dev6, golden(cfg, ps))
	routes, neighs, fdbs := tn.ours(t, netlink.FAMILY_V6, vx.Index)
	if len(routes) != len(ps) || len(neighs) != len(ps) || len(fdbs) != len(ps) {
		t.Fatalf("kernel holds %d routes, %d neighbours, %d FDB entries; want %d each", len(routes), len(neighs), len(fdbs), len(ps))
	}
	p := peer6(2)
	for _, r := range routes {
		if r.Dst.String() != p.Subnet.String() {
			continue
		}
		if !r.Gw.Equal(p.Subnet.Addr().AsSlice()) || r.LinkIndex != vx.Index || r.Flags&int(netlink.FLAG_ONLINK) == 0 || r.Priority != vxlan.RouteMetric(p.Subnet) {
			t.Errorf("route %v: want via %s dev %s onlink metric %d", r, p.Subnet.Addr(), dev6, vxlan.RouteMetric(p.Subnet))
		}
	}
	if !slices.ContainsFunc(neighs, func(n netlink.Neigh) bool {
		return n.IP.Equal(p.Subnet.Addr().AsSlice()) && n.HardwareAddr.String() == vxlan.PeerMAC(p).String()
	}) {
		t.Errorf("no permanent neighbour %s -> %s in %v", p.Subnet.Addr(), vxlan.PeerMAC(p), neighs)
	}
	if !slices.ContainsFunc(fdbs, func(f netlink.Neigh) bool {
		return f.IP.Equal(p.PublicIP.AsSlice()) && f.HardwareAddr.String() == vxlan.PeerMAC(p).String() && f.State&netlink.NUD_PERMANENT != 0
	}) {
		t.Errorf("no permanent FDB entry %s -> %s in %v", vxlan.PeerMAC(p), p.PublicIP, fdbs)
	}

	b.SetPeers(nil)
	reconcile(t, b)
	checkState(t, tn.nl, dev6, golden(cfg, nil))
	if routes, neighs, fdbs := tn.ours(t, netlink.FAMILY_V6, vx.Index); len(routes)+len(neighs)+len(fdbs) != 0 {
		t.Errorf("after removing all peers: %v, %v, %v", routes, neighs, fdbs)
	}
}

func TestKernelIPv6RepairsDrift(t *testing.T) {
	tn := newTestNS(t).withUnderlay6(t)
	cfg := kernelConfig6(t) // resync every hour: only notifications help
	b := newBackend(t, cfg, tn.nl)
	ps := peers6(2, 3, 4)
	b.SetPeers(ps)
	run(t, b)
	waitSynced(t, b, len(ps))
	d, err := tn.h.LinkByName(dev6)
	if err != nil {
		t.Fatal(err)
	}
	idx := d.Attrs().Index
	victim := peer6(3)
	hop := victim.Subnet.Addr().AsSlice()
	for what, del := range map[string]func() error{
		"route": func() error {
			return tn.h.RouteDel(&netlink.Route{Dst: &net.IPNet{IP: hop, Mask: net.CIDRMask(64, 128)}, Protocol: vxlan.RouteProtocol})
		},
		"neighbour": func() error {
			return tn.h.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V6, IP: hop})
		},
		"FDB entry": func() error {
			return tn.h.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
				IP: victim.PublicIP.AsSlice(), HardwareAddr: vxlan.PeerMAC(victim).HardwareAddr()})
		},
	} {
		// One at a time, each repaired before the next goes.
		if err := del(); err != nil {
			t.Fatalf("delete the %s by hand: %v", what, err)
		}
		waitState(t, tn.nl, dev6, golden(cfg, ps))
	}
	waitFor(t, "3 drift repairs counted", func() bool { return b.Status().DriftRepairs == 3 })
}

// TestKernelDualStackOverlaysLeaveEachOtherAlone runs an IPv4 and an IPv6
// backend in one namespace, on one underlay and one netlink connection,
// both with DirectRouting so that both own routes on the underlay too. What
// one does — repairs, removing all its peers, its teardown — leaves the
// other's entries in place and gives it nothing to write.
func TestKernelDualStackOverlaysLeaveEachOtherAlone(t *testing.T) {
	for _, first := range []vxlan.Family{vxlan.IPv4, vxlan.IPv6} {
		t.Run(first.String()+" goes first", func(t *testing.T) {
			tn := newTestNS(t).withUnderlay6(t)
			cfg4 := kernelConfig(t)
			cfg4.DirectRouting = true
			cfg6 := config6(cfg4)
			b4, b6 := newBackend(t, cfg4, tn.nl), newBackend(t, cfg6, tn.nl)
			ps4, ps6 := append(peers(2, 3), manyPeers(3)...), append(peers6(2, 3), manyPeers6(3)...)
			want4 := goldenWith(cfg4, ps4, []netip.Prefix{peer(2).Subnet, peer(3).Subnet}, nil)
			want6 := goldenWith(cfg6, ps6, []netip.Prefix{peer6(2).Subnet, peer6(3).Subnet}, nil)
			b4.SetPeers(ps4)
			b6.SetPeers(ps6)
			run(t, b4)
			run(t, b6)
			waitSynced(t, b4, len(ps4))
			waitSynced(t, b6, len(ps6))
			checkState(t, tn.nl, dev, want4)
			checkState(t, tn.nl, dev6, want6)

			me, twin, twinDev, twinWant := b4, b6, dev6, want6
			myDev, myWant := dev, want4
			if first == vxlan.IPv6 {
				me, twin, twinDev, twinWant = b6, b4, dev, want4
				myDev, myWant = dev6, want6
			}
			twinWrites := twin.Status().Writes

			// A direct route of mine deleted by hand is repaired by me alone.
			d, err := tn.h.LinkByName(myDev)
			if err != nil {
				t.Fatal(err)
			}
			victim := ps4[0]
			if first == vxlan.IPv6 {
				victim = ps6[0]
			}
			if err := tn.h.RouteDel(&netlink.Route{Dst: &net.IPNet{IP: victim.Subnet.Addr().AsSlice(),
				Mask: net.CIDRMask(victim.Subnet.Bits(), victim.Subnet.Addr().BitLen())}, Protocol: vxlan.RouteProtocol}); err != nil {
				t.Fatalf("delete a route by hand: %v", err)
			}
			waitState(t, tn.nl, myDev, myWant)

			// All my peers go, then I do.
			me.SetPeers(nil)
			waitSynced(t, me, 0)
			if err := me.Teardown(context.Background()); err != nil {
				t.Fatal(err)
			}
			if _, err := tn.h.LinkByIndex(d.Attrs().Index); err == nil {
				t.Errorf("%s survived its teardown", myDev)
			}
			checkState(t, tn.nl, twinDev, twinWant)
			if err := twin.Reconcile(context.Background()); err != nil {
				t.Fatal(err)
			}
			if s := twin.Status(); s.Writes != twinWrites || s.DriftRepairs != 0 || !s.Ready() {
				t.Errorf("the other overlay wrote %d times (drift repairs %d) while this one worked and went: %+v",
					s.Writes-twinWrites, s.DriftRepairs, s)
			}
			checkState(t, tn.nl, twinDev, twinWant)
		})
	}
}

// TestKernelIPv6TwoHostsReachEachOther joins two namespaces by a veth pair
// with IPv6 underlay addresses, runs an IPv6 backend in each with the other
// as its peer, and connects over TCP from an address of one host's IPv6
// subnet to one of the other's.
func TestKernelIPv6TwoHostsReachEachOther(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("DirectRouting=%t", direct), func(t *testing.T) {
			a, b := twoHosts(t)
			hostA := backend.Peer{Subnet: netip.MustParsePrefix("fd00:10:244:1::/64"), PublicIP: netip.MustParseAddr("2001:db8::1"), Data: vxlan.PeerData(vtepMAC6("host-a"))}
			hostB := backend.Peer{Subnet: netip.MustParsePrefix("fd00:10:244:2::/64"), PublicIP: netip.MustParseAddr("2001:db8::2"), Data: vxlan.PeerData(vtepMAC6("host-b"))}
			start := func(tn *testNS, self, other backend.Peer, node string) {
				ul, err := tn.h.LinkByName("ul0")
				if err != nil {
					t.Fatal(err)
				}
				tn.addAddr6(t, ul, netip.PrefixFrom(self.PublicIP, 64).String())
				// Neighbour solicitations for a packet whose source is not
				// on the link come from a link-local address: give the
				// underlay one that is usable at once, rather than wait
				// out the DAD of the kernel's own.
				ll := netip.AddrFrom16([16]byte{0: 0xfe, 1: 0x80, 15: self.PublicIP.As16()[15]})
				tn.addAddr6(t, ul, netip.PrefixFrom(ll, 64).String())
				// An address of the host's own subnet, as a pod's would be.
				lo, err := tn.h.LinkByName("lo")
				if err != nil {
					t.Fatal(err)
				}
				tn.addAddr6(t, lo, netip.PrefixFrom(self.Subnet.Addr().Next(), 128).String())
				cfg := kernelConfig6(t)
				cfg.LocalIP, cfg.OwnSubnet, cfg.NodeID, cfg.DirectRouting = self.PublicIP, self.Subnet, node, direct
				be := newBackend(t, cfg, tn.nl)
				be.SetPeers([]backend.Peer{other})
				run(t, be)
				waitSynced(t, be, 1)
				var want []netip.Prefix
				if direct {
					want = []netip.Prefix{other.Subnet}
				}
				checkState(t, tn.nl, dev6, goldenWith(cfg, []backend.Peer{other}, want, nil))
			}
			start(a, hostA, hostB, "host-a")
			start(b, hostB, hostA, "host-b")
			srcA, srcB := hostA.Subnet.Addr().Next(), hostB.Subnet.Addr().Next()

			if seen := tcpEcho(t, a, b, srcA, srcB); seen != srcB.String() {
				t.Errorf("host A saw the connection from %s, want %s", seen, srcB)
			}
		})
	}
}
