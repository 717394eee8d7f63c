package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/printer"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

func newLeaseReserveCommand(g *GlobalFlags) *cobra.Command {
	var publicIP, publicIPv6, ipv6Subnet, node string
	var force bool
	c := &cobra.Command{
		Use:   "reserve SUBNET --public-ip IP [--ipv6-subnet SUBNET6 --public-ipv6 IP6] [--node-name NAME] [--force]",
		Short: "Reserve a subnet for a host: a lease that never expires, adopted by the host with that public IP (or node name)",
		Long: `Reserve a subnet for a host: a key without TTL that the host with that
node name (or, without --node-name, that public IP) adopts when it starts.

In a network that carries IPv6 (EnableIPv6 in the network config) a host
leases an IPv4 and an IPv6 subnet under one key: name the IPv6 subnet with
--ipv6-subnet and the host's IPv6 underlay address with --public-ipv6.
In an IPv6-only network (EnableIPv4 false) SUBNET is the IPv6 subnet and
--public-ipv6 the host's address. With --node-name alone, and no address, the reservation waits for the host
of that node name, whatever its addresses.

The reservation is checked as every daemon checks what it reads: the
subnets must be subnets of the network, of the families it carries, the
public addresses unicast addresses outside it, the node name one overlayd
accepts; and a host has one subnet, so a node or public address that
already holds a lease or reservation is refused, and so is a subnet that
another key holds.

A subnet outside SubnetMin..SubnetMax (IPv6SubnetMin..IPv6SubnetMax) — the
network's first subnet among them, which no host leases, as in flannel —
is refused unless --force.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := g.format()
			if err != nil {
				return err
			}
			s, err := reservedSubnets(args[0], ipv6Subnet)
			if err != nil {
				return err
			}
			if publicIP == "" && publicIPv6 == "" && node == "" {
				return usagef("--public-ip is required: the address of the host the subnet is for (--public-ipv6 in an IPv6-only network, or --node-name alone, if its addresses are not known yet)")
			}
			ctx, reg, done, err := g.connectLeases(cmd)
			if err != nil {
				return err
			}
			defer done()
			attrs := subnet.LeaseAttrs{PublicIP: publicIP, PublicIPv6: publicIPv6, BackendType: subnet.DefaultBackendType, NodeID: node}
			for attempt := 0; ; attempt++ {
				err = reserve(ctx, reg, s, attrs, force, cmd.ErrOrStderr())
				if !errors.Is(err, etcdv3.ErrConflict) || attempt == 2 {
					break
				}
			}
			var refused refusal
			switch {
			case errors.As(err, &refused):
				return refused.error
			case err != nil:
				return g.etcdHint(err)
			}
			return writeResult{Action: "reserved", Key: reg.LeaseKey(s)}.with(s, attrs).print(cmd.OutOrStdout(), format,
				fmt.Sprintf("reserved %s for %s", s, describeOwner(attrs)))
		},
	}
	c.Flags().StringVar(&publicIP, "public-ip", "", "public IP of the host the subnet is reserved for (required unless --node-name is given alone)")
	c.Flags().StringVar(&publicIPv6, "public-ipv6", "", "public IPv6 address of the host (in a network that carries IPv6)")
	c.Flags().StringVar(&ipv6Subnet, "ipv6-subnet", "", "the host's IPv6 subnet, e.g. fd00:10:244:7::/64 (required in a network that carries IPv6)")
	c.Flags().StringVar(&node, "node-name", "", "node ID of the host (matches before the public IP)")
	c.Flags().BoolVar(&force, "force", false, "reserve a subnet outside SubnetMin..SubnetMax, the network's first subnet included (never from the environment)")
	checkFlag(c.Flags(), "force", boolean)
	checkFlag(c.Flags(), "public-ip", hostIPv4)
	checkFlag(c.Flags(), "public-ipv6", hostIPv6)
	checkFlag(c.Flags(), "ipv6-subnet", ipv6SubnetArg)
	checkFlag(c.Flags(), "node-name", nodeName)
	return usesEtcd(c)
}

// reservedSubnets are the subnets a reservation's key names: SUBNET (the
// IPv4 one, or the IPv6 one of an IPv6-only network), and --ipv6-subnet
// (checked when set) if given. Whether they are the network's families
// checkFamilies says, once the config is read.
func reservedSubnets(arg, ipv6Subnet string) (subnet.Subnets, error) {
	p, err := parseSubnetArg(arg)
	if err != nil {
		return subnet.Subnets{}, err
	}
	if !p.Addr().Is4() {
		if ipv6Subnet != "" {
			return subnet.Subnets{}, usagef("subnet %s is an IPv6 subnet: name the IPv4 subnet as SUBNET and the IPv6 one with --ipv6-subnet", p)
		}
		return subnet.Subnets{IPv6: p}, nil
	}
	s := subnet.Subnets{IPv4: p}
	if ipv6Subnet != "" {
		s.IPv6 = netip.MustParsePrefix(ipv6Subnet)
	}
	return s, nil
}

// refusal is a reservation refused for what it is, not for an etcd failure.
type refusal struct{ error }

func refusef(format string, args ...any) error { return refusal{fmt.Errorf(format, args...)} }

// reserve writes a reservation after checking it exactly as a daemon
// checks what it reads — the value is encoded, decoded and judged by
// Config.CheckClaim — and that no other key names its host or either of
// its subnets. The write succeeds only if no lease changed since the
// check.
func reserve(ctx context.Context, reg *etcdv3.Registry, s subnet.Subnets, attrs subnet.LeaseAttrs, force bool, warn io.Writer) error {
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
	value, err := attrs.Marshal()
	if err != nil {
		return err
	}
	l := subnet.Lease{Subnet: s.IPv4, IPv6Subnet: s.IPv6, Reserved: true}
	if l.Attrs, err = subnet.DecodeAttrs(value); err == nil {
		err = cfg.CheckClaim(l, daemon.LeaseCodec(cfg.Backend))
	}
	switch {
	case errors.Is(err, subnet.ErrOrphaned):
		return refusef("cannot reserve %s: daemons would skip it: %w: pick %s", s, err, subnetsWanted(cfg))
	case err != nil:
		return refusef("cannot reserve %s: daemons would skip it: %w: pass the host's underlay %s", s, err, addressFlags(cfg))
	}
	outside := outsideRange(cfg, s)
	if outside != "" && !force {
		return refusef("cannot reserve %s: %s: pick %s, or pass --force to reserve it all the same", s, outside, rangeWanted(cfg))
	}
	if err := checkFree(reg, snap, l); err != nil {
		return err
	}
	_, err = reg.Reserve(ctx, s, attrs, snap.Revision)
	if err == nil && outside != "" {
		fmt.Fprintf(warn, "warning: reserved with --force: %s\n", outside)
	}
	if errors.Is(err, etcdv3.ErrTaken) {
		return refusef("cannot reserve %s: it is already leased (see `overlayd lease get %s`; revoke it first)", s, s.Primary())
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
		return refusef("cannot reserve %s: the network carries no IPv4 (EnableIPv4 is false in %s): name the IPv6 subnet as SUBNET, the host's address with --public-ipv6, and drop --public-ip", s, configKey)
	case !cfg.EnableIPv4:
		return nil
	case !s.IPv4.IsValid():
		return refusef("cannot reserve %s: the network carries IPv4: name the IPv4 subnet as SUBNET (and the IPv6 one with --ipv6-subnet)", s)
	case cfg.EnableIPv6 && !s.IPv6.IsValid():
		return refusef("cannot reserve %s: the network carries IPv6 (EnableIPv6 in %s), so a reservation names the host's IPv6 subnet too (a reservation pins each subnet its host gets): add --ipv6-subnet (a /%d inside %s) and the host's --public-ipv6",
			s, configKey, cfg.IPv6.SubnetLen, cfg.IPv6.Network)
	case !cfg.EnableIPv6 && (s.IPv6.IsValid() || a.PublicIPv6 != ""):
		return refusef("cannot reserve %s: the network carries no IPv6 (EnableIPv6 is false in %s): drop --ipv6-subnet and --public-ipv6", s, configKey)
	case cfg.EnableIPv6 && (a.PublicIP == "") != (a.PublicIPv6 == ""):
		return refusef("cannot reserve %s: a host of a dual-stack network has two underlay addresses: give both --public-ip and --public-ipv6, or (if they are not known yet) --node-name alone", s)
	}
	return nil
}

// outsideRange says why a subnet of s (which fit the network: CheckClaim)
// lies outside the range hosts lease from, "" if neither does. The
// network's first subnet is named as such: its address is the network's
// own, and neither overlay nor flannel ever leases it.
func outsideRange(cfg *subnet.Config, s subnet.Subnets) string {
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
func checkFree(reg *etcdv3.Registry, snap etcdv3.Snapshot, l subnet.Lease) error {
	s := l.Subnets()
	for _, other := range snap.Leases {
		if other.Subnets() == s {
			continue // reported as taken by the write
		}
		if same := sameHost(l.Attrs, other.Attrs); same != "" {
			return refusef("cannot reserve %s: %s already has %s (key %s): a host uses one subnet; revoke that one first (`overlayd lease revoke %s`)",
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
			return refusef("cannot reserve %s: %s is already held by key %s (see `overlayd lease get %s`; revoke it first)", s, p, key, p)
		}
	}
	return nil
}

// describeOwner names the host a lease value names, as messages show it:
// "198.18.0.7", "node h7 (198.18.0.7)", "node h7 (198.18.0.7, 2001:db8::7)"
// or, for a reservation waiting for its node, "node h7". The value is
// anyone's with write access to etcd: a node ID or address that is not
// one is shown quoted, so it can neither drive the terminal nor fake lines.
func describeOwner(a subnet.LeaseAttrs) string {
	node := subnet.ShownName(a.NodeID)
	var shown []string
	for _, s := range []string{a.PublicIP, a.PublicIPv6} {
		if s != "" {
			shown = append(shown, subnet.ShownAddr(s))
		}
	}
	addrs := strings.Join(shown, ", ")
	switch {
	case a.NodeID == "" && addrs == "":
		return "unknown: the value names no host"
	case a.NodeID == "":
		return addrs
	case addrs == "":
		return "node " + node
	}
	return fmt.Sprintf("node %s (%s)", node, addrs)
}

// plainKey is an etcd key as messages show it: as it is if it holds only
// printable ASCII other than space, else quoted (anyone may write a key).
func plainKey(key string) string {
	if strings.ContainsFunc(key, func(r rune) bool { return r <= ' ' || r > '~' }) {
		return strconv.Quote(key)
	}
	return key
}

func newLeaseRevokeCommand(g *GlobalFlags) *cobra.Command {
	var force, dryRun bool
	c := &cobra.Command{
		Use:   "revoke SUBNET [--force] [--dry-run]",
		Short: "Delete a lease or reservation; refuses while its owner is alive unless --force",
		Long: `Delete a lease or reservation.

A live owner's overlayd re-claims its subnet at once (pods on that host hold
addresses from it), so revoking a live lease is refused unless --force. Use it
to free the subnet of a host that is gone for good. Without --force it also
deletes a key whose value names no host (STATE invalid in 'lease list'), and an
orphaned lease or an unadopted reservation whose host already holds a lease
that fits the network config.
--dry-run shows what would be deleted.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := g.format()
			if err != nil {
				return err
			}
			p, err := parseSubnetArg(args[0])
			if err != nil {
				return err
			}
			ctx, reg, done, err := g.connectLeases(cmd)
			if err != nil {
				return err
			}
			defer done()
			l, err := lookup(ctx, reg, p)
			if errors.Is(err, etcdv3.ErrNotFound) {
				return err
			}
			// A value that names no host protects nobody's subnet (but a
			// key that did not decode names none to delete).
			garbage := l.Subnets() != subnet.Subnets{} && (errors.Is(err, subnet.ErrInvalidLease) || !l.Attrs.NamesAHost())
			if err != nil && !garbage {
				return g.etcdHint(err)
			}
			alive, err := reg.AliveNodes(ctx)
			if err != nil {
				return g.etcdHint(err)
			}
			stale, err := unusedByItsHost(ctx, reg, l)
			if err != nil {
				return g.etcdHint(err)
			}
			// Name the key, both subnets of a dual-stack one, whichever
			// one was given.
			name, owner := l.Subnets(), describeOwner(l.Attrs)
			switch {
			case force, garbage, stale:
			case l.Attrs.NodeID == "" && !l.Reserved:
				return fmt.Errorf("refusing to revoke %s: cannot tell whether its owner %s is alive (it was written without a node ID, e.g. by flanneld); use --force if that host is gone", name, owner)
			case alive[l.Attrs.NodeID]:
				return fmt.Errorf("refusing to revoke %s: its owner %s is alive and would re-claim it; stop overlayd there first or use --force", name, owner)
			}
			res := writeResult{Key: reg.LeaseKey(name)}.with(name, l.Attrs)
			if dryRun {
				res.Action = "wouldRevoke"
				res.Alive = aliveText(l.Attrs, alive)
				return res.print(cmd.OutOrStdout(), format, fmt.Sprintf("would revoke %s (owner %s, alive %s)", name, owner, res.Alive))
			}
			ok, err := reg.DeleteIfOwned(ctx, name, l.ModRevision)
			if err != nil {
				return g.etcdHint(err)
			}
			if !ok {
				return fmt.Errorf("%s changed while revoking it (someone else wrote it): look again with `overlayd lease get %s`", name, p)
			}
			res.Action = "revoked"
			return res.print(cmd.OutOrStdout(), format, fmt.Sprintf("revoked %s (owner %s)", name, owner))
		},
	}
	c.Flags().BoolVar(&force, "force", false, "revoke even if the owner is alive or its liveness is unknown")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "show what would be revoked without deleting anything")
	checkFlag(c.Flags(), "force", boolean)
	checkFlag(c.Flags(), "dry-run", boolean)
	return usesEtcd(c)
}

