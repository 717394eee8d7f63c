package vxlan_test

// Tests against the real kernel. Every one of them works in network
// namespaces it creates and deletes; nothing is configured in the namespace
// the tests run in, and no test namespace is connected to it.

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// testNS is a throwaway network namespace with two netlink views of it: the
// test's own handle (setup, disturbance, independent checks) and a
// KernelNetlink for backends and rendering.
type testNS struct {
	ns ns.NetNS
	h  *netlink.Handle
	nl *vxlan.KernelNetlink
}

func newTestNS(t testing.TB) *testNS {
	t.Helper()
	n := testenv.NewNS(t)
	nsh, err := netns.GetFromPath(n.Path())
	if err != nil {
		t.Fatalf("open %s: %v", n.Path(), err)
	}
	t.Cleanup(func() { nsh.Close() })
	// Guard: never hand out a handle on the namespace the tests run in.
	if cur, err := netns.Get(); err != nil || cur.Equal(nsh) {
		t.Fatalf("refusing to use %s: it is the current namespace (err %v)", n.Path(), err)
	} else {
		cur.Close()
	}
	h, err := netlink.NewHandleAt(nsh)
	if err != nil {
		t.Fatalf("netlink handle in %s: %v", n.Path(), err)
	}
	t.Cleanup(h.Close)
	nl, err := vxlan.OpenNetlink(nsh)
	if err != nil {
		t.Fatalf("OpenNetlink: %v", err)
	}
	t.Cleanup(func() { nl.Close() })
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatalf("set lo up: %v", err)
	}
	return &testNS{ns: n, h: h, nl: nl}
}

func (tn *testNS) addrUp(t testing.TB, l netlink.Link, addr string) {
	t.Helper()
	a, err := netlink.ParseAddr(addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := tn.h.AddrAdd(l, a); err != nil {
		t.Fatalf("add %s to %s: %v", addr, l.Attrs().Name, err)
	}
	if err := tn.h.LinkSetUp(l); err != nil {
		t.Fatalf("set %s up: %v", l.Attrs().Name, err)
	}
}

// withUnderlay gives the namespace an underlay ul0 (198.18.0.1/24, MTU
// 1500): one end of a veth pair whose other end, ul0p, is up in the same
// namespace with no address. Enough to program peers, nothing to reach.
// (A veth rather than a dummy link: not every kernel has the dummy module.)
func (tn *testNS) withUnderlay(t testing.TB) *testNS {
	t.Helper()
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0", MTU: 1500}, PeerName: "ul0p"}
	if err := tn.h.LinkAdd(v); err != nil {
		t.Fatalf("add veth ul0: %v", err)
	}
	p, err := tn.h.LinkByName("ul0p")
	if err == nil {
		err = tn.h.LinkSetUp(p)
	}
	if err != nil {
		t.Fatalf("set ul0p up: %v", err)
	}
	tn.addrUp(t, v, "198.18.0.1/24")
	return tn
}

// twoHosts returns two namespaces joined by a veth pair, ul0 on both ends:
// 198.18.0.1/24 in a, 198.18.0.2/24 in b.
func twoHosts(t testing.TB) (a, b *testNS) {
	a, b = newTestNS(t), newTestNS(t)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: "ul0", MTU: 1500},
		PeerName:      "ul0",
		PeerNamespace: netlink.NsFd(int(b.ns.Fd())),
	}
	if err := a.h.LinkAdd(veth); err != nil {
		t.Fatalf("add veth pair between the test namespaces: %v", err)
	}
	for _, x := range []struct {
		tn   *testNS
		addr string
	}{{a, "198.18.0.1/24"}, {b, "198.18.0.2/24"}} {
		l, err := x.tn.h.LinkByName("ul0")
		if err != nil {
			t.Fatal(err)
		}
		x.tn.addrUp(t, l, x.addr)
	}
	return a, b
}

func kernelConfig(t testing.TB) vxlan.Config {
	log, _ := newLogger(t)
	return vxlan.Config{
		Underlay:       "ul0",
		LocalIP:        localIP,
		OwnSubnet:      ownSubnet,
		NodeID:         "host-a",
		ResyncInterval: time.Hour,
		Logger:         log,
	}
}

