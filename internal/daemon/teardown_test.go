package daemon

import (
	"context"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/testing/flannelhost"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet/etcdv3"
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
	if err != nil || !res.removed(vxlan.DeviceName(1)) || !res.MasqRemoved || res.LeaseRemoved != own1.String() || res.SubnetFile != h1.cfg.SubnetFile {
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
	if err != nil || !res.removed(vxlan.DeviceName(1)) || !res.MasqRemoved || res.LeaseRemoved != own2.String() || res.SubnetFile != h2.cfg.SubnetFile || len(res.Warnings) != 0 {
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

// Teardown of a host taken over from flanneld removes flannel.<VNI> even
// when it carries no route of overlayd's (issue 28 item 11: a host with no
// peer kept the device): overlayd marks the device it takes over.
func TestTeardownRemovesATakenOverFlannelDeviceWithoutRoutes(t *testing.T) {
	c := newCluster(t)
	h1 := c.addHost("h1", 1)
	fl := flannelhost.Host{Iface: "eth0", PublicIP: h1.host.IP, Network: netip.MustParsePrefix("10.244.0.0/16"),
		Subnet: netip.MustParsePrefix("10.244.5.0/24"), VNI: 1, VtepMAC: net.HardwareAddr{0x0e, 0xf1, 0, 0, 0, 5},
		SubnetFile: filepath.Join(t.TempDir(), "flannel", "subnet.env")}
	if _, err := fl.Build(tctx(t), h1.host.NS, c.srv.Client(t), etcdv3.DefaultPrefix); err != nil {
		t.Fatal(err)
	}
	h1.cfg.AdoptFlannel = true
	h1.start(t)
	if got := h1.env(t).Lease(); got != fl.Subnet {
		t.Fatalf("h1 leased %s, not flanneld's %s", got, fl.Subnet)
	}
	hl, err := netlink.NewHandleAt(h1.host.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	waitFor(t, testenv.Slack, "flannel.1 to be marked as overlayd's", func() bool {
		l, err := hl.LinkByName("flannel.1")
		return err == nil && l.Attrs().Alias == TakenOverAlias
	})
	h1.stop()
	if len(h1.routes(t)) != 0 {
		t.Fatalf("h1 has routes %v; this test needs a device without them", h1.routes(t))
	}
	res, err := Teardown(context.Background(), h1.cfg, TeardownOptions{VNI: 1})
	if err != nil || !slices.Equal(res.takenOver(), []string{"flannel.1"}) || res.LeaseRemoved != fl.Subnet.String() {
		t.Fatalf("teardown = %+v, %v; want flannel.1 removed and the lease released", res, err)
	}
	if _, err := hl.LinkByName("flannel.1"); err == nil {
		t.Error("flannel.1 is still there after teardown")
	}

	// flanneld's own device, never taken over, is left alone.
	h2 := c.addHost("h2", 2)
	fl2 := fl
	fl2.PublicIP, fl2.Subnet, fl2.SubnetFile = h2.host.IP, netip.MustParsePrefix("10.244.6.0/24"), filepath.Join(t.TempDir(), "flannel2", "subnet.env")
	if _, err := fl2.Build(tctx(t), h2.host.NS, c.srv.Client(t), etcdv3.DefaultPrefix); err != nil {
		t.Fatal(err)
	}
	if res, err := Teardown(context.Background(), h2.cfg, TeardownOptions{VNI: 1}); err != nil || len(res.takenOver()) != 0 {
		t.Errorf("teardown of a flanneld host = %+v, %v; want flannel.1 left alone", res, err)
	}
	h2l, err := netlink.NewHandleAt(h2.host.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer h2l.Close()
	if _, err := h2l.LinkByName("flannel.1"); err != nil {
		t.Errorf("flanneld's own flannel.1 was removed: %v", err)
	}
}

// removed reports whether teardown removed the device called name.
func (r TeardownResult) removed(name string) bool {
	return slices.ContainsFunc(r.Removed, func(d RemovedDevice) bool { return d.Name == name })
}

// takenOver names the devices of flanneld's that teardown removed.
func (r TeardownResult) takenOver() []string {
	var out []string
	for _, d := range r.Removed {
		if d.TakenOver {
			out = append(out, d.Name)
		}
	}
	return out
}
