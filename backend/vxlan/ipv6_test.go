package vxlan

// The IPv6 overlay's pure logic: configuration, peers, diff, and the wire
// encoding of its entries.

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// tSpec6 is peer n of the IPv6 overlay: fd00:10:244:<n>::/64 at
// 2001:db8::<n>.
func tSpec6(n int) Peer {
	return Peer{
		Subnet:   netip.MustParsePrefix(fmt.Sprintf("fd00:10:244:%x::/64", n)),
		PublicIP: netip.MustParseAddr(fmt.Sprintf("2001:db8::%x", n)),
		Data:     PeerData(MAC{0x0e, 0, 0, 0, 6, byte(n)}),
	}
}

var underlayConnected6 = kernelState{Routes: []Route{
	// IPv6 routes have no scope: a connected one is universe, metric 256.
	{Dst: netip.MustParsePrefix("2001:db8::/64"), LinkIndex: tUnderlay, Protocol: 2, Priority: 256},
	{Dst: netip.MustParsePrefix("fe80::/64"), LinkIndex: tUnderlay, Protocol: 2, Priority: 256},
}}

// IPv6 peers come out sorted as comparePrefix orders them, whatever the
// input order, with the first of equal subnets (as given) winning; the
// index finds them.
func TestValidatePeersSortsIPv6(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var in []Peer
	for i := range 300 {
		p := Peer{
			Subnet:   netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, byte(rng.IntN(4)), 0, 0, 0, byte(rng.IntN(256)), byte(i)}), 64),
			PublicIP: netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 14: byte(i >> 8), 15: byte(i)}),
			Data:     PeerData(MAC{0x0e, 6, 0, 0, byte(i >> 8), byte(i)}),
		}
		in = append(in, p)
	}
	dup := in[17]
	dup.PublicIP, dup.Data = netip.MustParseAddr("2001:db8::ffff"), PeerData(MAC{0x0e, 6, 9, 9, 9, 9})
	in = append(in, dup) // after the original: the original wins
	rng.Shuffle(len(in)-1, func(i, j int) { in[i], in[j] = in[j], in[i] })
	specs, rejected, idx := validatePeers(in, IPv6, netip.Prefix{}, netip.Addr{})
	if len(specs) != 300 || len(rejected) != 1 {
		t.Fatalf("%d accepted, rejected %v; want 300 and the duplicate", len(specs), rejected)
	}
	for i := 1; i < len(specs); i++ {
		if comparePrefix(specs[i-1].Subnet, specs[i].Subnet) >= 0 {
			t.Fatalf("not sorted at %d: %v before %v", i, specs[i-1].Subnet, specs[i].Subnet)
		}
	}
	for _, p := range specs {
		if p.Subnet == dup.Subnet && p != in[slicesIndex(in, dup.Subnet)] {
			t.Errorf("the later duplicate won: %v", p)
		}
		if !idx.hasSubnet(p.Subnet) || !idx.hasHop(p.Subnet.Addr()) || !idx.hasMAC(PeerMAC(p)) {
			t.Errorf("index misses %v", p)
		}
	}
}

// slicesIndex is the position of the first peer with subnet s.
func slicesIndex(ps []Peer, s netip.Prefix) int {
	for i, p := range ps {
		if p.Subnet == s {
			return i
		}
	}
	return -1
}

