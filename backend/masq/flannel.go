package masq

import (
	"fmt"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// FlannelChain is the nat chain flanneld keeps its masquerade rules in,
// jumped to from the nat table's POSTROUTING chain.
const FlannelChain = "FLANNEL-POSTRTG"

// RemoveFlannel deletes the masquerade flanneld left through iptables-nft:
// in the nat table of each family, the POSTROUTING rules that jump to
// FLANNEL-POSTRTG and then that chain, in one transaction. Call it once
// our own table is in place (Ensure), so pod traffic to the outside is
// masqueraded at every moment of a host's takeover from flanneld. It
// reports the tables it changed ("ip nat", "ip6 nat"), none if flanneld
// left nothing there. Rules flanneld wrote with iptables-legacy are not
// in nftables and stay: the caller says so. flannel's FLANNEL-FWD accept
// chain is left alone on purpose: on a host whose FORWARD policy is drop
// it is what lets pod traffic through.
func (m *Masq) RemoveFlannel() ([]string, error) {
	c, err := m.conn()
	if err != nil {
		return nil, err
	}
	var changed []string
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		chains, err := c.ListChainsOfTableFamily(fam)
		if err != nil {
			return nil, fmt.Errorf("list nftables chains of family %s in netns %s: %w", FamilyName(fam), m.ns, err)
		}
		flannel := slices.IndexFunc(chains, func(ch *nftables.Chain) bool { return isNat(ch.Table) && ch.Name == FlannelChain })
		if flannel < 0 {
			continue
		}
		table := chains[flannel].Table
		for _, ch := range chains {
			if !isNat(ch.Table) || ch.Name == FlannelChain {
				continue
			}
			rules, err := c.GetRules(table, ch)
			if err != nil {
				return nil, fmt.Errorf("list rules of chain %s in table %s nat: %w", ch.Name, FamilyName(fam), err)
			}
			for _, r := range rules {
				if jumpsTo(r, FlannelChain) {
					if err := c.DelRule(r); err != nil {
						return nil, fmt.Errorf("delete the jump to %s from %s: %w", FlannelChain, ch.Name, err)
					}
				}
			}
		}
		c.FlushChain(chains[flannel])
		c.DelChain(chains[flannel])
		changed = append(changed, FamilyName(fam)+" nat")
	}
	if len(changed) == 0 {
		return nil, nil
	}
	if err := c.Flush(); err != nil {
		return nil, fmt.Errorf("remove flanneld's %s chain in netns %s: %w", FlannelChain, m.ns, err)
	}
	return changed, nil
}

func isNat(t *nftables.Table) bool { return t != nil && t.Name == "nat" }

// jumpsTo reports whether rule r jumps or goes to chain.
func jumpsTo(r *nftables.Rule, chain string) bool {
	for _, e := range r.Exprs {
		if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) && v.Chain == chain {
			return true
		}
	}
	return false
}
