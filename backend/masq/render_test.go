package masq

import (
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// The rules of our table, by family, as Rules renders them.
const (
	goldenHead = "table inet overlay {\n\tchain postrouting {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n"
	goldenTail = "\t}\n}"

	goldenV4Rules = `		meta nfproto ipv4 ip saddr 10.244.0.0/16 ip daddr 10.244.0.0/16 return comment "overlay: pod to pod, no NAT"
		meta nfproto ipv4 ip saddr 10.244.0.0/16 ip daddr 224.0.0.0/4 return comment "overlay: multicast, no NAT"
		meta nfproto ipv4 ip saddr 10.244.0.0/16 masquerade fully-random comment "overlay: pod to outside"
`
	goldenV4DeviceRule = `		meta nfproto ipv4 ip saddr != 10.244.0.0/16 ip daddr 10.244.0.0/16 oifname "overlay.1" masquerade fully-random comment "overlay: outside to remote pod"
`
	goldenV6Rules = `		meta nfproto ipv6 ip6 saddr fd00:10:244::/48 ip6 daddr fd00:10:244::/48 return comment "overlay: pod to pod, no NAT"
		meta nfproto ipv6 ip6 saddr fd00:10:244::/48 ip6 daddr ff00::/8 return comment "overlay: multicast, no NAT"
		meta nfproto ipv6 ip6 saddr fd00:10:244::/48 masquerade fully-random comment "overlay: pod to outside"
`
	goldenV6DeviceRule = `		meta nfproto ipv6 ip6 saddr != fd00:10:244::/48 ip6 daddr fd00:10:244::/48 oifname "overlay-v6.1" masquerade fully-random comment "overlay: outside to remote pod"
`
)

// goldenWithDevice is the table for 10.244.0.0/16 with WithOverlayDevice("overlay.1").
const goldenWithDevice = goldenHead + goldenV4Rules + goldenV4DeviceRule + goldenTail

// goldenNoDevice is the table for 10.244.0.0/16 without an overlay device.
const goldenNoDevice = goldenHead + goldenV4Rules + goldenTail

// goldenV6WithDevice is the table for fd00:10:244::/48 alone, with
// WithIPv6OverlayDevice("overlay-v6.1").
const goldenV6WithDevice = goldenHead + goldenV6Rules + goldenV6DeviceRule + goldenTail

// goldenDualStack is the table for both networks with both devices.
const goldenDualStack = goldenHead + goldenV4Rules + goldenV4DeviceRule + goldenV6Rules + goldenV6DeviceRule + goldenTail

// goldenPrevious is the table the version before dual stack installed for
// 10.244.0.0/16 and overlay.1: family ip, no nfproto guard.
const goldenPrevious = `table ip overlay {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 10.244.0.0/16 ip daddr 10.244.0.0/16 return comment "overlay: pod to pod, no NAT"
		ip saddr 10.244.0.0/16 ip daddr 224.0.0.0/4 return comment "overlay: multicast, no NAT"
		ip saddr 10.244.0.0/16 masquerade fully-random comment "overlay: pod to outside"
		ip saddr != 10.244.0.0/16 ip daddr 10.244.0.0/16 oifname "overlay.1" masquerade fully-random comment "overlay: outside to remote pod"
	}
}`

// goldenLegacyWithDevice is goldenPrevious as still older versions
// installed it, with a forward chain that could not change any packet's
// verdict.
const goldenLegacyWithDevice = `table ip overlay {
	chain forward {
		type filter hook forward priority filter; policy accept;
		ip saddr 10.244.0.0/16 accept comment "overlay: forward from pods"
		ip daddr 10.244.0.0/16 accept comment "overlay: forward to pods"
	}
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 10.244.0.0/16 ip daddr 10.244.0.0/16 return comment "overlay: pod to pod, no NAT"
		ip saddr 10.244.0.0/16 ip daddr 224.0.0.0/4 return comment "overlay: multicast, no NAT"
		ip saddr 10.244.0.0/16 masquerade fully-random comment "overlay: pod to outside"
		ip saddr != 10.244.0.0/16 ip daddr 10.244.0.0/16 oifname "overlay.1" masquerade fully-random comment "overlay: outside to remote pod"
	}
}`

// previousState is the table the version before dual stack installed for
// an IPv4 network, built as that version built it: family ip, the rules
// without an nfproto guard. Frozen here, so the migration tests keep
// starting from what hosts really hold whatever the current rules become.
func previousState(network netip.Prefix, device string) *state {
	table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}
	accept := nftables.ChainPolicyAccept
	nat := &nftables.Chain{
		Name:     "postrouting",
		Table:    table,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource,
		Policy:   &accept,
	}
	rule := func(comment string, exprs ...[]expr.Any) *nftables.Rule {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		return &nftables.Rule{Table: table, Chain: nat, Exprs: all, UserData: userdata.AppendString(nil, userdata.TypeComment, comment)}
	}
	saddr := func(op expr.CmpOp, p netip.Prefix) []expr.Any { return matchPrefix(12, op, p) }
	daddr := func(op expr.CmpOp, p netip.Prefix) []expr.Any { return matchPrefix(16, op, p) }
	eq, neq := expr.CmpOpEq, expr.CmpOpNeq
	ret := []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}}
	masquerade := []expr.Any{&expr.Masq{FullyRandom: true}}
	rules := []*nftables.Rule{
		rule("overlay: pod to pod, no NAT", saddr(eq, network), daddr(eq, network), ret),
		rule("overlay: multicast, no NAT", saddr(eq, network), daddr(eq, netip.MustParsePrefix("224.0.0.0/4")), ret),
		rule("overlay: pod to outside", saddr(eq, network), masquerade),
	}
	if device != "" {
		rules = append(rules, rule("overlay: outside to remote pod", saddr(neq, network), daddr(eq, network), matchOifname(device), masquerade))
	}
	table.Use = 1
	return &state{table: table, chains: []chainState{{chain: nat, rules: rules}}}
}

