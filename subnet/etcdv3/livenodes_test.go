package etcdv3

import (
	"slices"
	"testing"
)

// LiveNodes reads every liveness key with the addresses its value names, as
// a claim writes it; a value that does not decode still names its node.
func TestLiveNodesReadsTheHostsAddresses(t *testing.T) {
	f := newFixture(t, testNetwork)
	h := host(1)
	m := f.manager(h, ManagerOptions{})
	if err := m.ClaimNodeID(ctx(t)); err != nil {
		t.Fatal(err)
	}
	defer m.ReleaseClaim(ctx(t))
	if _, err := f.cli.Put(ctx(t), f.reg.Keys.NodeKey("garbage"), "{not json"); err != nil {
		t.Fatal(err)
	}
	nodes, err := f.reg.LiveNodes(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	want := []LiveNode{{NodeID: "garbage"}, {NodeID: h.NodeID, PublicIP: h.PublicIP.String(), Hostname: h.Hostname}}
	if !slices.Equal(nodes, want) {
		t.Errorf("LiveNodes = %+v, want %+v", nodes, want)
	}
}
