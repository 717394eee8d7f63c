package masq

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
)

// goldenWithDevice is the table for 10.244.0.0/16 with WithOverlayDevice("overlay.1").
const goldenWithDevice = `table ip overlay {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 10.244.0.0/16 ip daddr 10.244.0.0/16 return comment "overlay: pod to pod, no NAT"
		ip saddr 10.244.0.0/16 ip daddr 224.0.0.0/4 return comment "overlay: multicast, no NAT"
		ip saddr 10.244.0.0/16 masquerade fully-random comment "overlay: pod to outside"
		ip saddr != 10.244.0.0/16 ip daddr 10.244.0.0/16 oifname "overlay.1" masquerade fully-random comment "overlay: outside to remote pod"
	}
}`

// goldenNoDevice is the table for 10.244.0.0/16 without an overlay device.
const goldenNoDevice = `table ip overlay {
	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 10.244.0.0/16 ip daddr 10.244.0.0/16 return comment "overlay: pod to pod, no NAT"
		ip saddr 10.244.0.0/16 ip daddr 224.0.0.0/4 return comment "overlay: multicast, no NAT"
		ip saddr 10.244.0.0/16 masquerade fully-random comment "overlay: pod to outside"
	}
}`

// goldenLegacyWithDevice is goldenWithDevice as older versions installed it,
// with a forward chain that could not change any packet's verdict.
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

// legacyState is the table older versions installed: the desired state plus
// the forward chain, listed first as they added it.
func legacyState(network netip.Prefix, device string) *state {
	st := desiredState(network, device)
	st.table.Use++
	st.chains = append([]chainState{legacyForwardChain(st.table, network)}, st.chains...)
	return st
}

func TestRenderLegacy(t *testing.T) {
	got := strings.Join(render(legacyState(netip.MustParsePrefix("10.244.0.0/16"), "overlay.1")), "\n")
	if diff := cmp.Diff(goldenLegacyWithDevice, got); diff != "" {
		t.Errorf("rendering of the legacy table (-want +got):\n%s", diff)
	}
}

func TestRenderDesired(t *testing.T) {
	for _, tc := range []struct {
		name    string
		network string
		device  string
		want    string
	}{
		{"cluster network with the VXLAN device", "10.244.0.0/16", "overlay.1", goldenWithDevice},
		{"cluster network without a device", "10.244.0.0/16", "", goldenNoDevice},
		{"host bits are ignored", "10.244.7.9/16", "", goldenNoDevice},
		{"a /8 network", "10.0.0.0/8", "", strings.ReplaceAll(goldenNoDevice, "10.244.0.0/16", "10.0.0.0/8")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(netip.MustParsePrefix(tc.network), withDevice(tc.device)...)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			st := desiredState(m.network, m.device)
			if diff := cmp.Diff(tc.want, strings.Join(render(st), "\n")); diff != "" {
				t.Errorf("rendering (-want +got):\n%s", diff)
			}
		})
	}
}

func withDevice(dev string) []Option {
	if dev == "" {
		return nil
	}
	return []Option{WithOverlayDevice(dev)}
}

func TestRenderExprs(t *testing.T) {
	n := netip.MustParsePrefix("10.244.0.0/16")
	load := func(off uint32) *expr.Payload {
		return &expr.Payload{OperationType: expr.PayloadLoad, DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: 4}
	}
	cmpData := func(b ...byte) *expr.Cmp { return &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b} }
	for _, tc := range []struct {
		name  string
		exprs []expr.Any
		want  string
	}{
		{"prefix match", matchPrefix(ipv4SaddrOffset, expr.CmpOpEq, n), "ip saddr 10.244.0.0/16"},
		{"negated prefix match", matchPrefix(ipv4DaddrOffset, expr.CmpOpNeq, n), "ip daddr != 10.244.0.0/16"},
		{"a /32 has no mask", matchPrefix(ipv4SaddrOffset, expr.CmpOpEq, netip.MustParsePrefix("10.244.1.5/32")), "ip saddr 10.244.1.5"},
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
			[]expr.Any{load(12), &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: prefixMask(16), Xor: make([]byte, 4)}, cmpData(10, 244, 0, 1)},
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
		return desiredState(n, "overlay.1")
	}
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
	for _, tc := range []struct {
		name    string
		network netip.Prefix
		opts    []Option
	}{
		{"zero prefix", netip.Prefix{}, nil},
		{"IPv6 network", netip.MustParsePrefix("fd00::/64"), nil},
		{"IPv4-mapped IPv6", netip.MustParsePrefix("::ffff:10.244.0.0/112"), nil},
		{"the whole IPv4 space", netip.MustParsePrefix("0.0.0.0/0"), nil},
		{"device name too long", netip.MustParsePrefix("10.244.0.0/16"), []Option{WithOverlayDevice("a-name-longer-than-15")}},
		{"device name with a slash", netip.MustParsePrefix("10.244.0.0/16"), []Option{WithOverlayDevice("a/b")}},
		{"empty device name", netip.MustParsePrefix("10.244.0.0/16"), []Option{WithOverlayDevice("")}},
		{"closed namespace handle", netip.MustParsePrefix("10.244.0.0/16"), []Option{WithNetNS(-1)}},
		{"zero timeout", netip.MustParsePrefix("10.244.0.0/16"), []Option{WithTimeout(0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.network, tc.opts...)
			if !errors.Is(err, ErrInvalidConfig) {
				if m != nil {
					m.Close()
				}
				t.Fatalf("New = %v, want ErrInvalidConfig", err)
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
	for bits := 0; bits <= 32; bits++ {
		if got, ok := maskBits(prefixMask(bits)); !ok || got != bits {
			t.Errorf("maskBits(prefixMask(%d)) = %d, %v", bits, got, ok)
		}
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
