package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/spf13/cobra"

	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

func newLeaseReserveCommand(g *GlobalFlags) *cobra.Command {
	var publicIP, node string
	c := &cobra.Command{
		Use:   "reserve SUBNET --public-ip IP [--node-name NAME]",
		Short: "Reserve a subnet for a host: a lease that never expires, adopted by the host with that public IP (or node name)",
		Long: `Reserve a subnet for a host: a key without TTL that the host with that
node name (or, without --node-name, that public IP) adopts when it starts.

The reservation is checked as every daemon checks what it reads: the subnet
must be a subnet of the network, the public IP a unicast address outside it,
the node name one overlayd accepts; and a host has one subnet, so a node or
public IP that already holds a lease or reservation is refused.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := parseSubnetArg(args[0])
			if err != nil {
				return err
			}
			if publicIP == "" {
				return usagef("--public-ip is required: the address of the host the subnet is for")
			}
			ctx, reg, done, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			attrs := subnet.LeaseAttrs{PublicIP: publicIP, BackendType: subnet.DefaultBackendType, NodeID: node}
			for attempt := 0; ; attempt++ {
				err = reserve(ctx, reg, p, attrs)
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
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "reserved %s for %s\n", p, describeOwner(publicIP, node))
			return err
		},
	}
	c.Flags().StringVar(&publicIP, "public-ip", "", "public IP of the host the subnet is reserved for (required)")
	c.Flags().StringVar(&node, "node-name", "", "node ID of the host (matches before the public IP)")
	checkFlag(c.Flags(), "public-ip", hostIPv4)
	checkFlag(c.Flags(), "node-name", nodeName)
	return usesEtcd(c)
}

// refusal is a reservation refused for what it is, not for an etcd failure.
type refusal struct{ error }

func refusef(format string, args ...any) error { return refusal{fmt.Errorf(format, args...)} }

// reserve writes a reservation after checking it exactly as a daemon
// checks what it reads — the value is encoded, decoded and judged by
// Config.CheckClaim — and that no lease or reservation already names the
// host. The write succeeds only if no lease changed since the check.
func reserve(ctx context.Context, reg *etcdv3.Registry, p netip.Prefix, attrs subnet.LeaseAttrs) error {
	snap, err := reg.List(ctx)
	if err != nil {
		return err
	}
	cfg, _, err := reg.GetConfig(ctx)
	if err != nil {
		return err
	}
	value, err := attrs.Marshal()
	if err != nil {
		return err
	}
	l := subnet.Lease{Subnet: p, Reserved: true}
	if l.Attrs, err = subnet.DecodeAttrs(value); err == nil {
		err = cfg.CheckClaim(l)
	}
	switch {
	case errors.Is(err, subnet.ErrOrphaned):
		return refusef("cannot reserve %s: daemons would skip it: %w: pick a /%d inside %s", p, err, cfg.SubnetLen, cfg.Network)
	case err != nil:
		return refusef("cannot reserve %s: daemons would skip it: %w: pass the host's underlay address as --public-ip", p, err)
	}
	for _, other := range snap.Leases {
		var same string
		switch {
		case other.Subnet == p:
			continue // reported as taken by the write
		case attrs.NodeID != "" && other.Attrs.NodeID == attrs.NodeID:
			same = "node " + attrs.NodeID
		case other.Attrs.PublicAddr() == l.Attrs.PublicAddr():
			same = "public IP " + attrs.PublicIP
		default:
			continue
		}
		return refusef("cannot reserve %s: %s already has %s (key %s): a host uses one subnet; revoke that one first (`overlayd lease revoke %s`)",
			p, same, other.Subnet, reg.LeaseKey(other.Subnet), other.Subnet)
	}
	_, err = reg.Reserve(ctx, p, attrs, snap.Revision)
	if errors.Is(err, etcdv3.ErrTaken) {
		return refusef("cannot reserve %s: it is already leased (see `overlayd lease get %s`; revoke it first)", p, p)
	}
	return err
}

func describeOwner(ip, node string) string {
	if ip == "" && node == "" {
		return "unknown: the value names no host"
	}
	if node != "" {
		return fmt.Sprintf("node %s (%s)", node, ip)
	}
	return ip
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
			ctx, reg, done, err := g.connect(cmd)
			if err != nil {
				return err
			}
			defer done()
			l, err := reg.Get(ctx, p)
			// A value that names no host protects nobody's subnet.
			garbage := errors.Is(err, subnet.ErrInvalidLease) || !l.Attrs.NamesAHost()
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
			owner := describeOwner(l.Attrs.PublicIP, l.Attrs.NodeID)
			switch {
			case force, garbage, stale:
			case l.Attrs.NodeID == "" && !l.Reserved:
				return fmt.Errorf("refusing to revoke %s: cannot tell whether its owner %s is alive (it was written without a node ID, e.g. by flanneld); use --force if that host is gone", p, owner)
			case alive[l.Attrs.NodeID]:
				return fmt.Errorf("refusing to revoke %s: its owner %s is alive and would re-claim it; stop overlayd there first or use --force", p, owner)
			}
			if dryRun {
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "would revoke %s (owner %s, alive %s)\n", p, owner, yesNo(alive[l.Attrs.NodeID]))
				return err
			}
			ok, err := reg.DeleteIfOwned(ctx, p, l.ModRevision)
			if err != nil {
				return g.etcdHint(err)
			}
			if !ok {
				return fmt.Errorf("%s changed while revoking it (someone else wrote it): look again with `overlayd lease get %s`", p, p)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "revoked %s (owner %s)\n", p, owner)
			return err
		},
	}
	c.Flags().BoolVar(&force, "force", false, "revoke even if the owner is alive or its liveness is unknown")
	c.Flags().BoolVar(&dryRun, "dry-run", false, "show what would be revoked without deleting anything")
	checkFlag(c.Flags(), "force", boolean)
	checkFlag(c.Flags(), "dry-run", boolean)
	return usesEtcd(c)
}

// unusedByItsHost reports whether l is unused by its host, which holds
// another lease that fits the network config: l is orphaned (it does not
// fit) or a reservation its host never adopted (e.g. a second one for the
// same node). Revoking it takes nothing from the host even if it is alive.
func unusedByItsHost(ctx context.Context, reg *etcdv3.Registry, l subnet.Lease) (bool, error) {
	cfg, _, err := reg.GetConfig(ctx)
	if err != nil || cfg.Orphaned(l) == nil && !l.Unclaimed() {
		return false, nil // without a valid config nothing is known to be orphaned
	}
	snap, err := reg.List(ctx)
	if err != nil {
		return false, err
	}
	for _, other := range snap.Leases {
		if other.Subnet != l.Subnet && cfg.Orphaned(other) == nil && other.Attrs.OwnedBy(l.Attrs.NodeID, l.Attrs.PublicAddr()) {
			return true, nil
		}
	}
	return false, nil
}
