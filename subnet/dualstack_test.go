package subnet

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
)

func TestLeaseKeyForms(t *testing.T) {
	for key, want := range map[string]Subnets{
		"10.244.7.0-24":                    {IPv4: mustPrefix("10.244.7.0/24")},
		"10.244.7.0-24&fd00:10:244:7::-64": {IPv4: mustPrefix("10.244.7.0/24"), IPv6: mustPrefix("fd00:10:244:7::/64")},
		"10.1.2.64-26&2001:db8::40-122":    {IPv4: mustPrefix("10.1.2.64/26"), IPv6: mustPrefix("2001:db8::40/122")},
	} {
		got, err := ParseLeaseKey(key)
		if err != nil || got != want {
			t.Errorf("ParseLeaseKey(%q) = %v, %v; want %v", key, got, err, want)
		}
		if got.Key() != key {
			t.Errorf("%v.Key() = %q, want %q", got, got.Key(), key)
		}
		if l := (Lease{Subnet: want.IPv4, IPv6Subnet: want.IPv6}); l.Key() != key || l.Subnets() != want {
			t.Errorf("Lease.Key() = %q, want %q", l.Key(), key)
		}
	}
}

func TestParseLeaseKeyRejectsNonCanonical(t *testing.T) {
	for _, k := range []string{
		"&fd00::-64", "fd00::-64", "10.244.7.0-24&", "10.244.7.0-24&fd00::", "10.244.7.0-24&fd00::-",
		"10.244.7.0-24&FD00::-64",               // upper case
		"10.244.7.0-24&fd00:0::-64",             // not the shortest form
		"10.244.7.0-24&fd00::1-64",              // host bits
		"10.244.7.0-24&fd00::-129",              // too long
		"10.244.7.0-24&fd00::-064",              // leading zero
		"10.244.7.0-24&::ffff:10.0.0.0-120",     // an IPv4-mapped address
		"10.244.7.0-24&fe80::%eth0-64",          // a zone
		"10.244.7.0-24&10.245.7.0-24",           // two IPv4 subnets
		"10.244.7.0-24&fd00::-64&fd01::-64",     // three parts
		"10.244.7.0-24&fd00:10:244:7::-64&",     // trailing separator
		"10.244.7.0-24&fd00:10:244:7::-64 ",     // trailing space
		"10.244.7.0-24&fd00:10:244:7::-64/../x", // path tricks
	} {
		if s, err := ParseLeaseKey(k); !errors.Is(err, ErrInvalidLease) {
			t.Errorf("ParseLeaseKey(%q) = %v, %v; want ErrInvalidLease", k, s, err)
		}
	}
}

// The IPv6-only form (under subnets6/) is one IPv6 subnet, canonical.
func TestIPv6OnlyKeys(t *testing.T) {
	want := Subnets{IPv6: mustPrefix("fd00:10:244:7::/64")}
	got, err := ParseIPv6OnlyKey("fd00:10:244:7::-64")
	if err != nil || got != want || got.Key() != "fd00:10:244:7::-64" || got.String() != "fd00:10:244:7::/64" || got.Primary() != want.IPv6 {
		t.Errorf("ParseIPv6OnlyKey = %v, %v (key %q)", got, err, got.Key())
	}
	for _, k := range []string{"", "10.244.7.0-24", "10.244.7.0-24&fd00::-64", "FD00::-64", "fd00:0::-64", "fd00::1-64",
		"fd00::-129", "::ffff:10.0.0.0-120", "fe80::%eth0-64", "fd00::-64&fd01::-64", "fd00::-64/../x"} {
		if s, err := ParseIPv6OnlyKey(k); !errors.Is(err, ErrInvalidLease) {
			t.Errorf("ParseIPv6OnlyKey(%q) = %v, %v; want ErrInvalidLease", k, s, err)
		}
	}
}

