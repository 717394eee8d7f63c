package vxlan_test

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/backend/vxlan"
)

// Audit reports, without a single write, what a reconcile pass would
// change: nothing on a converged namespace; a route deleted, a neighbour
// of a peer that left, and a wrong MTU after someone changed them by hand;
// a device that is not there.
func TestAuditReportsDriftAndWritesNothing(t *testing.T) {
	f, cfg := fakeHost(t)
	if res, err := vxlan.Audit(cfg, f, peers(2, 3)); err != nil || !res.Missing || res.Device != dev {
		t.Fatalf("Audit before the device exists = %+v, %v; want it missing", res, err)
	}
	b := newBackend(t, cfg, f)
	b.SetPeers(peers(2, 3))
	reconcile(t, b)
	before := f.Writes()

	res, err := vxlan.Audit(cfg, f, peers(2, 3))
	if err != nil || res.Missing || res.DeviceProblem != "" || len(res.Drift) != 0 || len(res.Conflicts) != 0 || len(res.Rejected) != 0 {
		t.Fatalf("Audit of a converged namespace = %+v, %v; want nothing", res, err)
	}

	d, _ := f.LinkByName(dev)
	ext := f.External(false)
	if err := ext.RouteDel(vxlan.Route{Dst: peer(3).Subnet, Gw: peer(3).Subnet.Addr(), LinkIndex: d.Index, OnLink: true,
		Protocol: vxlan.RouteProtocol, Priority: vxlan.RouteMetric(peer(3).Subnet)}); err != nil {
		t.Fatal(err)
	}
	if err := ext.LinkSetMTU(d.Index, 1400); err != nil {
		t.Fatal(err)
	}
	before = f.Writes()
	// Peer 2 has left the leases: its entries are stale.
	res, err = vxlan.Audit(cfg, f, peers(3))
	if err != nil {
		t.Fatal(err)
	}
	if f.Writes() != before {
		t.Errorf("Audit wrote: %v", f.Ops())
	}
	var got []string
	for _, x := range res.Drift {
		s := x.Kind
		if x.Stale {
			s += " stale"
		} else {
			s += " for " + x.Peer.String()
		}
		got = append(got, s)
	}
	want := []string{"route stale", "fdb stale", "neighbour stale", "route for " + peer(3).Subnet.String()}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("drift (-want +got):\n%s\n%+v", d, res.Drift)
	}
	if res.DeviceProblem != "wrong MTU" {
		t.Errorf("device problem %q, want wrong MTU", res.DeviceProblem)
	}

	// A peer the backend refuses is reported with the reason.
	bad := peer(4)
	bad.PublicIP = netip.MustParseAddr("198.18.0.1") // our own
	res, err = vxlan.Audit(cfg, f, append(peers(3), bad))
	if err != nil || len(res.Rejected) != 1 {
		t.Errorf("Audit with a peer using our address: rejected %v, %v", res.Rejected, err)
	}
}
