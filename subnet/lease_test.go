package subnet

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
)

func TestKeyRoundTrip(t *testing.T) {
	for _, s := range []string{"10.244.7.0/24", "10.1.2.64/26", "0.0.0.0/0", "10.0.0.4/30"} {
		p := mustPrefix(s)
		got, err := ParseLeaseKey(Key(p))
		if err != nil || got != (Subnets{IPv4: p}) {
			t.Errorf("ParseLeaseKey(Key(%s)) = %v, %v", p, got, err)
		}
	}
	if Key(mustPrefix("10.244.7.0/24")) != "10.244.7.0-24" {
		t.Errorf("Key = %q, want flannel's 10.244.7.0-24", Key(mustPrefix("10.244.7.0/24")))
	}
}

func TestParseKeyRejectsNonCanonical(t *testing.T) {
	for _, k := range []string{"", "10.244.7.0", "10.244.7.0-", "10.244.7.0-33", "10.244.7.0--1", "10.244.7.0-024",
		"10.244.7.1-24", "fd00::-64", "10.244.7.0-24-1", "x-24", "10.244.7.0-2a", "../../etc-24", "010.244.7.0-24"} {
		if p, err := ParseLeaseKey(k); !errors.Is(err, ErrInvalidLease) {
			t.Errorf("ParseLeaseKey(%q) = %v, %v; want ErrInvalidLease", k, p, err)
		}
	}
}

func TestAttrsAreFlannelCompatible(t *testing.T) {
	mac, _ := net.ParseMAC("0e:2a:5f:00:11:22")
	a := NewAttrs(mustAddr("198.18.0.7"), DefaultBackendType, leasedata.Codec{VNI: 1}.Encode(mac), "node-a", "host-a")
	b, err := a.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	want := `{"PublicIP":"198.18.0.7","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:2a:5f:00:11:22"},"NodeID":"node-a","Hostname":"host-a"}`
	if string(b) != want {
		t.Errorf("lease value\n got %s\nwant %s", b, want)
	}
	// A value written by flanneld (no NodeID, extra fields) decodes.
	flannel := `{"PublicIP":"198.18.0.9","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:02"}}`
	got, err := DecodeAttrs([]byte(flannel))
	if err != nil {
		t.Fatalf("DecodeAttrs(flannel value): %v", err)
	}
	if !got.OwnedBy("any-node", mustAddr("198.18.0.9")) || got.OwnedBy("any-node", mustAddr("198.18.0.10")) {
		t.Errorf("a lease without NodeID must be owned by its PublicIP")
	}
	if a.OwnedBy("node-b", mustAddr("198.18.0.7")) {
		t.Errorf("a lease with a NodeID must not be owned by another node with the same IP")
	}
	// A reservation for an IPv6-only host names it by PublicIPv6 alone.
	v6 := LeaseAttrs{PublicIPv6: "2001:db8::2"}
	if !v6.OwnedBy("n", netip.Addr{}, mustAddr("2001:db8::2")) || v6.OwnedBy("n", netip.Addr{}, mustAddr("2001:db8::3")) || v6.OwnedBy("n", mustAddr("198.18.0.2")) {
		t.Errorf("a lease without NodeID must be owned by its PublicIPv6, and only by it")
	}
}