// A dual-stack value as flanneld writes it decodes, and ours keeps
// flannel's field names.
func TestDualStackAttrsAreFlannelCompatible(t *testing.T) {
	flannel := `{"PublicIP":"198.18.0.7","PublicIPv6":"2001:db8::7","BackendType":"vxlan",` +
		`"BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"},"BackendV6Data":{"VNI":1,"VtepMAC":"0e:00:00:00:06:07"}}`
	a, err := DecodeAttrs([]byte(flannel))
	if err != nil {
		t.Fatal(err)
	}
	if a.PublicAddrV6() != mustAddr("2001:db8::7") {
		t.Errorf("PublicAddrV6 = %v", a.PublicAddrV6())
	}
	if d, err := leasedata.DecodeLeaseData("BackendV6Data", a.BackendV6Data); err != nil || d != (leasedata.LeaseData{VNI: 1, VtepMAC: "0e:00:00:00:06:07"}) {
		t.Errorf("BackendV6Data = %+v, %v", d, err)
	}
	b, err := a.Marshal()
	if err != nil || string(b) != flannel {
		t.Errorf("Marshal = %s, %v; want flannel's value back:\n%s", b, err, flannel)
	}
	// A host named only by its IPv6 address is a host.
	if _, err := DecodeAttrs([]byte(`{"PublicIPv6":"2001:db8::7"}`)); err != nil {
		t.Errorf("DecodeAttrs(PublicIPv6 only) = %v", err)
	}
	for _, changed := range []func(*LeaseAttrs){
		func(c *LeaseAttrs) { c.PublicIPv6 = "2001:db8::8" },
		func(c *LeaseAttrs) { c.BackendV6Data = []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:06:08"}`) },
	} {
		c := a
		changed(&c)
		if SameAttrs(a, c) {
			t.Errorf("SameAttrs missed a change: %+v", c)
		}
	}
}

func dualStackConfig(t *testing.T) *Config {
	return mustConfig(t, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/48"}`)
}

func goodDualStackLease() Lease {
	return Lease{Subnet: mustPrefix("10.244.7.0/24"), IPv6Subnet: mustPrefix("fd00:10:244:7::/64"), Attrs: LeaseAttrs{
		PublicIP: "198.18.0.7", PublicIPv6: "2001:db8::7", BackendType: "vxlan", NodeID: "n7",
		BackendData:   []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"}`),
		BackendV6Data: []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:06:07"}`),
	}}
}

func TestDualStackPeerValidation(t *testing.T) {
	cfg := dualStackConfig(t)
	v4, v6, err := peers(cfg, goodDualStackLease())
	if err != nil {
		t.Fatalf("Peer(good) = %v", err)
	}
	if want := (backend.Peer{Subnet: mustPrefix("10.244.7.0/24"), PublicIP: mustAddr("198.18.0.7"), Data: leasedata.PeerData(leasedata.MAC{0x0e, 0, 0, 0, 0, 7})}); v4 != want {
		t.Errorf("IPv4 peer = %+v, want %+v", v4, want)
	}
	if want := (backend.Peer{Subnet: mustPrefix("fd00:10:244:7::/64"), PublicIP: mustAddr("2001:db8::7"), Data: leasedata.PeerData(leasedata.MAC{0x0e, 0, 0, 0, 6, 7})}); v6 != want {
		t.Errorf("IPv6 peer = %+v, want %+v", v6, want)
	}

	v6data := func(s string) func(*Lease) { return func(l *Lease) { l.Attrs.BackendV6Data = []byte(s) } }
	public6 := func(s string) func(*Lease) { return func(l *Lease) { l.Attrs.PublicIPv6 = s } }
	for _, tt := range []struct {
		name   string
		mutate func(*Lease)
		want   string
		orphan bool
	}{
		{"IPv6 subnet outside IPv6Network", func(l *Lease) { l.IPv6Subnet = mustPrefix("fd00:10:245:7::/64") }, "outside IPv6Network fd00:10:244::/48", true},
		{"IPv6 subnet of another length", func(l *Lease) { l.IPv6Subnet = mustPrefix("fd00:10:244:7::/80") }, "is not a /64 (IPv6SubnetLen 64)", true},
		{"IPv4 subnet in the IPv6 half", func(l *Lease) { l.IPv6Subnet = mustPrefix("10.244.8.0/24") }, "is not an IPv6 subnet", true},
		{"other IPv6 VNI", v6data(`{"VNI":2,"VtepMAC":"0e:00:00:00:06:07"}`), "IPv6 VNI 2 is not the network's Backend.VNI 1", true},
		{"no PublicIPv6", public6(""), `PublicIPv6 "" is not an IPv6 address`, false},
		{"PublicIPv6 an IPv4 address", public6("198.18.0.7"), "is not an IPv6 address", false},
		{"PublicIPv6 garbage", public6("eve"), "is not an IPv6 address", false},
		{"PublicIPv6 unspecified", public6("::"), "the unspecified address", false},
		{"PublicIPv6 loopback", public6("::1"), "a loopback address", false},
		{"PublicIPv6 multicast", public6("ff02::1"), "a multicast address", false},
		{"PublicIPv6 link-local", public6("fe80::7"), "a link-local address", false},
		{"PublicIPv6 with a zone", public6("2001:db8::7%eth0"), "a zone", false},
		{"PublicIPv6 IPv4-mapped", public6("::ffff:198.18.0.7"), "is not an IPv6 address", false},
		{"PublicIPv6 in the overlay", public6("fd00:10:244:9::9"), "PublicIPv6 fd00:10:244:9::9 is inside the overlay network", false},
		{"no BackendV6Data", v6data(""), "BackendV6Data is missing", false},
		{"BackendV6Data garbage", v6data(`[1]`), `"BackendV6Data": want a JSON object`, false},
		{"IPv6 MAC multicast", v6data(`{"VNI":1,"VtepMAC":"01:00:5e:00:00:01"}`), "multicast", false},
		{"IPv6 MAC garbage", v6data(`{"VNI":1,"VtepMAC":"zz"}`), "not a 6-byte MAC", false},
		{"bad IPv4 half", func(l *Lease) { l.Attrs.PublicIP = "127.0.0.1" }, "PublicIP 127.0.0.1 is a loopback address", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := goodDualStackLease()
			tt.mutate(&l)
			_, _, err := peers(cfg, l)
			if err == nil || !errors.Is(err, ErrInvalidLease) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Peer = %v, want an invalid lease error with %q", err, tt.want)
			}
			if got := errors.Is(err, ErrOrphaned); got != tt.orphan {
				t.Errorf("errors.Is(%v, ErrOrphaned) = %v, want %v", err, got, tt.orphan)
			}
		})
	}
}

