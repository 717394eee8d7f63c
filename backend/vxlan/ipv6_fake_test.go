package vxlan_test

// The IPv6 overlay on the fake, through the same batched writes as the
// kernel, and the two overlays of a dual-stack host side by side.

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/backend/vxlan/vxlantest"
)

const dev6 = "overlay-v6.1"

var (
	localIP6   = netip.MustParseAddr("2001:db8::1")
	ownSubnet6 = netip.MustParsePrefix("fd00:10:244:1::/64")
	underlay6  = netip.MustParsePrefix("2001:db8::1/64")
)

// to6 moves a peer of the IPv4 overlay's tests to the IPv6 overlay:
// a.b.c.0/24 becomes fd00:a:b:c::/64 (the numbers written alike), public
// address 198.18.c.d (the underlay's subnet) 2001:db8::d and 198.19.c.d
// (behind a router) 2001:db8:1:c::d, and the MAC's third byte is 6.
func to6(p backend.Peer) backend.Peer {
	s, a := p.Subnet.Addr().As4(), p.PublicIP.As4()
	p.Subnet = netip.MustParsePrefix(fmt.Sprintf("fd00:%d:%d:%d::/64", s[0], s[1], s[2]))
	p.PublicIP = netip.MustParseAddr(fmt.Sprintf("2001:db8:%d:%d::%d", a[1]-18, a[2], a[3]))
	p.Data[2] = 6
	return p
}

// peer6 n (2..254) is peer n on the IPv6 overlay: fd00:10:244:<n>::/64 at
// 2001:db8::<n> (on the underlay's subnet) with MAC 0e:00:06:00:00:<n>.
func peer6(n int) backend.Peer { return to6(peer(n)) }

func peers6(ns ...int) []backend.Peer { return peersOf(peer6, ns) }

// manyPeers6 is manyPeers on the IPv6 overlay.
func manyPeers6(count int) []backend.Peer {
	out := manyPeers(count)
	for i, p := range out {
		out[i] = to6(p)
	}
	return out
}

// config6 is cfg turned into the IPv6 overlay's config of the same host.
func config6(cfg vxlan.Config) vxlan.Config {
	cfg.LocalIP, cfg.OwnSubnet = localIP6, ownSubnet6
	return cfg
}

// fakeHost6 is fakeHost with an IPv6 address on the underlay too, and the
// config of the IPv6 overlay's backend.
func fakeHost6(t *testing.T) (*vxlantest.Fake, vxlan.Config) {
	f, cfg := fakeHost(t)
	ul, _ := f.LinkByName("ul0")
	if err := f.External(false).AddrReplace(ul.Index, underlay6); err != nil {
		t.Fatal(err)
	}
	return f, config6(cfg)
}

func TestFakeIPv6RejectsIPv4PeersAndMixedConfig(t *testing.T) {
	f, cfg := fakeHost6(t)
	b := newBackend(t, cfg, f)
	if b.Family() != vxlan.IPv6 {
		t.Fatalf("family %v, want IPv6", b.Family())
	}
	b.SetPeers([]backend.Peer{peer6(2), peer(3), {Subnet: ownSubnet6, PublicIP: netip.MustParseAddr("2001:db8::9"), Data: peer6(9).Data}})
	reconcile(t, b)
	if s := b.Status(); s.Peers != 1 || s.InvalidPeers != 2 || s.PeersProgrammed != 1 {
		t.Errorf("status = %+v, want 1 peer and 2 invalid", s)
	}
	checkState(t, f, dev6, golden(cfg, peers6(2)))

	mixed := cfg
	mixed.OwnSubnet = ownSubnet
	if _, err := vxlan.New(mixed, f); err == nil || !strings.Contains(err.Error(), "give both of one family") {
		t.Errorf("New with an IPv6 LocalIP and an IPv4 OwnSubnet: err = %v, want a config error", err)
	}
}

func TestFakeIPv6MismatchedDevice(t *testing.T) {
	for _, tt := range []struct {
		name     string
		mutate   func(*vxlan.Link)
		recreate bool
	}{
		{"wrong local address", func(l *vxlan.Link) { l.Local = netip.MustParseAddr("2001:db8::9") }, true},
		{"an IPv4 local address", func(l *vxlan.Link) { l.Local = localIP }, true},
		{"wrong MTU and MAC", func(l *vxlan.Link) { l.MTU = 1300; l.MAC = vxlan.MAC{2, 1, 1, 1, 1, 1} }, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, cfg := fakeHost6(t)
			ul, _ := f.LinkByName("ul0")
			mac, _ := backend.MACFrom(vxlan.VtepMACv6(cfg.NodeID, 1))
			l := vxlan.Link{Name: dev6, Kind: "vxlan", VNI: 1, Port: 8472, Local: localIP6, UnderlayIndex: ul.Index, MTU: 1430, MAC: mac}
			tt.mutate(&l)
			if err := f.External(false).LinkAdd(l); err != nil {
				t.Fatal(err)
			}
			// A foreign address goes, the kernel's link-local one stays.
			ext := f.External(false)
			for _, a := range []string{"fd00:10:244:9::/128", "fe80::1/64"} {
				if err := ext.AddrReplace(3, netip.MustParsePrefix(a)); err != nil {
					t.Fatal(err)
				}
			}
			b := newBackend(t, cfg, f)
			b.SetPeers(peers6(2))
			reconcile(t, b)
			if got := b.Status().DeviceRecreations; got != map[bool]uint64{false: 0, true: 1}[tt.recreate] {
				t.Errorf("%d recreations, want recreated: %t", got, tt.recreate)
			}
			if !tt.recreate {
				checkState(t, f, dev6, golden(cfg, peers6(2))) // State leaves fe80::/10 out
				addrs, _ := f.AddrListFamily(3, vxlan.IPv6)
				if !slices.Contains(addrs, netip.MustParsePrefix("fe80::1/64")) || slices.Contains(addrs, netip.MustParsePrefix("fd00:10:244:9::/128")) {
					t.Errorf("addresses %v: want the link-local one kept and the foreign one gone", addrs)
				}
			}
			checkState(t, f, dev6, golden(cfg, peers6(2)))
		})
	}
}