func TestPeerValidation(t *testing.T) {
	cfg := mustConfig(t, `{"Network":"10.244.0.0/16"}`)
	good := func() Lease {
		return Lease{Subnet: mustPrefix("10.244.7.0/24"), Attrs: LeaseAttrs{PublicIP: "198.18.0.7", BackendType: "vxlan",
			BackendData: []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"}`), NodeID: "n7"}}
	}
	p, _, err := peers(cfg, good())
	if err != nil {
		t.Fatalf("Peer(good) = %v", err)
	}
	want := backend.Peer{Subnet: mustPrefix("10.244.7.0/24"), PublicIP: mustAddr("198.18.0.7"), Data: leasedata.PeerData(leasedata.MAC{0x0e, 0, 0, 0, 0, 7})}
	if diff := cmp.Diff(want, p, cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("Peer mismatch (-want +got):\n%s", diff)
	}
	bad := map[string]func(l *Lease){
		"outside the network":      func(l *Lease) { l.Subnet = mustPrefix("10.245.7.0/24") },
		"wrong prefix length":      func(l *Lease) { l.Subnet = mustPrefix("10.244.7.0/25") },
		"public IP zero":           func(l *Lease) { l.Attrs.PublicIP = "0.0.0.0" },
		"public IP loopback":       func(l *Lease) { l.Attrs.PublicIP = "127.0.0.1" },
		"public IP multicast":      func(l *Lease) { l.Attrs.PublicIP = "224.0.0.1" },
		"public IP broadcast":      func(l *Lease) { l.Attrs.PublicIP = "255.255.255.255" },
		"public IP class E":        func(l *Lease) { l.Attrs.PublicIP = "240.0.0.1" },
		"public IP link-local":     func(l *Lease) { l.Attrs.PublicIP = "169.254.1.1" },
		"public IP garbage":        func(l *Lease) { l.Attrs.PublicIP = "eve" },
		"public IP v6":             func(l *Lease) { l.Attrs.PublicIP = "fd00::1" },
		"public IP in the overlay": func(l *Lease) { l.Attrs.PublicIP = "10.244.9.9" },
		"other backend":            func(l *Lease) { l.Attrs.BackendType = "host-gw" },
		"no backend data":          func(l *Lease) { l.Attrs.BackendData = nil },
		"null backend data":        func(l *Lease) { l.Attrs.BackendData = []byte("null") },
		"backend data garbage":     func(l *Lease) { l.Attrs.BackendData = []byte(`"x"`) },
		"other VNI":                func(l *Lease) { l.Attrs.BackendData = []byte(`{"VNI":2,"VtepMAC":"0e:00:00:00:00:07"}`) },
		"MAC garbage":              func(l *Lease) { l.Attrs.BackendData = []byte(`{"VNI":1,"VtepMAC":"zz"}`) },
		"MAC all zeros":            func(l *Lease) { l.Attrs.BackendData = []byte(`{"VNI":1,"VtepMAC":"00:00:00:00:00:00"}`) },
		"MAC multicast":            func(l *Lease) { l.Attrs.BackendData = []byte(`{"VNI":1,"VtepMAC":"01:00:5e:00:00:01"}`) },
		"MAC too long": func(l *Lease) {
			l.Attrs.BackendData = []byte(`{"VNI":1,"VtepMAC":"00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01"}`)
		},
	}
	for name, mutate := range bad {
		t.Run(name, func(t *testing.T) {
			l := good()
			mutate(&l)
			if _, _, err := peers(cfg, l); !errors.Is(err, ErrInvalidLease) {
				t.Errorf("Peer() error = %v, want ErrInvalidLease", err)
			}
		})
	}
}

func TestDecodeAttrsRejectsHugeAndGarbage(t *testing.T) {
	for name, v := range map[string]string{
		"huge":   `{"PublicIP":"` + strings.Repeat("1", MaxLeaseValueSize) + `"}`,
		"array":  `[1,2]`,
		"broken": `{"PublicIP":`,
		"number": `{"PublicIP":7}`,
		"null":   `null`,
		"empty":  ``,
		"string": `"x"`,
		"nobody": `{"BackendType":"vxlan"}`,
	} {
		if _, err := DecodeAttrs([]byte(v)); !errors.Is(err, ErrInvalidLease) {
			t.Errorf("%s: DecodeAttrs error = %v, want ErrInvalidLease", name, err)
		}
	}
}

func TestPickFree(t *testing.T) {
	cfg := mustConfig(t, `{"Network":"10.1.2.0/24"}`) // three subnets: .64, .128, .192
	rng := rand.New(rand.NewPCG(1, 2))
	taken := map[netip.Prefix]bool{mustPrefix("10.1.2.64/26"): true, mustPrefix("10.1.2.192/26"): true, mustPrefix("10.9.9.0/24"): true}
	for range 20 {
		p, err := cfg.PickFree(taken, rng)
		if err != nil || p != mustPrefix("10.1.2.128/26") {
			t.Fatalf("PickFree = %v, %v; want the only free subnet 10.1.2.128/26", p, err)
		}
	}
	taken[mustPrefix("10.1.2.128/26")] = true
	_, err := cfg.PickFree(taken, rng)
	if !errors.Is(err, ErrOutOfSubnets) || !strings.Contains(err.Error(), "all 3 subnets") {
		t.Errorf("full pool: err = %v, want ErrOutOfSubnets naming 3 subnets", err)
	}
}

func TestPickFreeCoversWholeRange(t *testing.T) {
	cfg := mustConfig(t, `{"Network":"10.244.0.0/16"}`)
	rng := rand.New(rand.NewPCG(3, 4))
	taken := map[netip.Prefix]bool{}
	for i := range cfg.Count() {
		p, err := cfg.PickFree(taken, rng)
		if err != nil {
			t.Fatalf("pick %d: %v", i, err)
		}
		if taken[p] || !cfg.InRange(p) {
			t.Fatalf("pick %d returned %s: taken=%v inRange=%v", i, p, taken[p], cfg.InRange(p))
		}
		taken[p] = true
	}
	if len(taken) != 255 {
		t.Errorf("picked %d distinct subnets, want 255", len(taken))
	}
	if _, err := cfg.PickFree(taken, rng); !errors.Is(err, ErrOutOfSubnets) {
		t.Errorf("after exhausting: %v, want ErrOutOfSubnets", err)
	}
}

func TestDiff(t *testing.T) {
	l := func(subnet, ip, mac string) Lease {
		return Lease{Subnet: mustPrefix(subnet), Attrs: LeaseAttrs{PublicIP: ip, BackendType: "vxlan", BackendData: []byte(`{"VNI":1,"VtepMAC":"` + mac + `"}`)}}
	}
	a1 := l("10.244.1.0/24", "198.18.0.1", "0e:00:00:00:00:01")
	b1 := l("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:02")
	b2 := l("10.244.2.0/24", "198.18.0.2", "0e:00:00:00:00:22") // new MAC
	c1 := l("10.244.3.0/24", "198.18.0.3", "0e:00:00:00:00:03")
	c2 := l("10.244.3.0/24", "198.18.0.33", "0e:00:00:00:00:03") // new public IP
	d1 := l("10.244.4.0/24", "198.18.0.4", "0e:00:00:00:00:04")
	e1 := l("10.244.5.0/24", "198.18.0.5", "0e:00:00:00:00:05")
	same := e1
	same.ModRevision = 99 // rewritten with the same value: no event
	f1 := l("10.244.6.0/24", "198.18.0.6", "0e:00:00:00:00:06")
	f1.ModRevision = 7
	known := map[ID]Known{}
	for _, l := range []Lease{a1, b1, c1, e1, f1} {
		known[l.ID()] = KnownOf(l)
	}
	reserved := d1
	reserved.Reserved = true // the same value, but the key lost its etcd lease: a change
	// f1 listed at the revision known has for it: not decoded, unchanged.
	got, next := Diff(known, []Lease{b2, c2, reserved, same}, []ID{f1.ID()})
	want := []Event{
		{Type: Removed, Lease: Lease{Subnet: a1.Subnet}},
		{Type: Changed, Lease: b2},
		{Type: Changed, Lease: c2},
		{Type: Added, Lease: reserved},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("Diff mismatch (-want +got):\n%s", diff)
	}
	if len(next) != 5 || next[same.ID()] != (Known{Fingerprint(e1), 99}) || next[f1.ID()] != (Known{Fingerprint(f1), 7}) {
		t.Errorf("Diff's known set: %v", next)
	}
	if again, _ := Diff(next, []Lease{b2, c2, d1, same}, nil); len(again) != 2 || again[0].Type != Changed || again[1].Type != Removed {
		t.Errorf("a reservation that became a lease, f1 not listed: %v", again)
	}
}

// A lease is known by every subnet its key names: a dual-stack key and an
// IPv4-only key on one IPv4 subnet are two leases, and a key whose IPv6
// half changes is another lease.
func TestDiffKnowsLeasesByTheirKeys(t *testing.T) {
	v4 := Lease{Subnet: mustPrefix("10.244.1.0/24"), Attrs: LeaseAttrs{PublicIP: "198.18.0.1"}}
	dual := v4
	dual.IPv6Subnet = mustPrefix("fd00:10:244:1::/64")
	moved := v4
	moved.IPv6Subnet = mustPrefix("fd00:10:244:2::/64")

	got, known := Diff(nil, []Lease{v4, dual}, nil)
	if len(got) != 2 || got[0].Lease.Subnets() != v4.Subnets() || got[1].Lease.Subnets() != dual.Subnets() || len(known) != 2 {
		t.Fatalf("two keys on one IPv4 subnet: events %v, known %v", got, known)
	}
	got, _ = Diff(known, []Lease{v4, moved}, nil)
	want := []Event{
		{Type: Removed, Lease: Lease{Subnet: dual.Subnet, IPv6Subnet: dual.IPv6Subnet}},
		{Type: Added, Lease: moved},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("IPv6 half changed (-want +got):\n%s", diff)
	}
}

// The fingerprint sees every field that SameAttrs compares, and nothing
// else of the value (the subnets are the key it is kept by).
func TestFingerprintFollowsSameAttrs(t *testing.T) {
	base := goodDualStackLease()
	for name, change := range map[string]func(*Lease){
		"PublicIP":      func(l *Lease) { l.Attrs.PublicIP = "198.18.0.8" },
		"PublicIPv6":    func(l *Lease) { l.Attrs.PublicIPv6 = "2001:db8::8" },
		"BackendType":   func(l *Lease) { l.Attrs.BackendType = "host-gw" },
		"BackendData":   func(l *Lease) { l.Attrs.BackendData = []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:00:08"}`) },
		"BackendV6Data": func(l *Lease) { l.Attrs.BackendV6Data = []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:06:08"}`) },
		"NodeID":        func(l *Lease) { l.Attrs.NodeID = "n8" },
		"Hostname":      func(l *Lease) { l.Attrs.Hostname = "h8" },
		"Reserved":      func(l *Lease) { l.Reserved = true },
		"fields shifted": func(l *Lease) { // the same bytes split differently between two fields
			l.Attrs.NodeID, l.Attrs.Hostname = "n", "7"+l.Attrs.Hostname
		},
	} {
		l := base
		change(&l)
		if Fingerprint(l) == Fingerprint(base) {
			t.Errorf("%s changed, the fingerprint did not", name)
		}
	}
	same := base
	same.Attrs.BackendData = []byte("  " + string(base.Attrs.BackendData) + "\n")
	same.ModRevision, same.EtcdLease = 99, 7
	if !SameAttrs(same.Attrs, base.Attrs) || Fingerprint(same) != Fingerprint(base) {
		t.Errorf("a rewrite of the same value (other revision, etcd lease, white space) changed the fingerprint")
	}
}

func FuzzLeaseKeyAndValue(f *testing.F) {
	f.Add("10.244.7.0-24", []byte(`{"PublicIP":"198.18.0.7","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"}}`))
	f.Add("10.244.7.0-25", []byte(`{"PublicIP":"0.0.0.0","BackendType":"vxlan","BackendData":null}`))
	f.Add("../../x-24", []byte(`{}`))
	f.Add("10.244.0.0-24", []byte(`{"PublicIP":"198.18.0.7","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"01:00:00:00:00:07"}}`))
	f.Add("10.244.7.0-24&fd00:10:244:7::-64", []byte(`{"PublicIP":"198.18.0.7","PublicIPv6":"2001:db8::7","BackendType":"vxlan",`+
		`"BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"},"BackendV6Data":{"VNI":1,"VtepMAC":"0e:00:00:00:06:07"}}`))
	f.Add("10.244.7.0-24&fd00:10:244::-64", []byte(`{"PublicIP":"198.18.0.7","PublicIPv6":"fe80::1","BackendType":"vxlan"}`))
	f.Add("fd00:10:244:7::-64", []byte(`{"PublicIPv6":"2001:db8::7","BackendType":"vxlan","BackendV6Data":{"VNI":1,"VtepMAC":"0e:00:00:00:06:07"}}`))
	configs := []*Config{
		mustConfig(f, `{"Network":"10.244.0.0/16"}`),
		mustConfig(f, `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/48"}`),
		mustConfig(f, `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/48"}`),
	}
	f.Fuzz(func(t *testing.T, key string, value []byte) {
		attrs, verr := DecodeAttrs(value)
		if verr != nil && !errors.Is(verr, ErrInvalidLease) {
			t.Fatalf("errors must wrap ErrInvalidLease: %v", verr)
		}
		if verr == nil {
			// A value read is written again (the lease journal keeps
			// values so), and from then on reads and writes the same.
			out, err := attrs.Marshal()
			if err != nil {
				t.Fatalf("a value read does not encode: %v", err)
			}
			again, err := DecodeAttrs(out)
			if err != nil {
				t.Fatalf("%s written as %s does not read back: %v", value, out, err)
			}
			if out2, err := again.Marshal(); err != nil || !bytes.Equal(out2, out) {
				t.Fatalf("%s written as %s, read back and written as %s (%v)", value, out, out2, err)
			}
		}
		for _, cfg := range configs {
			// Each network reads its own key space's form.
			sn, kerr := cfg.ParseLeaseKey(key)
			if kerr != nil && !errors.Is(kerr, ErrInvalidLease) {
				t.Fatalf("errors must wrap ErrInvalidLease: %v", kerr)
			}
			if kerr != nil || verr != nil {
				continue
			}
			if sn.Key() != key {
				t.Fatalf("accepted non-canonical key %q (canonical %q)", key, sn.Key())
			}
			v4, v6, err := peers(cfg, Lease{Subnet: sn.IPv4, IPv6Subnet: sn.IPv6, Attrs: attrs})
			if err != nil {
				continue
			}
			// Anything accepted for programming is safe to program, and
			// only in the families the network carries — and the IPv6 half
			// not at all of a key IPv4Only explains (a roll of EnableIPv6).
			l := Lease{Subnet: sn.IPv4, IPv6Subnet: sn.IPv6, Attrs: attrs}
			half := cfg.IPv4Only(l) != ""
			if half && v6 != (backend.Peer{}) {
				t.Fatalf("IPv6 peer %+v of a key whose IPv6 half is not used (%s)", v6, cfg.IPv4Only(l))
			}
			for _, fam := range []struct {
				on   bool
				pool *Pool
				peer backend.Peer
			}{{cfg.EnableIPv4, &cfg.Pool, v4}, {cfg.EnableIPv6 && !half, &cfg.IPv6, v6}} {
				if fam.on {
					checkPeerSafe(t, fam.pool, fam.peer)
				} else if fam.peer != (backend.Peer{}) {
					t.Fatalf("peer %+v of a family the network does not carry", fam.peer)
				}
			}
		}
	})
}

func checkPeerSafe(t *testing.T, pool *Pool, p backend.Peer) {
	t.Helper()
	ip := p.PublicIP
	if !pool.Contains(p.Subnet) || ip.Is6() != p.Subnet.Addr().Is6() || ip.Is4In6() || ip.Zone() != "" || ip.IsUnspecified() ||
		ip.IsMulticast() || ip.IsLoopback() || ip.IsLinkLocalUnicast() || pool.Network.Contains(ip) || leasedata.PeerMAC(p).IsZero() || leasedata.PeerMAC(p)[0]&1 == 1 {
		t.Fatalf("unsafe peer accepted: %+v", p)
	}
}

func TestCheckClaimIsPeerWithoutTheBackend(t *testing.T) {
	cfg, err := ParseConfig([]byte(`{"Network":"10.244.0.0/16","Backend":{"VNI":7}}`))
	if err != nil {
		t.Fatal(err)
	}
	sub := netip.MustParsePrefix("10.244.5.0/24")
	tests := []struct {
		name   string
		subnet netip.Prefix
		attrs  LeaseAttrs
		want   string // "" = valid claim
		orphan bool
	}{
		{"reservation", sub, LeaseAttrs{PublicIP: "198.18.0.5", NodeID: "h5"}, "", false},
		{"reservation by node only", sub, LeaseAttrs{NodeID: "h6"}, "", false},
		{"reservation naming nothing", sub, LeaseAttrs{}, "PublicIP \"\" is not an IPv4 address", false},
		{"unspecified", sub, LeaseAttrs{PublicIP: "0.0.0.0"}, "0.0.0.0 is the unspecified address", false},
		{"multicast", sub, LeaseAttrs{PublicIP: "224.0.0.1"}, "224.0.0.1 is a multicast address", false},
		{"broadcast", sub, LeaseAttrs{PublicIP: "255.255.255.255"}, "the broadcast address", false},
		{"loopback", sub, LeaseAttrs{PublicIP: "127.0.0.1"}, "a loopback address", false},
		{"link-local", sub, LeaseAttrs{PublicIP: "169.254.1.1"}, "a link-local address", false},
		{"reserved", sub, LeaseAttrs{PublicIP: "240.0.0.1"}, "a reserved address", false},
		{"ipv6", sub, LeaseAttrs{PublicIP: "2001:db8::1"}, "not an IPv4 address", false},
		{"inside network", sub, LeaseAttrs{PublicIP: "10.244.9.9"}, "inside the overlay network", false},
		{"bad node", sub, LeaseAttrs{PublicIP: "198.18.0.5", NodeID: "bad/name"}, "NodeID \"bad/name\" may hold only", false},
		{"outside network", netip.MustParsePrefix("10.99.1.0/24"), LeaseAttrs{PublicIP: "198.18.0.5"}, "subnet 10.99.1.0/24 is outside Network 10.244.0.0/16", true},
		{"wrong length", netip.MustParsePrefix("10.244.5.0/25"), LeaseAttrs{PublicIP: "198.18.0.5"}, "is not a /24", true},
		{"other VNI", sub, LeaseAttrs{PublicIP: "198.18.0.5", BackendType: "vxlan", BackendData: []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:00:05"}`)}, "VNI 1 is not the network's Backend.VNI 7", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := Lease{Subnet: tt.subnet, Attrs: tt.attrs, Reserved: true}
			err := cfg.CheckClaim(l, codec(cfg))
			if tt.want == "" {
				if err != nil {
					t.Fatalf("CheckClaim = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) || !errors.Is(err, ErrInvalidLease) {
				t.Fatalf("CheckClaim = %v, want an invalid lease error with %q", err, tt.want)
			}
			if got := errors.Is(err, ErrOrphaned); got != tt.orphan {
				t.Errorf("errors.Is(%v, ErrOrphaned) = %v, want %v", err, got, tt.orphan)
			}
			// The daemon's read path refuses it the same way.
			if _, _, perr := peers(cfg, l); perr == nil || perr.Error() != err.Error() {
				t.Errorf("Peer = %v, want the CheckClaim error %v", perr, err)
			}
		})
	}
}

func TestUnclaimedReservation(t *testing.T) {
	data := []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:00:05"}`)
	for _, tt := range []struct {
		l    Lease
		want bool
	}{
		{Lease{Reserved: true}, true},
		{Lease{Reserved: true, Attrs: LeaseAttrs{BackendData: []byte("null")}}, true},
		{Lease{Reserved: true, Attrs: LeaseAttrs{BackendData: data}}, false}, // adopted
		{Lease{EtcdLease: 7}, false}, // a lease, even without data
	} {
		if got := tt.l.Unclaimed(); got != tt.want {
			t.Errorf("%+v.Unclaimed() = %v, want %v", tt.l, got, tt.want)
		}
	}
}

func TestDecodeAttrsErrorsSpeakJSON(t *testing.T) {
	for value, want := range map[string]string{
		`{"PublicIP":198}`:                         `value: "PublicIP": want a string such as "198.18.0.7", got 198`,
		`{"PublicIP":"198.18.0.1","NodeID":["a"]}`: `value: "NodeID": want a string, got ["a"]`,
	} {
		_, err := DecodeAttrs([]byte(value))
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "Go ") {
			t.Errorf("DecodeAttrs(%s) = %v, want %q", value, err, want)
		}
	}
}

func TestCheckNodeID(t *testing.T) {
	for _, ok := range []string{"h1", "worker-7.example_com", strings.Repeat("a", MaxNodeIDLen)} {
		if err := CheckNodeID(ok); err != nil {
			t.Errorf("CheckNodeID(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "bad/name", "a b", "é", "x\n", strings.Repeat("a", MaxNodeIDLen+1)} {
		if err := CheckNodeID(bad); err == nil {
			t.Errorf("CheckNodeID(%q) = nil, want an error", bad)
		}
	}
}

// DecodeAttrs reads a value in one pass of encoding/json, and member by
// member (for its error messages) only when that pass fails: both must read
// every value alike, except where members differ only in case — there the
// one pass reads the last, as flanneld does.
func FuzzDecodeAttrsReadsAsMemberByMember(f *testing.F) {
	f.Add([]byte(`{"PublicIP":"198.18.0.7","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"},"NodeID":"n","Hostname":"h"}`))
	f.Add([]byte(`{"publicip":"198.18.0.7","backenddata":null,"BackendV6Data":null,"Other":[1,{}]}`))
	f.Add([]byte(` { "PublicIP" : "198.18.0.7" , "BackendData" : { "vni" : 1.0 , "VtepMAC" : null } } `))
	f.Add([]byte(`{"PublicIP":"198.18.0.7","BackendData":{"VNI":"1"}}`))
	f.Add([]byte(`{"PublicIP":"198.18.0.7","BackendData":"x"}`))
	f.Add([]byte(`{"PublicIP":"198.18.0.7","publicIP":"198.18.0.8"}`))
	f.Add([]byte(`{"PublicIP":"198.18.0.7","publicip":5}`))
	f.Add([]byte(`{"PublicIP":"198.18.0.7\u0000\ud800"}`))
	f.Add([]byte(`{"NodeID":"n"} x`))
	f.Fuzz(func(t *testing.T, value []byte) {
		got, err := DecodeAttrs(value)
		if err != nil && !errors.Is(err, ErrInvalidLease) {
			t.Fatalf("errors must wrap ErrInvalidLease: %v", err)
		}
		if err != nil && strings.Contains(err.Error(), "Go ") {
			t.Fatalf("error speaks Go, not JSON: %v", err)
		}
		if len(value) > MaxLeaseValueSize {
			return
		}
		if json.Valid(value) && anyTwins(value) {
			if !errors.Is(err, ErrInvalidLease) {
				t.Fatalf("a value with twin members decodes: %+v", got)
			}
			return
		}
		want, wantErr := attrsByMember(value)
		if wantErr == nil && want.PublicIP == "" && want.PublicIPv6 == "" && want.NodeID == "" {
			wantErr = errors.New("names no host")
		}
		if (err == nil) != (wantErr == nil) {
			t.Fatalf("DecodeAttrs: %v; member by member: %v", err, wantErr)
		}
		if err == nil && !reflect.DeepEqual(got, want) {
			t.Fatalf("DecodeAttrs read %+v; member by member %+v", got, want)
		}
		// The backend's data is read by its codec, and so checked by its
		// fuzz target (backend/vxlan FuzzLeaseDataReadsAsMemberByMember).
	})
}
