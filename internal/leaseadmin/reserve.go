package leaseadmin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/overlaynet/overlay/backend/codecs"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// Reserve writes a reservation after checking it exactly as a daemon
// checks what it reads — the value is encoded, decoded and judged by
// Config.CheckClaim — and that no other key names its host or either of
// its subnets. The write succeeds only if no lease changed since the
// check.
func Reserve(ctx context.Context, reg Store, s subnet.Subnets, attrs subnet.LeaseAttrs, force bool, warn io.Writer) error {
	snap, err := reg.List(ctx)
	if err != nil {
		return err
	}
	cfg, _, err := reg.GetConfig(ctx)
	if err != nil {
		return err
	}
	if err := checkFamilies(cfg, reg.ConfigKey(), s, attrs); err != nil {
		return err
	}
	codec, err := codecs.For(cfg.Backend)
	if err != nil {
		return fmt.Errorf("cannot reserve %s: %s: %w", s, reg.ConfigKey(), err)
	}
	value, err := attrs.Marshal()
	if err != nil {
		return err
	}
	l := subnet.Lease{Subnet: s.IPv4, IPv6Subnet: s.IPv6, Reserved: true}
	if l.Attrs, err = subnet.DecodeAttrs(value); err == nil {
		err = cfg.CheckClaim(l, codec)
	}
	switch {
	case errors.Is(err, subnet.ErrOrphaned):
		return Refusef("cannot reserve %s: daemons would skip it: %w: pick %s", s, err, subnetsWanted(cfg))
	case err != nil:
		return Refusef("cannot reserve %s: daemons would skip it: %w: pass the host's underlay %s", s, err, addressFlags(cfg))
	}
	outside := OutsideRange(cfg, s)
	if outside != "" && !force {
		return Refusef("cannot reserve %s: %s: pick %s, or pass --force to reserve it all the same", s, outside, rangeWanted(cfg))
	}
	if err := checkFree(reg, snap, l); err != nil {
		return err
	}
	_, err = reg.Reserve(ctx, s, attrs, snap.Revision)
	if err == nil && outside != "" {
		fmt.Fprintf(warn, "warning: reserved with --force: %s\n", outside)
	}
	if errors.Is(err, etcdv3.ErrTaken) {
		return Refusef("cannot reserve %s: it is already leased (see `overlayd lease get %s`; revoke it first)", s, s.Primary())
	}
	return err
}

// checkFamilies refuses a reservation whose key would not name the address
// families the network carries (a reservation pins each subnet its host
// gets), or that names the host by one public address where it has two,
// saying which flag to add or drop.
func checkFamilies(cfg *subnet.Config, configKey string, s subnet.Subnets, a subnet.LeaseAttrs) error {
	switch {
	case !cfg.EnableIPv4 && (s.IPv4.IsValid() || a.PublicIP != ""):
		return Refusef("cannot reserve %s: the network carries no IPv4 (EnableIPv4 is false in %s): name the IPv6 subnet as SUBNET, the host's address with --public-ipv6, and drop --public-ip", s, configKey)
	case !cfg.EnableIPv4:
		return nil
	case !s.IPv4.IsValid():
		return Refusef("cannot reserve %s: the network carries IPv4: name the IPv4 subnet as SUBNET (and the IPv6 one with --ipv6-subnet)", s)
	case cfg.EnableIPv6 && !s.IPv6.IsValid():
		return Refusef("cannot reserve %s: the network carries IPv6 (EnableIPv6 in %s), so a reservation names the host's IPv6 subnet too (a reservation pins each subnet its host gets): add --ipv6-subnet (a /%d inside %s) and the host's --public-ipv6",
			s, configKey, cfg.IPv6.SubnetLen, cfg.IPv6.Network)
	case !cfg.EnableIPv6 && (s.IPv6.IsValid() || a.PublicIPv6 != ""):
		return Refusef("cannot reserve %s: the network carries no IPv6 (EnableIPv6 is false in %s): drop --ipv6-subnet and --public-ipv6", s, configKey)
	case cfg.EnableIPv6 && (a.PublicIP == "") != (a.PublicIPv6 == ""):
		return Refusef("cannot reserve %s: a host of a dual-stack network has two underlay addresses: give both --public-ip and --public-ipv6, or (if they are not known yet) --node-name alone", s)
	}
	return nil
}

