package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/overlaynet/overlay/internal/leaseadmin"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

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
	return leaseadmin.RefuseUnderlayInside(cfg, append(slices.Clip(leases), snap6.Leases...), nodes, reg.NodeKey, w)
}

// refusedOrHint returns a refusal with what prefixed, or explains an etcd
// failure.
func (g *GlobalFlags) refusedOrHint(what string, err error) error {
	var refused leaseadmin.Refusal
	if errors.As(err, &refused) {
		return fmt.Errorf("%s%w; nothing was stored", what, refused.Err)
	}
	return g.etcdHint(err)
}
