package daemon

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// Teardown needs the underlay only for the routes of DirectRouting through
// it. Without a default route to find it by (the lab has none) it warns
// that those stay and removes everything else; with --iface naming an
// underlay that is down and has no address left it removes everything.
func TestTeardownWithoutAUsableUnderlay(t *testing.T) {
	c := newCluster(t)
	if _, err := c.reg.PutConfig(tctx(t), []byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","DirectRouting":true}}`)); err != nil {
		t.Fatal(err)
	}
	h1, h2 := c.addHost("h1", 1), c.addHost("h2", 2)
	h1.start(t)
	h2.start(t)
	own1, own2 := h1.env(t).Lease(), h2.env(t).Lease()
	waitFor(t, testenv.Slack, "h1's direct route to h2", func() bool { return h1.routes(t)[own2] })
	h1.stop()
	h2.stop()

	h1.cfg.Iface = ""
	res, err := Teardown(context.Background(), h1.cfg, TeardownOptions{VNI: 1})
	if err != nil || !res.DeviceRemoved || !res.MasqRemoved || res.LeaseRemoved != own1.String() || res.SubnetFile != h1.cfg.SubnetFile {
		t.Fatalf("teardown without a default route = %+v, %v; want device, table, lease and subnet.env removed", res, err)
	}
	if len(res.Warnings) != 1 || !strings.Contains(res.Warnings[0], "DirectRouting") || !strings.Contains(res.Warnings[0], "no IPv4 or IPv6 default route") {
		t.Errorf("warnings %q, want one saying why the routes of DirectRouting stay", res.Warnings)
	}
	if !h1.routes(t)[own2] {
		t.Errorf("the direct route to %s was removed without the underlay", own2)
	}

	// h2's eth0: down, and without its addresses.
	hl, err := netlink.NewHandleAt(h2.host.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	eth0, err := hl.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := hl.AddrList(eth0, netlink.FAMILY_ALL)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if a.IP.IsGlobalUnicast() {
			if err := hl.AddrDel(eth0, &a); err != nil {
				t.Fatalf("delete %s: %v", a.IPNet, err)
			}
		}
	}
	if err := hl.LinkSetDown(eth0); err != nil {
		t.Fatal(err)
	}
	res, err = Teardown(context.Background(), h2.cfg, TeardownOptions{VNI: 1})
	if err != nil || !res.DeviceRemoved || !res.MasqRemoved || res.LeaseRemoved != own2.String() || res.SubnetFile != h2.cfg.SubnetFile || len(res.Warnings) != 0 {
		t.Fatalf("teardown with eth0 down and without addresses = %+v, %v; want everything removed, no warning", res, err)
	}
	if _, err := hl.LinkByName("overlay.1"); err == nil {
		t.Error("h2's overlay.1 is still there")
	}
}

// Teardown gives each etcd request the dial timeout, as the daemon and
// the CLI do, not a fixed 5 s for connecting and reading the config: with
// every answer 1.8 s late (those two steps wait for three answers, 5.4 s)
// and --dial-timeout 20s, it releases the lease.
func TestTeardownWaitsTheDialTimeoutForASlowEtcd(t *testing.T) {
	c := newCluster(t)
	h1, own := c.leasedOnce(t, "h1", 1)

	proxy, err := lab.NewProxy(filepath.Join(t.TempDir(), "etcd.sock"), c.srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	proxy.SetAnswerDelay(1800 * time.Millisecond)
	h1.cfg.Etcd.Endpoints, h1.cfg.Etcd.DialTimeout = []string{proxy.Endpoint()}, 20*time.Second
	res, err := Teardown(context.Background(), h1.cfg, TeardownOptions{VNI: 1})
	if err != nil || res.LeaseRemoved != own.String() {
		t.Fatalf("teardown through a slow etcd = %+v, %v; want the lease %s released", res, err, own)
	}
}