// installState adds st to the kernel with c, as the version that built it
// did: the table, its chains, their rules, in one batch.
func installState(t *testing.T, c *nftables.Conn, st *state) {
	t.Helper()
	c.AddTable(st.table)
	for _, ch := range st.chains {
		c.AddChain(ch.chain)
		for _, r := range ch.rules {
			c.AddRule(r)
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("install table %s %s: %v", FamilyName(st.table.Family), st.table.Name, err)
	}
}

// legacyForwardChain returns the forward chain older versions put in table,
// for network, with its two rules.
func legacyForwardChain(table *nftables.Table, network netip.Prefix) chainState {
	accept := nftables.ChainPolicyAccept
	ch := &nftables.Chain{
		Name:     "forward",
		Table:    table,
		Type:     nftables.ChainTypeFilter,
		Hooknum:  nftables.ChainHookForward,
		Priority: nftables.ChainPriorityFilter,
		Policy:   &accept,
	}
	rule := func(comment string, offset uint32) *nftables.Rule {
		return &nftables.Rule{
			Table:    table,
			Chain:    ch,
			Exprs:    append(matchPrefix(offset, expr.CmpOpEq, network), &expr.Verdict{Kind: expr.VerdictAccept}),
			UserData: userdata.AppendString(nil, userdata.TypeComment, comment),
		}
	}
	return chainState{chain: ch, rules: []*nftables.Rule{
		rule("overlay: forward from pods", ipv4SaddrOffset),
		rule("overlay: forward to pods", ipv4DaddrOffset),
	}}
}

// legacyState is the table still older versions installed: the previous
// state plus the forward chain, listed first as they added it.
func legacyState(network netip.Prefix, device string) *state {
	st := previousState(network, device)
	st.table.Use++
	st.chains = append([]chainState{legacyForwardChain(st.table, network)}, st.chains...)
	return st
}

func TestRenderLegacy(t *testing.T) {
	n := netip.MustParsePrefix("10.244.0.0/16")
	for _, tc := range []struct {
		name string
		st   *state
		want string
	}{
		{"the previous version's table", previousState(n, "overlay.1"), goldenPrevious},
		{"with the forward chain of older versions", legacyState(n, "overlay.1"), goldenLegacyWithDevice},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, strings.Join(render(tc.st), "\n")); diff != "" {
				t.Errorf("rendering (-want +got):\n%s", diff)
			}
		})
	}
}

