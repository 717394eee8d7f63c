package e2e

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

	"github.com/overlaynet/overlay/backend/masq"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/testing/flannelhost"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// A host as flanneld leaves it is taken over in place by overlayd
// --adopt-flannel while a pod on another host probes a pod on it 20 times
// a second: no probe lost, the pod not restarted, the lease key, subnet,
// device and VTEP MAC kept, flannel's routes and masquerade replaced by
// overlay's.
func TestAdoptFlannelHostInPlace(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{})
	ctx := ctxT(t, 2*time.Minute)
	cli, err := l.Etcd.Client()
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	// h2 is the flannel host: its lease first, so h1 leases around it.
	h2, fl, grant := flannelLeaseHolder(ctx, t, l, cli)
	h1 := labtest.StartHost(t, l, "h1", 1)
	labtest.WaitReady(t, h1)
	row, ok := leaseRow(t, l, "h1")
	if !ok {
		t.Fatal("h1 has no lease")
	}
	mac1, _ := net.ParseMAC(row.VtepMAC)
	fl.Peers = []flannelhost.Peer{{Subnet: lease(t, h1), PublicIP: h1.IP, VtepMAC: mac1}}
	if _, err := cli.Revoke(ctx, grant); err != nil { // Build writes the lease again, with its own etcd lease
		t.Fatal(err)
	}
	if _, err := fl.Build(ctx, h2.NS, cli, etcdv3.DefaultPrefix); err != nil {
		t.Fatal(err)
	}
	before, err := cli.Get(ctx, fl.LeaseKey(etcdv3.DefaultPrefix))
	if err != nil || len(before.Kvs) != 1 {
		t.Fatalf("flannel's lease: %v %v", before, err)
	}
	dev, err := linkIndex(h2, flannelhost.DeviceName(1))
	if err != nil {
		t.Fatal(err)
	}

	// A pod flannel's plugin attached: the bridge plugin with the delegate
	// config flannel renders and caches, network cbr0, host-local's store.
	ipamDir, flannelCache := filepath.Join(h2.Dir, "ipam"), filepath.Join(h2.Dir, "flannel-cni")
	podConf := fl.PodConfig("cbr0", ipamDir)
	old, err := h2.AddPodWith(ctx, "old", flannelConfList(t, podConf))
	if err != nil {
		t.Fatal(err)
	}
	if err := flannelhost.WriteCache(flannelCache, old.ContainerID, podConf); err != nil {
		t.Fatal(err)
	}
	// From here on the host's conflist is overlay-cni's, keeping the
	// network's name and naming flannel's cache.
	h2.NetworkName, h2.FlannelDataDir = "cbr0", flannelCache
	p1 := labtest.AddPod(t, h1, "p1")
	labtest.Eventually(t, settle, "h1's pod and flannel's pod to reach each other", func() error {
		return errors.Join(reach(p1, old), reach(old, p1))
	})

	s, err := lab.StartStream(p1.NS, netip.AddrPortFrom(old.IP, lab.ProbePort), streamInterval, streamTimeout)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	warmUp(t, s, 5)
	// The documented first step, while flanneld still runs: overlay's
	// masquerade beside flannel's.
	if out, err := h2.CLI(ctx, "masquerade", "install"); err != nil || out != "installed nftables table inet overlay for 10.244.0.0/16\n" {
		t.Fatalf("overlayd masquerade install: %q, %v", out, err)
	}
	// Again (it is idempotent), with -w json and -w simple (printed the sentence whatever -w said).
	if out, err := h2.CLI(ctx, "masquerade", "install", "-w", "json"); err != nil || !strings.Contains(out, `"table": "inet overlay"`) || !strings.Contains(out, `"10.244.0.0/16"`) {
		t.Fatalf("overlayd masquerade install -w json: %q, %v", out, err)
	}
	if out, err := h2.CLI(ctx, "masquerade", "install", "-w", "simple"); err != nil || out != "installed \"inet overlay\" 10.244.0.0/16\n" {
		t.Fatalf("overlayd masquerade install -w simple: %q, %v", out, err)
	}
	if rules, err := masqRules(h2); err != nil || !strings.Contains(strings.Join(rules, "\n"), `oifname "flannel.1"`) {
		t.Fatalf("overlay's table after masquerade install: %v, %v; want the outside-to-remote-pod rule on flannel.1", rules, err)
	}
	if present, err := flannelhost.MasqPresent(h2.NS); err != nil || !present {
		t.Fatalf("flanneld's masquerade is gone before the takeover (%v)", err)
	}
	h2.ExtraArgs = []string{"--adopt-flannel"}
	if err := h2.Start(); err != nil {
		t.Fatal(err)
	}
	labtest.WaitReady(t, h2)
	seenAt := s.Stats().Sent
	labtest.Eventually(t, 50*streamInterval+settle, "2.5 s of traffic after the takeover", func() error {
		if sent := s.Stats().Sent; sent < seenAt+50 {
			return fmt.Errorf("%d probes since ready", sent-seenAt)
		}
		return nil
	})
	checkStream(t, fmt.Sprintf("%s -> %s across the takeover of flanneld's host", p1, old), s.Stop())

	// Kept: the lease key and its subnet, the device and its MAC.
	after, err := cli.Get(ctx, fl.LeaseKey(etcdv3.DefaultPrefix))
	if err != nil || len(after.Kvs) != 1 || after.Kvs[0].CreateRevision != before.Kvs[0].CreateRevision {
		t.Errorf("flannel's lease key was not kept (before %v, after %v, %v)", before.Kvs, after.Kvs, err)
	}
	if got := lease(t, h2); got != fl.Subnet {
		t.Errorf("h2's subnet.env names %s, want flannel's subnet %s", got, fl.Subnet)
	}
	if row, ok := leaseRow(t, l, "h2"); !ok || row.Subnet != fl.Subnet.String() || row.VtepMAC != fl.VtepMAC.String() {
		t.Errorf("h2's lease after the takeover: %+v (found %v), want %s with flannel's MAC %s", row, ok, fl.Subnet, fl.VtepMAC)
	}
	if idx, err := linkIndex(h2, flannelhost.DeviceName(1)); err != nil || idx != dev {
		t.Errorf("flannel.1 is index %d (%v), was %d: recreated", idx, err, dev)
	}
	if _, err := linkIndex(h2, vxlan.DeviceName(1)); err == nil {
		t.Errorf("overlay.1 was created beside flannel.1")
	}
	// Replaced: flannel's routes by overlay's, its masquerade by overlay's.
	labtest.Eventually(t, settle, "h2's route to h1 to be overlay's on flannel.1", func() error {
		r, ok, err := h2.RouteTo(lease(t, h1))
		if err != nil || !ok || r.Dev != flannelhost.DeviceName(1) || r.Metric != vxlan.RouteMetric(lease(t, h1)) {
			return fmt.Errorf("route %v (found %v, err %v)", r, ok, err)
		}
		return nil
	})
	if present, err := flannelhost.MasqPresent(h2.NS); err != nil || present {
		t.Errorf("flanneld's masquerade chain is still there (%v)", err)
	}
	if rules, err := masqRules(h2); err != nil || len(rules) == 0 {
		t.Errorf("overlay's masquerade table on h2: %v, %v", rules, err)
	}
	if err := errors.Join(reach(p1, old), reach(old, p1)); err != nil {
		t.Error(err)
	}

	// A new pod gets a fresh address of the same lease; the old pod's DEL,
	// now through overlay-cni, replays flannel's cached config: its
	// address is released, its veth and flannel's cache entry gone.
	fresh := labtest.AddPod(t, h2, "new")
	if fresh.IP == old.IP || !fl.Subnet.Contains(fresh.IP) {
		t.Errorf("new pod's address %s: want a fresh one of %s (the old pod holds %s)", fresh.IP, fl.Subnet, old.IP)
	}
	if err := errors.Join(reach(p1, fresh), reach(fresh, p1)); err != nil {
		t.Error(err)
	}
	reservation := filepath.Join(ipamDir, "cbr0", old.IP.String())
	if _, err := os.Stat(reservation); err != nil {
		t.Fatalf("host-local's reservation of the old pod: %v", err)
	}
	if ports, err := bridgePorts(h2, "cni0"); err != nil || ports != 2 {
		t.Fatalf("cni0 has %d ports (%v), want the old and the new pod's", ports, err)
	}
	if err := old.Delete(ctx); err != nil {
		t.Fatalf("DEL of the old pod through overlay-cni: %v", err)
	}
	for _, gone := range []string{reservation, filepath.Join(flannelCache, old.ContainerID)} {
		if _, err := os.Stat(gone); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is still there after the old pod's DEL (%v)", gone, err)
		}
	}
	if ports, err := bridgePorts(h2, "cni0"); err != nil || ports != 1 {
		t.Errorf("cni0 has %d ports after the old pod's DEL (%v), want the new pod's only", ports, err)
	}

	// flannel.1 is overlay's now: teardown removes it.
	if err := h2.Stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	out, err := h2.Teardown(ctx)
	if err != nil || !strings.Contains(out, "removed device flannel.1 and its routes, neighbours and FDB entries") {
		t.Errorf("teardown after the takeover: %q, %v", out, err)
	}
	if _, err := linkIndex(h2, flannelhost.DeviceName(1)); err == nil {
		t.Errorf("flannel.1 is still there after teardown")
	}
}

