package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"

	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// heldUnderlay is a host's underlay address that a network config's
// network holds, and what in etcd names it.
type heldUnderlay struct {
	addr    netip.Addr
	network string // as Config.NetworkHolding names it
	owner   string
}

func (h heldUnderlay) String() string {
	return fmt.Sprintf("%s, inside %s, is the underlay address of %s", h.addr, h.network, h.owner)
}

// underlayInside returns the hosts' underlay addresses cfg's networks
// hold: the public addresses of every lease and reservation (leases, of
// both key layouts) and of every liveness key (nodes), each address once,
// in address order. Every host would skip such a host's lease.
func underlayInside(cfg *subnet.Config, leases []subnet.Lease, nodes []etcdv3.LiveNode, nodeKey func(string) string) []heldUnderlay {
	seen := map[netip.Addr]bool{}
	var out []heldUnderlay
	add := func(raw, owner string) {
		ip, err := netip.ParseAddr(raw)
		if err != nil || seen[ip] {
			return
		}
		if network := cfg.NetworkHolding(ip); network != "" {
			seen[ip] = true
			out = append(out, heldUnderlay{ip, network, owner})
		}
	}
	for _, l := range leases {
		owner := fmt.Sprintf("%s (lease %s)", describeOwner(l.Attrs), l.Subnets())
		add(l.Attrs.PublicIP, owner)
		add(l.Attrs.PublicIPv6, owner)
	}
	for _, n := range nodes {
		owner := fmt.Sprintf("node %s, running (liveness key %s)", subnet.ShownName(n.NodeID), plainKey(nodeKey(n.NodeID)))
		add(n.PublicIP, owner)
		add(n.PublicIPv6, owner)
	}
	slices.SortFunc(out, func(a, b heldUnderlay) int { return a.addr.Compare(b.addr) })
	return out
}

// checkUnderlayOutside refuses cfg if its networks hold an underlay
// address of a host that has a lease, a reservation or a liveness key at
// reg's prefix, writing one line per address to w. leases are those
// already listed under reg's subnets/ (nil: list them); the IPv6-only
// layout (subnets6/) and the liveness keys are read here.
func checkUnderlayOutside(ctx context.Context, reg *etcdv3.Registry, cfg *subnet.Config, leases []subnet.Lease, w io.Writer) error {
	if leases == nil {
		snap, err := reg.List(ctx)
		if err != nil {
			return err
		}
		leases = snap.Leases
	}
	snap6, err := reg.For(&subnet.Config{EnableIPv6: true}).List(ctx)
	if err != nil {
		return err
	}
	nodes, err := reg.LiveNodes(ctx)
	if err != nil {
		return err
	}
	held := underlayInside(cfg, append(slices.Clip(leases), snap6.Leases...), nodes, reg.NodeKey)
	if len(held) == 0 {
		return nil
	}
	for _, h := range held {
		fmt.Fprintf(w, "inside: %s\n", h)
	}
	what := "a host's underlay address"
	if len(held) > 1 {
		what = fmt.Sprintf("%d underlay addresses of hosts", len(held))
	}
	return refusef("%s holds %s (listed above): every host would skip the leases of the hosts it holds, as VXLAN to them would be routed into the overlay, and no traffic would reach them; choose a network that holds no host's underlay address (--force does not override this)",
		held[0].network, what)
}

// refusedOrHint returns a refusal with what prefixed, or explains an etcd
// failure.
func (g *GlobalFlags) refusedOrHint(what string, err error) error {
	var refused refusal
	if errors.As(err, &refused) {
		return fmt.Errorf("%s%w; nothing was stored", what, refused.error)
	}
	return g.etcdHint(err)
}
