package kubee2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcore "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// TestKubeModeDaemons runs two `overlayd run --kube-subnet-mgr` processes
// (bin/overlayd) on two hosts of an underlay, against a real
// kube-apiserver on a third, each with a kubeconfig of a user holding only
// overlay-kube.yaml's ClusterRole and no etcd: both get ready, mark their
// Node's network available, and VXLAN carries traffic between their
// subnets (a ping from one host's overlay address to the other's); one
// restarted adopts what it left with no netlink write.
func TestKubeModeDaemons(t *testing.T) {
	k := newKubeModeLab(t, "kmode")
	type host struct {
		h       *lab.Host
		podCIDR string
		overlay netip.Addr // the address of its VXLAN device: its subnet's .0
	}
	hosts := []host{{podCIDR: "10.244.1.0/24", overlay: netip.MustParseAddr("10.244.1.0")}, {podCIDR: "10.244.2.0/24", overlay: netip.MustParseAddr("10.244.2.0")}}
	first := make([]*proc, len(hosts))
	for i := range hosts {
		hosts[i].h = k.addNode(fmt.Sprintf("k%d", i+1), i+1, hosts[i].podCIDR)
		first[i] = k.startOverlayd(hosts[i].h, "overlayd", "--ip-masq=false")
	}
	for _, h := range hosts {
		testenv.Eventually(t, 2*time.Minute, h.h.Name+"'s overlayd ready", func() error { return readyz(h.h) })
	}
	// bin/overlayd links no Kubernetes client: it handed the command over
	// to overlayd-kube in place, the supervisor's child keeping its PID.
	for i, h := range hosts {
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", first[i].PID)); err != nil || exe != k.overlaydKube {
			t.Errorf("%s's overlayd (pid %d) runs %q (%v), want %s", h.h.Name, first[i].PID, exe, err, k.overlaydKube)
		}
	}
	for _, h := range hosts {
		n, err := k.admin.Nodes().Get(k.ctx, h.h.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Annotations[ann+"public-ip"] != h.h.IP.String() || n.Annotations[ann+"kube-subnet-manager"] != "true" {
			t.Errorf("%s's annotations %v, want public-ip %s", h.h.Name, n.Annotations, h.h.IP)
		}
		// Set once the data path is up, which may be just after /readyz
		// says ready.
		testenv.Eventually(t, 30*time.Second, h.h.Name+"'s NetworkUnavailable to be False", func() error {
			n, err := k.admin.Nodes().Get(k.ctx, h.h.Name, metav1.GetOptions{})
			if err == nil && !networkAvailable(n) {
				err = fmt.Errorf("conditions %+v", n.Status.Conditions)
			}
			return err
		})
	}
	// Over VXLAN: k1's overlay address to k2's, and back.
	testenv.Eventually(t, time.Minute, "k1 to reach k2's overlay address", func() error {
		_, err := lab.Ping(hosts[0].h.NS, hosts[1].overlay, 2*time.Second)
		return err
	})
	if _, err := lab.Ping(hosts[1].h.NS, hosts[0].overlay, 2*time.Second); err != nil {
		t.Errorf("k2 to k1's overlay address: %v", err)
	}

	// A restart, as a rolling update of the DaemonSet does: the new
	// overlayd adopts the kernel state the old one left, writing nothing,
	// and the path still carries traffic.
	k2 := hosts[1].h
	if err := k.sups[k2.Name].StopProc(first[1], testenv.Deadline(time.Minute)); err != nil {
		t.Fatal(err)
	}
	k.waitReady(k2, k.startOverlayd(k2, "overlayd-restarted", "--ip-masq=false"))
	if w, err := netlinkWrites(k2); err != nil || w != "0" {
		t.Errorf("k2's overlayd after a restart: overlay_netlink_writes_total %q (%v), want 0: it rewrote kernel state the old one left", w, err)
	}
	if _, err := lab.Ping(hosts[0].h.NS, hosts[1].overlay, 2*time.Second); err != nil {
		t.Errorf("k1 to k2's overlay address after k2's restart: %v", err)
	}
}

// kubeModeLab is an underlay with a real kube-apiserver on a host of its
// own (cp), the kubeconfig of a user holding only overlay-kube.yaml's
// ClusterRole, and a net-conf.json of 10.244.0.0/16: where overlayd
// --kube-subnet-mgr runs on the hosts addNode makes.
type kubeModeLab struct {
	t                   *testing.T
	ctx                 context.Context
	ul                  *lab.Underlay
	a                   *apiServer
	admin               typedcore.CoreV1Interface
	kubeconfig, netConf string
	overlayd            string // bin/overlayd
	overlaydKube        string // bin/overlayd-kube, which bin/overlayd runs in kube mode
	sups                map[string]*nodeSupervisor
}

