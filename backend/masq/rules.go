package masq

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// TableName is the name of our table, in family inet. Versions before dual
// stack kept a table of this name in family ip; Ensure replaces it (see the
// package documentation).
const TableName = "overlay"

// natChainName is the one chain inside our table.
const natChainName = "postrouting"

// Offsets of the source and destination addresses in the IPv4 and IPv6
// headers.
const (
	ipv4SaddrOffset = 12
	ipv4DaddrOffset = 16
	ipv6SaddrOffset = 8
	ipv6DaddrOffset = 24
)

// ifNameSize is IFNAMSIZ: interface names are compared as 16 bytes, NUL padded.
const ifNameSize = 16

// ourTable is the table Ensure keeps; legacyTable is the one versions before
// dual stack kept, which Ensure deletes in the same transaction.
var (
	ourTable    = nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	legacyTable = nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}
)

// ipFamily is what the rules of one address family differ in.
type ipFamily struct {
	table        nftables.TableFamily // the single-family table family
	nfproto      byte                 // the value of meta nfproto for the family's packets
	saddr, daddr uint32               // address offsets in the network header
	multicast    netip.Prefix
}

var (
	familyIPv4 = &ipFamily{nftables.TableFamilyIPv4, unix.NFPROTO_IPV4, ipv4SaddrOffset, ipv4DaddrOffset, netip.MustParsePrefix("224.0.0.0/4")}
	familyIPv6 = &ipFamily{nftables.TableFamilyIPv6, unix.NFPROTO_IPV6, ipv6SaddrOffset, ipv6DaddrOffset, netip.MustParsePrefix("ff00::/8")}
)

// familyOf returns the address family of a valid prefix.
func familyOf(p netip.Prefix) *ipFamily {
	if p.Addr().Is4() {
		return familyIPv4
	}
	return familyIPv6
}

// cluster is one address family's part of the configuration: the cluster
// network (masked) and the VXLAN device carrying it ("" for none).
type cluster struct {
	network netip.Prefix
	device  string
}

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

// desiredState returns the table Ensure installs for clusters (IPv4 first):
// one NAT chain with each family's rules, every rule guarded by meta nfproto
// so that it sees only its own family's packets.
func desiredState(clusters []cluster) *state {
	table := &nftables.Table{Family: ourTable.Family, Name: ourTable.Name}
	accept := nftables.ChainPolicyAccept
	nat := &nftables.Chain{
		Name:     natChainName,
		Table:    table,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource,
		Policy:   &accept,
	}
	var rules []*nftables.Rule
	for _, c := range clusters {
		for _, r := range familyRules(c) {
			rules = append(rules, &nftables.Rule{
				Table:    table,
				Chain:    nat,
				Exprs:    r.exprs,
				UserData: userdata.AppendString(nil, userdata.TypeComment, r.comment),
			})
		}
	}
	// The kernel reports a table's use count: its chains, sets, maps,
	// stateful objects and flowtables. Ours holds the one chain only: no
	// forward chain (see the package documentation), so a forward chain left
	// by an older version is drift that Ensure removes.
	table.Use = 1
	return &state{
		table:  table,
		chains: []chainState{{chain: nat, rules: rules}},
	}
}

// ruleSpec is one rule's expressions and comment.
type ruleSpec struct {
	comment string
	exprs   []expr.Any
}

// familyRules returns the rules for one family's cluster network, flannel's
// masquerade rules in nftables form, each starting with the nfproto guard.
func familyRules(c cluster) []ruleSpec {
	f, n := familyOf(c.network), c.network
	eq, neq := expr.CmpOpEq, expr.CmpOpNeq
	saddr := func(op expr.CmpOp, p netip.Prefix) []expr.Any { return matchPrefix(f.saddr, op, p) }
	daddr := func(op expr.CmpOp, p netip.Prefix) []expr.Any { return matchPrefix(f.daddr, op, p) }
	ret := []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}}
	masquerade := []expr.Any{&expr.Masq{FullyRandom: true}}
	rule := func(comment string, parts ...[]expr.Any) ruleSpec {
		exprs := matchNfproto(f.nfproto)
		for _, p := range parts {
			exprs = append(exprs, p...)
		}
		return ruleSpec{comment, exprs}
	}
	rules := []ruleSpec{
		rule("overlay: pod to pod, no NAT", saddr(eq, n), daddr(eq, n), ret),
		rule("overlay: multicast, no NAT", saddr(eq, n), daddr(eq, f.multicast), ret),
		rule("overlay: pod to outside", saddr(eq, n), masquerade),
	}
	if c.device != "" {
		rules = append(rules, rule("overlay: outside to remote pod",
			saddr(neq, n), daddr(eq, n), matchOifname(c.device), masquerade))
	}
	return rules
}

// matchNfproto compares the packet's family with nfproto, the way nft
// encodes `meta nfproto ipv4` (the dependency it adds, and hides, before
// an `ip saddr` match in an inet table).
func matchNfproto(nfproto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{nfproto}},
	}
}

// matchPrefix compares the address at offset in the network header with p,
// the way nft encodes `ip saddr 10.244.0.0/16` or `ip6 saddr fd00::/48`:
// load the whole address, mask it (omitted for a host prefix), compare.
func matchPrefix(offset uint32, op expr.CmpOp, p netip.Prefix) []expr.Any {
	size := uint32(p.Addr().BitLen() / 8)
	exprs := []expr.Any{&expr.Payload{
		OperationType: expr.PayloadLoad,
		DestRegister:  1,
		Base:          expr.PayloadBaseNetworkHeader,
		Offset:        offset,
		Len:           size,
	}}
	if p.Bits() < p.Addr().BitLen() {
		exprs = append(exprs, &expr.Bitwise{
			SourceRegister: 1,
			DestRegister:   1,
			Len:            size,
			Mask:           prefixMask(p.Bits(), int(size)),
			Xor:            make([]byte, size),
		})
	}
	return append(exprs, &expr.Cmp{Op: op, Register: 1, Data: p.Masked().Addr().AsSlice()})
}

// prefixMask returns the netmask of a prefix length, size bytes long.
func prefixMask(bits, size int) []byte {
	mask := make([]byte, size)
	for i := range mask {
		switch {
		case bits >= 8:
			mask[i], bits = 0xff, bits-8
		case bits > 0:
			mask[i], bits = ^byte(0xff>>bits), 0
		}
	}
	return mask
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