// Turning EnableIPv6 on or off is rolled host by host: until a host
// restarts, its key names the families of the old config. A dual-stack key
// in an IPv4-only network, and an IPv4-only key in a dual-stack one, are
// not orphaned: their IPv4 half is a peer (checked like any other), their
// IPv6 half is ignored, and IPv4Only says so. Anything else wrong in the
// IPv6 half of a key the network carries IPv6 for still orphans it.
func TestIPv6ToggleKeysUseTheirIPv4Half(t *testing.T) {
	v4net, dual := mustConfig(t, `{"Network":"10.244.0.0/16"}`), dualStackConfig(t)
	want4 := backend.Peer{Subnet: mustPrefix("10.244.7.0/24"), PublicIP: mustAddr("198.18.0.7"), Data: leasedata.PeerData(leasedata.MAC{0x0e, 0, 0, 0, 0, 7})}
	dualKey := goodDualStackLease()
	dualKey.Attrs.BackendV6Data = []byte(`{"VNI":9,"VtepMAC":"0e:00:00:00:06:07"}`) // ignored with the IPv6 half
	v4Key := goodDualStackLease()
	v4Key.IPv6Subnet, v4Key.Attrs.PublicIPv6, v4Key.Attrs.BackendV6Data = netip.Prefix{}, "", nil
	for _, tc := range []struct {
		name string
		cfg  *Config
		l    Lease
		why  string
	}{
		{"dual-stack key, IPv4-only network", v4net, dualKey, "its key names the IPv6 subnet fd00:10:244:7::/64, but the network carries no IPv6"},
		{"IPv4-only key, dual-stack network", dual, v4Key, "its key names no IPv6 subnet"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for what, err := range map[string]error{"Orphaned": tc.cfg.Orphaned(tc.l, codec(tc.cfg)), "CheckClaim": tc.cfg.CheckClaim(tc.l, codec(tc.cfg))} {
				if err != nil {
					t.Errorf("%s = %v, want nil", what, err)
				}
			}
			v4, v6, err := peers(tc.cfg, tc.l)
			if err != nil || v4 != want4 || v6 != (backend.Peer{}) {
				t.Errorf("Peer = %+v, %+v, %v; want the IPv4 half %+v alone", v4, v6, err, want4)
			}
			if why := tc.cfg.IPv4Only(tc.l); !strings.HasPrefix(why, tc.why) || !strings.Contains(why, "its IPv4 half is used") {
				t.Errorf("IPv4Only = %q, want it to start with %q", why, tc.why)
			}
			// The IPv4 half is checked as ever.
			bad := tc.l
			bad.Attrs.PublicIP = "127.0.0.1"
			if _, _, err := peers(tc.cfg, bad); !errors.Is(err, ErrInvalidLease) {
				t.Errorf("Peer with a loopback PublicIP = %v, want invalid", err)
			}
		})
	}
	for name, l := range map[string]Lease{"dual-stack key": goodDualStackLease(), "IPv4-only key": v4Key} {
		cfg := dual
		if name == "IPv4-only key" {
			cfg = v4net
		}
		if why := cfg.IPv4Only(l); why != "" {
			t.Errorf("%s in its own network: IPv4Only = %q, want \"\"", name, why)
		}
	}
	// An IPv6-only network has no IPv4 half to use.
	v6only := mustConfig(t, `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/48"}`)
	if err := v6only.Orphaned(v4Key, codec(v6only)); !errors.Is(err, ErrOrphaned) {
		t.Errorf("IPv4-only key in an IPv6-only network: %v, want orphaned", err)
	}
}

