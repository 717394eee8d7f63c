package subnet

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"net/netip"
)

// Pool is one address family's part of the network config: the cluster
// network and how it is cut into per-host subnets. The IPv4 pool is
// flannel's Network, SubnetLen, SubnetMin and SubnetMax; the IPv6 pool its
// IPv6Network, IPv6SubnetLen, IPv6SubnetMin and IPv6SubnetMax.
type Pool struct {
	Network   netip.Prefix
	SubnetLen int
	SubnetMin netip.Addr
	SubnetMax netip.Addr
}

// ErrOutOfSubnets means every subnet between SubnetMin and SubnetMax is held.
var ErrOutOfSubnets = errors.New("out of subnets")

// family holds what differs between the IPv4 and IPv6 pools: the names of
// the fields in the JSON config, flannel's rules for the subnet length, and
// an example for messages.
type family struct {
	v6                                       bool
	network, subnetLen, subnetMin, subnetMax string // JSON field names
	maxLen                                   int    // longest subnet: room for a few pods
	defaultLen                               int    // the subnet length for large networks
	example                                  string // a network prefix, for messages
}

var (
	ipv4 = family{network: "Network", subnetLen: "SubnetLen", subnetMin: "SubnetMin", subnetMax: "SubnetMax",
		maxLen: 30, defaultLen: 24, example: "10.244.0.0/16"}
	ipv6 = family{v6: true, network: "IPv6Network", subnetLen: "IPv6SubnetLen", subnetMin: "IPv6SubnetMin", subnetMax: "IPv6SubnetMax",
		maxLen: 126, defaultLen: 64, example: "fd00:10:244::/48"}
)

func (f family) name() string {
	if f.v6 {
		return "IPv6"
	}
	return "IPv4"
}

// publicIP names the lease field holding a host's underlay address of f.
func (f family) publicIP() string {
	if f.v6 {
		return "PublicIPv6"
	}
	return "PublicIP"
}

func (f family) is(a netip.Addr) bool {
	return a.IsValid() && a.Is6() == f.v6 && !a.Is4In6() && a.Zone() == ""
}

// resolve validates a pool as given and fills in flannel's defaults: the
// subnet length, and SubnetMin/SubnetMax as the second and the last subnet
// of the network (the first is skipped, as flannel does, so no lease's
// network address equals the cluster network's).
func (f family) resolve(network string, subnetLen int, subnetMin, subnetMax string) (Pool, error) {
	if network == "" {
		return Pool{}, fmt.Errorf("%w: %s is missing (e.g. %q: %q)", ErrInvalidConfig, f.network, f.network, f.example)
	}
	n, err := netip.ParsePrefix(network)
	if err != nil || !f.is(n.Addr()) {
		return Pool{}, fmt.Errorf("%w: %s %q is not an %s prefix such as %s", ErrInvalidConfig, f.network, network, f.name(), f.example)
	}
	if n != n.Masked() {
		return Pool{}, fmt.Errorf("%w: %s %q has host bits set; did you mean %s?", ErrInvalidConfig, f.network, network, n.Masked())
	}
	if err := f.checkRange(n, false); err != nil {
		return Pool{}, err
	}
	p := Pool{Network: n, SubnetLen: subnetLen}
	if err := f.resolveSubnetLen(&p); err != nil {
		return Pool{}, err
	}
	if p.SubnetMin, err = f.boundary(&p, f.subnetMin, subnetMin, p.firstUsable()); err != nil {
		return Pool{}, err
	}
	if p.SubnetMax, err = f.boundary(&p, f.subnetMax, subnetMax, p.last()); err != nil {
		return Pool{}, err
	}
	if p.SubnetMin.Compare(p.SubnetMax) > 0 {
		return Pool{}, fmt.Errorf("%w: %s %s is above %s %s", ErrInvalidConfig, f.subnetMin, p.SubnetMin, f.subnetMax, p.SubnetMax)
	}
	return p, nil
}

