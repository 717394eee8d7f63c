package masq

import (
	"net/netip"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/overlaynet/overlay/internal/testing/flannelhost"
)

// flanneld's masquerade chain and the jump to it go, in one transaction,
// once ours is in place; another program's rule in the same chain stays,
// and a namespace without flannel's chain is left alone.
func TestRemoveFlannelMasquerade(t *testing.T) {
	m, ns := newMasq(t)
	if tables, err := m.RemoveFlannel(); err != nil || len(tables) != 0 {
		t.Fatalf("RemoveFlannel without flannel's chain = %v, %v; want nothing done", tables, err)
	}
	if err := flannelhost.InstallMasq(ns, clusterNet, netip.MustParsePrefix("10.244.7.0/24")); err != nil {
		t.Fatal(err)
	}
	// Another program's rule in the chain flanneld jumps from.
	c := nftConn(t, ns)
	nat := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: "nat"}
	post := &nftables.Chain{Name: "POSTROUTING", Table: nat}
	c.AddRule(&nftables.Rule{Table: nat, Chain: post, Exprs: []expr.Any{&expr.Counter{}, &expr.Masq{}}})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Ensure(); err != nil {
		t.Fatal(err)
	}
	tables, err := m.RemoveFlannel()
	if err != nil || len(tables) != 1 || tables[0] != "ip nat" {
		t.Fatalf("RemoveFlannel = %v, %v; want [ip nat]", tables, err)
	}
	if present, err := flannelhost.MasqPresent(ns); err != nil || present {
		t.Errorf("flannel's chain or the jump to it is still there (%v)", err)
	}
	rules, err := nftConn(t, ns).GetRules(nat, post)
	if err != nil || len(rules) != 1 {
		t.Errorf("POSTROUTING holds %d rules (%v), want the other program's one", len(rules), err)
	}
	if changed, err := m.Ensure(); err != nil || changed {
		t.Errorf("our table after the removal: changed %v, %v; want intact", changed, err)
	}
}

func TestNewNetworks(t *testing.T) {
	if _, err := NewNetworks(nil); err == nil {
		t.Error("NewNetworks(nil) accepted no network")
	}
	m, err := NewNetworks([]Network{{Prefix: clusterNetV6, Device: "overlay-v6.1"}, {Prefix: clusterNet, Device: "overlay.1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if got := m.Networks(); len(got) != 2 || got[0] != clusterNet || got[1] != clusterNetV6 {
		t.Errorf("Networks() = %v", got)
	}
}
