package masq

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// render returns st as `nft list table` style lines. It is the canonical form
// Ensure compares: the desired state and the state read back from the kernel
// are rendered by this one function, and they are equal exactly when their
// renderings are. Expressions outside the small vocabulary we use are shown
// raw (type and every field), never dropped, so foreign content always makes
// a difference. Rule handles and counter values are not part of the form.
func render(st *state) []string {
	if st == nil || st.table == nil {
		return nil
	}
	t := st.table
	lines := []string{fmt.Sprintf("table %s %s {", FamilyName(t.Family), t.Name)}
	if t.Flags != 0 {
		lines = append(lines, "\tflags "+tableFlags(t.Flags)+";")
	}
	if other := int(t.Use) - len(st.chains); other != 0 {
		lines = append(lines, fmt.Sprintf("\t# %d set(s), map(s), stateful object(s) or flowtable(s) not shown", other))
	}
	chains := slices.Clone(st.chains)
	slices.SortStableFunc(chains, func(a, b chainState) int { return strings.Compare(a.chain.Name, b.chain.Name) })
	for _, c := range chains {
		lines = append(lines, "\tchain "+c.chain.Name+" {")
		if h := chainHeader(c.chain); h != "" {
			lines = append(lines, "\t\t"+h)
		}
		for _, r := range c.rules {
			lines = append(lines, "\t\t"+renderRule(r))
		}
		lines = append(lines, "\t}")
	}
	return append(lines, "}")
}

// renderAll renders each of sts in turn: our table and, during a migration,
// the ip-family table of older versions (nil if there is none).
func renderAll(sts []*state) []string {
	var lines []string
	for _, st := range sts {
		lines = append(lines, render(st)...)
	}
	return lines
}

// FamilyName is an nftables family as nft(8) spells it (ip, ip6, inet, ...).
func FamilyName(f nftables.TableFamily) string {
	switch f {
	case nftables.TableFamilyIPv4:
		return "ip"
	case nftables.TableFamilyIPv6:
		return "ip6"
	case nftables.TableFamilyINet:
		return "inet"
	case nftables.TableFamilyARP:
		return "arp"
	case nftables.TableFamilyBridge:
		return "bridge"
	case nftables.TableFamilyNetdev:
		return "netdev"
	}
	return "family" + strconv.Itoa(int(f))
}

func tableFlags(f uint32) string {
	var names []string
	for _, fl := range []struct {
		bit  uint32
		name string
	}{{unix.NFT_TABLE_F_DORMANT, "dormant"}, {2, "owner"}, {4, "persist"}} {
		if f&fl.bit != 0 {
			names = append(names, fl.name)
			f &^= fl.bit
		}
	}
	if f != 0 {
		names = append(names, fmt.Sprintf("0x%x", f))
	}
	return strings.Join(names, ",")
}

// chainHeader renders a base chain's type, hook, priority and policy, or ""
// for a regular chain.
func chainHeader(c *nftables.Chain) string {
	if c.Hooknum == nil {
		if c.Policy != nil {
			return "policy " + policyName(*c.Policy) + ";"
		}
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "type %s hook %s", c.Type, hookName(c.Table, *c.Hooknum))
	if c.Device != "" {
		fmt.Fprintf(&b, " device %q", c.Device)
	}
	if c.Priority != nil {
		b.WriteString(" priority " + priorityName(*c.Priority))
	}
	b.WriteString(";")
	if c.Policy != nil {
		b.WriteString(" policy " + policyName(*c.Policy) + ";")
	}
	return b.String()
}

func hookName(t *nftables.Table, h nftables.ChainHook) string {
	if t != nil && t.Family == nftables.TableFamilyNetdev {
		switch h {
		case *nftables.ChainHookIngress:
			return "ingress"
		case *nftables.ChainHookEgress:
			return "egress"
		}
	}
	switch h {
	case *nftables.ChainHookPrerouting:
		return "prerouting"
	case *nftables.ChainHookInput:
		return "input"
	case *nftables.ChainHookForward:
		return "forward"
	case *nftables.ChainHookOutput:
		return "output"
	case *nftables.ChainHookPostrouting:
		return "postrouting"
	}
	return "hook" + strconv.Itoa(int(h))
}

func priorityName(p nftables.ChainPriority) string {
	switch p {
	case *nftables.ChainPriorityRaw:
		return "raw"
	case *nftables.ChainPriorityMangle:
		return "mangle"
	case *nftables.ChainPriorityNATDest:
		return "dstnat"
	case *nftables.ChainPriorityFilter:
		return "filter"
	case *nftables.ChainPrioritySecurity:
		return "security"
	case *nftables.ChainPriorityNATSource:
		return "srcnat"
	}
	return strconv.Itoa(int(p))
}

