package masq

import (
	"context"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

var clusterNet = netip.MustParsePrefix("10.244.0.0/16")

// newMasq returns a Masq for 10.244.0.0/16 and overlay.1 in a fresh namespace.
func newMasq(t *testing.T) (*Masq, netns.NsHandle) {
	t.Helper()
	ns := newNS(t, "nft")
	m, err := New(clusterNet, WithNetNS(ns), WithOverlayDevice("overlay.1"), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, ns
}

func mustEnsure(t *testing.T, m *Masq, wantChanged bool) {
	t.Helper()
	changed, err := m.Ensure()
	if err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if changed != wantChanged {
		t.Fatalf("Ensure changed = %v, want %v", changed, wantChanged)
	}
}

func assertRules(t *testing.T, m *Masq, want string) {
	t.Helper()
	got, err := m.Rules()
	if err != nil {
		t.Fatalf("Rules: %v", err)
	}
	if diff := cmp.Diff(want, strings.Join(got, "\n")); diff != "" {
		t.Fatalf("rules in the kernel (-want +got):\n%s", diff)
	}
}

// ourRules reads the rules of one of our chains straight from the kernel.
func ourRules(t *testing.T, c *nftables.Conn, chain string) (*nftables.Table, *nftables.Chain, []*nftables.Rule) {
	t.Helper()
	table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}
	ch := &nftables.Chain{Name: chain, Table: table}
	rules, err := c.GetRules(table, ch)
	if err != nil {
		t.Fatal(err)
	}
	return table, ch, rules
}

func TestEnsureInstallsAndIsIdempotent(t *testing.T) {
	m, ns := newMasq(t)
	if rules, err := m.Rules(); err != nil || rules != nil {
		t.Fatalf("Rules on an empty namespace = %q, %v; want none", rules, err)
	}
	mustEnsure(t, m, true)
	assertRules(t, m, goldenWithDevice)

	g, batches := gen(t, ns), m.batches
	mustEnsure(t, m, false)
	mustEnsure(t, m, false)
	if got := gen(t, ns); got != g {
		t.Errorf("ruleset generation moved from %d to %d: a no-op Ensure wrote to the kernel", g, got)
	}
	if m.batches != batches {
		t.Errorf("no-op Ensure sent %d batches", m.batches-batches)
	}
}

func TestEnsureRepairsDrift(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, c *nftables.Conn)
	}{
		{"table deleted", func(t *testing.T, c *nftables.Conn) {
			c.DelTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName})
		}},
		{"rule deleted", func(t *testing.T, c *nftables.Conn) {
			_, _, rules := ourRules(t, c, natChainName)
			if err := c.DelRule(rules[0]); err != nil {
				t.Fatal(err)
			}
		}},
		{"foreign rule appended", func(t *testing.T, c *nftables.Conn) {
			table, ch, _ := ourRules(t, c, natChainName)
			c.AddRule(&nftables.Rule{Table: table, Chain: ch, Exprs: []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictAccept}}})
		}},
		{"foreign rule inserted first", func(t *testing.T, c *nftables.Conn) {
			table, ch, _ := ourRules(t, c, natChainName)
			c.InsertRule(&nftables.Rule{Table: table, Chain: ch, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}})
		}},
		{"rule replaced with another network", func(t *testing.T, c *nftables.Conn) {
			table, ch, rules := ourRules(t, c, natChainName)
			r := rules[2]
			c.ReplaceRule(&nftables.Rule{Table: table, Chain: ch, Handle: r.Handle, UserData: r.UserData,
				Exprs: append(matchPrefix(ipv4SaddrOffset, expr.CmpOpEq, netip.MustParsePrefix("10.0.0.0/8")), &expr.Masq{FullyRandom: true})})
		}},
		{"masquerade rule moved first", func(t *testing.T, c *nftables.Conn) {
			table, ch, rules := ourRules(t, c, natChainName)
			r := rules[2]
			if err := c.DelRule(r); err != nil {
				t.Fatal(err)
			}
			c.InsertRule(&nftables.Rule{Table: table, Chain: ch, Exprs: r.Exprs, UserData: r.UserData})
		}},
		{"chain policy set to drop", func(t *testing.T, c *nftables.Conn) {
			table := &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}
			drop := nftables.ChainPolicyDrop
			c.AddChain(&nftables.Chain{Name: natChainName, Table: table, Type: nftables.ChainTypeNAT,
				Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &drop})
		}},
		{"foreign chain added", func(t *testing.T, c *nftables.Conn) {
			c.AddChain(&nftables.Chain{Name: "foreign", Table: &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}})
		}},
		{"foreign set added", func(t *testing.T, c *nftables.Conn) {
			s := &nftables.Set{Table: &nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName}, Name: "foreign", KeyType: nftables.TypeIPAddr}
			if err := c.AddSet(s, nil); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, ns := newMasq(t)
			mustEnsure(t, m, true)
			c := nftConn(t, ns)
			tc.tamper(t, c)
			if err := c.Flush(); err != nil {
				t.Fatalf("tamper: %v", err)
			}
			if got, _ := m.Rules(); strings.Join(got, "\n") == goldenWithDevice {
				t.Fatal("tampering changed nothing the rendering shows")
			}
			mustEnsure(t, m, true)
			assertRules(t, m, goldenWithDevice)
			g := gen(t, ns)
			mustEnsure(t, m, false)
			if got := gen(t, ns); got != g {
				t.Errorf("Ensure after the repair wrote again (generation %d -> %d)", g, got)
			}
		})
	}
}

