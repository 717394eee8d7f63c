package vxlan_test

// Passes woken only by a change of the desired peers (see Backend.pass):
// they write exactly the delta and list nothing.

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/backend/vxlan/vxlantest"
)

func TestFakePeerChangesWriteOnlyTheDeltaAndListNothing(t *testing.T) {
	f, cfg := fakeHost(t)
	b := newBackend(t, cfg, f)
	b.SetPeers(peers(2, 3, 4))
	run(t, b)
	waitSynced(t, b, 3)
	f.Ops()
	// Any listing now fails: a pass that listed would not converge.
	for _, op := range []string{"RouteList", "NeighList", "FDBList", "LinkByName", "AddrList"} {
		f.Inject(vxlantest.Fault{Op: op, Err: syscall.EBUSY})
	}
	next := []backend.Peer{peer(2), withMAC(peer(3), 0x33), peer(5)} // 3 changes MAC, 4 leaves, 5 comes
	b.SetPeers(next)
	waitSynced(t, b, 3)
	want := []string{
		"RouteDel 10.244.4.0/24",
		"FDBDel 0e:00:00:00:00:03", "FDBDel 0e:00:00:00:00:04",
		"NeighDel 10.244.4.0",
		"NeighSet 10.244.3.0", "NeighSet 10.244.5.0",
		"FDBSet 0e:00:00:00:99:33", "FDBSet 0e:00:00:00:00:05",
		"RouteReplace 10.244.5.0/24",
	}
	if d := cmp.Diff(want, f.Ops()); d != "" {
		t.Errorf("writes (-want +got):\n%s", d)
	}
	f.ClearFaults()
	checkState(t, f, dev, golden(cfg, next))
}

func TestFakeSilentDriftWaitsForAFullPass(t *testing.T) {
	f, cfg := fakeHost(t)
	b := newBackend(t, cfg, f)
	b.SetPeers(peers(2, 3))
	run(t, b)
	waitSynced(t, b, 2)
	// Someone deletes peer 2's route and nothing tells us.
	if err := f.External(false).RouteDel(vxlan.Route{Dst: peer(2).Subnet}); err != nil {
		t.Fatal(err)
	}
	b.SetPeers(peers(2, 3, 4))
	waitSynced(t, b, 3)
	drifted := golden(cfg, peers(2, 3, 4))
	if s, _ := vxlantest.State(f, dev); s == drifted {
		t.Fatalf("a pass woken by a peer change repaired silent drift; it is meant to list nothing")
	}
	// The next full pass (the periodic resync, here by hand) repairs it.
	if err := b.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	checkState(t, f, dev, drifted)
}

func TestFakeNotifiedDeletionOfAWantedEntryIsRepairedButNotOfAnUnwantedOne(t *testing.T) {
	f, cfg := fakeHost(t)
	cfg.DisableWatch = false
	b := newBackend(t, cfg, f)
	b.SetPeers(peers(2, 3))
	run(t, b)
	waitSynced(t, b, 2)
	passes := b.Status().Passes
	// A route of ours to no desired peer vanishing needs no pass.
	stale := vxlan.Route{Dst: peer(9).Subnet, Gw: peer(9).Subnet.Addr(), LinkIndex: devIndex(t, f), OnLink: true,
		Protocol: vxlan.RouteProtocol, Priority: vxlan.RouteMetric(peer(9).Subnet)}
	ext := f.External(true)
	if err := f.External(false).RouteReplace(stale); err != nil {
		t.Fatal(err)
	}
	if err := ext.RouteDel(stale); err != nil {
		t.Fatal(err)
	}
	// The fake notifies synchronously: had the filter let this one
	// through, a pass would start within moments. (A bounded look, so it
	// can only miss a late pass, never fail a correct filter.)
	for range 10 {
		if b.Status().Passes != passes {
			t.Fatalf("the deletion of a route no desired peer needs woke a pass")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A wanted one vanishing is put back at once.
	if err := ext.RouteDel(vxlan.Route{Dst: peer(3).Subnet}); err != nil {
		t.Fatal(err)
	}
	waitState(t, f, dev, golden(cfg, peers(2, 3)))
	waitFor(t, "the repair pass to finish", func() bool { return b.Status().Passes == passes+1 })
}

func devIndex(t *testing.T, nl vxlan.Netlink) int {
	t.Helper()
	d, err := nl.LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	return d.Index
}