func policyName(p nftables.ChainPolicy) string {
	switch p {
	case nftables.ChainPolicyAccept:
		return "accept"
	case nftables.ChainPolicyDrop:
		return "drop"
	}
	return "policy" + strconv.Itoa(int(p))
}

// renderRule renders one rule's expressions and its comment. User data other
// than exactly one comment is shown in hex.
func renderRule(r *nftables.Rule) string {
	s := renderExprs(r.Exprs)
	if len(r.UserData) == 0 {
		return s
	}
	if c, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok &&
		bytes.Equal(r.UserData, userdata.AppendString(nil, userdata.TypeComment, c)) {
		return s + " comment " + strconv.Quote(c)
	}
	return s + " userdata 0x" + hex.EncodeToString(r.UserData)
}

// operand is a value loaded into a register and not yet compared.
type operand struct {
	name string     // "ip saddr", "ip6 daddr", "oifname", "iifname", "meta nfproto"
	size uint32     // for addresses: 4 or 16 bytes
	mask []byte     // for addresses: the bitwise mask applied, if any
	raw  []expr.Any // the expressions that produced it, for the fallback
}

// renderExprs renders the expression vocabulary of our rules in nft syntax:
// family matches (meta nfproto load, cmp), IPv4 and IPv6 address matches
// (payload load, optional bitwise prefix mask, cmp), interface name matches
// (meta load, cmp), masquerade and verdicts. Anything else, or any of these
// in a shape we do not emit, is rendered raw. The family match is shown,
// unlike in `nft list`, which hides it as the dependency of an address match.
func renderExprs(exprs []expr.Any) string {
	r := exprRenderer{pending: map[uint32]*operand{}}
	for _, e := range exprs {
		if !r.known(e) {
			r.flush()
			r.out = append(r.out, rawExpr(e))
		}
	}
	r.flush()
	return strings.Join(r.out, " ")
}

// exprRenderer holds what renderExprs has rendered so far and the operands
// loaded into registers that no comparison has used yet.
type exprRenderer struct {
	out     []string
	pending map[uint32]*operand
	order   []uint32 // registers with a pending operand, in load order
}

// flush renders the pending operands raw: loads no comparison used.
func (r *exprRenderer) flush() {
	for _, reg := range r.order {
		if op, ok := r.pending[reg]; ok {
			for _, e := range op.raw {
				r.out = append(r.out, rawExpr(e))
			}
		}
	}
	clear(r.pending)
	r.order = r.order[:0]
}

func (r *exprRenderer) load(reg uint32, op *operand) {
	if _, ok := r.pending[reg]; ok {
		r.flush() // a register overwritten before use: show both loads raw
	}
	r.pending[reg] = op
	r.order = append(r.order, reg)
}

func (r *exprRenderer) take(reg uint32) {
	delete(r.pending, reg)
	r.order = slices.DeleteFunc(r.order, func(x uint32) bool { return x == reg })
}

// known renders e if it has a shape we emit, and reports whether it did.
func (r *exprRenderer) known(e expr.Any) bool {
	switch e := e.(type) {
	case *expr.Payload:
		if name := ipField(e); name != "" {
			r.load(e.DestRegister, &operand{name: name, size: e.Len, raw: []expr.Any{e}})
			return true
		}
	case *expr.Meta:
		if name := metaName[e.Key]; name != "" && !e.SourceRegister {
			r.load(e.Register, &operand{name: name, raw: []expr.Any{e}})
			return true
		}
	case *expr.Bitwise:
		if op, ok := r.pending[e.SourceRegister]; ok && op.size != 0 && op.mask == nil &&
			e.DestRegister == e.SourceRegister && e.Len == op.size && len(e.Mask) == int(op.size) &&
			bytes.Equal(e.Xor, make([]byte, op.size)) {
			op.mask = e.Mask
			op.raw = append(op.raw, e)
			return true
		}
	case *expr.Cmp:
		if op, ok := r.pending[e.Register]; ok {
			if s, ok := renderCmp(op, e); ok {
				r.take(e.Register)
				r.out = append(r.out, s)
				return true
			}
		}
	case *expr.Masq:
		if !e.ToPorts && e.RegProtoMin == 0 && e.RegProtoMax == 0 {
			r.flush()
			r.out = append(r.out, masqText(e))
			return true
		}
	case *expr.Verdict:
		if s := verdictName(e); s != "" {
			r.flush()
			r.out = append(r.out, s)
			return true
		}
	}
	return false
}

