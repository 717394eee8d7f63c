package kubee2e

import (
	"bytes"
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
)

// forwardDrop gives node namespace ns what Docker (and many host
// firewalls) leave on a node: the filter FORWARD chain of network's
// family with policy drop (iptables-nft's table "ip filter", as `iptables
// -P FORWARD DROP` makes it; for an IPv6 network ip6tables-nft's "ip6
// filter", as `ip6tables -P FORWARD DROP`). With accept, it also adds the
// two rules Documentation/operations.md tells the operator to add, as
// `iptables -A FORWARD -s <network> -j ACCEPT` and `-d <network>` (or
// ip6tables') write them (payload, mask, compare, counter, accept), so
// iptables-nft and kube-proxy read them as their own.
func forwardDrop(ns netns.NsHandle, network netip.Prefix, accept bool) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return err
	}
	family, name, offsets := forwardFamily(network)
	tbl := c.AddTable(&nftables.Table{Family: family, Name: "filter"})
	drop := nftables.ChainPolicyDrop
	ch := c.AddChain(&nftables.Chain{Name: "FORWARD", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	if accept {
		addr := network.Masked().Addr().AsSlice()
		size := uint32(len(addr))
		mask := make([]byte, size)
		for i := range network.Bits() {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		for _, offset := range offsets {
			c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: size},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: size, Mask: mask, Xor: make([]byte, size)},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr},
				&expr.Counter{},
				&expr.Verdict{Kind: expr.VerdictAccept},
			}})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("%s filter FORWARD policy drop for %s: %w", name, network, err)
	}
	return nil
}

// forwardFamily is the nftables family of network's FORWARD chain, the
// iptables command that writes it, and the offsets of the source and
// destination addresses in that family's network header.
func forwardFamily(network netip.Prefix) (nftables.TableFamily, string, []uint32) {
	if network.Addr().Is6() {
		return nftables.TableFamilyIPv6, "ip6tables", []uint32{8, 24}
	}
	return nftables.TableFamilyIPv4, "iptables", []uint32{12, 16}
}

// forwardAccepted checks that network's FORWARD chain in namespace ns
// still has its policy drop and returns how many packets its two accept
// rules (forwardDrop's) have let through: more than none shows that the
// chain stood in the way of the traffic the matrix sent, so the matrix
// passed through the rules, not around the chain.
func forwardAccepted(ns netns.NsHandle, network netip.Prefix) (uint64, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return 0, err
	}
	family, name, _ := forwardFamily(network)
	tbl := &nftables.Table{Family: family, Name: "filter"}
	ch, err := c.ListChain(tbl, "FORWARD")
	if err != nil {
		return 0, fmt.Errorf("%s filter FORWARD: %w", name, err)
	}
	if ch.Policy == nil || *ch.Policy != nftables.ChainPolicyDrop {
		return 0, fmt.Errorf("%s filter FORWARD: policy is no longer drop", name)
	}
	rules, err := c.GetRules(tbl, ch)
	if err != nil {
		return 0, fmt.Errorf("%s filter FORWARD: %w", name, err)
	}
	addr := network.Masked().Addr().AsSlice()
	var packets uint64
	found := 0
	for _, r := range rules {
		var ours bool
		var counted uint64
		for _, e := range r.Exprs {
			switch e := e.(type) {
			case *expr.Cmp:
				ours = ours || bytes.Equal(e.Data, addr)
			case *expr.Counter:
				counted = e.Packets
			}
		}
		if ours {
			found++
			packets += counted
		}
	}
	if found != 2 {
		return 0, fmt.Errorf("%s filter FORWARD: %d accept rules for %s, want 2", name, found, network)
	}
	return packets, nil
}