// writeResult is what lease reserve and revoke did: a sentence for people
// (table), its fields for programs (-w json, and -w simple in the order
// action, subnet, IPv6 subnet, public IP, public IPv6, node ID, alive; "-"
// for none, and a value that is "-" quoted).
type writeResult struct {
	Action     string `json:"action"` // reserved, revoked or wouldRevoke (--dry-run)
	Key        string `json:"key"`
	Subnet     string `json:"subnet,omitempty"`
	IPv6Subnet string `json:"ipv6Subnet,omitempty"`
	PublicIP   string `json:"publicIP,omitempty"`
	PublicIPv6 string `json:"publicIPv6,omitempty"`
	NodeID     string `json:"nodeID,omitempty"`
	Alive      string `json:"alive,omitempty"` // --dry-run: yes, no, or unknown (a lease that names no node)
}

func (r writeResult) with(s subnet.Subnets, a subnet.LeaseAttrs) writeResult {
	r.Subnet, r.IPv6Subnet = prefixString(s.IPv4), prefixString(s.IPv6)
	r.PublicIP, r.PublicIPv6, r.NodeID = a.PublicIP, a.PublicIPv6, a.NodeID
	return r
}

func (r writeResult) print(w io.Writer, format printer.Format, sentence string) error {
	if format == printer.Table {
		_, err := fmt.Fprintln(w, sentence)
		return err
	}
	row := []string{r.Action, orNone(r.Subnet), orNone(r.IPv6Subnet), orNone(r.PublicIP), orNone(r.PublicIPv6), orNone(r.NodeID), orNone(r.Alive)}
	return printer.Write(w, format, printer.Output{Rows: [][]string{row}, JSON: r})
}

// unusedByItsHost reports whether l is unused by its host, which holds
// another lease that fits the network config: l is orphaned (it does not
// fit) or a reservation its host never adopted (e.g. a second one for the
// same node). Revoking it takes nothing from the host even if it is alive.
func unusedByItsHost(ctx context.Context, reg *etcdv3.Registry, l subnet.Lease) (bool, error) {
	cfg, _, err := reg.GetConfig(ctx)
	if err != nil || cfg.Orphaned(l, daemon.LeaseCodec(cfg.Backend)) == nil && !l.Unclaimed() {
		return false, nil // without a valid config nothing is known to be orphaned
	}
	snap, err := reg.List(ctx)
	if err != nil {
		return false, err
	}
	for _, other := range snap.Leases {
		if other.Subnets() != l.Subnets() && cfg.Orphaned(other, daemon.LeaseCodec(cfg.Backend)) == nil && other.Attrs.OwnedBy(l.Attrs.NodeID, l.Attrs.PublicAddr(), l.Attrs.PublicAddrV6()) {
			return true, nil
		}
	}
	return false, nil
}
