package testenv

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
)

// RootNetworkState is what a suite must leave in the root network
// namespace as it found it: its links (name, type, master, flags), its
// routes of every table, and its nftables tables and chains (names,
// hooks, policies; iptables-nft's too), as sorted text. A suite takes it
// before it starts and compares after it ends. It only reads.
func RootNetworkState(t testing.TB) string {
	t.Helper()
	links, err := netlink.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range links {
		a := l.Attrs()
		lines = append(lines, fmt.Sprintf("link %s %s master %d %s", a.Name, l.Type(), a.MasterIndex, a.Flags))
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range routes {
		lines = append(lines, "route "+r.String())
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChains()
	if err != nil {
		t.Fatalf("list the root namespace's nftables chains: %v", err)
	}
	for _, ch := range chains {
		line := fmt.Sprintf("nft chain %d %s %s", ch.Table.Family, ch.Table.Name, ch.Name)
		if ch.Hooknum != nil {
			line += fmt.Sprintf(" hook %d", *ch.Hooknum)
		}
		if ch.Policy != nil {
			line += fmt.Sprintf(" policy %d", *ch.Policy)
		}
		lines = append(lines, line)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}