func ensure(t testing.TB, b *vxlan.Backend) vxlan.DeviceInfo {
	t.Helper()
	info, err := b.EnsureDevice(context.Background())
	if err != nil {
		t.Fatalf("EnsureDevice: %v", err)
	}
	return info
}

// counts lists the kernel through the test's own handle, independently of
// the code under test: our IPv4 routes, permanent neighbours and FDB
// entries on the device.
func (tn *testNS) counts(t testing.TB, devIndex int) (routes, neighs, fdbs int) {
	t.Helper()
	rs, ns, fs := tn.ours(t, netlink.FAMILY_V4, devIndex)
	return len(rs), len(ns), len(fs)
}

// ours lists, through the test's own handle, the routes of our protocol
// (on any link) of family (netlink.FAMILY_V4 or _V6), and the permanent
// neighbours of that family and the FDB entries of link index.
func (tn *testNS) ours(t testing.TB, family, index int) (routes []netlink.Route, neighs, fdbs []netlink.Neigh) {
	t.Helper()
	routes, err := tn.h.RouteListFiltered(family, &netlink.Route{Protocol: vxlan.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		t.Fatalf("list routes: %v", err)
	}
	all, err := tn.h.NeighList(index, family)
	if err != nil {
		t.Fatalf("list neighbours: %v", err)
	}
	for _, n := range all {
		if n.State&netlink.NUD_PERMANENT != 0 {
			neighs = append(neighs, n)
		}
	}
	all, err = tn.h.NeighList(index, unix.AF_BRIDGE)
	if err != nil {
		t.Fatalf("list FDB: %v", err)
	}
	for _, f := range all {
		if f.LinkIndex == index {
			fdbs = append(fdbs, f)
		}
	}
	return routes, neighs, fdbs
}

func TestKernelProgramsAndRemoves200Peers(t *testing.T) {
	tn := newTestNS(t).withUnderlay(t)
	cfg := kernelConfig(t)
	b := newBackend(t, cfg, tn.nl)
	info := ensure(t, b)

	// Another program's route on our device must survive everything.
	foreign := &netlink.Route{Dst: &net.IPNet{IP: net.IPv4(10, 250, 0, 0), Mask: net.CIDRMask(24, 32)},
		LinkIndex: info.Index, Protocol: unix.RTPROT_STATIC, Scope: netlink.SCOPE_LINK}
	if err := tn.h.RouteAdd(foreign); err != nil {
		t.Fatalf("add foreign route: %v", err)
	}
	extra := []string{"route 10.250.0.0/24 dev overlay.1 proto 4"}

	ps := manyPeers(200)
	b.SetPeers(ps)
	reconcile(t, b)
	checkState(t, tn.nl, dev, goldenWith(cfg, ps, nil, extra))
	if r, n, f := tn.counts(t, info.Index); r != 200 || n != 200 || f != 200 {
		t.Errorf("kernel holds %d routes, %d neighbours, %d FDB entries; want 200 each", r, n, f)
	}
	// 3 writes made the device (create, address, up), 3 per peer the rest.
	if s := b.Status(); !s.Ready() || s.PeersProgrammed != 200 || s.Writes != 3+600 {
		t.Errorf("status = %+v, want ready, 200 peers, 603 writes", s)
	}

	b.SetPeers(nil)
	reconcile(t, b)
	checkState(t, tn.nl, dev, goldenWith(cfg, nil, nil, extra))
	if r, n, f := tn.counts(t, info.Index); r != 0 || n != 0 || f != 0 {
		t.Errorf("after removing all peers the kernel holds %d routes, %d neighbours, %d FDB entries", r, n, f)
	}
}

func TestKernelRepairsDrift(t *testing.T) {
	ps := peers(2, 3, 4, 5, 6)
	victim := peer(5)
	disturb := func(t *testing.T, tn *testNS) {
		t.Helper()
		d, err := tn.h.LinkByName(dev)
		if err != nil {
			t.Fatal(err)
		}
		idx := d.Attrs().Index
		hop := victim.Subnet.Addr().AsSlice()
		for what, err := range map[string]error{
			"route":     tn.h.RouteDel(&netlink.Route{Dst: &net.IPNet{IP: hop, Mask: net.CIDRMask(24, 32)}, Protocol: vxlan.RouteProtocol}),
			"neighbour": tn.h.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, IP: hop}),
			"FDB entry": tn.h.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, Flags: netlink.NTF_SELF,
				IP: victim.PublicIP.AsSlice(), HardwareAddr: vxlan.PeerMAC(victim).HardwareAddr()}),
		} {
			if err != nil {
				t.Fatalf("delete the %s by hand: %v", what, err)
			}
		}
	}

	t.Run("the next pass repairs exactly what was deleted", func(t *testing.T) {
		tn := newTestNS(t).withUnderlay(t)
		cfg := kernelConfig(t)
		b := newBackend(t, cfg, tn.nl)
		b.SetPeers(ps)
		reconcile(t, b)
		disturb(t, tn)
		if s := state(t, tn.nl, dev); s == golden(cfg, ps) {
			t.Fatal("the disturbance did not change the kernel")
		}
		writes := b.Status().Writes
		reconcile(t, b)
		checkState(t, tn.nl, dev, golden(cfg, ps))
		if s := b.Status(); s.DriftRepairs != 3 || s.Writes-writes != 3 {
			t.Errorf("drift repairs %d with %d writes, want 3 and 3", s.DriftRepairs, s.Writes-writes)
		}
	})

	t.Run("notifications bring the repair without waiting for a resync", func(t *testing.T) {
		tn := newTestNS(t).withUnderlay(t)
		cfg := kernelConfig(t) // resync every hour: only notifications help
		b := newBackend(t, cfg, tn.nl)
		b.SetPeers(ps)
		run(t, b)
		waitSynced(t, b, len(ps))
		disturb(t, tn)
		waitState(t, tn.nl, dev, golden(cfg, ps))
	})
}