// compareSubnet's IPv4 fast path orders as comparePrefix does, and it
// falls back to comparePrefix for everything else.
func TestCompareSubnetAgreesWithComparePrefix(t *testing.T) {
	ps := []netip.Prefix{}
	for _, s := range []string{"10.244.2.0/24", "10.244.2.0/25", "10.244.3.0/24", "9.255.255.0/24", "0.0.0.0/0",
		"fd00:10:244:2::/64", "fd00:10:244:2::/80", "fd00:10:244:10::/64", "::/0", "2001:db8::/64"} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	sign := func(n int) int { return cmpInt(n, 0) }
	for _, a := range ps {
		for _, b := range ps {
			if got, want := sign(compareSubnet(a, b)), sign(comparePrefix(a, b)); got != want {
				t.Errorf("compareSubnet(%v, %v) = %d, comparePrefix says %d", a, b, got, want)
			}
		}
	}
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func TestSpecDeltaIPv6(t *testing.T) {
	s2, s3, s10 := tSpec6(2), tSpec6(3), tSpec6(0x10)
	s3b := s3
	s3b.Data = PeerData(tMAC(0x33))
	gone, come := specDelta([]Peer{s2, s3}, []Peer{s3b, s10})
	eq := cmp.Comparer(func(a, b Peer) bool { return a == b })
	if d := cmp.Diff([]Peer{s2, s3}, gone, eq); d != "" {
		t.Errorf("gone (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]Peer{s3b, s10}, come, eq); d != "" {
		t.Errorf("come (-want +got):\n%s", d)
	}
}

func TestConfigFamily(t *testing.T) {
	v4, v6 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("2001:db8::1")
	own4, own6 := netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")
	tests := []struct {
		name  string
		local netip.Addr
		own   netip.Prefix
		fam   Family
		err   string // in the config error, "" for none
	}{
		{"IPv4", v4, own4, IPv4, ""},
		{"IPv6", v6, own6, IPv6, ""},
		{"only a local IPv6 address (teardown)", v6, netip.Prefix{}, IPv6, ""},
		{"only an IPv6 subnet", netip.Addr{}, own6, IPv6, ""},
		{"neither: IPv4", netip.Addr{}, netip.Prefix{}, IPv4, ""},
		{"IPv4 local, IPv6 subnet", v4, own6, 0,
			"LocalIP 198.18.0.1 is IPv4 but OwnSubnet fd00:10:244:1::/64 is IPv6: give both of one family (IPv4 for overlay.1, IPv6 for overlay-v6.1)"},
		{"IPv6 local, IPv4 subnet", v6, own4, 0, "LocalIP 2001:db8::1 is IPv6 but OwnSubnet 10.244.1.0/24 is IPv4"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Config{Underlay: "ul0", LocalIP: tt.local, OwnSubnet: tt.own}.withDefaults()
			switch {
			case tt.err == "" && err != nil:
				t.Fatalf("withDefaults: %v", err)
			case tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)):
				t.Fatalf("withDefaults: err = %v, want one saying %q", err, tt.err)
			case tt.err == "" && c.fam != tt.fam:
				t.Errorf("family %v, want %v", c.fam, tt.fam)
			}
		})
	}

	t.Run("device checks of the IPv6 overlay", func(t *testing.T) {
		for _, tt := range []struct {
			local netip.Addr
			own   netip.Prefix
			err   string
		}{
			{v6, own6, ""},
			{netip.MustParseAddr("::"), own6, "LocalIP :: is not a usable IPv6 address"},
			{netip.MustParseAddr("ff02::1"), own6, "LocalIP ff02::1 is not a usable IPv6 address"},
			{netip.MustParseAddr("fe80::1%ul0"), own6, "LocalIP fe80::1%ul0 is not a usable IPv6 address"},
			{netip.MustParseAddr("::ffff:198.18.0.1"), own6, "LocalIP ::ffff:198.18.0.1 is not a usable IPv6 address"},
			{v6, netip.MustParsePrefix("fd00:10:244:1::1/64"), "OwnSubnet fd00:10:244:1::1/64 is not an IPv6 network prefix"},
		} {
			c, err := Config{Underlay: "ul0", LocalIP: tt.local, OwnSubnet: tt.own, NodeID: "n"}.withDefaults()
			if err == nil {
				err = c.checkDevice()
			}
			if (tt.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.err) {
				t.Errorf("local %v, subnet %v: err = %v, want %q", tt.local, tt.own, err, tt.err)
			}
		}
	})
}

func TestVtepMACv6(t *testing.T) {
	// VtepMAC's values are published by running hosts: they must never
	// change (this one was computed before IPv6 came).
	if got := VtepMAC("node-a", 1).String(); got != "26:3d:91:fb:c0:bc" {
		t.Errorf("VtepMAC(node-a, 1) = %s, want 26:3d:91:fb:c0:bc as ever", got)
	}
	if a, b := VtepMACv6("node-a", 1), VtepMACv6("node-a", 1); a.String() != b.String() {
		t.Errorf("not stable: %s vs %s", a, b)
	}
	seen := map[string]string{}
	for i := range 1000 {
		node := fmt.Sprintf("node-%d", i)
		for _, vni := range []int{1, 2} {
			for fam, m := range map[string]string{"v4": VtepMAC(node, vni).String(), "v6": VtepMACv6(node, vni).String()} {
				who := fmt.Sprintf("%s %s VNI %d", fam, node, vni)
				if other, dup := seen[m]; dup {
					t.Fatalf("%s and %s share MAC %s", who, other, m)
				}
				seen[m] = who
			}
		}
		m := VtepMACv6(node, 1)
		if len(m) != 6 || m[0]&0x01 != 0 || m[0]&0x02 == 0 {
			t.Errorf("%s is not a locally administered unicast MAC", m)
		}
	}
	if DeviceNameV6(7) != "overlay-v6.7" || DeviceName(7) != "overlay.7" {
		t.Errorf("device names %q, %q", DeviceName(7), DeviceNameV6(7))
	}
}

