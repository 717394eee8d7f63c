package guard

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/backend"
)

// TableName is the guard's table, in family inet: `nft list table inet
// overlay-guard`.
const TableName = "overlay-guard"

// ruleComment marks the drop rule of each family's chain, recordComment
// the rule before it that records the refused sources.
const (
	ruleComment   = "overlay: VXLAN only from peers"
	recordComment = "overlay: record refused VXLAN sources"
)

// RefusedTimeout is how long a refused source stays in the refused set
// after its last dropped datagram; RefusedMax is how many the set holds.
// A full set records no new source, and still drops its datagrams: the
// recording rule is apart from the dropping one, so an element that cannot
// be added never lets a datagram through.
const (
	RefusedTimeout = 10 * time.Minute
	RefusedMax     = 1024
)

var ourTable = nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}

// famSpec is what the objects of one address family are called and
// match.
type famSpec struct {
	set, chain string
	refused    string // the dynamic set of recently refused sources
	keyType    nftables.SetDatatype
	nfproto    byte
	saddr      uint32 // offset of the source address in the network header
	addrLen    uint32
}

func specOf(fam backend.Family) famSpec {
	if fam == backend.IPv6 {
		return famSpec{set: "peers6", chain: "vxlan6", refused: "refused6", keyType: nftables.TypeIP6Addr, nfproto: unix.NFPROTO_IPV6, saddr: 8, addrLen: 16}
	}
	return famSpec{set: "peers4", chain: "vxlan4", refused: "refused4", keyType: nftables.TypeIPAddr, nfproto: unix.NFPROTO_IPV4, saddr: 12, addrLen: 4}
}

// SetName is the name of fam's set of admitted addresses in TableName
// (peers4, peers6).
func SetName(fam backend.Family) string { return specOf(fam).set }

// RefusedSetName is the name of fam's set of recently refused sources in
// TableName (refused4, refused6).
func RefusedSetName(fam backend.Family) string { return specOf(fam).refused }

// ChainName is the name of fam's chain in TableName (vxlan4, vxlan6).
func ChainName(fam backend.Family) string { return specOf(fam).chain }

func (s famSpec) newSet(table *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: table, Name: s.set, KeyType: s.keyType}
}

func (s famSpec) newRefusedSet(table *nftables.Table) *nftables.Set {
	return &nftables.Set{Table: table, Name: s.refused, KeyType: s.keyType, Dynamic: true, HasTimeout: true, Timeout: RefusedTimeout, Size: RefusedMax}
}

func (s famSpec) newChain(table *nftables.Table) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return &nftables.Chain{
		Name:     s.chain,
		Table:    table,
		Type:     nftables.ChainTypeFilter,
		Hooknum:  nftables.ChainHookPrerouting,
		Priority: nftables.ChainPriorityRaw,
		Policy:   &accept,
	}
}

// matchExprs is what both rules of a family's chain match: UDP to port,
// from an address outside the set, to an address the host receives
// itself: a local, broadcast, anycast or multicast destination (route
// types 2 to 5), not a unicast one it would forward, nor one it has no
// route to (unreachable, blackhole, prohibit: the kernel refuses those
// itself). The source address stays in register 1 for the refused set;
// the set lookup comes before the FIB lookup, so a peer's datagram never
// pays for the second.
func (s famSpec) matchExprs(port uint16, setID uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{s.nfproto}},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_UDP}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.BigEndian.AppendUint16(nil, port)},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: s.saddr, Len: s.addrLen},
		&expr.Lookup{SourceRegister: 1, SetName: s.set, SetID: setID, Invert: true},
		&expr.Fib{Register: 2, FlagDADDR: true, ResultADDRTYPE: true},
		// The FIB's address type is a host-order u32, as nft encodes it;
		// the range compares bytes, which is right for values below 256.
		&expr.Range{Op: expr.CmpOpEq, Register: 2,
			FromData: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL),
			ToData:   binary.NativeEndian.AppendUint32(nil, unix.RTN_MULTICAST)},
	}
}

// recordExprs is the first rule: what matchExprs matches goes into (or
// refreshes its timeout in) the refused set. No verdict: the next rule
// drops.
func (s famSpec) recordExprs(port uint16, setID, refusedID uint32) []expr.Any {
	return append(s.matchExprs(port, setID),
		&expr.Dynset{SrcRegKey: 1, SetName: s.refused, SetID: refusedID, Operation: unix.NFT_DYNSET_OP_UPDATE})
}

// ruleExprs is the second rule: what matchExprs matches is counted and
// dropped.
func (s famSpec) ruleExprs(port uint16, setID uint32) []expr.Any {
	return append(s.matchExprs(port, setID), &expr.Counter{}, &expr.Verdict{Kind: expr.VerdictDrop})
}

func (s famSpec) newRule(table *nftables.Table, chain *nftables.Chain, port uint16, setID uint32) *nftables.Rule {
	return &nftables.Rule{
		Table:    table,
		Chain:    chain,
		Exprs:    s.ruleExprs(port, setID),
		UserData: userdata.AppendString(nil, userdata.TypeComment, ruleComment),
	}
}

func (s famSpec) newRecordRule(table *nftables.Table, chain *nftables.Chain, port uint16, setID, refusedID uint32) *nftables.Rule {
	return &nftables.Rule{
		Table:    table,
		Chain:    chain,
		Exprs:    s.recordExprs(port, setID, refusedID),
		UserData: userdata.AppendString(nil, userdata.TypeComment, recordComment),
	}
}