// Ensure compares our table followed by the legacy one.
func TestRenderAll(t *testing.T) {
	n := netip.MustParsePrefix("10.244.0.0/16")
	if got := renderAll(nil); got != nil {
		t.Errorf("renderAll(nil) = %q, want nil", got)
	}
	got := strings.Join(renderAll([]*state{desiredState([]cluster{{n, "overlay.1"}}), previousState(n, "overlay.1")}), "\n")
	if diff := cmp.Diff(goldenWithDevice+"\n"+goldenPrevious, got); diff != "" {
		t.Errorf("renderAll (-want +got):\n%s", diff)
	}
}

func TestRenderDesired(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")
	dev4, dev6 := WithOverlayDevice("overlay.1"), WithIPv6OverlayDevice("overlay-v6.1")
	for _, tc := range []struct {
		name    string
		network netip.Prefix
		opts    []Option
		want    string
	}{
		{"cluster network with the VXLAN device", v4, []Option{dev4}, goldenWithDevice},
		{"cluster network without a device", v4, nil, goldenNoDevice},
		{"host bits are ignored", netip.MustParsePrefix("10.244.7.9/16"), nil, goldenNoDevice},
		{"a /8 network", netip.MustParsePrefix("10.0.0.0/8"), nil, strings.ReplaceAll(goldenNoDevice, "10.244.0.0/16", "10.0.0.0/8")},
		{"IPv6 only with the VXLAN device", v6, []Option{dev6}, goldenV6WithDevice},
		{"IPv6 only without a device", v6, nil, goldenHead + goldenV6Rules + goldenTail},
		{"IPv6 host bits are ignored", netip.MustParsePrefix("fd00:10:244:7::9/48"), []Option{dev6}, goldenV6WithDevice},
		{"dual stack", v4, []Option{dev4, WithNetwork(v6), dev6}, goldenDualStack},
		{"dual stack given IPv6 first: IPv4 rules still come first", v6, []Option{dev6, WithNetwork(v4), dev4}, goldenDualStack},
		{"dual stack without devices", v4, []Option{WithNetwork(v6)}, goldenHead + goldenV4Rules + goldenV6Rules + goldenTail},
		{"dual stack with the IPv6 device only", v4, []Option{WithNetwork(v6), dev6}, goldenHead + goldenV4Rules + goldenV6Rules + goldenV6DeviceRule + goldenTail},
		{"an IPv6 /128", netip.MustParsePrefix("fd00::1/128"), nil, strings.ReplaceAll(goldenHead+goldenV6Rules+goldenTail, "fd00:10:244::/48", "fd00::1")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.network, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			st := desiredState(m.clusters)
			if diff := cmp.Diff(tc.want, strings.Join(render(st), "\n")); diff != "" {
				t.Errorf("rendering (-want +got):\n%s", diff)
			}
		})
	}
}