// An upgrade from a version that installed a forward chain: Ensure removes
// the chain, leaves the NAT chain as it was, and then writes nothing more.
func TestEnsureRemovesLegacyForwardChain(t *testing.T) {
	m, ns := newMasq(t)
	c := nftConn(t, ns)
	legacy := legacyState(clusterNet, "overlay.1")
	c.AddTable(legacy.table)
	for _, ch := range legacy.chains {
		c.AddChain(ch.chain)
		for _, r := range ch.rules {
			c.AddRule(r)
		}
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("install the legacy table: %v", err)
	}
	assertRules(t, m, goldenLegacyWithDevice)

	batches := m.batches
	mustEnsure(t, m, true)
	if m.batches != batches+1 {
		t.Errorf("the repair sent %d batches, want 1", m.batches-batches)
	}
	assertRules(t, m, goldenWithDevice)
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ch := range chains {
		names = append(names, ch.Table.Name+" "+ch.Name)
		if ch.Hooknum != nil && *ch.Hooknum == *nftables.ChainHookForward {
			t.Errorf("a forward chain is left: table ip %s chain %s", ch.Table.Name, ch.Name)
		}
	}
	if diff := cmp.Diff([]string{TableName + " " + natChainName}, names); diff != "" {
		t.Errorf("chains in family ip after the repair (-want +got):\n%s", diff)
	}

	g, batches := gen(t, ns), m.batches
	mustEnsure(t, m, false)
	if got := gen(t, ns); got != g {
		t.Errorf("Ensure after the repair wrote again (generation %d -> %d)", g, got)
	}
	if m.batches != batches {
		t.Errorf("Ensure after the repair sent %d batches", m.batches-batches)
	}
}

func TestEnsureRepairsDormantTable(t *testing.T) {
	m, ns := newMasq(t)
	mustEnsure(t, m, true)
	setTableDormant(t, ns)
	got, err := m.Rules()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) < 2 || got[1] != "\tflags dormant;" {
		t.Fatalf("a dormant table renders as\n%s", strings.Join(got, "\n"))
	}
	mustEnsure(t, m, true)
	assertRules(t, m, goldenWithDevice)
}

