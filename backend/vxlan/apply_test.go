package vxlan

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"
)

// The outcome of a pass is kept by the peer's index in the plan's desired
// set; track asks by subnet with its own index as a hint, which is the same
// slice in a full pass and a different one (all peers, against the few that
// changed) in an incremental pass.
func TestApplyResultByIndex(t *testing.T) {
	want := []Peer{tSpec(1), tSpec(2), tSpec(3), tSpec(4)}
	r := applyResult{want: want}
	r.record(op{kind: opNeighSet, peer: want[1].Subnet}, 1, nil, 12)
	r.record(op{kind: opRouteSet, peer: want[3].Subnet}, 3, syscall.EPERM, 12)
	gone := Route{Dst: netip.MustParsePrefix("10.244.9.0/24"), Protocol: RouteProtocol}
	r.record(op{kind: opRouteDel, route: gone}, -1, nil, 12)

	for _, c := range []struct {
		name            string
		subnet          netip.Prefix
		hint            int
		touched, failed bool
	}{
		{"written, hint right (full pass)", want[1].Subnet, 1, true, false},
		{"written, hint of another slice (incremental pass)", want[1].Subnet, 7, true, false},
		{"written, no hint", want[1].Subnet, -1, true, false},
		{"untouched", want[0].Subnet, 0, false, false},
		{"failed", want[3].Subnet, 0, false, true},
		{"not in the plan", netip.MustParsePrefix("10.244.5.0/24"), 2, false, false},
		{"no peer", netip.Prefix{}, 0, false, false},
	} {
		if got := r.peerTouched(c.subnet, c.hint); got != c.touched {
			t.Errorf("%s: touched = %v, want %v", c.name, got, c.touched)
		}
		if got := r.peerFailed(c.subnet, c.hint); got != c.failed {
			t.Errorf("%s: failed = %v, want %v", c.name, got, c.failed)
		}
	}
	if r.err == nil || r.err.Failed != 1 || r.err.Total != 12 || !errors.Is(r.err, syscall.EPERM) {
		t.Errorf("err = %v, want 1 of 12 failed with EPERM", r.err)
	}
	if len(r.removed) != 1 || r.removed[0] != gone {
		t.Errorf("removed = %v, want [%v]", r.removed, gone)
	}

	// The guard holds peers back without a write failing: by subnet, in
	// the plan or (a caller's mistake) not.
	r.fail(want[0].Subnet)
	outside := netip.MustParsePrefix("10.244.8.0/24")
	r.fail(outside)
	if !r.peerFailed(want[0].Subnet, 9) || !r.peerFailed(outside, 0) || r.peerFailed(want[2].Subnet, 2) {
		t.Errorf("after fail: failed %v/%v/%v, want true/true/false", r.peerFailed(want[0].Subnet, 9), r.peerFailed(outside, 0), r.peerFailed(want[2].Subnet, 2))
	}

	// A prune is held as an op, not an index: its peer is found by subnet.
	p := plan{want: want}
	p.add(op{kind: opFDBPrune, peer: want[2].Subnet})
	p.add(op{kind: opRouteDel, route: gone})
	if i := p.peerOf(&r, opFDBPrune, 0, p.at(opFDBPrune, 0)); i != 2 {
		t.Errorf("prune of %v: peer index %d, want 2", want[2].Subnet, i)
	}
	if i := p.peerOf(&r, opRouteDel, 0, p.at(opRouteDel, 0)); i != -1 {
		t.Errorf("removal of a stale route: peer index %d, want -1", i)
	}
	p.set(opNeighSet, 3)
	if i := p.peerOf(&r, opNeighSet, 0, p.at(opNeighSet, 0)); i != 3 {
		t.Errorf("neighbour of want[3]: peer index %d, want 3", i)
	}
}
