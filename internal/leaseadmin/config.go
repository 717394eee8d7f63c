package leaseadmin

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/codecs"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// Stranded is a lease that fits the stored config but not the new one.
type Stranded struct {
	lease  subnet.Lease
	reason string
}

func (s Stranded) String() string {
	return fmt.Sprintf("%s of %s: %s", s.lease.Subnets(), DescribeOwner(s.lease.Attrs), s.reason)
}

// StrandedLeases returns the leases the change from prev (nil: none
// stored) to next would strand: those next's Orphaned refuses, the same
// check every daemon makes, and — when Backend.Port changes — every
// lease a host has claimed, as hosts on different ports cannot reach
// each other.
func StrandedLeases(prev, next *subnet.Config, leases []subnet.Lease) []Stranded {
	var out []Stranded
	leases = slices.SortedFunc(slices.Values(leases), func(a, b subnet.Lease) int { return a.Subnets().Compare(b.Subnets()) })
	// ParseConfig accepts only backends with a codec; should next's have
	// none, no daemon could read any lease: each is stranded.
	nextCodec, nextErr := codecs.For(next.Backend)
	var prevCodec backend.Codec
	if prev != nil {
		if c, err := codecs.For(prev.Backend); err == nil {
			prevCodec = c
		}
	}
	for _, l := range leases {
		if prevCodec != nil && prev.Orphaned(l, prevCodec) != nil {
			continue // already orphaned: nothing changes for it
		}
		if nextErr != nil {
			out = append(out, Stranded{l, nextErr.Error()})
			continue
		}
		if err := next.Orphaned(l, nextCodec); err != nil {
			out = append(out, Stranded{l, strings.TrimPrefix(err.Error(), subnet.ErrOrphaned.Error()+": ")})
			continue
		}
		if prev != nil && prev.Backend.Port != next.Backend.Port && !l.Unclaimed() {
			out = append(out, Stranded{l, fmt.Sprintf("its host sends VXLAN to port %d, Backend.Port %d would be used by restarted hosts", prev.Backend.Port, next.Backend.Port)})
		}
	}
	return out
}

// StrandedHosts names the hosts of ss for a refusal: the first five, and
// how many more.
func StrandedHosts(ss []Stranded) string {
	var hosts []string
	for _, s := range ss {
		hosts = append(hosts, DescribeOwner(s.lease.Attrs))
	}
	if len(hosts) > 5 {
		hosts = append(hosts[:5], fmt.Sprintf("%d more", len(hosts)-5))
	}
	return strings.Join(hosts, ", ")
}

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
		owner := fmt.Sprintf("%s (lease %s)", DescribeOwner(l.Attrs), l.Subnets())
		add(l.Attrs.PublicIP, owner)
		add(l.Attrs.PublicIPv6, owner)
	}
	for _, n := range nodes {
		owner := fmt.Sprintf("node %s, running (liveness key %s)", subnet.ShownName(n.NodeID), PlainKey(nodeKey(n.NodeID)))
		add(n.PublicIP, owner)
		add(n.PublicIPv6, owner)
	}
	slices.SortFunc(out, func(a, b heldUnderlay) int { return a.addr.Compare(b.addr) })
	return out
}

// RefuseUnderlayInside refuses cfg if its networks hold an underlay
// address of a host that has a lease, a reservation or a liveness key
// (leases: both key layouts; nodes: the liveness keys, named by nodeKey),
// writing one line per address to w.
func RefuseUnderlayInside(cfg *subnet.Config, leases []subnet.Lease, nodes []etcdv3.LiveNode, nodeKey func(string) string, w io.Writer) error {
	held := underlayInside(cfg, leases, nodes, nodeKey)
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
	return Refusef("%s holds %s (listed above): every host would skip the leases of the hosts it holds, as VXLAN to them would be routed into the overlay, and no traffic would reach them; choose a network that holds no host's underlay address (--force does not override this)",
		held[0].network, what)
}