// What the writer encodes, the dump parser and the notification parser
// read back, for both families, byte for byte of the kernel's format.
func TestRTNLEncodingRoundTrips(t *testing.T) {
	mac := MAC{0x0e, 0, 0, 0, 6, 2}
	for _, fam := range []Family{IPv4, IPv6} {
		subnet, hop, public := netip.MustParsePrefix("10.244.2.0/24"), netip.MustParseAddr("10.244.2.0"), netip.MustParseAddr("198.18.0.2")
		if fam == IPv6 {
			subnet, hop, public = netip.MustParsePrefix("fd00:10:244:2::/64"), netip.MustParseAddr("fd00:10:244:2::"), netip.MustParseAddr("2001:db8::2")
		}
		t.Run(fam.String(), func(t *testing.T) {
			route := Route{Dst: subnet, Gw: hop, LinkIndex: 10, OnLink: true, Protocol: RouteProtocol, Priority: RouteMetric(subnet)}
			neigh := Neigh{LinkIndex: 10, IP: hop, MAC: mac, State: NUDPermanent}
			fdb := FDB{LinkIndex: 10, MAC: mac, Dst: public, State: NUDPermanent}
			msg := func(w Write) (typ uint16, payload []byte) {
				c := &rtnlConn{}
				if err := c.appendOp(w); err != nil {
					t.Fatal(err)
				}
				l := int(ne.Uint32(c.wbuf[0:4]))
				if l != len(c.wbuf) {
					t.Fatalf("message length %d, buffer %d", l, len(c.wbuf))
				}
				return ne.Uint16(c.wbuf[4:6]), c.wbuf[unix.NLMSG_HDRLEN:l]
			}

			_, p := msg(Write{Kind: RouteReplace, Route: route})
			if got, ok := parseRoute(p, famAF(fam)); !ok || got != route {
				t.Errorf("route back: %v %v, want %v", got, ok, route)
			}
			if _, ok := parseRoute(p, famAF(otherFamily(fam))); ok {
				t.Errorf("a route of the other family was parsed")
			}
			_, p = msg(Write{Kind: NeighSet, Neigh: neigh})
			if af, link, state, ip, m, ok := parseNeigh(p); !ok || af != famAF(fam) || link != 10 || state != NUDPermanent || ip != hop || m != mac {
				t.Errorf("neighbour back: family %d link %d state %#x %v %v %v", af, link, state, ip, m, ok)
			}
			_, p = msg(Write{Kind: FDBSet, FDB: fdb})
			if af, _, _, ip, m, ok := parseNeigh(p); !ok || af != unix.AF_BRIDGE || ip != public || m != mac {
				t.Errorf("FDB entry back: family %d %v %v %v", af, ip, m, ok)
			}

			typ, p := msg(Write{Kind: RouteDel, Route: route})
			if e, ok := parseEvent(typ, p); !ok || e.Kind != EventRouteDel || e.Dst != subnet || e.Protocol != RouteProtocol || e.LinkIndex != 10 {
				t.Errorf("route deletion event: %+v %v", e, ok)
			}
			typ, p = msg(Write{Kind: NeighDel, Neigh: neigh})
			if e, ok := parseEvent(typ, p); !ok || e.Kind != EventNeighDel || e.IP != hop || e.FDB {
				t.Errorf("neighbour deletion event: %+v %v", e, ok)
			}
			typ, p = msg(Write{Kind: FDBDel, FDB: fdb})
			if e, ok := parseEvent(typ, p); !ok || e.Kind != EventNeighDel || !e.FDB || e.MAC != mac {
				t.Errorf("FDB deletion event: %+v %v", e, ok)
			}
		})
	}
}

func otherFamily(f Family) Family {
	if f == IPv6 {
		return IPv4
	}
	return IPv6
}

// Each overlay of a dual-stack host wakes only for deletions of its own
// family's entries.
func TestNotificationsOfTheOtherFamilyAreIgnored(t *testing.T) {
	p4, p6 := tSpec(2), tSpec6(2)
	for _, tt := range []struct {
		fam        Family
		mine, twin Peer
	}{{IPv4, p4, p6}, {IPv6, p6, p4}} {
		b := &Backend{cfg: Config{fam: tt.fam}, notify: make(chan struct{}, 1)}
		b.devIndex.Store(tDev)
		_, _, idx := validatePeers([]Peer{tt.mine}, tt.fam, netip.Prefix{}, netip.Addr{})
		b.wanted.Store(&idx)
		woke := func(e Event) bool {
			b.onEvent(e)
			select {
			case <-b.notify:
				return true
			default:
				return false
			}
		}
		for _, tc := range []struct {
			e    Event
			want bool
		}{
			{Event{Kind: EventRouteDel, Protocol: RouteProtocol, Dst: tt.mine.Subnet}, true},
			{Event{Kind: EventRouteDel, Protocol: RouteProtocol, Dst: tt.twin.Subnet}, false},
			{Event{Kind: EventNeighDel, LinkIndex: tDev, IP: tt.mine.Subnet.Addr()}, true},
			{Event{Kind: EventNeighDel, LinkIndex: tDev, IP: tt.twin.Subnet.Addr()}, false},
			{Event{Kind: EventNeighDel, LinkIndex: tDev, FDB: true, MAC: PeerMAC(tt.mine)}, true},
			{Event{Kind: EventNeighDel, LinkIndex: tDev + 1, IP: tt.mine.Subnet.Addr()}, false}, // the twin's device
		} {
			if got := woke(tc.e); got != tc.want {
				t.Errorf("%v overlay: %+v woke a pass: %v, want %v", tt.fam, tc.e, got, tc.want)
			}
		}
	}
}
