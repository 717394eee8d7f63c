package subnet

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Subnets are what one lease key names, in flannel's form: an IPv4 subnet
// ("10.244.7.0-24"), or an IPv4 and an IPv6 subnet joined by '&'
// ("10.244.7.0-24&fd00:10:244:7::-64", a dual-stack lease).
type Subnets struct {
	IPv4 netip.Prefix
	IPv6 netip.Prefix // zero in an IPv4-only key
}

// Key returns the key suffix naming s.
func (s Subnets) Key() string {
	if !s.IPv6.IsValid() {
		return Key(s.IPv4)
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

// ParseKey decodes the key suffix of an IPv4-only lease, such as
// "10.244.7.0-24": the only form this version programs.
func ParseKey(s string) (netip.Prefix, error) {
	sn, err := ParseLeaseKey(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if sn.IPv6.IsValid() {
		return netip.Prefix{}, fmt.Errorf("%w: key %q names the IPv6 subnet %s too (a dual-stack lease), but this version carries IPv4 only", ErrInvalidLease, s, sn.IPv6)
	}
	return sn.IPv4, nil
}

// parseSubnet decodes one half of key, "<address>-<length>", of family f.
func parseSubnet(key, part string, f family) (netip.Prefix, error) {
	addrPart, bitsPart, ok := strings.Cut(part, "-")
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%w: key %q: %q is not <%s address>-<prefix length>", ErrInvalidLease, key, part, f.name())
	}
	addr, err := netip.ParseAddr(addrPart)
	if err != nil || !f.is(addr) || addr.String() != addrPart {
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
