package masq

import (
	"context"
	"errors"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

var (
	clusterNet   = netip.MustParsePrefix("10.244.0.0/16")
	clusterNetV6 = netip.MustParsePrefix("fd00:10:244::/48")
)

// dualStack is the options of a Masq for both networks and both devices,
// besides clusterNet.
var dualStack = []Option{WithOverlayDevice("overlay.1"), WithNetwork(clusterNetV6), WithIPv6OverlayDevice("overlay-v6.1")}

// newMasq returns a Masq for 10.244.0.0/16 and overlay.1 in a fresh namespace.
func newMasq(t *testing.T) (*Masq, netns.NsHandle) {
	t.Helper()
	return newMasqWith(t, clusterNet, WithOverlayDevice("overlay.1"))
}

// newMasqWith returns a Masq for network and opts in a fresh namespace.
func newMasqWith(t *testing.T, network netip.Prefix, opts ...Option) (*Masq, netns.NsHandle) {
	t.Helper()
	ns := newNS(t, "nft")
	m, err := New(network, append([]Option{WithNetNS(ns), WithLogger(slog.New(slog.DiscardHandler))}, opts...)...)
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
	table := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
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

// allChains lists every chain in ns, of every table and family, as
// "family table chain".
func allChains(t *testing.T, c *nftables.Conn) []string {
	t.Helper()
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ch := range chains {
		names = append(names, FamilyName(ch.Table.Family)+" "+ch.Table.Name+" "+ch.Name)
	}
	slices.Sort(names)
	return names
}

func TestEnsureRepairsDrift(t *testing.T) {
	ours := &nftables.Table{Family: nftables.TableFamilyINet, Name: TableName}
	ipv6Cases := []driftCase{
		{"an IPv6 rule deleted", func(t *testing.T, c *nftables.Conn) {
			_, _, rules := ourRules(t, c, natChainName)
			if err := c.DelRule(rules[6]); err != nil {
				t.Fatal(err)
			}
		}},
		{"the IPv6 masquerade rule without its nfproto guard", func(t *testing.T, c *nftables.Conn) {
			table, ch, rules := ourRules(t, c, natChainName)
			r := rules[6]
			c.ReplaceRule(&nftables.Rule{Table: table, Chain: ch, Handle: r.Handle, UserData: r.UserData, Exprs: r.Exprs[2:]})
		}},
	}
	for _, cfg := range []struct {
		name    string
		network netip.Prefix
		opts    []Option
		golden  string
		extra   []driftCase
	}{
		{"IPv4", clusterNet, []Option{WithOverlayDevice("overlay.1")}, goldenWithDevice, nil},
		{"dual stack", clusterNet, dualStack, goldenDualStack, ipv6Cases},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			testRepairs(t, cfg.network, cfg.opts, cfg.golden, append(cfg.extra, []driftCase{
				{"table deleted", func(t *testing.T, c *nftables.Conn) { c.DelTable(ours) }},
				{"the previous version's table added back", func(t *testing.T, c *nftables.Conn) {
					installState(t, c, previousState(clusterNet, "overlay.1"))
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
					drop := nftables.ChainPolicyDrop
					c.AddChain(&nftables.Chain{Name: natChainName, Table: ours, Type: nftables.ChainTypeNAT,
						Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &drop})
				}},
				{"foreign chain added", func(t *testing.T, c *nftables.Conn) {
					c.AddChain(&nftables.Chain{Name: "foreign", Table: ours})
				}},
				{"foreign set added", func(t *testing.T, c *nftables.Conn) {
					s := &nftables.Set{Table: ours, Name: "foreign", KeyType: nftables.TypeIPAddr}
					if err := c.AddSet(s, nil); err != nil {
						t.Fatal(err)
					}
				}},
			}...))
		})
	}
}

// driftCase is one way to tamper with our installed table.
type driftCase struct {
	name   string
	tamper func(t *testing.T, c *nftables.Conn)
}

// testRepairs installs the table for network and opts, applies each tamper
// in turn to a fresh copy, and checks that one Ensure repairs it to golden.
func testRepairs(t *testing.T, network netip.Prefix, opts []Option, golden string, cases []driftCase) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, ns := newMasqWith(t, network, opts...)
			mustEnsure(t, m, true)
			c := nftConn(t, ns)
			tc.tamper(t, c)
			if err := c.Flush(); err != nil {
				t.Fatalf("tamper: %v", err)
			}
			if got, _ := m.Rules(); strings.Join(got, "\n") == golden {
				t.Fatal("tampering changed nothing the rendering shows")
			}
			mustEnsure(t, m, true)
			assertRules(t, m, golden)
			if diff := cmp.Diff([]string{"inet " + TableName + " " + natChainName}, allChains(t, c)); diff != "" {
				t.Errorf("chains after the repair (-want +got):\n%s", diff)
			}
			g := gen(t, ns)
			mustEnsure(t, m, false)
			if got := gen(t, ns); got != g {
				t.Errorf("Ensure after the repair wrote again (generation %d -> %d)", g, got)
			}
		})
	}
}