func TestNetworks(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")
	for _, tc := range []struct {
		name    string
		network netip.Prefix
		opts    []Option
		want    []netip.Prefix
	}{
		{"IPv4", v4, nil, []netip.Prefix{v4}},
		{"IPv6", netip.MustParsePrefix("fd00:10:244:1::/48"), nil, []netip.Prefix{v6}},
		{"dual stack", v4, []Option{WithNetwork(v6)}, []netip.Prefix{v4, v6}},
		{"dual stack, IPv6 first", v6, []Option{WithNetwork(v4)}, []netip.Prefix{v4, v6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.network, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if diff := cmp.Diff(tc.want, m.Networks(), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
				t.Errorf("Networks (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRenderExprs(t *testing.T) {
	n := netip.MustParsePrefix("10.244.0.0/16")
	load := func(off uint32) *expr.Payload {
		return &expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}
	}
	load6 := func(off uint32) *expr.Payload {
		return &expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 16}
	}
	n6 := netip.MustParsePrefix("fd00:10:244::/48")
	cmpData := func(b ...byte) *expr.Cmp { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b} }
	for _, tc := range []struct {
		name  string
		exprs []expr.Any
		want  string
	}{
		{"prefix match", matchPrefix(ipv4SaddrOffset, expr.CmpOpEq, n), "ip saddr 10.244.0.0/16"},
		{"negated prefix match", matchPrefix(ipv4DaddrOffset, expr.CmpOpNeq, n), "ip daddr != 10.244.0.0/16"},
		{"a /32 has no mask", matchPrefix(ipv4SaddrOffset, expr.CmpOpEq, netip.MustParsePrefix("10.244.1.5/32")), "ip saddr 10.244.1.5"},
		{"IPv6 prefix match", matchPrefix(ipv6SaddrOffset, expr.CmpOpEq, n6), "ip6 saddr fd00:10:244::/48"},
		{"negated IPv6 prefix match", matchPrefix(ipv6DaddrOffset, expr.CmpOpNeq, n6), "ip6 daddr != fd00:10:244::/48"},
		{"an IPv6 /128 has no mask", matchPrefix(ipv6DaddrOffset, expr.CmpOpEq, netip.MustParsePrefix("fd00::1/128")), "ip6 daddr fd00::1"},
		{"an IPv6 prefix not on a byte boundary", matchPrefix(ipv6SaddrOffset, expr.CmpOpEq, netip.MustParsePrefix("fd00:10:240::/44")), "ip6 saddr fd00:10:240::/44"},
		{"family guards", append(matchNfproto(unix.NFPROTO_IPV4), matchNfproto(unix.NFPROTO_IPV6)...), "meta nfproto ipv4 meta nfproto ipv6"},
		{"another family by number", []expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{7}}}, "meta nfproto != 7"},
		{
			"a family compare of the wrong size is raw",
			[]expr.Any{&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, cmpData(2, 0)},
			"[Meta {Key:15 SourceRegister:false Register:1}] [Cmp {Op:0 Register:1 Data:[2 0]}]",
		},
		{
			"an IPv6 load compared with an IPv4 address is raw",
			[]expr.Any{load6(8), cmpData(10, 0, 0, 1)},
			"[Payload {OperationType:0 DestRegister:1 SourceRegister:0 Base:1 Offset:8 Len:16 CsumType:0 CsumOffset:0 CsumFlags:0}] [Cmp {Op:0 Register:1 Data:[10 0 0 1]}]",
		},
		{
			"an IPv6 load masked with an IPv4 mask is raw",
			[]expr.Any{load6(8), &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: prefixMask(16, 4), Xor: make([]byte, 4)}, cmpData(10, 244, 0, 0)},
			"[Payload {OperationType:0 DestRegister:1 SourceRegister:0 Base:1 Offset:8 Len:16 CsumType:0 CsumOffset:0 CsumFlags:0}] " +
				"[Bitwise {SourceRegister:1 DestRegister:1 Len:4 Mask:[255 255 0 0] Xor:[0 0 0 0]}] " +
				"[Cmp {Op:0 Register:1 Data:[10 244 0 0]}]",
		},
		{
			"a 16-byte load at the IPv4 source offset is raw",
			[]expr.Any{load6(12), cmpData(make([]byte, 16)...)},
			"[Payload {OperationType:0 DestRegister:1 SourceRegister:0 Base:1 Offset:12 Len:16 CsumType:0 CsumOffset:0 CsumFlags:0}] [Cmp {Op:0 Register:1 Data:[0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0]}]",
		},
		{"exact interface name", matchOifname("overlay.1"), `oifname "overlay.1"`},
		{"wildcard interface name", []expr.Any{&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1}, cmpData('v', 'e', 't', 'h')}, `iifname "veth*"`},
		{"masquerade flags", []expr.Any{&expr.Masq{Random: true, Persistent: true}}, "masquerade random persistent"},
		{"verdicts", []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: "x"}, &expr.Verdict{Kind: expr.VerdictDrop}}, "jump x drop"},
		{
			"a counter is shown raw",
			[]expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}},
			"[Counter {Bytes:0 Packets:0}] accept",
		},
		{
			"non-contiguous mask falls back to raw",
			[]expr.Any{load(12), &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 0, 255, 0}, Xor: make([]byte, 4)}, cmpData(10, 0, 1, 0)},
			"[Payload {OperationType:0 DestRegister:1 SourceRegister:0 Base:1 Offset:12 Len:4 CsumType:0 CsumOffset:0 CsumFlags:0}] " +
				"[Bitwise {SourceRegister:1 DestRegister:1 Len:4 Mask:[255 0 255 0] Xor:[0 0 0 0]}] " +
				"[Cmp {Op:0 Register:1 Data:[10 0 1 0]}]",
		},
		{
			"compare of bits the mask cleared falls back to raw",
			[]expr.Any{load(12), &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: prefixMask(16, 4), Xor: make([]byte, 4)}, cmpData(10, 244, 0, 1)},
			"[Payload {OperationType:0 DestRegister:1 SourceRegister:0 Base:1 Offset:12 Len:4 CsumType:0 CsumOffset:0 CsumFlags:0}] " +
				"[Bitwise {SourceRegister:1 DestRegister:1 Len:4 Mask:[255 255 0 0] Xor:[0 0 0 0]}] " +
				"[Cmp {Op:0 Register:1 Data:[10 244 0 1]}]",
		},
		{
			"a load never compared is shown raw",
			[]expr.Any{load(16), &expr.Verdict{Kind: expr.VerdictAccept}},
			"[Payload {OperationType:0 DestRegister:1 SourceRegister:0 Base:1 Offset:16 Len:4 CsumType:0 CsumOffset:0 CsumFlags:0}] accept",
		},
		{
			"other payload offsets are raw",
			[]expr.Any{load(9), cmpData(10, 0, 0, 1)},
			"[Payload {OperationType:0 DestRegister:1 SourceRegister:0 Base:1 Offset:9 Len:4 CsumType:0 CsumOffset:0 CsumFlags:0}] [Cmp {Op:0 Register:1 Data:[10 0 0 1]}]",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := renderExprs(tc.exprs); got != tc.want {
				t.Errorf("renderExprs:\n got %s\nwant %s", got, tc.want)
			}
		})
	}
}