func TestKernelRecreatesDeletedDevice(t *testing.T) {
	tn := newTestNS(t).withUnderlay(t)
	cfg := kernelConfig(t)
	b := newBackend(t, cfg, tn.nl)
	ps := manyPeers(50)
	b.SetPeers(ps)
	run(t, b)
	waitSynced(t, b, len(ps))
	d, err := tn.h.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	if err := tn.h.LinkDel(d); err != nil {
		t.Fatalf("delete the device by hand: %v", err)
	}
	// The golden state includes the device's MAC: recreated, it is the same.
	waitState(t, tn.nl, dev, golden(cfg, ps))
	waitFor(t, "the recreation to be counted", func() bool { return b.Status().DeviceRecreations == 1 })
	if d2, err := tn.h.LinkByName(dev); err != nil || d2.Attrs().Index == d.Attrs().Index {
		t.Errorf("device not recreated (err %v)", err)
	}
}

func TestKernelDeviceSetDownIsRepaired(t *testing.T) {
	tn := newTestNS(t).withUnderlay(t)
	cfg := kernelConfig(t)
	b := newBackend(t, cfg, tn.nl)
	ps := manyPeers(20)
	b.SetPeers(ps)
	run(t, b)
	waitSynced(t, b, len(ps))
	d, err := tn.h.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	// The kernel flushes the routes and neighbours of a link going down.
	if err := tn.h.LinkSetDown(d); err != nil {
		t.Fatalf("set the device down by hand: %v", err)
	}
	waitState(t, tn.nl, dev, golden(cfg, ps))
	if s := b.Status(); s.DeviceRecreations != 0 {
		t.Errorf("device recreated %d times, want it set up in place", s.DeviceRecreations)
	}
}