func TestLeaseFamiliesMustBeTheNetworks(t *testing.T) {
	l := goodDualStackLease()
	// A reservation that names only its node needs neither address.
	r := Lease{Subnet: l.Subnet, IPv6Subnet: mustPrefix("fd00:10:244:7::/64"), Reserved: true, Attrs: LeaseAttrs{NodeID: "n7"}}
	if err := dualStackConfig(t).CheckClaim(r, codec(dualStackConfig(t))); err != nil {
		t.Errorf("dual-stack reservation by node: %v", err)
	}
}

// A key's ID is one value per set of subnets, and gives them back.
func TestIDRoundTripsAndTellsKeysApart(t *testing.T) {
	v4 := mustPrefix("10.244.7.0/24")
	v6 := mustPrefix("fd00:10:244:7::/64")
	all := []Subnets{{IPv4: v4}, {IPv4: v4, IPv6: v6}, {IPv6: v6}, {IPv4: mustPrefix("10.244.7.0/25")},
		{IPv4: v4, IPv6: mustPrefix("fd00:10:244:7::/80")}, {IPv4: mustPrefix("0.0.0.0/0")}, {IPv6: mustPrefix("::/0")}}
	seen := map[ID]Subnets{}
	for _, s := range all {
		id := s.ID()
		if got := id.Subnets(); got != s {
			t.Errorf("%v: ID gives back %v", s, got)
		}
		if other, dup := seen[id]; dup {
			t.Errorf("%v and %v have one ID", s, other)
		}
		seen[id] = s
	}
}