func TestRenderRuleUserData(t *testing.T) {
	comment := userdata.AppendString(nil, userdata.TypeComment, "hello")
	for _, tc := range []struct {
		name string
		ud   []byte
		want string
	}{
		{"no user data", nil, "accept"},
		{"a comment", comment, `accept comment "hello"`},
		{"a comment and more", append(comment, 7, 1, 0), "accept userdata 0x000668656c6c6f00070100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &nftables.Rule{Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}, UserData: tc.ud}
			if got := renderRule(r); got != tc.want {
				t.Errorf("renderRule = %s, want %s", got, tc.want)
			}
		})
	}
}

// Drift the canonical form must notice, compared with the desired state.
func TestRenderNoticesDrift(t *testing.T) {
	n := netip.MustParsePrefix("10.244.0.0/16")
	fresh := func() *state {
		return desiredState([]cluster{{n, "overlay.1"}, {netip.MustParsePrefix("fd00:10:244::/48"), "overlay-v6.1"}})
	}
	v6Masq := func(s *state) *nftables.Rule { return s.chains[0].rules[6] }
	want := render(fresh())
	for _, tc := range []struct {
		name   string
		tamper func(*state)
	}{
		{"table dormant", func(s *state) { s.table.Flags = 1 }},
		{"a foreign set in the table", func(s *state) { s.table.Use = 2 }},
		{"chain policy drop", func(s *state) { d := nftables.ChainPolicyDrop; s.chains[0].chain.Policy = &d }},
		{"chain priority", func(s *state) { s.chains[0].chain.Priority = nftables.ChainPriorityRef(99) }},
		{"a rule missing", func(s *state) { s.chains[0].rules = s.chains[0].rules[1:] }},
		{"rules reordered", func(s *state) {
			r := s.chains[0].rules
			r[0], r[2] = r[2], r[0]
		}},
		{"fully-random lost", func(s *state) { s.chains[0].rules[2].Exprs[len(s.chains[0].rules[2].Exprs)-1] = &expr.Masq{} }},
		{"comment changed", func(s *state) { s.chains[0].rules[0].UserData = nil }},
		{"a foreign chain", func(s *state) {
			s.table.Use++
			s.chains = append(s.chains, chainState{chain: &nftables.Chain{Name: "x", Table: s.table}})
		}},
		{"the forward chain of older versions", func(s *state) { *s = *legacyState(n, "overlay.1") }},
		{"the previous version's family ip table", func(s *state) { *s = *previousState(n, "overlay.1") }},
		{"an IPv6 rule missing", func(s *state) { s.chains[0].rules = slices.Delete(s.chains[0].rules, 6, 7) }},
		{"the nfproto guard lost", func(s *state) { r := v6Masq(s); r.Exprs = r.Exprs[2:] }},
		{"the guard of the other family", func(s *state) {
			r := v6Masq(s)
			r.Exprs = append(matchNfproto(unix.NFPROTO_IPV4), r.Exprs[2:]...)
		}},
		{"the IPv6 network narrowed", func(s *state) {
			r := v6Masq(s)
			r.Exprs = append(append(matchNfproto(unix.NFPROTO_IPV6), matchPrefix(ipv6SaddrOffset, expr.CmpOpEq, netip.MustParsePrefix("fd00:10:244::/56"))...), r.Exprs[len(r.Exprs)-1])
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := fresh()
			tc.tamper(st)
			if diff := cmp.Diff(want, render(st)); diff == "" {
				t.Error("the rendering did not change")
			}
		})
	}
}

