package kubee2e

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
)

// forwardDrop gives node namespace ns what Docker (and many host
// firewalls) leave on a node: iptables' filter FORWARD chain with policy
// drop (iptables-nft's table "ip filter", as `iptables -P FORWARD DROP`
// makes it). With accept, it also adds the two rules
// Documentation/operations.md tells the operator to add, as `iptables -A
// FORWARD -s <network> -j ACCEPT` and `-d <network>` write them (payload,
// mask, compare, counter, accept), so iptables-nft and kube-proxy read
// them as their own.
func forwardDrop(ns netns.NsHandle, network netip.Prefix, accept bool) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return err
	}
	tbl := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "filter"})
	drop := nftables.ChainPolicyDrop
	ch := c.AddChain(&nftables.Chain{Name: "FORWARD", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	if accept {
		addr := network.Masked().Addr().As4()
		mask := make([]byte, 4)
		for i := range network.Bits() {
			mask[i/8] |= 0x80 >> (i % 8)
		}
		for _, offset := range []uint32{12, 16} { // source, destination
			c.AddRule(&nftables.Rule{Table: tbl, Chain: ch, Exprs: []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
				&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:]},
				&expr.Counter{},
				&expr.Verdict{Kind: expr.VerdictAccept},
			}})
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("filter FORWARD policy drop: %w", err)
	}
	return nil
}