// An upgrade from a version that installed a forward chain in its family ip
// table: one transaction replaces that table, forward chain and all, with
// ours, and then Ensure writes nothing more.
func TestEnsureRemovesLegacyForwardChain(t *testing.T) {
	for _, cfg := range []struct {
		name   string
		opts   []Option
		golden string
	}{
		{"IPv4", []Option{WithOverlayDevice("overlay.1")}, goldenWithDevice},
		{"dual stack", dualStack, goldenDualStack},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			m, ns := newMasqWith(t, clusterNet, cfg.opts...)
			c := nftConn(t, ns)
			installState(t, c, legacyState(clusterNet, "overlay.1"))
			assertRules(t, m, goldenLegacyWithDevice)
			assertMigrates(t, m, ns, cfg.golden)
		})
	}
}

// The failure of any part of the migration's one transaction leaves the
// old table untouched: here another process owns a table inet overlay
// (NFT_TABLE_F_OWNER), so replacing ours is refused.
func TestFailedMigrationKeepsThePreviousTable(t *testing.T) {
	m, ns := newMasqWith(t, clusterNet, dualStack...)
	c := nftConn(t, ns)
	installState(t, c, previousState(clusterNet, "overlay.1"))
	owner := addOwnedTable(t, ns, unix.NFPROTO_INET, TableName)
	g := gen(t, ns)
	if _, err := m.Ensure(); !errors.Is(err, unix.EPERM) {
		t.Fatalf("Ensure beside another owner's table inet %s = %v, want EPERM", TableName, err)
	}
	if got := gen(t, ns); got != g {
		t.Errorf("the failed batch committed something (generation %d -> %d)", g, got)
	}
	got, err := m.Rules()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(strings.Join(got, "\n"), goldenPrevious) {
		t.Errorf("after the failed migration the kernel holds\n%s\nwant the previous table intact", strings.Join(got, "\n"))
	}
	owner.Close() // the kernel deletes an owned table with its owner's socket
	testenv.WaitFor(t, testenv.Slack, "the owned table to go with its socket", func() bool {
		tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
		return err == nil && len(tables) == 0
	})
	assertMigrates(t, m, ns, goldenDualStack)
}