func TestEnsureLeavesOtherTablesAlone(t *testing.T) {
	m, ns := newMasq(t)
	c := nftConn(t, ns)
	// Someone else's tables: a family ip table and a same-named inet table.
	for _, tbl := range []*nftables.Table{
		{Family: nftables.TableFamilyIPv4, Name: "filter"},
		{Family: nftables.TableFamilyINet, Name: TableName},
	} {
		c.AddTable(tbl)
		c.AddChain(&nftables.Chain{Name: "mine", Table: tbl})
		c.AddRule(&nftables.Rule{Table: tbl, Chain: &nftables.Chain{Name: "mine", Table: tbl}, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	snapshot := func() []string {
		var out []string
		for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyINet} {
			for _, name := range []string{"filter", TableName} {
				if fam == nftables.TableFamilyIPv4 && name == TableName {
					continue
				}
				rules, err := c.GetRules(&nftables.Table{Family: fam, Name: name}, &nftables.Chain{Name: "mine"})
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rules {
					out = append(out, familyName(fam)+" "+name+": "+renderRule(r))
				}
			}
		}
		return out
	}
	before := snapshot()
	if len(before) != 2 {
		t.Fatalf("foreign rules before: %q", before)
	}
	mustEnsure(t, m, true)
	if err := m.Remove(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, snapshot()); diff != "" {
		t.Errorf("foreign rules changed (-before +after):\n%s", diff)
	}
}

func TestRemove(t *testing.T) {
	m, ns := newMasq(t)
	t.Run("never installed", func(t *testing.T) {
		if err := m.Remove(); err != nil {
			t.Fatalf("Remove without a table = %v, want nil", err)
		}
	})
	t.Run("installed", func(t *testing.T) {
		mustEnsure(t, m, true)
		if err := m.Remove(); err != nil {
			t.Fatal(err)
		}
		if rules, err := m.Rules(); err != nil || rules != nil {
			t.Fatalf("Rules after Remove = %q, %v", rules, err)
		}
		tables, err := nftConn(t, ns).ListTablesOfFamily(nftables.TableFamilyIPv4)
		if err != nil {
			t.Fatal(err)
		}
		if len(tables) != 0 {
			t.Fatalf("tables left after Remove: %v", tables)
		}
	})
	t.Run("twice", func(t *testing.T) {
		if err := m.Remove(); err != nil {
			t.Fatalf("second Remove = %v, want nil", err)
		}
	})
	t.Run("Ensure after Remove reinstalls", func(t *testing.T) {
		mustEnsure(t, m, true)
		assertRules(t, m, goldenWithDevice)
	})
}

func TestNetworkChangeReplacesRules(t *testing.T) {
	m, ns := newMasq(t)
	mustEnsure(t, m, true)
	other, err := New(netip.MustParsePrefix("10.96.0.0/12"), WithNetNS(ns))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if changed, err := other.Ensure(); err != nil || !changed {
		t.Fatalf("Ensure for the new network = %v, %v", changed, err)
	}
	assertRules(t, other, strings.ReplaceAll(goldenNoDevice, "10.244.0.0/16", "10.96.0.0/12"))
}

// The current namespace is the default: New inside a test namespace programs it.
func TestDefaultNamespaceIsTheCallers(t *testing.T) {
	ns := newNS(t, "cur")
	var m *Masq
	err := lab.Do(ns, func() (err error) {
		m, err = New(clusterNet)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	mustEnsure(t, m, true)
	tables, err := nftConn(t, ns).ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 1 || tables[0].Name != TableName {
		t.Fatalf("tables in the test namespace: %v", tables)
	}
}

func TestRunRepairs(t *testing.T) {
	m, ns := newMasq(t)
	type report struct {
		changed bool
		err     error
	}
	reports := make(chan report, 64)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- m.Run(ctx, 20*time.Millisecond, func(changed bool, err error) {
			select {
			case reports <- report{changed, err}:
			default:
			}
		})
	}()
	waitChanged := func(what string) {
		t.Helper()
		deadline := time.After(testenv.Deadline(testenv.Slack))
		for {
			select {
			case r := <-reports:
				if r.err != nil {
					t.Fatalf("%s: Ensure in Run: %v", what, r.err)
				}
				if r.changed {
					return
				}
			case <-deadline:
				t.Fatalf("%s: Run did not write in time", what)
			}
		}
	}
	waitChanged("install")
	assertRules(t, m, goldenWithDevice)
	c := nftConn(t, ns)
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: TableName})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	waitChanged("repair")
	assertRules(t, m, goldenWithDevice)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil after cancel", err)
		}
	case <-time.After(testenv.Deadline(testenv.Slack)):
		t.Fatal("Run did not return after cancel")
	}
}

func TestForwardDrops(t *testing.T) {
	m, ns := newMasq(t)
	mustEnsure(t, m, true)
	if drops, err := m.ForwardDrops(); err != nil || len(drops) != 0 {
		t.Fatalf("ForwardDrops with only our table = %q, %v", drops, err)
	}
	addForwardDrop(t, ns, nftables.TableFamilyINet, "fw")
	addForwardDrop(t, ns, nftables.TableFamilyIPv4, "filter")
	drops, err := m.ForwardDrops()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"inet fw forward", "ip filter forward"}, drops); diff != "" {
		t.Errorf("ForwardDrops (-want +got):\n%s", diff)
	}
}

// addForwardDrop adds table family/name with a forward base chain whose
// policy is drop, as iptables-nft does for `iptables -P FORWARD DROP`.
func addForwardDrop(t *testing.T, ns netns.NsHandle, family nftables.TableFamily, name string) {
	t.Helper()
	c := nftConn(t, ns)
	tbl := c.AddTable(&nftables.Table{Family: family, Name: name})
	drop := nftables.ChainPolicyDrop
	c.AddChain(&nftables.Chain{Name: "forward", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop})
	if err := c.Flush(); err != nil {
		t.Fatalf("add %s %s forward drop: %v", familyName(family), name, err)
	}
}