func masqText(e *expr.Masq) string {
	s := "masquerade"
	if e.Random {
		s += " random"
	}
	if e.FullyRandom {
		s += " fully-random"
	}
	if e.Persistent {
		s += " persistent"
	}
	return s
}

// metaName names the meta keys we load.
var metaName = map[expr.MetaKey]string{
	expr.MetaKeyOIFNAME: "oifname",
	expr.MetaKeyIIFNAME: "iifname",
	expr.MetaKeyNFPROTO: "meta nfproto",
}

// ipField names a whole IPv4 or IPv6 address load, or returns "".
func ipField(e *expr.Payload) string {
	if e.OperationType != expr.PayloadLoad || e.Base != expr.PayloadBaseNetworkHeader ||
		e.CsumType != expr.CsumTypeNone || e.CsumOffset != 0 || e.CsumFlags != 0 || e.SourceRegister != 0 {
		return ""
	}
	switch {
	case e.Len == 4 && e.Offset == ipv4SaddrOffset:
		return "ip saddr"
	case e.Len == 4 && e.Offset == ipv4DaddrOffset:
		return "ip daddr"
	case e.Len == 16 && e.Offset == ipv6SaddrOffset:
		return "ip6 saddr"
	case e.Len == 16 && e.Offset == ipv6DaddrOffset:
		return "ip6 daddr"
	}
	return ""
}

func renderCmp(op *operand, e *expr.Cmp) (string, bool) {
	var rel string
	switch e.Op {
	case expr.CmpOpEq:
	case expr.CmpOpNeq:
		rel = "!= "
	default:
		return "", false
	}
	switch op.name {
	case "oifname", "iifname":
		name, ok := ifName(e.Data)
		if !ok {
			return "", false
		}
		return op.name + " " + rel + strconv.Quote(name), true
	case "meta nfproto":
		if len(e.Data) != 1 {
			return "", false
		}
		return op.name + " " + rel + nfprotoName(e.Data[0]), true
	}
	addr, ok := netip.AddrFromSlice(e.Data)
	if !ok || len(e.Data) != int(op.size) {
		return "", false
	}
	if op.mask == nil {
		return op.name + " " + rel + addr.String(), true
	}
	bits, ok := maskBits(op.mask)
	if !ok {
		return "", false
	}
	p := netip.PrefixFrom(addr, bits)
	if p.Masked().Addr() != addr {
		return "", false // compares bits the mask cleared: never or always true
	}
	return op.name + " " + rel + p.String(), true
}

// ifName decodes an interface name compared as IFNAMSIZ bytes with NUL
// padding; a shorter compare without a NUL is nft's wildcard `"name*"`.
func ifName(data []byte) (string, bool) {
	if i := bytes.IndexByte(data, 0); i >= 0 {
		if len(data) != ifNameSize || !bytes.Equal(data[i:], make([]byte, len(data)-i)) {
			return "", false
		}
		return string(data[:i]), true
	}
	if len(data) == 0 || len(data) >= ifNameSize {
		return "", false
	}
	return string(data) + "*", true
}

// nfprotoName names a meta nfproto value as nft does.
func nfprotoName(v byte) string {
	switch v {
	case unix.NFPROTO_IPV4:
		return "ipv4"
	case unix.NFPROTO_IPV6:
		return "ipv6"
	}
	return strconv.Itoa(int(v))
}

// maskBits returns the prefix length of a contiguous netmask.
func maskBits(mask []byte) (int, bool) {
	for bits := 0; bits <= 8*len(mask); bits++ {
		if bytes.Equal(mask, prefixMask(bits, len(mask))) {
			return bits, true
		}
	}
	return 0, false
}

func verdictName(v *expr.Verdict) string {
	switch v.Kind {
	case expr.VerdictAccept:
		return "accept"
	case expr.VerdictDrop:
		return "drop"
	case expr.VerdictReturn:
		return "return"
	case expr.VerdictContinue:
		return "continue"
	case expr.VerdictJump:
		return "jump " + v.Chain
	case expr.VerdictGoto:
		return "goto " + v.Chain
	}
	return ""
}

// rawExpr renders any expression with its type and every field, e.g.
// `[Counter {Bytes:0 Packets:0}]`, so nothing unknown passes unnoticed.
func rawExpr(e expr.Any) string {
	v := reflect.Indirect(reflect.ValueOf(e))
	if !v.IsValid() {
		return "[nil]"
	}
	return fmt.Sprintf("[%s %+v]", v.Type().Name(), v.Interface())
}