func TestFakeIPv6Teardown(t *testing.T) {
	f, cfg := fakeHost6(t)
	cfg.DirectRouting = true
	b := newBackend(t, cfg, f)
	far := peer6(3)
	far.PublicIP = netip.MustParseAddr("2001:db8:ffff::3")
	b.SetPeers([]backend.Peer{peer6(2), far})
	reconcile(t, b)
	for i := range 2 {
		if err := b.Teardown(context.Background()); err != nil {
			t.Fatalf("Teardown #%d: %v", i+1, err)
		}
		checkState(t, f, dev6, "no device overlay-v6.1\n")
	}
}

// scenarios6 are TestFakeEveryInjectedFailureRecovers's scenarios of the
// IPv6 overlay.
var scenarios6 = []scenario{
	{
		name: "IPv6 changes: MAC, public IP, add, remove",
		v6:   true,
		setup: func(t *testing.T, f *vxlantest.Fake, cfg vxlan.Config) {
			b := newBackend(t, cfg, f)
			b.SetPeers(peers6(2, 3, 4))
			reconcile(t, b)
		},
		peers: []backend.Peer{withMAC(peer6(2), 2), withIP(peer6(3), "2001:db8::33"), peer6(5)},
	},
}

// dualStack runs an IPv4 and an IPv6 backend of one host on one fake
// namespace, with DirectRouting so that both also own routes on the shared
// underlay, each converged to its peers.
func dualStack(t *testing.T) (f *vxlantest.Fake, b4, b6 *vxlan.Backend, cfg4, cfg6 vxlan.Config, ps4, ps6 []backend.Peer) {
	f, cfg4 = fakeHost(t)
	cfg4.DirectRouting = true
	cfg6 = config6(cfg4)
	ul, _ := f.LinkByName("ul0")
	if err := f.External(false).AddrReplace(ul.Index, underlay6); err != nil {
		t.Fatal(err)
	}
	b4, b6 = newBackend(t, cfg4, f), newBackend(t, cfg6, f)
	ps4, ps6 = append(peers(2, 3), manyPeers(3)...), append(peers6(2, 3), manyPeers6(3)...)
	b4.SetPeers(ps4)
	b6.SetPeers(ps6)
	reconcile(t, b4)
	reconcile(t, b6)
	return f, b4, b6, cfg4, cfg6, ps4, ps6
}

func TestFakeDualStackOverlaysLeaveEachOtherAlone(t *testing.T) {
	direct4 := []netip.Prefix{peer(2).Subnet, peer(3).Subnet}
	direct6 := []netip.Prefix{peer6(2).Subnet, peer6(3).Subnet}
	for _, first := range []vxlan.Family{vxlan.IPv4, vxlan.IPv6} {
		t.Run(first.String()+" changes first", func(t *testing.T) {
			f, b4, b6, cfg4, cfg6, ps4, ps6 := dualStack(t)
			checkState(t, f, dev, goldenWith(cfg4, ps4, direct4, nil))
			checkState(t, f, dev6, goldenWith(cfg6, ps6, direct6, nil))
			me, twin := b4, b6
			twinDev, twinGolden := dev6, goldenWith(cfg6, ps6, direct6, nil)
			if first == vxlan.IPv6 {
				me, twin = b6, b4
				twinDev, twinGolden = dev, goldenWith(cfg4, ps4, direct4, nil)
			}
			// One overlay drops its peers and goes: the other's entries,
			// its routes on the shared underlay included, stay, and it
			// finds nothing to write.
			me.SetPeers(nil)
			reconcile(t, me)
			if err := me.Teardown(context.Background()); err != nil {
				t.Fatal(err)
			}
			checkState(t, f, twinDev, twinGolden)
			writes := twin.Status().Writes
			reconcile(t, twin)
			if s := twin.Status(); s.Writes != writes || s.DriftRepairs != 0 || !s.Ready() {
				t.Errorf("the other overlay after this one's teardown: %+v", s)
			}
		})
	}
}