// flannelConfList runs podConf, the bridge config flannel's plugin hands
// on, as a runtime would run flannel's conflist.
func flannelConfList(t *testing.T, podConf []byte) *libcni.NetworkConfigList {
	t.Helper()
	list, err := flannelhost.PodConfList(podConf)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// bridgePorts counts the links enslaved to bridge on n: one veth per pod.
func bridgePorts(n *lab.Node, bridge string) (int, error) {
	h, err := netlink.NewHandleAt(n.NS)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	br, err := h.LinkByName(bridge)
	if err != nil {
		return 0, err
	}
	links, err := h.LinkList()
	if err != nil {
		return 0, err
	}
	ports := 0
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			ports++
		}
	}
	return ports, nil
}

func leaseRow(t *testing.T, l *lab.Lab, node string) (lab.LeaseRow, bool) {
	t.Helper()
	ll, err := l.Leases(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return ll.ByNode(node)
}

func linkIndex(n *lab.Node, name string) (int, error) {
	h, err := netlink.NewHandleAt(n.NS)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		return 0, err
	}
	return link.Attrs().Index, nil
}

// masqRules lists overlay's masquerade table in n.
func masqRules(n *lab.Node) ([]string, error) {
	m, err := masq.New(netip.MustParsePrefix("10.244.0.0/16"), masq.WithNetNS(n.NS))
	if err != nil {
		return nil, err
	}
	defer m.Close()
	return m.Rules()
}