// specialRange is a range of addresses that can never be a cluster
// network: hosts do not route them (loopback, link-local, multicast,
// reserved), so the overlay's routes would capture traffic the host needs
// or carry none.
type specialRange struct {
	prefix netip.Prefix
	what   string
	// newOnly: refused in a config being stored, read in one stored
	// already. Linux routes class E as unicast and some clusters carry
	// pods in it (flanneld accepts it): refusing it when reading would
	// turn an upgrade into an outage.
	newOnly bool
}

var (
	special4 = []specialRange{
		{prefix: netip.MustParsePrefix("0.0.0.0/8"), what: "the \"this network\" range 0.0.0.0/8 (source addresses only)"},
		{prefix: netip.MustParsePrefix("127.0.0.0/8"), what: "the loopback range 127.0.0.0/8"},
		{prefix: netip.MustParsePrefix("169.254.0.0/16"), what: "the link-local range 169.254.0.0/16"},
		{prefix: netip.MustParsePrefix("224.0.0.0/4"), what: "the multicast range 224.0.0.0/4"},
		{prefix: netip.MustParsePrefix("240.0.0.0/4"), what: "the reserved range 240.0.0.0/4 (class E and the broadcast address)", newOnly: true},
	}
	special6 = []specialRange{
		{prefix: netip.MustParsePrefix("::1/128"), what: "the loopback address ::1"},
		{prefix: netip.MustParsePrefix("::/128"), what: "the unspecified address ::"},
		{prefix: netip.MustParsePrefix("fe80::/10"), what: "the link-local range fe80::/10"},
		{prefix: netip.MustParsePrefix("ff00::/8"), what: "the multicast range ff00::/8"},
	}
)

// checkRange refuses a network that can never be a cluster network: the
// default route (every address, the hosts' own underlay among them), or
// one that overlaps a range hosts do not route. It is part of parsing, so
// every reader of a config (the CLI, each daemon, any other lease source)
// applies it; storing, the newOnly ranges too (Config.CheckStorable).
func (f family) checkRange(n netip.Prefix, storing bool) error {
	if n.Bits() == 0 {
		return fmt.Errorf("%w: %s %s is the default route, every address (the hosts' own among them), and can never be a cluster network: choose a range of its own, such as %s",
			ErrInvalidConfig, f.network, n, f.example)
	}
	ranges := special4
	if f.v6 {
		ranges = special6
	}
	for _, r := range ranges {
		if !n.Overlaps(r.prefix) || r.newOnly && !storing {
			continue
		}
		rel := "contains"
		if n.Bits() >= r.prefix.Bits() {
			rel = "is inside"
		}
		return fmt.Errorf("%w: %s %s %s %s, which hosts do not route, and can never be a cluster network: choose a range of its own, such as %s",
			ErrInvalidConfig, f.network, n, rel, r.what, f.example)
	}
	return nil
}

// resolveSubnetLen applies flannel's rule: the default length (/24, /64)
// when the network leaves room for it and four subnets, else a quarter of
// the network; a given length must leave at least four subnets.
func (f family) resolveSubnetLen(p *Pool) error {
	netBits := p.Network.Bits()
	if p.SubnetLen == 0 {
		switch {
		case netBits+2 > f.maxLen:
			return fmt.Errorf("%w: %s %s is too small: use a /%d or larger", ErrInvalidConfig, f.network, p.Network, f.maxLen-2)
		case netBits+2 <= f.defaultLen:
			p.SubnetLen = f.defaultLen
		default:
			p.SubnetLen = netBits + 2
		}
		return nil
	}
	if p.SubnetLen < 0 || p.SubnetLen > f.maxLen {
		return fmt.Errorf("%w: %s %d is outside 1..%d (a host needs at least a /%d)", ErrInvalidConfig, f.subnetLen, p.SubnetLen, f.maxLen, f.maxLen)
	}
	if p.SubnetLen < netBits+2 {
		return fmt.Errorf("%w: %s %d leaves fewer than four subnets in %s %s: use %d or more", ErrInvalidConfig, f.subnetLen, p.SubnetLen, f.network, p.Network, netBits+2)
	}
	return nil
}

