package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"

	"github.com/spf13/cobra"

	"github.com/overlaynet/overlay/internal/leaseadmin"
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
			s, err := reservedSubnets(args[0], ipv6Subnet)
			if err != nil {
				return err
			}
			if publicIP == "" && publicIPv6 == "" && node == "" {
				return usagef("--public-ip is required: the address of the host the subnet is for (--public-ipv6 in an IPv6-only network, or --node-name alone, if its addresses are not known yet)")
			}
			sess, err := g.open(cmd, true)
			if err != nil {
				return err
			}
			defer sess.close()
			ctx, reg, format := sess.ctx, sess.reg, sess.format
			attrs := subnet.LeaseAttrs{PublicIP: publicIP, PublicIPv6: publicIPv6, BackendType: subnet.DefaultBackendType, NodeID: node}
			for attempt := 0; ; attempt++ {
				err = leaseadmin.Reserve(ctx, reg, s, attrs, force, cmd.ErrOrStderr())
				if !errors.Is(err, etcdv3.ErrConflict) || attempt == 2 {
					break
				}
			}
			var refused leaseadmin.Refusal
			switch {
			case errors.As(err, &refused):
				return refused.Err
			case err != nil:
				return g.etcdHint(err)
			}
			return writeResult{Action: "reserved", Key: reg.LeaseKey(s)}.with(s, attrs).print(cmd.OutOrStdout(), format,
				fmt.Sprintf("reserved %s for %s", s, leaseadmin.DescribeOwner(attrs)))
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
			p, err := parseSubnetArg(args[0])
			if err != nil {
				return err
			}
			sess, err := g.open(cmd, true)
			if err != nil {
				return err
			}
			defer sess.close()
			ctx, reg, format := sess.ctx, sess.reg, sess.format
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
			stale, err := leaseadmin.UnusedByItsHost(ctx, reg, l)
			if err != nil {
				return g.etcdHint(err)
			}
			// Name the key, both subnets of a dual-stack one, whichever
			// one was given.
			name, owner := l.Subnets(), leaseadmin.DescribeOwner(l.Attrs)
			if !force && !garbage && !stale {
				if err := leaseadmin.RefuseRevoke(l, alive); err != nil {
					return err
				}
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
