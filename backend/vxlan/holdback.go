package vxlan

import (
	"fmt"
	"net/netip"
	"strconv"
)

// AdmitError is the error of a pass whose Gate.Admit failed (the VXLAN
// guard could not add the peers' addresses to its set). The pass went on
// without the peers it held back: their entries were neither written nor
// removed, while peers that left were removed and the entries of the
// others repaired. The pass counts as failed, so it is retried with
// backoff as a full pass, which admits again.
type AdmitError struct {
	Err error // the gate's error
	// Held are the peers held back, sorted by subnet: those reached over
	// VXLAN whose public address no FDB entry of the device sent to yet.
	Held []Peer
}

func (e *AdmitError) Error() string {
	s := "VXLAN guard: admit the peers' addresses: " + e.Err.Error()
	switch len(e.Held) {
	case 0:
		return s + "; no peer held back (this host already sends VXLAN to every peer's address)"
	case 1:
		return fmt.Sprintf("%s; peer %s at %s held back until the guard admits its address, the others programmed", s, e.Held[0].Subnet, e.Held[0].PublicIP)
	}
	return s + "; " + strconv.Itoa(len(e.Held)) + " peers held back until the guard admits their addresses (first " +
		e.Held[0].Subnet.String() + " at " + e.Held[0].PublicIP.String() + "), the others programmed"
}

func (e *AdmitError) Unwrap() error { return e.Err }

// holdBack is what a pass does when the gate failed to admit the peers of
// admit: it keeps out of plan p every write of the
// peers that may not be admitted, and returns them. The rule the gate
// keeps is that this host never starts sending VXLAN to an address the
// guard does not admit (its answers would be dropped); so a peer reached
// over VXLAN whose public address is already the destination of an FDB
// entry on the device — written after an Admit that succeeded, or
// adopted with the guard's set from the previous run — goes ahead (its
// repairs change nothing about whom this host sends to), and so does a
// DirectRouting peer (its traffic is not VXLAN). Any other is held back:
// nothing of its is written, and nothing the device holds for it (its
// route, its neighbour, the FDB entry of the MAC that neighbour names) is
// removed, so a peer that moved keeps its old entries until it is
// admitted. Removals of peers that left, and writes of the other peers,
// stay in the plan.
func (rec *reconciler) holdBack(p *plan, admit []Peer) []Peer {
	v := rec.view
	var sending map[ip16]bool
	var held []Peer
	for _, a := range admit {
		if _, _, _, encap := entriesOf(a, v.env, v.connected); !encap {
			continue
		}
		if sending == nil {
			sending = make(map[ip16]bool, v.fdbsLen())
			for f := range v.allFDBFirsts() {
				sending[packIP(f.Dst)] = true
			}
		}
		if !sending[packIP(a.PublicIP)] {
			held = append(held, a)
		}
	}
	if len(held) == 0 {
		return nil
	}
	isHeld := make(map[netip.Prefix]bool, len(held))
	routes := make(map[netip.Prefix]bool, len(held))
	hops := make(map[netip.Addr]bool, len(held))
	macs := make(map[MAC]bool, len(held))
	for _, h := range held {
		isHeld[h.Subnet] = true
		routes[h.Subnet] = true
		hop := h.Subnet.Addr()
		hops[hop] = true
		if n, ok := v.neigh(hop); ok {
			macs[n.MAC] = true
		}
	}
	for k := range numOpKinds {
		if ix := p.sets[k]; ix != nil {
			kept := ix[:0]
			for _, i := range ix {
				if !isHeld[p.want[i].Subnet] {
					kept = append(kept, i)
				}
			}
			p.sets[k] = kept
		}
		if ops := p.byKind[k]; ops != nil {
			kept := ops[:0]
			for _, o := range ops {
				if !isHeld[o.peer] && !o.touches(routes, hops, macs) {
					kept = append(kept, o)
				}
			}
			p.byKind[k] = kept
		}
	}
	return held
}

// touches reports whether removal o takes away an entry of a held-back
// peer: a route to one of routes, a neighbour at one of hops, an FDB entry
// of one of macs.
func (o op) touches(routes map[netip.Prefix]bool, hops map[netip.Addr]bool, macs map[MAC]bool) bool {
	switch o.kind {
	case opRouteDel, opRoutePrune:
		return routes[o.route.Dst]
	case opNeighDel:
		return hops[o.neigh.IP]
	case opFDBDel, opFDBPrune:
		return macs[o.fdb.MAC]
	}
	return false
}