// boundary parses SubnetMin or SubnetMax, or returns def when absent.
func (f family) boundary(p *Pool, field, value string, def netip.Addr) (netip.Addr, error) {
	if value == "" {
		return def, nil
	}
	addr, err := netip.ParseAddr(value)
	if err != nil || !f.is(addr) {
		return netip.Addr{}, fmt.Errorf("%w: %s %q is not an %s address", ErrInvalidConfig, field, value, f.name())
	}
	if !p.Network.Contains(addr) {
		return netip.Addr{}, fmt.Errorf("%w: %s %s is outside %s %s", ErrInvalidConfig, field, addr, f.network, p.Network)
	}
	if aligned := netip.PrefixFrom(addr, p.SubnetLen).Masked().Addr(); aligned != addr {
		return netip.Addr{}, fmt.Errorf("%w: %s %s is not on a /%d boundary (nearest below: %s)", ErrInvalidConfig, field, addr, p.SubnetLen, aligned)
	}
	return addr, nil
}

// hostBits is the number of address bits inside one subnet.
func (p *Pool) hostBits() int { return p.Network.Addr().BitLen() - p.SubnetLen }

// firstUsable is the second subnet of the network.
func (p *Pool) firstUsable() netip.Addr {
	a, _ := addBlocks(p.Network.Addr(), 1, p.hostBits())
	return a
}

// last is the network address of the last subnet in the network.
func (p *Pool) last() netip.Addr {
	return netip.PrefixFrom(lastAddr(p.Network), p.SubnetLen).Masked().Addr()
}

// Contains reports whether s is a subnet this pool can lease: inside
// Network, with exactly SubnetLen bits, on its boundary.
func (p *Pool) Contains(s netip.Prefix) bool {
	return s.IsValid() && p.Network.IsValid() && s.Bits() == p.SubnetLen && s.Masked() == s && p.Network.Contains(s.Addr())
}

// InRange reports whether s is a subnet the allocator may hand out: between
// SubnetMin and SubnetMax.
func (p *Pool) InRange(s netip.Prefix) bool {
	return p.Contains(s) && s.Addr().Compare(p.SubnetMin) >= 0 && s.Addr().Compare(p.SubnetMax) <= 0
}

// Count is the number of subnets between SubnetMin and SubnetMax; an IPv6
// pool may hold more than an int counts, and is then said to hold MaxInt.
func (p *Pool) Count() int {
	n := blocksBetween(p.SubnetMin, p.SubnetMax, p.hostBits())
	if n >= math.MaxInt {
		return math.MaxInt
	}
	return int(n) + 1
}

// SubnetAt returns the i-th subnet counting from SubnetMin.
func (p *Pool) SubnetAt(i int) netip.Prefix {
	a, _ := addBlocks(p.SubnetMin, uint64(i), p.hostBits())
	return netip.PrefixFrom(a, p.SubnetLen)
}

