package daemon

import (
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/overlaynet/overlay/backend/masq"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

// A host switched from --ip-masq to --ip-masq=false stops masquerading at
// its next start: the table the earlier run left in place, and the
// ip-family table of versions before dual stack, are removed, once, and
// logged once.
func TestIPMasqFalseRemovesTheTableOfAnEarlierRun(t *testing.T) {
	c := newCluster(t)
	h1 := c.addHost("h1", 1)
	h1.start(t)
	h1.env(t)
	waitFor(t, testenv.Slack, "h1's masquerade table", func() bool { return masqRules(t, h1) != nil })
	h1.stop()
	// An upgrade from a version before dual stack may have left this too.
	nft, err := nftables.New(nftables.WithNetNSFd(int(h1.host.NS)))
	if err != nil {
		t.Fatal(err)
	}
	nft.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: masq.TableName})
	if err := nft.Flush(); err != nil {
		t.Fatal(err)
	}

	const removed = "--ip-masq=false: removed the masquerade table of an earlier run with --ip-masq"
	for run := 1; run <= 2; run++ {
		h1.cfg.IPMasq = false
		logs := h1.withLog(t)
		h1.start(t)
		// subnet.env is written after the masquerade is dealt with.
		waitFor(t, testenv.Slack, "subnet.env with OVERLAY_IPMASQ=false", func() bool {
			env, err := subnet.ReadEnv(h1.cfg.SubnetFile)
			return err == nil && !env.IPMasq
		})
		if rules := masqRules(t, h1); rules != nil {
			t.Errorf("run %d with --ip-masq=false: overlayd's tables are still there:\n%s", run, strings.Join(rules, "\n"))
		}
		if got, want := logs.count(t, removed), 2-run; got != want { // only the first run found any
			t.Errorf("run %d logged %q %d times, want %d:\n%s", run, removed, got, want, strings.Join(logs.lines(t), "\n"))
		}
		h1.stop()
	}
}
