package subnet

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Subnets are what one lease key names, in flannel's form under
// <prefix>/subnets/: an IPv4 subnet ("10.244.7.0-24"), or an IPv4 and an
// IPv6 subnet joined by '&' ("10.244.7.0-24&fd00:10:244:7::-64", a
// dual-stack lease); or, in an IPv6-only network, an IPv6 subnet alone
// ("fd00:10:244:7::-64", under <prefix>/subnets6/: overlay's own form,
// which flannel cannot express).
type Subnets struct {
	IPv4 netip.Prefix // zero in an IPv6-only key
	IPv6 netip.Prefix // zero in an IPv4-only key
}

// ID is the subnets of a key packed into a comparable value of 24 bytes
// without pointers: what the watcher and the daemon key their per-lease
// maps by. (A Subnets is 64 bytes and holds two pointers: with thousands
// of leases, the maps' size and the collector's scanning of them count.)
type ID struct{ w0, hi, lo uint64 }

// ID packs s: the IPv4 address, its length and presence in w0's low 41
// bits, the IPv6 length and presence above, the IPv6 address in hi and lo.
func (s Subnets) ID() ID {
	var id ID
	if s.IPv4.IsValid() {
		a := s.IPv4.Addr().As4()
		id.w0 = uint64(binary.BigEndian.Uint32(a[:])) | uint64(s.IPv4.Bits())<<32 | 1<<40
	}
	if s.IPv6.IsValid() {
		a := s.IPv6.Addr().As16()
		id.hi, id.lo = binary.BigEndian.Uint64(a[:8]), binary.BigEndian.Uint64(a[8:])
		id.w0 |= uint64(s.IPv6.Bits())<<48 | 1<<56
	}
	return id
}

// Subnets unpacks id.
func (id ID) Subnets() Subnets {
	var s Subnets
	if id.w0&(1<<40) != 0 {
		var a [4]byte
		binary.BigEndian.PutUint32(a[:], uint32(id.w0))
		s.IPv4 = netip.PrefixFrom(netip.AddrFrom4(a), int(id.w0>>32&0xff))
	}
	if id.w0&(1<<56) != 0 {
		var a [16]byte
		binary.BigEndian.PutUint64(a[:8], id.hi)
		binary.BigEndian.PutUint64(a[8:], id.lo)
		s.IPv6 = netip.PrefixFrom(netip.AddrFrom16(a), int(id.w0>>48&0xff))
	}
	return s
}

// Primary is the subnet that names the lease in logs and metrics: the
// IPv4 one, or the IPv6 one in an IPv6-only key.
func (s Subnets) Primary() netip.Prefix {
	if s.IPv4.IsValid() {
		return s.IPv4
	}
	return s.IPv6
}

// String names the subnets in CIDR form, joined by '&' like the key:
// "10.244.7.0/24", "10.244.7.0/24&fd00:10:244:7::/64" or
// "fd00:10:244:7::/64".
func (s Subnets) String() string {
	switch {
	case !s.IPv6.IsValid():
		return s.IPv4.String()
	case !s.IPv4.IsValid():
		return s.IPv6.String()
	}
	return s.IPv4.String() + "&" + s.IPv6.String()
}

// Compare orders subnets by the IPv4 subnet, then the IPv6 one (address,
// then length), the zero prefix first.
func (s Subnets) Compare(o Subnets) int {
	return cmp.Or(comparePrefix(s.IPv4, o.IPv4), comparePrefix(s.IPv6, o.IPv6))
}

func comparePrefix(a, b netip.Prefix) int {
	return cmp.Or(a.Addr().Compare(b.Addr()), cmp.Compare(a.Bits(), b.Bits()))
}

// Key returns the key suffix naming s.
func (s Subnets) Key() string {
	switch {
	case !s.IPv6.IsValid():
		return Key(s.IPv4)
	case !s.IPv4.IsValid():
		return Key(s.IPv6)
	}
	return Key(s.IPv4) + "&" + Key(s.IPv6)
}

// Key returns the key suffix of one subnet, e.g. "10.244.7.0-24" or
// "fd00:10:244:7::-64".
func Key(p netip.Prefix) string {
	return p.Addr().String() + "-" + strconv.Itoa(p.Bits())
}

// ParseLeaseKey decodes a key suffix in either of flannel's forms. It
// accepts only the canonical spelling Subnets.Key produces (lower-case
// hexadecimal, the shortest IPv6 form, no leading zeros), so that one pair
// of subnets has exactly one key.
func ParseLeaseKey(s string) (Subnets, error) {
	v4part, v6part, dual := strings.Cut(s, "&")
	v4, err := parseSubnet(s, v4part, ipv4)
	if err != nil {
		return Subnets{}, err
	}
	if !dual {
		return Subnets{IPv4: v4}, nil
	}
	v6, err := parseSubnet(s, v6part, ipv6)
	if err != nil {
		return Subnets{}, err
	}
	return Subnets{IPv4: v4, IPv6: v6}, nil
}

// ParseIPv6OnlyKey decodes a key suffix under <prefix>/subnets6/, an IPv6
// subnet alone ("fd00:10:244:7::-64"), in the canonical spelling only.
func ParseIPv6OnlyKey(s string) (Subnets, error) {
	v6, err := parseSubnet(s, s, ipv6)
	if err != nil {
		return Subnets{}, err
	}
	return Subnets{IPv6: v6}, nil
}

// ParseLeaseKey decodes a lease key suffix of this network: flannel's
// forms, or the IPv6-only form in an IPv6-only network (whose keys live
// under <prefix>/subnets6/).
func (c *Config) ParseLeaseKey(s string) (Subnets, error) {
	if !c.EnableIPv4 {
		return ParseIPv6OnlyKey(s)
	}
	return ParseLeaseKey(s)
}

// parseSubnet decodes one half of key, "<address>-<length>", of family f.
func parseSubnet(key, part string, f family) (netip.Prefix, error) {
	addrPart, bitsPart, ok := strings.Cut(part, "-")
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%w: key %q: %q is not <%s address>-<prefix length>", ErrInvalidLease, key, part, f.name())
	}
	addr, err := netip.ParseAddr(addrPart)
	var canonical [64]byte // an address's text fits; compared without a copy
	if err != nil || !f.is(addr) || string(addr.AppendTo(canonical[:0])) != addrPart {
		return netip.Prefix{}, fmt.Errorf("%w: key %q: %q is not an %s address in canonical form", ErrInvalidLease, key, addrPart, f.name())
	}
	bits, err := strconv.Atoi(bitsPart)
	if err != nil || bits < 0 || bits > addr.BitLen() || strconv.Itoa(bits) != bitsPart {
		return netip.Prefix{}, fmt.Errorf("%w: key %q: %q is not a prefix length 0..%d", ErrInvalidLease, key, bitsPart, addr.BitLen())
	}
	p := netip.PrefixFrom(addr, bits)
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%w: key %q: %s has host bits set", ErrInvalidLease, key, p)
	}
	return p, nil
}