func TestKernelRestartPerformsZeroWrites(t *testing.T) {
	for _, tt := range []struct{ v6, direct bool }{{false, false}, {false, true}, {true, false}, {true, true}} {
		t.Run(fmt.Sprintf("IPv6=%t/DirectRouting=%t", tt.v6, tt.direct), func(t *testing.T) {
			direct := tt.direct
			tn := newTestNS(t).withUnderlay6(t)
			cfg, dev, mtu := kernelConfig(t), dev, 1450
			cfg.DirectRouting = direct
			// Half the peers on the underlay's subnet (routed directly
			// when DirectRouting is on), half behind it.
			ps := append(peers(2, 3, 4, 5, 6, 7, 8, 9, 10, 11), manyPeers(10)...)
			if tt.v6 {
				cfg, dev, mtu = config6(cfg), dev6, 1430
				for i, p := range ps {
					ps[i] = to6(p)
				}
			}
			first := newBackend(t, cfg, tn.nl)
			first.SetPeers(ps)
			reconcile(t, first)
			var directPeers []netip.Prefix
			if direct {
				for _, p := range ps[:10] {
					directPeers = append(directPeers, p.Subnet)
				}
			}
			want := goldenWith(cfg, ps, directPeers, nil)
			checkState(t, tn.nl, dev, want)

			before, err := tn.h.LinkByName(dev)
			if err != nil {
				t.Fatal(err)
			}

			c := &counting{Netlink: tn.nl}
			cfg.DisableWatch = false
			second := newBackend(t, cfg, c)
			if info := ensure(t, second); info.MTU != mtu || info.Index != before.Attrs().Index {
				t.Errorf("adopted %+v, want MTU %d and the same device (index %d)", info, mtu, before.Attrs().Index)
			}
			slices.Reverse(ps) // order does not matter
			second.SetPeers(ps)
			run(t, second)
			waitSynced(t, second, len(ps))
			if n := c.n.Load(); n != 0 {
				t.Errorf("a backend started on a converged namespace made %d netlink writes, want 0", n)
			}
			if s := second.Status(); s.Writes != 0 || s.DeviceRecreations != 0 {
				t.Errorf("status = %+v", s)
			}
			checkState(t, tn.nl, dev, want)
		})
	}
}

func TestKernelFixesMismatchedDevice(t *testing.T) {
	mac := vxlan.VtepMAC("host-a", 1)
	tests := []struct {
		name     string
		v6       bool // of the IPv6 overlay
		link     func(underlay int) netlink.Link
		recreate bool
		writes   uint64 // for in-place fixes
	}{
		{
			name: "wrong port: recreated",
			link: func(ul int) netlink.Link {
				return &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: dev, MTU: 1450, HardwareAddr: mac},
					VxlanId: 1, Port: 4789, SrcAddr: localIP.AsSlice(), VtepDevIndex: ul}
			},
			recreate: true,
		},
		{
			name: "learning on: recreated",
			link: func(ul int) netlink.Link {
				return &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: dev, MTU: 1450, HardwareAddr: mac},
					VxlanId: 1, Port: 8472, SrcAddr: localIP.AsSlice(), VtepDevIndex: ul, Learning: true}
			},
			recreate: true,
		},
		{
			name: "a veth holding the name: replaced",
			link: func(int) netlink.Link {
				return &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: dev}, PeerName: "squatter"}
			},
			recreate: true,
		},
		{
			name: "wrong MTU and MAC, no address, down: fixed in place",
			link: func(ul int) netlink.Link {
				return &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: dev, MTU: 1300, HardwareAddr: net.HardwareAddr{2, 0, 0, 0, 0, 1}},
					VxlanId: 1, Port: 8472, SrcAddr: localIP.AsSlice(), VtepDevIndex: ul}
			},
			writes: 4, // MTU, MAC, address, up
		},
		{
			name: "IPv6: wrong port: recreated",
			v6:   true,
			link: func(ul int) netlink.Link {
				return &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: dev6, MTU: 1430, HardwareAddr: vxlan.VtepMACv6("host-a", 1)},
					VxlanId: 1, Port: 4789, SrcAddr: localIP6.AsSlice(), VtepDevIndex: ul}
			},
			recreate: true,
		},
		{
			name: "IPv6: an IPv4 local address: recreated",
			v6:   true,
			link: func(ul int) netlink.Link {
				return &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: dev6, MTU: 1430, HardwareAddr: vxlan.VtepMACv6("host-a", 1)},
					VxlanId: 7, Port: 8472, SrcAddr: localIP.AsSlice(), VtepDevIndex: ul}
			},
			recreate: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tn := newTestNS(t).withUnderlay6(t)
			cfg, dev, ps := kernelConfig(t), dev, peers(2)
			if tt.v6 {
				cfg, dev, ps = config6(cfg), dev6, peers6(2)
			}
			ul, err := tn.h.LinkByName("ul0")
			if err != nil {
				t.Fatal(err)
			}
			if err := tn.h.LinkAdd(tt.link(ul.Attrs().Index)); err != nil {
				t.Fatalf("create the mismatched device: %v", err)
			}
			old, err := tn.h.LinkByName(dev)
			if err != nil {
				t.Fatal(err)
			}
			b := newBackend(t, cfg, tn.nl)
			info := ensure(t, b)
			s := b.Status()
			if tt.recreate {
				if info.Index == old.Attrs().Index || s.DeviceRecreations != 1 {
					t.Errorf("not recreated: index %d (was %d), recreations %d", info.Index, old.Attrs().Index, s.DeviceRecreations)
				}
			} else if info.Index != old.Attrs().Index || s.DeviceRecreations != 0 || s.Writes != tt.writes {
				t.Errorf("not fixed in place: index %d (was %d), recreations %d, writes %d (want %d)",
					info.Index, old.Attrs().Index, s.DeviceRecreations, s.Writes, tt.writes)
			}
			b.SetPeers(ps)
			reconcile(t, b)
			checkState(t, tn.nl, dev, golden(cfg, ps))
		})
	}
}