// OutsideRange says why a subnet of s (which fit the network: CheckClaim)
// lies outside the range hosts lease from, "" if neither does. The
// network's first subnet is named as such: its address is the network's
// own, and neither overlay nor flannel ever leases it.
func OutsideRange(cfg *subnet.Config, s subnet.Subnets) string {
	for _, f := range []struct {
		p        netip.Prefix
		pool     *subnet.Pool
		min, max string
		enabled  bool
	}{
		{s.IPv4, &cfg.Pool, "SubnetMin", "SubnetMax", cfg.EnableIPv4},
		{s.IPv6, &cfg.IPv6, "IPv6SubnetMin", "IPv6SubnetMax", cfg.EnableIPv6},
	} {
		switch {
		case !f.enabled || !f.p.IsValid() || f.pool.InRange(f.p):
		case f.p.Addr() == f.pool.Network.Addr():
			return fmt.Sprintf("%s is the first subnet of %s, which no host leases (its address is the network's own; %s is %s)", f.p, f.pool.Network, f.min, f.pool.SubnetMin)
		case f.p.Addr().Less(f.pool.SubnetMin):
			return fmt.Sprintf("%s is below %s %s, outside the range hosts lease from", f.p, f.min, f.pool.SubnetMin)
		default:
			return fmt.Sprintf("%s is above %s %s, outside the range hosts lease from", f.p, f.max, f.pool.SubnetMax)
		}
	}
	return ""
}

// rangeWanted says what subnets hosts lease, for a refusal.
func rangeWanted(cfg *subnet.Config) string {
	var want []string
	if cfg.EnableIPv4 {
		want = append(want, fmt.Sprintf("a /%d between SubnetMin %s and SubnetMax %s", cfg.SubnetLen, cfg.SubnetMin, cfg.SubnetMax))
	}
	if cfg.EnableIPv6 {
		want = append(want, fmt.Sprintf("a /%d between IPv6SubnetMin %s and IPv6SubnetMax %s", cfg.IPv6.SubnetLen, cfg.IPv6.SubnetMin, cfg.IPv6.SubnetMax))
	}
	return strings.Join(want, " and ")
}

// subnetsWanted says what subnets the network leases, for a refusal.
func subnetsWanted(cfg *subnet.Config) string {
	var want []string
	if cfg.EnableIPv4 {
		want = append(want, fmt.Sprintf("a /%d inside %s", cfg.SubnetLen, cfg.Network))
	}
	if cfg.EnableIPv6 {
		want = append(want, fmt.Sprintf("a /%d inside %s", cfg.IPv6.SubnetLen, cfg.IPv6.Network))
	}
	return strings.Join(want, " and ")
}

// addressFlags names the flags of the host's underlay addresses.
func addressFlags(cfg *subnet.Config) string {
	switch {
	case !cfg.EnableIPv4:
		return "address as --public-ipv6"
	case cfg.EnableIPv6:
		return "addresses as --public-ip and --public-ipv6"
	}
	return "address as --public-ip"
}

// checkFree refuses a reservation l whose host already has a lease or
// reservation (a host uses one subnet), or one of whose subnets another
// key holds. The write's transaction guards only l's own key, so another
// key holding one half (an IPv4-only key beside a dual-stack one, two
// dual-stack keys sharing a half) is caught here, in the listing whose
// revision the write is conditional on.
func checkFree(reg Store, snap subnet.Snapshot, l subnet.Lease) error {
	s := l.Subnets()
	for _, other := range snap.Leases {
		if other.Subnets() == s {
			continue // reported as taken by the write
		}
		if same := sameHost(l.Attrs, other.Attrs); same != "" {
			return Refusef("cannot reserve %s: %s already has %s (key %s): a host uses one subnet; revoke that one first (`overlayd lease revoke %s`)",
				s, same, other.Subnets(), reg.LeaseKey(other.Subnets()), other.Subnets().Primary())
		}
		if err := heldElsewhere(s, other.Subnets(), reg.LeaseKey(other.Subnets())); err != nil {
			return err
		}
	}
	for _, inv := range snap.Invalid { // undecodable values still hold their subnets
		other, err := reg.ParseKey(inv.Key)
		if err != nil || other == s {
			continue
		}
		if err := heldElsewhere(s, other, inv.Key); err != nil {
			return err
		}
	}
	return nil
}

// sameHost says by what a names the host b names, or "".
func sameHost(a, b subnet.LeaseAttrs) string {
	switch {
	case a.NodeID != "" && b.NodeID == a.NodeID:
		return "node " + a.NodeID
	case a.PublicAddr().IsValid() && b.PublicAddr() == a.PublicAddr():
		return "public IP " + a.PublicIP
	case a.PublicAddrV6().IsValid() && b.PublicAddrV6() == a.PublicAddrV6():
		return "public IPv6 " + a.PublicIPv6
	}
	return ""
}

// heldElsewhere refuses s if other, the subnets of key, names one of them.
func heldElsewhere(s, other subnet.Subnets, key string) error {
	for _, p := range []netip.Prefix{s.IPv4, s.IPv6} {
		if p.IsValid() && (p == other.IPv4 || p == other.IPv6) {
			return Refusef("cannot reserve %s: %s is already held by key %s (see `overlayd lease get %s`; revoke it first)", s, p, key, p)
		}
	}
	return nil
}
