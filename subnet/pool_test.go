package subnet

import (
	"errors"
	"math"
	"math/rand/v2"
	"net/netip"
	"testing"
)

func TestSubnetArithmeticInBothFamilies(t *testing.T) {
	for _, tt := range []struct {
		a        string
		n        uint64
		hostBits int
		want     string // "" when the sum leaves the family's space
	}{
		{"10.244.0.0", 1, 8, "10.244.1.0"},
		{"10.244.255.0", 1, 8, "10.245.0.0"},
		{"255.255.255.0", 1, 8, ""},
		{"0.0.0.0", 1, 32, ""},
		{"fd00:10:244::", 1, 64, "fd00:10:244:1::"},
		{"fd00:10:244:ffff::", 1, 64, "fd00:10:245::"},
		{"fd00::", 3, 6, "fd00::c0"},
		{"::", 1, 127, "8000::"},
		{"::", 2, 127, ""},
		{"ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00", 1, 8, ""},
		{"::ffff:ffff:ffff:ffff", 1, 0, "0:0:0:1::"},
	} {
		got, ok := addBlocks(netip.MustParseAddr(tt.a), tt.n, tt.hostBits)
		if tt.want == "" {
			if ok {
				t.Errorf("addBlocks(%s, %d, %d) = %s, want overflow", tt.a, tt.n, tt.hostBits, got)
			}
			continue
		}
		if !ok || got != netip.MustParseAddr(tt.want) {
			t.Errorf("addBlocks(%s, %d, %d) = %s, %v; want %s", tt.a, tt.n, tt.hostBits, got, ok, tt.want)
		}
	}
	for _, tt := range []struct{ p, want string }{
		{"10.244.0.0/16", "10.244.255.255"},
		{"10.1.2.3/32", "10.1.2.3"},
		{"0.0.0.0/0", "255.255.255.255"},
		{"fd00:10:244::/48", "fd00:10:244:ffff:ffff:ffff:ffff:ffff"},
		{"fd00::/65", "fd00::7fff:ffff:ffff:ffff"},
		{"::/0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
	} {
		if got := lastAddr(netip.MustParsePrefix(tt.p)); got != netip.MustParseAddr(tt.want) {
			t.Errorf("lastAddr(%s) = %s, want %s", tt.p, got, tt.want)
		}
	}
	if got := blocksBetween(netip.MustParseAddr("::"), netip.MustParseAddr("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), 2); got != math.MaxUint64 {
		t.Errorf("blocksBetween over 2^126 blocks = %d, want MaxUint64", got)
	}
	if got := blocksBetween(netip.MustParseAddr("fd00:10:244:1::"), netip.MustParseAddr("fd00:10:244:ffff::"), 64); got != 65534 {
		t.Errorf("blocksBetween(/64s of a /48) = %d, want 65534", got)
	}
}

func TestIPv6PoolHandsOutItsSubnets(t *testing.T) {
	cfg := mustConfig(t, `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/48"}`)
	p := cfg.IPv6
	if n := p.Count(); n != 65535 {
		t.Fatalf("Count = %d, want 65535 /64s (the first is skipped)", n)
	}
	if first, last := p.SubnetAt(0), p.SubnetAt(65534); first != mustPrefix("fd00:10:244:1::/64") || last != mustPrefix("fd00:10:244:ffff::/64") {
		t.Errorf("SubnetAt(0), SubnetAt(65534) = %s, %s", first, last)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100 {
		s, err := p.PickFree(nil, rng)
		if err != nil || !p.InRange(s) {
			t.Fatalf("PickFree = %s, %v: not a subnet of the pool", s, err)
		}
	}

	// A small pool: the last free subnet is found, then none.
	small := mustConfig(t, `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00::100/120"}`).IPv6
	taken := map[netip.Prefix]bool{mustPrefix("fd00::140/122"): true, mustPrefix("fd00::1c0/122"): true}
	if s, err := small.PickFree(taken, rng); err != nil || s != mustPrefix("fd00::180/122") {
		t.Errorf("PickFree with one left = %s, %v; want fd00::180/122", s, err)
	}
	taken[mustPrefix("fd00::180/122")] = true
	if _, err := small.PickFree(taken, rng); !errors.Is(err, ErrOutOfSubnets) {
		t.Errorf("PickFree of a full pool: %v, want ErrOutOfSubnets", err)
	}

	// More subnets than an int counts: still one of the pool's.
	huge := mustConfig(t, `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"2000::/3","IPv6SubnetLen":126}`).IPv6
	if n := huge.Count(); n != math.MaxInt {
		t.Errorf("Count of 2^123 subnets = %d, want MaxInt", n)
	}
	if s, err := huge.PickFree(nil, rng); err != nil || !huge.InRange(s) {
		t.Errorf("PickFree in a huge pool = %s, %v", s, err)
	}
}