func TestNewRejects(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/48")
	for _, tc := range []struct {
		name    string
		network netip.Prefix
		opts    []Option
		want    string // in the message
	}{
		{"no network (zero prefix)", netip.Prefix{}, nil, "want an IPv4 prefix"},
		{"an invalid second network", v4, []Option{WithNetwork(netip.Prefix{})}, "want an IPv4 prefix"},
		{"IPv4-mapped IPv6", netip.MustParsePrefix("::ffff:10.244.0.0/112"), nil, "IPv4-mapped"},
		{"IPv4-mapped IPv6 as the second network", v4, []Option{WithNetwork(netip.MustParsePrefix("::ffff:10.0.0.0/104"))}, "IPv4-mapped"},
		{"the whole IPv4 space", netip.MustParsePrefix("0.0.0.0/0"), nil, "whole address space"},
		{"the whole IPv6 space", v4, []Option{WithNetwork(netip.MustParsePrefix("::/0"))}, "whole address space"},
		{"two IPv4 networks", v4, []Option{WithNetwork(netip.MustParsePrefix("10.0.0.0/8"))}, "two IPv4 cluster networks"},
		{"two IPv6 networks", v6, []Option{WithNetwork(netip.MustParsePrefix("fd01::/48"))}, "two IPv6 cluster networks"},
		{"three networks", v4, []Option{WithNetwork(v6), WithNetwork(v6)}, "two IPv6 cluster networks"},
		{"an IPv4 device without an IPv4 network", v6, []Option{WithOverlayDevice("overlay.1")}, "IPv4 cluster network, and there is none"},
		{"an IPv6 device without an IPv6 network", v4, []Option{WithIPv6OverlayDevice("overlay-v6.1")}, "IPv6 cluster network, and there is none"},
		{"device name too long", v4, []Option{WithOverlayDevice("a-name-longer-than-15")}, "longer than"},
		{"IPv6 device name too long", v6, []Option{WithIPv6OverlayDevice("a-name-longer-than-15")}, "IPv6 overlay device"},
		{"device name with a slash", v4, []Option{WithOverlayDevice("a/b")}, "contains"},
		{"empty device name", v4, []Option{WithOverlayDevice("")}, "not valid"},
		{"closed namespace handle", v4, []Option{WithNetNS(-1)}, "not open"},
		{"zero timeout", v4, []Option{WithTimeout(0)}, "not positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.network, tc.opts...)
			if !errors.Is(err, ErrInvalidConfig) {
				if m != nil {
					m.Close()
				}
				t.Fatalf("New = %v, want ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: %v, want a message with %q", err, tc.want)
			}
		})
	}
}

