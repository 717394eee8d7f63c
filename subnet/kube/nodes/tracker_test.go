package nodes

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/subnet"
)

// summary renders a batch as lines in the order a consumer applies them, e.g. "added 10.244.7.0/24
// 198.18.0.7", "removed 10.244.7.0/24", "invalid node/x 10.244.7.0/24:
// …", "deleted node/x".
func summary(b subnet.Batch) []string {
	var out []string
	for _, ev := range b.Events {
		line := ev.Type.String() + " " + ev.Lease.Subnets().String()
		if ev.Type != subnet.Removed {
			line += " " + ev.Lease.Attrs.PublicIP
		}
		out = append(out, line)
	}
	for _, k := range b.Deleted {
		out = append(out, "deleted "+k)
	}
	for _, inv := range b.Invalid {
		if !errors.Is(inv.Err, subnet.ErrInvalidLease) {
			out = append(out, "BAD ERROR TYPE")
		}
		sn := "-"
		if inv.Subnets != (subnet.Subnets{}) {
			sn = inv.Subnets.String()
		}
		out = append(out, fmt.Sprintf("invalid %s %s", inv.Key, sn))
	}
	return out
}

func TestTracker(t *testing.T) {
	a := defaultAnnotations(t)
	tr := NewTracker(a, config(t, ipv4Only), leasedata.Codec{VNI: 1}, "self")
	nodes := map[string]*Node{}
	put := func(n Node) *Node { nodes[n.Name] = &n; return &n }
	lookup := func(name string) *Node { return nodes[name] }
	step := func(name string, n *Node, want ...string) {
		t.Helper()
		if n == nil {
			delete(nodes, name)
		}
		got := summary(tr.Update(name, n, lookup))
		if !slices.Equal(got, want) {
			t.Errorf("update of %s:\n got %q\nwant %q", name, got, want)
		}
	}
	self := put(Node{Name: "self", PodCIDRs: []string{"10.244.1.0/24"}})
	a2 := put(flannelNode("a", "10.244.2.0/24", map[string]string{a.PublicIP: "198.18.0.2"}))
	bare := put(Node{Name: "bare", PodCIDRs: []string{"10.244.3.0/24"}}) // not taking part yet
	snap := tr.Reset([]Node{*a2, *self, *bare})
	if len(snap.Leases) != 1 || snap.Leases[0].Subnet != netip.MustParsePrefix("10.244.2.0/24") || len(snap.Invalid) != 0 {
		t.Fatalf("snapshot = %+v, want node a's lease alone (self is never a peer, bare does not take part)", snap)
	}

	// A status heartbeat, a label: nothing.
	hb := *a2
	hb.ResourceVersion = "99"
	step("a", put(hb))
	step("self", self)
	// The VTEP MAC changed: one change.
	step("a", put(flannelNode("a", "10.244.2.0/24", map[string]string{a.PublicIP: "198.18.0.2", a.BackendData: goodData6})), "changed 10.244.2.0/24 198.18.0.2")
	// The podCIDR changed: the old subnet goes, the new one comes.
	step("a", put(flannelNode("a", "10.244.4.0/24", map[string]string{a.PublicIP: "198.18.0.2"})), "removed 10.244.2.0/24", "added 10.244.4.0/24 198.18.0.2")
	// A node starts taking part.
	step("bare", put(flannelNode("bare", "10.244.3.0/24", nil)), "added 10.244.3.0/24 198.18.0.7")
	// It turns hostile: its subnet is dropped (Invalid on it).
	step("bare", put(flannelNode("bare", "10.244.3.0/24", map[string]string{a.PublicIP: "10.244.9.9"})), "invalid node/bare 10.244.3.0/24")
	// It loses its podCIDR: invalid by name, its subnet released.
	noCIDR := flannelNode("bare", "", nil)
	noCIDR.PodCIDRs = nil
	step("bare", put(noCIDR), "removed 10.244.3.0/24", "invalid node/bare -")
	// It gets one back: the name's mark goes.
	step("bare", put(flannelNode("bare", "10.244.3.0/24", nil)), "added 10.244.3.0/24 198.18.0.7", "deleted node/bare")
	// It stops taking part (annotation removed): it is gone.
	step("bare", put(flannelNode("bare", "10.244.3.0/24", map[string]string{a.Managed: ""})), "removed 10.244.3.0/24")
	// Deleted: gone.
	step("a", nil, "removed 10.244.4.0/24")
	step("a", nil)
}

// TestTrackerSharedPodCIDR: a node naming another's podCIDR (this host's
// included) is refused by name, the holder's peer untouched; when the
// holder lets it go, the other is judged again.
func TestTrackerSharedPodCIDR(t *testing.T) {
	a := defaultAnnotations(t)
	tr := NewTracker(a, config(t, ipv4Only), leasedata.Codec{VNI: 1}, "self")
	nodes := map[string]*Node{}
	put := func(n Node) *Node { nodes[n.Name] = &n; return &n }
	lookup := func(name string) *Node { return nodes[name] }
	self := put(Node{Name: "self", PodCIDRs: []string{"10.244.1.0/24"}})
	first := put(flannelNode("first", "10.244.2.0/24", nil))
	tr.Reset([]Node{*self, *first})

	thief := put(flannelNode("thief", "10.244.1.0/24", nil))
	if got := summary(tr.Update("thief", thief, lookup)); !slices.Equal(got, []string{"invalid node/thief -"}) {
		t.Errorf("a node naming this host's podCIDR: %q, want it invalid by name", got)
	}
	second := put(flannelNode("second", "10.244.2.0/24", map[string]string{a.PublicIP: "198.18.0.9"}))
	got := tr.Update("second", second, lookup)
	if s := summary(got); !slices.Equal(s, []string{"invalid node/second -"}) || !strings.Contains(got.Invalid[0].Err.Error(), "node first's too") {
		t.Errorf("second node on one podCIDR: %q %v, want it invalid by name, naming the holder", s, got.Invalid)
	}
	if tr.Node(subnet.Subnets{IPv4: netip.MustParsePrefix("10.244.2.0/24")}) != "first" {
		t.Error("the holder changed")
	}
	// The holder moves away: the second takes the subnet.
	delete(nodes, "first")
	if got := summary(tr.Update("first", nil, lookup)); !slices.Equal(got, []string{"removed 10.244.2.0/24", "added 10.244.2.0/24 198.18.0.9", "deleted node/second"}) {
		t.Errorf("holder deleted: %q", got)
	}
}