func newKubeModeLab(t *testing.T, tag string) *kubeModeLab {
	t.Helper()
	testenv.RequireRoot(t)
	k := &kubeModeLab{t: t, overlayd: testenv.Binary(t, "overlayd"), overlaydKube: testenv.Binary(t, "overlayd-kube"), sups: map[string]*nodeSupervisor{}}
	rootUnchanged(t)
	var err error
	if k.ul, err = lab.NewUnderlay(tag); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k.ul.Close() })
	cp, err := k.ul.AddHost("cp", cpHostNum)
	if err != nil {
		t.Fatal(err)
	}
	k.a = startAPIServer(t, cp.NS, cp.IP.String())
	k.a.grantManifestRole("overlay")
	k.admin = k.a.core("admin-token")
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(4*time.Minute))
	t.Cleanup(cancel)
	k.ctx = ctx

	k.kubeconfig = filepath.Join(k.a.dir, "overlay.kubeconfig")
	if err := os.WriteFile(k.kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: lab, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: overlay, user: {token: overlay-token}}]
contexts: [{name: lab, context: {cluster: lab, user: overlay}}]
current-context: lab
`, k.a.url(), k.a.pki.CACert)), 0o600); err != nil {
		t.Fatal(err)
	}
	k.netConf = filepath.Join(k.a.dir, "net-conf.json")
	if err := os.WriteFile(k.netConf, []byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":1}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	return k
}

// addNode adds host name (underlay address num) and registers its Node
// with podCIDR, as kube-controller-manager would have assigned it.
func (k *kubeModeLab) addNode(name string, num int, podCIDR string) *lab.Host {
	k.t.Helper()
	h, err := k.ul.AddHost(name, num)
	if err != nil {
		k.t.Fatal(err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: podCIDR, PodCIDRs: []string{podCIDR}}}
	if _, err := k.admin.Nodes().Create(k.ctx, n, metav1.CreateOptions{}); err != nil {
		k.t.Fatal(err)
	}
	if err := os.MkdirAll(k.dir(h), 0o755); err != nil {
		k.t.Fatal(err)
	}
	return h
}

// waitReady waits until p, h's overlayd, is ready, failing at once if
// it exits.
func (k *kubeModeLab) waitReady(h *lab.Host, p *proc) {
	k.t.Helper()
	testenv.Eventually(k.t, 2*time.Minute, h.Name+"'s overlayd ready", func() error {
		if done, how := p.Exited(); done {
			k.t.Fatalf("%s's overlayd exited (%s):\n%s", h.Name, how, tail(p.Log, 20))
		}
		return readyz(h)
	})
}

// dir is host h's directory: its subnet.env, logs, CNI state.
func (k *kubeModeLab) dir(h *lab.Host) string { return filepath.Join(k.a.dir, h.Name) }

// startOverlayd starts `overlayd run --kube-subnet-mgr` on h (the
// supervisor's program name, with args added), through h's supervisor;
// its log's tail is reported if the test fails.
func (k *kubeModeLab) startOverlayd(h *lab.Host, name string, args ...string) *proc {
	k.t.Helper()
	sup := k.sups[h.Name]
	if sup == nil {
		var err error
		if sup, err = startSupervisor(h.Name, h.NS, nil, filepath.Join(k.dir(h), "supervisor.log")); err != nil {
			k.t.Fatal(err)
		}
		k.t.Cleanup(func() { _ = sup.Stop() })
		k.sups[h.Name] = sup
	}
	argv := append([]string{k.overlayd, "run", "--kube-subnet-mgr", "--kubeconfig-file", k.kubeconfig, "--net-config-path", k.netConf,
		"--iface", "eth0", "--subnet-file", filepath.Join(k.dir(h), "subnet.env")}, args...)
	p, err := sup.Start(name, filepath.Join(k.dir(h), name+".log"), testenv.ProgramEnv("NODE_NAME="+h.Name), argv...)
	if err != nil {
		k.t.Fatal(err)
	}
	k.t.Cleanup(func() {
		if k.t.Failed() {
			k.t.Logf("%s's %s log:\n%s", h.Name, name, tail(p.Log, 40))
		}
	})
	return p
}

func networkAvailable(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable {
			return c.Status == corev1.ConditionFalse
		}
	}
	return false
}

// readyz asks h's overlayd, on its default health address inside h's
// namespace, whether it is ready.
func readyz(h *lab.Host) error {
	_, err := healthGet(h, "/readyz")
	return err
}

// healthGet GETs path from h's overlayd's health address (its default,
// inside h's namespace): the body, or an error naming a status other
// than 200 OK.
func healthGet(h *lab.Host, path string) (string, error) {
	cli := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
		err = lab.Do(h.NS, func() error {
			conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}}}
	resp, err := cli.Get("http://127.0.0.1:9436" + path)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return string(body), nil
}

// netlinkWrites is h's overlayd's overlay_netlink_writes_total.
func netlinkWrites(h *lab.Host) (string, error) {
	body, err := healthGet(h, "/metrics")
	if err != nil {
		return "", err
	}
	for line := range strings.Lines(body) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "overlay_netlink_writes_total "); ok {
			return v, nil
		}
	}
	return "", errors.New("no overlay_netlink_writes_total in /metrics")
}

// checkKubeMode checks, on a cluster deployed in kube mode, what flanneld's
// kube subnet manager leaves on every Node and what its peers rely on:
// podCIDRs allocated by kube-controller-manager and taken by overlayd as
// its lease (subnet.env), the NetworkUnavailable condition false, and
// exactly flanneld's annotations with this node's VTEP MAC and public
// address of each family the network carries. overlayd patches the
// condition once its data path is up, which may follow its readiness by a
// moment: the Nodes are read until all of it holds, for a minute at most.
func (c *cluster) checkKubeMode(t *testing.T) {
	t.Helper()
	nc := c.kubeNetwork()
	want := map[string]struct {
		podCIDRs    []string
		annotations map[string]string
	}{}
	for _, kn := range c.nodes {
		w := want[kn.Name]
		for _, v6 := range []bool{false, true} {
			if (v6 && !c.hasIPv6()) || (!v6 && c.ipv6Only) {
				continue
			}
			_, vtep := c.nodeAddrs(kn, v6)
			bits := nc.SubnetLen
			if v6 {
				bits = nc.IPv6.SubnetLen
			}
			w.podCIDRs = append(w.podCIDRs, netip.PrefixFrom(vtep, bits).String())
		}
		w.annotations = map[string]string{ann + "kube-subnet-manager": "true", ann + "backend-type": "vxlan"}
		if !c.ipv6Only {
			maps.Copy(w.annotations, flannelAnnotations(kn.IP.String(), vtepMAC(t, kn, "overlay.1")))
		}
		if c.hasIPv6() {
			w.annotations[ann+"public-ipv6"] = kn.IPv6.String()
			w.annotations[ann+"backend-v6-data"] = `{"VNI":1,"VtepMAC":"` + vtepMAC(t, kn, "overlay-v6.1") + `"}`
		}
		want[kn.Name] = w
	}
	testenv.Eventually(t, time.Minute, "every Node as flanneld's kube subnet manager leaves it", func() error {
		var nl struct {
			Items []corev1.Node `json:"items"`
		}
		if err := c.kubeGet(&nl, "nodes"); err != nil {
			return err
		}
		var errs []error
		seen := 0
		for _, n := range nl.Items {
			w, ok := want[n.Name]
			if !ok {
				continue
			}
			seen++
			if !networkAvailable(&n) {
				errs = append(errs, fmt.Errorf("%s: NetworkUnavailable is not False: %+v", n.Name, n.Status.Conditions))
			}
			got := slices.Clone(n.Spec.PodCIDRs)
			slices.SortFunc(got, func(a, b string) int { return cmpFamily(a) - cmpFamily(b) })
			if !slices.Equal(got, w.podCIDRs) {
				errs = append(errs, fmt.Errorf("%s: podCIDRs %v, but overlayd's lease (subnet.env) is %v", n.Name, n.Spec.PodCIDRs, w.podCIDRs))
			}
			gotAnn := map[string]string{}
			for k, v := range n.Annotations {
				if strings.HasPrefix(k, ann) {
					gotAnn[k] = v
				}
			}
			if !maps.Equal(gotAnn, w.annotations) {
				errs = append(errs, fmt.Errorf("%s: annotations %v, want flanneld's %v", n.Name, gotAnn, w.annotations))
			}
		}
		if seen != len(want) {
			errs = append(errs, fmt.Errorf("%d of the %d Nodes listed", seen, len(want)))
		}
		return errors.Join(errs...)
	})
	t.Logf("kube mode: %d nodes with podCIDRs from kube-controller-manager as their leases, NetworkUnavailable False, flanneld's annotations", len(c.nodes))
}

// cmpFamily orders a CIDR's family: IPv4 first.
func cmpFamily(cidr string) int {
	if strings.Contains(cidr, ":") {
		return 1
	}
	return 0
}

// vtepMAC is the MAC of device name in node n's namespace.
func vtepMAC(t *testing.T, n *kubeNode, name string) string {
	t.Helper()
	h, err := netlink.NewHandleAt(n.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("%s: %s: %v", n.Name, name, err)
	}
	return l.Attrs().HardwareAddr.String()
}