func TestKernelTeardown(t *testing.T) {
	for _, v6 := range []bool{false, true} {
		t.Run(fmt.Sprintf("IPv6=%t", v6), func(t *testing.T) {
			tn := newTestNS(t).withUnderlay6(t)
			cfg, dev, ps := kernelConfig(t), dev, append(peers(2, 3), manyPeers(3)...)
			if v6 {
				cfg, dev, ps = config6(cfg), dev6, append(peers6(2, 3), manyPeers6(3)...)
			}
			cfg.DirectRouting = true
			b := newBackend(t, cfg, tn.nl)
			b.SetPeers(ps)
			reconcile(t, b)
			for i := range 2 {
				if err := b.Teardown(context.Background()); err != nil {
					t.Fatalf("Teardown #%d: %v", i+1, err)
				}
				checkState(t, tn.nl, dev, "no device "+dev+"\n")
			}
			if _, err := tn.h.LinkByName("ul0"); err != nil {
				t.Errorf("the underlay went too: %v", err)
			}
			rs, err := tn.h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: vxlan.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
			if err != nil || len(rs) != 0 {
				t.Errorf("routes of ours left: %v (%v)", rs, err)
			}
		})
	}
}

// TestKernelTwoHostsReachEachOther joins two namespaces by a veth pair, runs
// a backend in each with the other as its peer, and connects over TCP from
// one host's VTEP address to the other's.
func TestKernelTwoHostsReachEachOther(t *testing.T) {
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("DirectRouting=%t", direct), func(t *testing.T) {
			a, b := twoHosts(t)
			hostA := backend.Peer{Subnet: netip.MustParsePrefix("10.244.1.0/24"), PublicIP: netip.MustParseAddr("198.18.0.1"), Data: vxlan.PeerData(vtepMAC("host-a"))}
			hostB := backend.Peer{Subnet: netip.MustParsePrefix("10.244.2.0/24"), PublicIP: netip.MustParseAddr("198.18.0.2"), Data: vxlan.PeerData(vtepMAC("host-b"))}
			start := func(tn *testNS, self, other backend.Peer, node string) {
				cfg := kernelConfig(t)
				cfg.LocalIP, cfg.OwnSubnet, cfg.NodeID, cfg.DirectRouting = self.PublicIP, self.Subnet, node, direct
				be := newBackend(t, cfg, tn.nl)
				be.SetPeers([]backend.Peer{other})
				run(t, be)
				waitSynced(t, be, 1)
				want := []netip.Prefix(nil)
				if direct {
					want = []netip.Prefix{other.Subnet}
				}
				checkState(t, tn.nl, dev, goldenWith(cfg, []backend.Peer{other}, want, nil))
			}
			start(a, hostA, hostB, "host-a")
			start(b, hostB, hostA, "host-b")

			src := tcpEcho(t, a, b, netip.MustParseAddr("10.244.1.0"), netip.Addr{})
			// Over VXLAN, B's packets leave overlay.1 with B's VTEP address
			// as source; routed directly they leave ul0 with B's public one.
			wantSrc := "10.244.2.0"
			if direct {
				wantSrc = "198.18.0.2"
			}
			if src != wantSrc {
				t.Errorf("host A saw the connection from %s, want %s", src, wantSrc)
			}
		})
	}
}