// PickFree chooses a random subnet between SubnetMin and SubnetMax that is not
// in taken. Random rather than first-free, so hosts racing for a subnet
// rarely collide. It returns ErrOutOfSubnets when none is free.
func (p *Pool) PickFree(taken map[netip.Prefix]bool, rng *rand.Rand) (netip.Prefix, error) {
	n := p.Count()
	used := 0
	for s := range taken {
		if p.InRange(s) {
			used++
		}
	}
	if used >= n {
		f := ipv4
		if p.Network.Addr().Is6() {
			f = ipv6
		}
		return netip.Prefix{}, fmt.Errorf("%w: all %d subnets /%d between %s and %s are leased; widen %s or the %s/%s range, or revoke stale leases",
			ErrOutOfSubnets, n, p.SubnetLen, p.SubnetMin, p.SubnetMax, f.network, f.subnetMin, f.subnetMax)
	}
	// A few random probes find a free subnet quickly unless the pool is
	// nearly full; then a scan from a random start is certain to (a pool
	// that full is small: it holds no more subnets than taken has keys).
	for range 16 {
		if s := p.SubnetAt(rng.IntN(n)); !taken[s] {
			return s, nil
		}
	}
	start := rng.IntN(n)
	for i := range n {
		if s := p.SubnetAt((start + i) % n); !taken[s] {
			return s, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("%w: no free subnet found among %d", ErrOutOfSubnets, n) // not reached: a free one was counted
}

// u128 is an address as a 128-bit number, for subnet arithmetic in either
// family (an IPv4 address is its 32 low bits).
type u128 struct{ hi, lo uint64 }

func toU128(a netip.Addr) u128 {
	if a.Is4() {
		b := a.As4()
		return u128{lo: uint64(b[0])<<24 | uint64(b[1])<<16 | uint64(b[2])<<8 | uint64(b[3])}
	}
	b := a.As16()
	var u u128
	for i := range 8 {
		u.hi = u.hi<<8 | uint64(b[i])
		u.lo = u.lo<<8 | uint64(b[8+i])
	}
	return u
}

// fromU128 is the address of family like with value u.
func fromU128(u u128, like netip.Addr) netip.Addr {
	if like.Is4() {
		return netip.AddrFrom4([4]byte{byte(u.lo >> 24), byte(u.lo >> 16), byte(u.lo >> 8), byte(u.lo)})
	}
	var b [16]byte
	for i := range 8 {
		b[7-i] = byte(u.hi >> (8 * i))
		b[15-i] = byte(u.lo >> (8 * i))
	}
	return netip.AddrFrom16(b)
}

// shl is u << n, for n < 128.
func (u u128) shl(n int) u128 {
	switch {
	case n == 0:
		return u
	case n >= 64:
		return u128{hi: u.lo << (n - 64)}
	}
	return u128{hi: u.hi<<n | u.lo>>(64-n), lo: u.lo << n}
}

// shr is u >> n, for n < 128.
func (u u128) shr(n int) u128 {
	switch {
	case n == 0:
		return u
	case n >= 64:
		return u128{lo: u.hi >> (n - 64)}
	}
	return u128{hi: u.hi >> n, lo: u.lo>>n | u.hi<<(64-n)}
}

// addBlocks returns a + n·2^hostBits; ok is false when the sum leaves a's
// family's address space.
func addBlocks(a netip.Addr, n uint64, hostBits int) (netip.Addr, bool) {
	if hostBits > 64 && n>>(128-hostBits) != 0 {
		return netip.Addr{}, false // n·2^hostBits needs more than 128 bits
	}
	u, d := toU128(a), u128{lo: n}.shl(hostBits)
	lo, carry := bits.Add64(u.lo, d.lo, 0)
	hi, over := bits.Add64(u.hi, d.hi, carry)
	sum := u128{hi, lo}
	if over != 0 || (a.Is4() && (sum.hi != 0 || sum.lo > math.MaxUint32)) {
		return netip.Addr{}, false
	}
	return fromU128(sum, a), true
}

// blocksBetween is (hi − lo) / 2^hostBits, or MaxUint64 when that does not
// fit; lo must not be above hi.
func blocksBetween(lo, hi netip.Addr, hostBits int) uint64 {
	a, b := toU128(lo), toU128(hi)
	d0, borrow := bits.Sub64(b.lo, a.lo, 0)
	d1, _ := bits.Sub64(b.hi, a.hi, borrow)
	q := u128{d1, d0}.shr(hostBits)
	if q.hi != 0 {
		return math.MaxUint64
	}
	return q.lo
}

// lastAddr is the last address of p: all its host bits set.
func lastAddr(p netip.Prefix) netip.Addr {
	u := toU128(p.Addr())
	hostBits := p.Addr().BitLen() - p.Bits()
	ones := u128{hi: math.MaxUint64, lo: math.MaxUint64}.shr(128 - hostBits)
	return fromU128(u128{u.hi | ones.hi, u.lo | ones.lo}, p.Addr())
}
