package kubee2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/overlaynet/overlay/backend/masq"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/internal/testing/flannelhost"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// A node running flanneld in kube mode (the flannelhost fixture: its
// Node's annotations and status as flanneld patches them, its device,
// routes, neighbours, FDB entries, subnet.env and masquerade keyed on the
// Node's podCIDR) and a node running overlayd --kube-subnet-mgr reach each
// other's pods over VXLAN, both ways, without NAT: overlayd takes the
// flanneld node for a peer from its annotations alone, and the flanneld
// node programs overlayd's from the annotations overlayd published, as
// flanneld does.
func TestKubeModeMixedWithFlanneld(t *testing.T) {
	k := newKubeModeLab(t, "kmix")
	k1, k2, fl := k.overlaydAndFlanneld()

	cni := k.cni()
	p1 := k.overlayPod(cni, k1, "p1", "")
	p2 := flannelPod(t, cni, k2, "p2", fl.PodConfig("cbr0", filepath.Join(k.dir(k2), "ipam")))
	testenv.Eventually(t, time.Minute, "k1's pod and the flanneld node's pod to reach each other", func() error {
		return errors.Join(p1.reach(p2), p2.reach(p1))
	})
}

// A node left by kube-flannel's DaemonSet (the fixture, with a pod its CNI
// plugin attached) is taken over in place by `overlayd run
// --kube-subnet-mgr --adopt-flannel` while a pod on an overlayd node
// probes that pod 20 times a second: no probe lost, the pod not
// restarted, the Node's annotations now overlayd's with the MAC of the
// device it adopted (same ifindex), flanneld's routes and masquerade
// replaced by overlayd's, a restart with --adopt-flannel still set (the
// DaemonSet keeps it) loses nothing either, and a new pod gets a fresh
// address of the same podCIDR. Before that, a takeover whose flanneld
// subnet.env names another subnet than the Node's podCIDR is refused with
// an error saying so, and touches nothing; and `overlayd masquerade
// install --net-config-path` puts overlay's masquerade beside flanneld's,
// as the migration's steps say.
func TestKubeModeAdoptFlannel(t *testing.T) {
	k := newKubeModeLab(t, "kadopt")
	k1, k2, fl := k.overlaydAndFlanneld()
	dev, err := linkIndex(k2.NS, flannelhost.DeviceName(1))
	if err != nil {
		t.Fatal(err)
	}

	// The pod flannel's plugin attached, and its cache entry.
	cni := k.cni()
	ipamDir, flannelCache := filepath.Join(k.dir(k2), "ipam"), filepath.Join(k.dir(k2), "flannel-cni")
	podConf := fl.PodConfig("cbr0", ipamDir)
	old := flannelPod(t, cni, k2, "old", podConf)
	if err := flannelhost.WriteCache(flannelCache, old.containerID, podConf); err != nil {
		t.Fatal(err)
	}
	p1 := k.overlayPod(cni, k1, "p1", "")
	testenv.Eventually(t, time.Minute, "k1's pod and flannel's pod to reach each other", func() error {
		return errors.Join(p1.reach(old), old.reach(p1))
	})
	interval := 50 * time.Millisecond
	s, err := lab.StartStream(p1.ns, netip.AddrPortFrom(old.ip, lab.ProbePort), interval, testenv.Deadline(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	testenv.Eventually(t, 10*time.Second, "the probe stream to start", func() error {
		if st := s.Stats(); st.Received < 5 {
			return fmt.Errorf("%s", st)
		}
		return nil
	})

	// flanneld's subnet.env names another subnet than the Node's podCIDR:
	// refused, nothing touched.
	wrong := filepath.Join(k.dir(k2), "wrong-subnet.env")
	if err := os.WriteFile(wrong, []byte("FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.9.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	refused := k.startOverlayd(k2, "overlayd-refused", "--adopt-flannel", "--flannel-subnet-file", wrong)
	testenv.Eventually(t, time.Minute, "the takeover with another subnet to be refused", func() error {
		if done, _ := refused.Exited(); !done {
			return errors.New("overlayd still runs")
		}
		return nil
	})
	if _, how := refused.Exited(); how == "exit status 0" || !strings.Contains(tail(refused.Log, 20), "this host's lease is 10.244.2.0/24 (node/k2)") ||
		!strings.Contains(tail(refused.Log, 20), wrong+" says 10.244.9.1/24") {
		t.Errorf("the refused takeover ended with %q, log:\n%s\nwant an error naming flanneld's subnet.env and node/k2's podCIDR", how, tail(refused.Log, 20))
	}
	if idx, err := linkIndex(k2.NS, flannelhost.DeviceName(1)); err != nil || idx != dev {
		t.Fatalf("flannel.1 is index %d (%v) after the refused takeover, was %d", idx, err, dev)
	}
	if present, err := flannelhost.MasqPresent(k2.NS); err != nil || !present {
		t.Fatalf("the refused takeover removed flanneld's masquerade (%v)", err)
	}

	// The documented step before flanneld stops: overlay's masquerade,
	// for the network of the file kube mode reads.
	install, err := k.sups[k2.Name].Start("masquerade-install", filepath.Join(k.dir(k2), "masquerade-install.log"), testenv.ProgramEnv(),
		k.overlayd, "masquerade", "install", "--net-config-path", k.netConf)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, time.Minute, "overlayd masquerade install to exit", func() error {
		if done, _ := install.Exited(); !done {
			return errors.New("still running")
		}
		return nil
	})
	if _, how := install.Exited(); how != "exit status 0" || !strings.Contains(tail(install.Log, 5), "installed nftables table inet overlay for 10.244.0.0/16") {
		t.Fatalf("overlayd masquerade install --net-config-path: %s, output:\n%s", how, tail(install.Log, 5))
	}
	if rules, err := masqRules(k2.NS); err != nil || !strings.Contains(strings.Join(rules, "\n"), `oifname "flannel.1"`) {
		t.Fatalf("overlay's table after masquerade install: %v, %v; want its rules on flannel.1", rules, err)
	}

	// The takeover, with flanneld's own subnet.env and its --ip-masq.
	ovl := k.startOverlayd(k2, "overlayd", "--adopt-flannel", "--flannel-subnet-file", fl.SubnetFile)
	k.waitReady(k2, ovl)
	twoAndAHalfSeconds := func(what string) {
		t.Helper()
		seenAt := s.Stats().Sent
		testenv.Eventually(t, 50*interval+10*time.Second, "2.5 s of traffic after "+what, func() error {
			if sent := s.Stats().Sent; sent < seenAt+50 {
				return fmt.Errorf("%d probes since ready", sent-seenAt)
			}
			return nil
		})
	}
	twoAndAHalfSeconds("the takeover")
	// The DaemonSet keeps --adopt-flannel: a restart (a rolling update)
	// finds flannel.1 overlayd's own, with the podCIDR, and drops nothing.
	if err := k.sups[k2.Name].StopProc(ovl, testenv.Deadline(time.Minute)); err != nil {
		t.Fatal(err)
	}
	k.waitReady(k2, k.startOverlayd(k2, "overlayd-restarted", "--adopt-flannel", "--flannel-subnet-file", fl.SubnetFile))
	twoAndAHalfSeconds("the restart")
	if st := s.Stop(); st.Sent == 0 || len(st.Lost) > 0 || st.Received != st.Sent {
		t.Errorf("%s -> %s across the takeover and a restart: %s; want every probe answered", p1, old, st)
	} else {
		t.Logf("%s -> %s across the takeover and a restart: %s", p1, old, st)
	}

	// The Node's annotations are overlayd's, with the adopted device's MAC.
	n, err := k.admin.Nodes().Get(k.ctx, "k2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := n.Annotations[ann+"backend-data"]; got != `{"VNI":1,"VtepMAC":"`+fl.VtepMAC.String()+`"}` ||
		n.Annotations[ann+"public-ip"] != k2.IP.String() || n.Annotations[ann+"kube-subnet-manager"] != "true" {
		t.Errorf("k2's annotations after the takeover %v, want flannel.1's MAC %s and public-ip %s", n.Annotations, fl.VtepMAC, k2.IP)
	}
	if !networkAvailable(n) {
		t.Errorf("k2's NetworkUnavailable is not False: %+v", n.Status.Conditions)
	}
	if idx, err := linkIndex(k2.NS, flannelhost.DeviceName(1)); err != nil || idx != dev {
		t.Errorf("flannel.1 is index %d (%v), was %d: recreated", idx, err, dev)
	}
	if _, err := linkIndex(k2.NS, vxlan.DeviceName(1)); err == nil {
		t.Errorf("overlay.1 was created beside flannel.1")
	}
	testenv.Eventually(t, 30*time.Second, "k2's route to k1's podCIDR to be overlayd's on flannel.1", func() error {
		return overlaydRoute(k2.NS, netip.MustParsePrefix("10.244.1.0/24"), dev)
	})
	if present, err := flannelhost.MasqPresent(k2.NS); err != nil || present {
		t.Errorf("flanneld's masquerade chain is still there (%v)", err)
	}
	if err := errors.Join(p1.reach(old), old.reach(p1)); err != nil {
		t.Error(err)
	}

	// A new pod, through overlay-cni on the network kube-flannel named
	// cbr0, gets a fresh address of the podCIDR and reaches k1's pod.
	fresh := k.overlayPod(cni, k2, "new", flannelCache)
	if fresh.ip == old.ip || !fl.Subnet.Contains(fresh.ip) {
		t.Errorf("new pod's address %s: want a fresh one of %s (the old pod holds %s)", fresh.ip, fl.Subnet, old.ip)
	}
	if err := errors.Join(p1.reach(fresh), fresh.reach(p1)); err != nil {
		t.Error(err)
	}
}

// overlaydAndFlanneld makes the two nodes of a mixed cluster: k1
// (podCIDR 10.244.1.0/24) running overlayd --kube-subnet-mgr, ready, and
// k2 (10.244.2.0/24) as flanneld in kube mode left it, with k1 for a peer.
func (k *kubeModeLab) overlaydAndFlanneld() (k1, k2 *lab.Host, fl flannelhost.Host) {
	k.t.Helper()
	k1 = k.addNode("k1", 1, "10.244.1.0/24")
	k2 = k.addNode("k2", 2, "10.244.2.0/24")
	fl = k.flanneldNode(k2, "10.244.2.0/24")
	k.waitReady(k1, k.startOverlayd(k1, "overlayd"))
	k.flanneldSeesPeer(fl, k2, k1, "10.244.1.0/24")
	return k1, k2, fl
}

// flanneldNode builds on h what flanneld --kube-subnet-mgr (v0.28, vxlan,
// --ip-masq) leaves, for h's Node with podCIDR, and puts flanneld's
// annotations and NetworkUnavailable=False on the Node, as flanneld
// patches them.
func (k *kubeModeLab) flanneldNode(h *lab.Host, podCIDR string) flannelhost.Host {
	k.t.Helper()
	ip4 := h.IP.As4()
	fl := flannelhost.Host{Iface: h.Iface, PublicIP: h.IP, Network: netip.MustParsePrefix("10.244.0.0/16"),
		Subnet: netip.MustParsePrefix(podCIDR), VNI: 1, VtepMAC: net.HardwareAddr{0x5a, 0x8e, 0x11, 0x22, 0x33, ip4[3]},
		SubnetFile: filepath.Join(k.dir(h), "flannel", "subnet.env")}
	if err := fl.BuildNode(h.NS); err != nil {
		k.t.Fatal(err)
	}
	if _, err := k.admin.Nodes().Patch(k.ctx, h.Name, types.StrategicMergePatchType, fl.KubePatch(flannelhost.DefaultAnnotationPrefix), metav1.PatchOptions{}, "status"); err != nil {
		k.t.Fatal(err)
	}
	if _, err := k.admin.Nodes().Patch(k.ctx, h.Name, types.StrategicMergePatchType, flannelhost.KubeStatusPatch(time.Now()), metav1.PatchOptions{}, "status"); err != nil {
		k.t.Fatal(err)
	}
	return fl
}

// flanneldSeesPeer programs, on the flanneld node h, the peer node peer
// (with podCIDR) from the annotations on its Node, as flanneld does when
// its informer delivers them.
func (k *kubeModeLab) flanneldSeesPeer(fl flannelhost.Host, h, peer *lab.Host, podCIDR string) {
	k.t.Helper()
	n, err := k.admin.Nodes().Get(k.ctx, peer.Name, metav1.GetOptions{})
	if err != nil {
		k.t.Fatal(err)
	}
	var data struct{ VtepMAC string }
	if err := json.Unmarshal([]byte(n.Annotations[ann+"backend-data"]), &data); err != nil {
		k.t.Fatalf("%s's backend-data %q: %v", peer.Name, n.Annotations[ann+"backend-data"], err)
	}
	mac, err := net.ParseMAC(data.VtepMAC)
	if err != nil {
		k.t.Fatal(err)
	}
	pub, err := netip.ParseAddr(n.Annotations[ann+"public-ip"])
	if err != nil {
		k.t.Fatal(err)
	}
	if err := fl.AddPeer(h.NS, flannelhost.Peer{Subnet: netip.MustParsePrefix(podCIDR), PublicIP: pub, VtepMAC: mac}); err != nil {
		k.t.Fatal(err)
	}
}

// cni is a libcni of the repository's plugins (bin/overlay-cni, bin/cni/*)
// with its cache in the lab's directory.
func (k *kubeModeLab) cni() *libcni.CNIConfig {
	bin := filepath.Join(testenv.RepoRoot(k.t), "bin")
	testenv.Binary(k.t, "overlay-cni")
	return libcni.NewCNIConfigWithCacheDir([]string{bin, filepath.Join(bin, "cni")}, filepath.Join(k.a.dir, "libcni"), testenv.CNIExec(os.Stderr))
}

// overlayPod attaches pod name on h through overlay-cni on the network
// cbr0 (kube-flannel's name, kept on a migrated node), reading h's
// subnet.env, its state in h's directory; flannelDataDir, if set, is
// flannel's cache.
func (k *kubeModeLab) overlayPod(cni *libcni.CNIConfig, h *lab.Host, name, flannelDataDir string) *nsPod {
	k.t.Helper()
	plugin := map[string]any{"type": "overlay-cni", "subnetFile": filepath.Join(k.dir(h), "subnet.env"),
		"dataDir": filepath.Join(k.dir(h), "cni-cache"), "ipam": map[string]any{"dataDir": filepath.Join(k.dir(h), "ipam")},
		"delegate": map[string]any{"hairpinMode": true, "isDefaultGateway": true}}
	if flannelDataDir != "" {
		plugin["flannelDataDir"] = flannelDataDir
	}
	raw, err := json.Marshal(map[string]any{"cniVersion": "1.0.0", "name": "cbr0", "plugins": []any{plugin}})
	if err != nil {
		k.t.Fatal(err)
	}
	list, err := libcni.ConfListFromBytes(raw)
	if err != nil {
		k.t.Fatal(err)
	}
	return attachPod(k.t, cni, h, name, list)
}

// flannelPod attaches pod name on h as flannel's CNI plugin does: the
// bridge plugin with podConf, the delegate config it renders.
func flannelPod(t *testing.T, cni *libcni.CNIConfig, h *lab.Host, name string, podConf []byte) *nsPod {
	t.Helper()
	list, err := flannelhost.PodConfList(podConf)
	if err != nil {
		t.Fatal(err)
	}
	return attachPod(t, cni, h, name, list)
}

// nsPod is a pod without a kubelet: a network namespace attached to its
// host by libcni with a conflist, as a runtime attaches one, serving
// lab's Responder on its address.
type nsPod struct {
	name, containerID string
	ns                netns.NsHandle
	ip                netip.Addr
}

func (p *nsPod) String() string { return fmt.Sprintf("%s (%s)", p.name, p.ip) }

// attachPod creates pod name on h: a namespace of the lab's run, CNI ADD
// of list inside h's namespace, a Responder on the pod's address. The
// cleanup deletes the namespace (the host's namespace, with the bridge
// and the veths, goes with the lab).
func attachPod(t *testing.T, cni *libcni.CNIConfig, h *lab.Host, name string, list *libcni.NetworkConfigList) *nsPod {
	t.Helper()
	p := &nsPod{name: h.Name + "/" + name, containerID: h.NSName + "-" + name}
	nsName := p.containerID
	_ = netns.DeleteNamed(nsName)
	var err error
	if p.ns, err = lab.NewNamedNS(nsName); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.ns.Close(); _ = netns.DeleteNamed(nsName) })
	if err := lab.Do(p.ns, func() error {
		lo, err := netlink.LinkByName("lo")
		if err == nil {
			err = netlink.LinkSetUp(lo)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	rt := &libcni.RuntimeConf{ContainerID: p.containerID, NetNS: filepath.Join("/run/netns", nsName), IfName: "eth0"}
	var res *types100.Result
	if err := lab.Do(h.NS, func() error {
		r, err := cni.AddNetworkList(context.Background(), list, rt)
		if err != nil {
			return err
		}
		res, err = types100.NewResultFromResult(r)
		return err
	}); err != nil {
		t.Fatalf("CNI ADD of %s: %v", p.name, err)
	}
	for _, ipc := range res.IPs {
		if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok && a.Unmap().Is4() {
			p.ip = a.Unmap()
		}
	}
	if !p.ip.IsValid() {
		t.Fatalf("CNI ADD of %s gave no IPv4 address: %v", p.name, res)
	}
	r, err := lab.Serve(p.ns, p.ip, lab.ProbePort)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return p
}

// reach connects from p to to's Responder: to must see p's own address
// (no NAT between pods).
func (p *nsPod) reach(to *nsPod) error {
	seen, err := lab.WhoAmI(p.ns, netip.AddrPortFrom(to.ip, lab.ProbePort), 2*time.Second)
	if err != nil {
		return fmt.Errorf("%s -> %s: %w", p, to, err)
	}
	if seen != p.ip {
		return fmt.Errorf("%s -> %s: the destination saw source %s (NAT between pods)", p, to, seen)
	}
	return nil
}

// masqRules lists overlay's masquerade table in ns.
func masqRules(ns netns.NsHandle) ([]string, error) {
	m, err := masq.New(netip.MustParsePrefix("10.244.0.0/16"), masq.WithNetNS(ns))
	if err != nil {
		return nil, err
	}
	defer m.Close()
	return m.Rules()
}

func linkIndex(ns netns.NsHandle, name string) (int, error) {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		return 0, err
	}
	return l.Attrs().Index, nil
}

// overlaydRoute says why the route to dst in ns is not overlayd's
// (protocol vxlan.RouteProtocol, its metric) on the device dev.
func overlaydRoute(ns netns.NsHandle, dst netip.Prefix, dev int) error {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	routes, err := h.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)}}, netlink.RT_FILTER_DST)
	if err != nil {
		return err
	}
	for _, r := range routes {
		if r.LinkIndex == dev && int(r.Protocol) == vxlan.RouteProtocol && r.Priority == vxlan.RouteMetric(dst) {
			return nil
		}
	}
	return fmt.Errorf("routes to %s: %v, want overlayd's on device %d", dst, routes, dev)
}
