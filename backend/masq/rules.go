package masq

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
)

// TableName is the name of our table, in family ip.
const TableName = "overlay"

// natChainName is the one chain inside our table.
const natChainName = "postrouting"

// Offsets of the IPv4 source and destination addresses in the header.
const (
	ipv4SaddrOffset = 12
	ipv4DaddrOffset = 16
)

// ifNameSize is IFNAMSIZ: interface names are compared as 16 bytes, NUL padded.
const ifNameSize = 16

var multicast = netip.MustParsePrefix("224.0.0.0/4")

// state is a table with its chains and their rules: the desired state built
// by desiredState, or what the kernel holds as read back by Masq.read.
type state struct {
	table  *nftables.Table
	chains []chainState
}

type chainState struct {
	chain *nftables.Chain
	rules []*nftables.Rule
}

// desiredState returns the table Ensure installs for network (a masked IPv4
// prefix) and, if device is not empty, the VXLAN device name used by the
// "outside to remote pod" rule.
func desiredState(network netip.Prefix, device string) *state {
	table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}
	accept := nftables.ChainPolicyAccept
	nat := &nftables.Chain{
		Name:     natChainName,
		Table:    table,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource,
		Policy:   &accept,
	}
	rule := func(c *nftables.Chain, comment string, exprs ...[]expr.Any) *nftables.Rule {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		return &nftables.Rule{
			Table:    table,
			Chain:    c,
			Exprs:    all,
			UserData: userdata.AppendString(nil, userdata.TypeComment, comment),
		}
	}
	saddr := func(op expr.CmpOp, p netip.Prefix) []expr.Any { return matchPrefix(ipv4SaddrOffset, op, p) }
	daddr := func(op expr.CmpOp, p netip.Prefix) []expr.Any { return matchPrefix(ipv4DaddrOffset, op, p) }
	eq, neq := expr.CmpOpEq, expr.CmpOpNeq
	verdict := func(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }
	masquerade := []expr.Any{&expr.Masq{FullyRandom: true}}

	natRules := []*nftables.Rule{
		rule(nat, "overlay: pod to pod, no NAT", saddr(eq, network), daddr(eq, network), verdict(expr.VerdictReturn)),
		rule(nat, "overlay: multicast, no NAT", saddr(eq, network), daddr(eq, multicast), verdict(expr.VerdictReturn)),
		rule(nat, "overlay: pod to outside", saddr(eq, network), masquerade),
	}
	if device != "" {
		natRules = append(natRules, rule(nat, "overlay: outside to remote pod",
			saddr(neq, network), daddr(eq, network), matchOifname(device), masquerade))
	}
	// The kernel reports a table's use count: its chains, sets, maps,
	// stateful objects and flowtables. Ours holds the one chain only: no
	// forward chain (see the package documentation), so a forward chain left
	// by an older version is drift that Ensure removes.
	table.Use = 1
	return &state{
		table:  table,
		chains: []chainState{{chain: nat, rules: natRules}},
	}
}

// matchPrefix compares the IPv4 address at offset in the network header with
// p, the way nft encodes `ip saddr 10.244.0.0/16`: load, mask (omitted for a
// /32), compare.
func matchPrefix(offset uint32, op expr.CmpOp, p netip.Prefix) []expr.Any {
	exprs := []expr.Any{&expr.Payload{
		OperationType: expr.PayloadLoad,
		DestRegister:  1,
		Base:          expr.PayloadBaseNetworkHeader,
		Offset:        offset,
		Len:           4,
	}}
	if p.Bits() < 32 {
		exprs = append(exprs, &expr.Bitwise{
			SourceRegister: 1,
			DestRegister:   1,
			Len:            4,
			Mask:           prefixMask(p.Bits()),
			Xor:            make([]byte, 4),
		})
	}
	addr := p.Masked().Addr().As4()
	return append(exprs, &expr.Cmp{Op: op, Register: 1, Data: addr[:]})
}

// prefixMask returns the 4-byte netmask of an IPv4 prefix length.
func prefixMask(bits int) []byte {
	m := uint32(0)
	if bits > 0 {
		m = ^uint32(0) << (32 - bits)
	}
	return []byte{byte(m >> 24), byte(m >> 16), byte(m >> 8), byte(m)}
}

// matchOifname compares the output interface's name with name, exactly (the
// full 16 bytes, NUL padded, as nft encodes `oifname "overlay.1"`). By name,
// not index, so the rule survives the device being recreated.
func matchOifname(name string) []expr.Any {
	data := make([]byte, ifNameSize)
	copy(data, name)
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data},
	}
}

// validDeviceName reports why name cannot be an interface name, or nil.
func validDeviceName(name string) error {
	switch {
	case len(name) >= ifNameSize:
		return fmt.Errorf("interface name %q is longer than %d bytes", name, ifNameSize-1)
	case name == "", name == ".", name == "..":
		return fmt.Errorf("interface name %q is not valid", name)
	}
	for _, c := range []byte(name) {
		if c == '/' || c == ':' || c == 0 || c == ' ' || c == '\t' || c == '\n' {
			return fmt.Errorf("interface name %q contains %q", name, c)
		}
	}
	return nil
}