// tcpEcho listens on dst inside host a, connects from host b (from its
// address from, if valid), has a message echoed over the connection, and
// returns the address host a saw the connection come from. It dials again
// while the underlay resolves its neighbours, for a bounded time.
func tcpEcho(t *testing.T, a, b *testNS, dst, from netip.Addr) (seenFrom string) {
	t.Helper()
	var ln net.Listener
	if err := a.ns.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(dst, 0).String())
		return err
	}); err != nil {
		t.Fatalf("listen in host A: %v", err)
	}
	defer ln.Close()
	accepted := make(chan string, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- "accept: " + err.Error()
			return
		}
		defer c.Close()
		accepted <- c.RemoteAddr().(*net.TCPAddr).IP.String()
		io.Copy(c, c) // echo
	}()

	d := net.Dialer{Timeout: 500 * time.Millisecond}
	if from.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
	}
	var conn net.Conn
	waitFor(t, fmt.Sprintf("a TCP connection from host B to %s", ln.Addr()), func() bool {
		err := b.ns.Do(func(ns.NetNS) error {
			var err error
			conn, err = d.Dial("tcp", ln.Addr().String())
			return err
		})
		return err == nil
	})
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	const msg = "ping over the overlay"
	if _, err := conn.Write([]byte(msg)); err != nil {
		t.Fatalf("write: %v", err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != msg {
		t.Fatalf("echo: %q, %v", buf, err)
	}
	return <-accepted
}

// BenchmarkKernelColdPass measures a cold start against the real kernel:
// device creation, one listing of each kind and every peer's three writes.
// The IPv4 overlay's figures keep their names (peers=N); the IPv6
// overlay's are IPv6/peers=N.
func BenchmarkKernelColdPass(b *testing.B) {
	for _, tt := range []struct {
		v6 bool
		n  int
	}{{false, 1000}, {false, 5000}, {true, 1000}, {true, 5000}} {
		name := fmt.Sprintf("peers=%d", tt.n)
		if tt.v6 {
			name = "IPv6/" + name
		}
		n := tt.n
		b.Run(name, func(b *testing.B) {
			tn := newTestNS(b).withUnderlay6(b)
			cfg := kernelConfig(b)
			cfg.Logger = nil
			ps := manyPeers(n)
			if tt.v6 {
				cfg = config6(cfg)
				for i, p := range ps {
					ps[i] = to6(p)
				}
			}
			b.ResetTimer()
			for range b.N {
				be, err := vxlan.New(cfg, tn.nl)
				if err != nil {
					b.Fatal(err)
				}
				be.SetPeers(ps)
				if err := be.Reconcile(context.Background()); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				if s := be.Status(); s.PeersProgrammed != n {
					b.Fatalf("%d peers programmed, want %d", s.PeersProgrammed, n)
				}
				if err := be.Teardown(context.Background()); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(n), "µs/peer")
		})
	}
}

// A DaemonSet pod granted NET_ADMIN and NET_RAW alone (no CAP_SYS_ADMIN,
// which entering a network namespace takes, even one's own) opens its
// netlink sockets in the namespace it runs in: deploy/kubernetes's pods did
// not start before ("failed to set into network namespace").
func TestOpenNetlinkWithoutCapSysAdmin(t *testing.T) {
	tn := newTestNS(t)
	nsh, err := netns.GetFromPath(tn.ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer nsh.Close()
	var links []vxlan.Link
	err = testenv.WithoutCapabilities(nsh, []uintptr{unix.CAP_SYS_ADMIN}, func() error {
		nl, err := vxlan.OpenNetlink(netns.None())
		if err != nil {
			return err
		}
		defer nl.Close()
		links, err = nl.LinkList()
		return err
	})
	if err != nil {
		t.Fatalf("OpenNetlink without CAP_SYS_ADMIN: %v", err)
	}
	// The sockets are in the test namespace: lo alone, no root link.
	if len(links) != 1 || links[0].Name != "lo" {
		t.Fatalf("links seen: %+v, want lo alone (the test namespace's)", links)
	}
}