// ruleText is a rule in a canonical form for comparing what the kernel
// holds with what we write: every expression with its type and fields,
// without what the kernel does not say back (a set's transaction ID) or
// changes by itself (counter values). Anything foreign shows.
func ruleText(r *nftables.Rule) string {
	var b strings.Builder
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Counter:
			b.WriteString("[counter]")
			continue
		case *expr.Lookup:
			l := *e
			l.SetID = 0
			fmt.Fprintf(&b, "[%+v]", l)
			continue
		case *expr.Dynset:
			d := *e
			d.SetID = 0
			fmt.Fprintf(&b, "[dynset %+v]", d)
			continue
		}
		v := reflect.Indirect(reflect.ValueOf(e))
		if !v.IsValid() {
			b.WriteString("[nil]")
			continue
		}
		fmt.Fprintf(&b, "[%s %+v]", v.Type().Name(), v.Interface())
	}
	fmt.Fprintf(&b, " userdata %x", r.UserData)
	return b.String()
}

// counterOf returns the packets counted by the rule's counter.
func counterOf(r *nftables.Rule) (uint64, bool) {
	for _, e := range r.Exprs {
		if c, ok := e.(*expr.Counter); ok {
			return c.Packets, true
		}
	}
	return 0, false
}

// chainRight reports whether a chain read from the kernel has our base
// chain's type, hook, priority and policy.
func chainRight(got, want *nftables.Chain) bool {
	return got.Type == want.Type &&
		got.Hooknum != nil && *got.Hooknum == *want.Hooknum &&
		got.Priority != nil && *got.Priority == *want.Priority &&
		got.Policy != nil && *got.Policy == *want.Policy
}

// setRight reports whether a set read from the kernel is a plain set of
// the family's addresses.
func setRight(got *nftables.Set, s famSpec) bool {
	return got.KeyType.Name == s.keyType.Name && got.KeyType.Bytes == s.keyType.Bytes &&
		!got.IsMap && !got.Interval && !got.Anonymous && !got.Constant && !got.HasTimeout && !got.Concatenation
}

// refusedRight reports whether a set read from the kernel is a dynamic
// set of the family's addresses with timeouts.
func refusedRight(got *nftables.Set, s famSpec) bool {
	return got.KeyType.Name == s.keyType.Name && got.KeyType.Bytes == s.keyType.Bytes &&
		got.Dynamic && got.HasTimeout && !got.IsMap && !got.Interval && !got.Anonymous && !got.Constant && !got.Concatenation
}

// addrOf decodes a set element's key as an address of the family.
func (s famSpec) addrOf(key []byte) (netip.Addr, bool) {
	if len(key) != int(s.addrLen) {
		return netip.Addr{}, false
	}
	a, ok := netip.AddrFromSlice(key)
	return a, ok
}

// elements encodes addrs (of one family) as set elements, their keys in
// one backing array.
func elements(addrs []netip.Addr) []nftables.SetElement {
	out := make([]nftables.SetElement, len(addrs))
	var keys []byte
	if len(addrs) > 0 {
		keys = make([]byte, 0, len(addrs)*addrs[0].BitLen()/8)
	}
	for i, a := range addrs {
		n := len(keys)
		if a.Is4() {
			b := a.As4()
			keys = append(keys, b[:]...)
		} else {
			b := a.As16()
			keys = append(keys, b[:]...)
		}
		out[i] = nftables.SetElement{Key: keys[n:len(keys):len(keys)]}
	}
	return out
}

// addrSet is a set of addresses as the Gate sees its nftables set, each
// with the mark of the last stale that found it kept.
type addrSet map[netip.Addr]uint32

// addMissing adds to s the public addresses of want it lacks and returns
// them, in want's order, each once: what Admit writes. (s itself dedupes:
// no second map for a cold start's thousands.)
func (s addrSet) addMissing(want []backend.Peer) []netip.Addr {
	var out []netip.Addr
	for _, p := range want {
		a := p.PublicIP
		if _, ok := s[a]; !ok {
			s[a] = 0
			out = append(out, a)
		}
	}
	return out
}

// stale marks the addresses of keep that s holds with mark (a value no
// earlier call used) and returns the addresses of s left unmarked,
// sorted: what Settle removes. It allocates nothing when nothing is
// stale.
func (s addrSet) stale(keep []backend.Peer, mark uint32) []netip.Addr {
	for _, p := range keep {
		if _, ok := s[p.PublicIP]; ok {
			s[p.PublicIP] = mark
		}
	}
	var out []netip.Addr
	for a, m := range s {
		if m != mark {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// left returns the public addresses of gone (peers that left or changed)
// that s holds and no peer of keep has, sorted, each once: what Settle
// removes after a pass that was not full. gone is a pass's worth (one
// lease event, a batch), so each is looked for in keep by a scan, which
// costs no hashing and no allocation even with 10,000 peers in keep.
func (s addrSet) left(keep, gone []backend.Peer) []netip.Addr {
	var out []netip.Addr
	for _, g := range gone {
		a := g.PublicIP
		if _, ok := s[a]; !ok || slices.Contains(out, a) {
			continue
		}
		if !slices.ContainsFunc(keep, func(p backend.Peer) bool { return p.PublicIP == a }) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
