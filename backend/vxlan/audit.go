package vxlan

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/overlaynet/overlay/backend"
)

// AuditResult is what Audit found: how the kernel differs from what the
// reconciler would make of a peer set, without changing anything.
type AuditResult struct {
	Device string // the device looked at (overlay.<VNI>, ...)
	// Missing says the device does not exist; nothing else was looked at.
	Missing bool
	// DeviceProblem is how the device differs from the configuration (a
	// pass would fix it in place or recreate it), "" if it matches.
	DeviceProblem string
	// Drift are the writes a reconcile pass would make, each as the entry
	// it concerns; none when the kernel holds exactly the peers.
	Drift []Drift
	// Conflicts are peers whose subnet another program's route holds (the
	// reconciler leaves those alone: the peer is unreachable).
	Conflicts []netip.Prefix
	// Rejected are peers the backend refuses (a duplicate subnet, MAC or
	// next hop, our own address ...), with the reason.
	Rejected map[string]string
	// Peers are the peers a pass would program (the rest), sorted by
	// subnet: those the VXLAN guard admits.
	Peers []Peer
}

// Drift is one kernel entry that differs from the desired peers.
type Drift struct {
	Kind  string       // "route", "neighbour" or "fdb"
	Peer  netip.Prefix // the desired peer the entry belongs to; zero for a stale entry
	Stale bool         // the entry is in the kernel but no peer wants it (else: missing or different)
	Entry string       // the entry the pass would write or delete, as the kernel shows it
}

// Audit compares what the kernel holds on the device cfg describes with
// what a reconcile pass would make of peers, read only: it lists the
// kernel as a full pass does (readKernel, viewOf) and returns the writes
// the reconciler's own diff plans, as Drift. It writes nothing: a device
// that is missing or mismatched is reported, not created or fixed.
func Audit(cfg Config, nl Netlink, peers []Peer) (AuditResult, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return AuditResult{}, err
	}
	if nl == nil {
		return AuditResult{}, errors.New("vxlan: nil Netlink")
	}
	name := cmp.Or(cfg.DeviceName, famDeviceName(cfg.fam, cfg.VNI))
	res := AuditResult{Device: name}
	hw := cfg.VtepMAC
	if hw == nil {
		hw = famVtepMAC(cfg.fam, cfg.NodeID, cfg.VNI)
	}
	mac, _ := backend.MACFrom(hw)
	dev := &device{cfg: cfg, nl: nl, name: name, mac: mac}
	underlay, err := dev.lookupUnderlay()
	if err != nil {
		return res, err
	}
	have, err := nl.LinkByName(name)
	if errors.Is(err, ErrLinkNotFound) {
		res.Missing = true
		return res, nil
	}
	if err != nil {
		return res, fmt.Errorf("look up device %s: %w", name, err)
	}
	addrs, err := retryDump(func() ([]netip.Prefix, error) { return nl.AddrListFamily(have.Index, cfg.fam) })
	if err != nil {
		return res, fmt.Errorf("list addresses of %s: %w", name, err)
	}
	if cfg.checkDevice() == nil {
		wantAddr := netip.PrefixFrom(cfg.OwnSubnet.Addr(), cfg.OwnSubnet.Addr().BitLen())
		res.DeviceProblem = compareDevice(dev.spec(underlay), have, wantAddr, addrs).Reason()
	}
	specs, rejected, _ := validatePeers(peers, cfg.fam, cfg.OwnSubnet, cfg.LocalIP)
	res.Rejected, res.Peers = rejected, specs
	rec := &reconciler{cfg: cfg, nl: nl, dev: dev}
	kernel, err := rec.readKernel(have.Index)
	if err != nil {
		return res, err
	}
	env := diffEnv{Family: cfg.fam, Dev: have.Index, Underlay: underlay.Index, DirectRouting: cfg.DirectRouting}
	p := diff(specs, viewOf(kernel, env, len(specs)))
	res.Conflicts = slices.Clone(p.conflicts)
	for _, o := range p.ops() {
		res.Drift = append(res.Drift, driftOf(o))
	}
	return res, nil
}

// driftOf is a planned write as the entry it concerns.
func driftOf(o op) Drift {
	d := Drift{Peer: o.peer, Stale: o.kind.isDelete() || o.kind == opRoutePrune}
	switch o.kind {
	case opRouteSet, opRouteDel, opRoutePrune:
		d.Kind, d.Entry = "route", o.route.String()
	case opNeighSet, opNeighDel:
		d.Kind, d.Entry = "neighbour", o.neigh.String()
	default:
		d.Kind, d.Entry = "fdb", o.fdb.String()
	}
	return d
}