// assertMigrates checks that Ensure replaces whatever our tables hold with
// golden in one batch and one committed transaction, leaving no other
// chain, and that it then writes nothing more.
func assertMigrates(t *testing.T, m *Masq, ns netns.NsHandle, golden string) {
	t.Helper()
	g, batches := gen(t, ns), m.batches
	mustEnsure(t, m, true)
	if m.batches != batches+1 {
		t.Errorf("the migration sent %d batches, want 1", m.batches-batches)
	}
	// Ensure reads without writing, so the generation moves once per
	// committed transaction of ours.
	if got := gen(t, ns); got != g+1 {
		t.Errorf("the ruleset generation moved from %d to %d: want one transaction", g, got)
	}
	assertRules(t, m, golden)
	if diff := cmp.Diff([]string{"inet " + TableName + " " + natChainName}, allChains(t, nftConn(t, ns))); diff != "" {
		t.Errorf("chains after the migration (-want +got):\n%s", diff)
	}

	g, batches = gen(t, ns), m.batches
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

var foreignTables = []*nftables.Table{
	{Family: nftables.TableFamilyIPv4, Name: "filter"},
	{Family: nftables.TableFamilyINet, Name: "filter"},
	{Family: nftables.TableFamilyIPv6, Name: TableName},
}

func TestEnsureLeavesOtherTablesAlone(t *testing.T) {
	m, ns := newMasqWith(t, clusterNet, dualStack...)
	c := nftConn(t, ns)
	// Someone else's tables: family ip and inet tables, and a same-named
	// table in family ip6 (the family ip one is our older versions').
	for _, tbl := range foreignTables {
		c.AddTable(tbl)
		c.AddChain(&nftables.Chain{Name: "mine", Table: tbl})
		c.AddRule(&nftables.Rule{Table: tbl, Chain: &nftables.Chain{Name: "mine", Table: tbl}, Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
	}
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	snapshot := func() []string {
		var out []string
		for _, tbl := range foreignTables {
			rules, err := c.GetRules(tbl, &nftables.Chain{Name: "mine"})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rules {
				out = append(out, FamilyName(tbl.Family)+" "+tbl.Name+": "+renderRule(r))
			}
		}
		return out
	}
	before := snapshot()
	if len(before) != len(foreignTables) {
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
		assertNoTables(t, ns)
	})
	t.Run("the previous version's table too", func(t *testing.T) {
		mustEnsure(t, m, true)
		installState(t, nftConn(t, ns), previousState(clusterNet, "overlay.1"))
		if err := m.Remove(); err != nil {
			t.Fatal(err)
		}
		assertNoTables(t, ns)
	})
	t.Run("the previous version's table alone", func(t *testing.T) {
		installState(t, nftConn(t, ns), previousState(clusterNet, "overlay.1"))
		if rules, err := m.Rules(); err != nil || strings.Join(rules, "\n") != goldenPrevious {
			t.Fatalf("Rules = %q, %v; want the previous table", rules, err)
		}
		if err := m.Remove(); err != nil {
			t.Fatal(err)
		}
		assertNoTables(t, ns)
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

// assertNoTables fails t unless ns holds no nftables table of any family.
func assertNoTables(t *testing.T, ns netns.NsHandle) {
	t.Helper()
	tables, err := nftConn(t, ns).ListTablesOfFamily(nftables.TableFamilyUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	for _, tbl := range tables {
		t.Errorf("table %s %s left after Remove", FamilyName(tbl.Family), tbl.Name)
	}
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

	// Adding the IPv6 network later, then dropping the IPv4 one.
	dual, err := New(clusterNet, append([]Option{WithNetNS(ns)}, dualStack...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer dual.Close()
	mustEnsure(t, dual, true)
	assertRules(t, dual, goldenDualStack)
	v6, err := New(clusterNetV6, WithNetNS(ns), WithIPv6OverlayDevice("overlay-v6.1"))
	if err != nil {
		t.Fatal(err)
	}
	defer v6.Close()
	mustEnsure(t, v6, true)
	assertRules(t, v6, goldenV6WithDevice)
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
	tables, err := nftConn(t, ns).ListTablesOfFamily(nftables.TableFamilyUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) != 1 || !isTable(tables[0], ourTable) {
		t.Fatalf("tables in the test namespace: %v", tables)
	}
}

func TestRunRepairs(t *testing.T) {
	m, ns := newMasqWith(t, clusterNet, dualStack...)
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
	assertRules(t, m, goldenDualStack)
	c := nftConn(t, ns)
	c.DelTable(&ourTable)
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	waitChanged("repair")
	assertRules(t, m, goldenDualStack)
	installState(t, c, previousState(clusterNet, "overlay.1"))
	waitChanged("the previous version's table reinstalled")
	assertRules(t, m, goldenDualStack)
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
	for _, cfg := range []struct {
		name    string
		network netip.Prefix
		opts    []Option
		want    []string
	}{
		// An ip6 chain cannot drop IPv4 traffic, nor an ip chain IPv6.
		{"IPv4", clusterNet, []Option{WithOverlayDevice("overlay.1")}, []string{"inet fw forward", "ip filter forward", "ip overlay forward"}},
		{"IPv6", clusterNetV6, nil, []string{"inet fw forward", "ip6 filter6 forward"}},
		{"dual stack", clusterNet, dualStack, []string{"inet fw forward", "ip filter forward", "ip overlay forward", "ip6 filter6 forward"}},
	} {
		t.Run(cfg.name, func(t *testing.T) {
			m, ns := newMasqWith(t, cfg.network, cfg.opts...)
			mustEnsure(t, m, true)
			if drops, err := m.ForwardDrops(); err != nil || len(drops) != 0 {
				t.Fatalf("ForwardDrops with only our table = %q, %v", drops, err)
			}
			addForwardDrop(t, ns, nftables.TableFamilyINet, "fw")
			addForwardDrop(t, ns, nftables.TableFamilyIPv4, "filter")
			addForwardDrop(t, ns, nftables.TableFamilyIPv6, "filter6")
			addForwardDrop(t, ns, nftables.TableFamilyBridge, "br")
			// Older versions' table name in family ip is no longer ours:
			// a drop there drops IPv4 pod traffic like any other.
			addForwardDrop(t, ns, nftables.TableFamilyIPv4, TableName)
			drops, err := m.ForwardDrops()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(cfg.want, drops); diff != "" {
				t.Errorf("ForwardDrops (-want +got):\n%s", diff)
			}
		})
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
		t.Fatalf("add %s %s forward drop: %v", FamilyName(family), name, err)
	}
}