func TestRunRejectsBadInterval(t *testing.T) {
	m, err := New(netip.MustParsePrefix("10.244.0.0/16"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Run(t.Context(), 0, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Run(0) = %v, want ErrInvalidConfig", err)
	}
}

func TestMaskBits(t *testing.T) {
	for _, size := range []int{4, 16} {
		for bits := 0; bits <= 8*size; bits++ {
			mask := prefixMask(bits, size)
			if want := netip.PrefixFrom(netip.IPv6Unspecified(), bits); size == 16 && !slices.Equal(mask, ipv6Mask(want)) {
				t.Errorf("prefixMask(%d, 16) = %x, want %x", bits, mask, ipv6Mask(want))
			}
			if got, ok := maskBits(mask); !ok || got != bits {
				t.Errorf("maskBits(prefixMask(%d, %d)) = %d, %v", bits, size, got, ok)
			}
		}
	}
	if _, ok := maskBits([]byte{255, 0, 255, 0}); ok {
		t.Error("maskBits accepted a non-contiguous mask")
	}
}

// ipv6Mask computes p's netmask independently of prefixMask, with net.CIDRMask.
func ipv6Mask(p netip.Prefix) []byte { return net.CIDRMask(p.Bits(), 128) }

func TestKernelHint(t *testing.T) {
	for _, tc := range []struct {
		release string
		want    string
	}{
		{"4.19.0-26-amd64", "this kernel, 4.19.0-26-amd64, is older than 5.2: it needs nf_tables NAT in family inet"},
		{"5.1.21", "is older than 5.2"},
		{"4.18.0-553.el8_10.x86_64", "is older than 5.2"},
		{"5.2.0", "the kernel (5.2.0) lacks an nf_tables feature: it needs nf_tables NAT in family inet: Linux 5.2 or later"},
		{"6.1.0-18-amd64", "the kernel (6.1.0-18-amd64) lacks"},
		{"5.10-rc1", "the kernel (5.10-rc1) lacks"},
		{"garbage", "the kernel (garbage) lacks"},
	} {
		if got := kernelHint(tc.release); !strings.Contains(got, tc.want) {
			t.Errorf("kernelHint(%q) = %q, want it to contain %q", tc.release, got, tc.want)
		}
	}
	if _, _, ok := kernelVersion(kernelRelease()); !ok {
		t.Errorf("the running kernel's release %q does not parse", kernelRelease())
	}
}

func TestCloseTwice(t *testing.T) {
	m, err := New(netip.MustParsePrefix("10.244.0.0/16"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	if _, err := m.Ensure(); !errors.Is(err, ErrClosed) {
		t.Errorf("Ensure after Close = %v, want ErrClosed", err)
	}
	if err := m.Remove(); !errors.Is(err, ErrClosed) {
		t.Errorf("Remove after Close = %v, want ErrClosed", err)
	}
	if _, err := m.Rules(); !errors.Is(err, ErrClosed) {
		t.Errorf("Rules after Close = %v, want ErrClosed", err)
	}
}
