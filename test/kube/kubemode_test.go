package kubee2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// TestKubeModeDaemons runs two `overlayd run --kube-subnet-mgr` processes
// (bin/overlayd) on two hosts of an underlay, against a real
// kube-apiserver on a third, each with a kubeconfig of a user holding only
// overlay-kube.yaml's ClusterRole and no etcd: both get ready, mark their
// Node's network available, and VXLAN carries traffic between their
// subnets (a ping from one host's overlay address to the other's).
func TestKubeModeDaemons(t *testing.T) {
	testenv.RequireRoot(t)
	overlayd := testenv.Binary(t, "overlayd")
	rootUnchanged(t)
	ul, err := lab.NewUnderlay("kmode")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ul.Close() })
	cp, err := ul.AddHost("cp", cpHostNum)
	if err != nil {
		t.Fatal(err)
	}
	a := startAPIServer(t, cp.NS, cp.IP.String())
	a.grantManifestRole("overlay")
	admin := a.core("admin-token")
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(4*time.Minute))
	defer cancel()

	kubeconfig := filepath.Join(a.dir, "overlay.kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: lab, cluster: {server: %q, certificate-authority: %q}}]
users: [{name: overlay, user: {token: overlay-token}}]
contexts: [{name: lab, context: {cluster: lab, user: overlay}}]
current-context: lab
`, a.url(), a.pki.CACert)), 0o600); err != nil {
		t.Fatal(err)
	}
	netConf := filepath.Join(a.dir, "net-conf.json")
	if err := os.WriteFile(netConf, []byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":1}}`), 0o644); err != nil {
		t.Fatal(err)
	}

	type host struct {
		h       *lab.Host
		podCIDR string
		overlay netip.Addr // the address of its VXLAN device: its subnet's .0
	}
	hosts := []host{{podCIDR: "10.244.1.0/24", overlay: netip.MustParseAddr("10.244.1.0")}, {podCIDR: "10.244.2.0/24", overlay: netip.MustParseAddr("10.244.2.0")}}
	for i := range hosts {
		name := fmt.Sprintf("k%d", i+1)
		if hosts[i].h, err = ul.AddHost(name, i+1); err != nil {
			t.Fatal(err)
		}
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: hosts[i].podCIDR, PodCIDRs: []string{hosts[i].podCIDR}}}
		if _, err := admin.Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(a.dir, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		sup, err := startSupervisor(name, hosts[i].h.NS, nil, filepath.Join(dir, "supervisor.log"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sup.Stop() })
		p, err := sup.Start("overlayd", filepath.Join(dir, "overlayd.log"), testenv.ProgramEnv("NODE_NAME="+name), overlayd, "run",
			"--kube-subnet-mgr", "--kubeconfig-file", kubeconfig, "--net-config-path", netConf,
			"--iface", "eth0", "--subnet-file", filepath.Join(dir, "subnet.env"), "--ip-masq=false")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("%s's overlayd log:\n%s", name, tail(p.Log, 40))
			}
		})
	}
	for _, h := range hosts {
		testenv.Eventually(t, 2*time.Minute, h.h.Name+"'s overlayd ready", func() error { return readyz(h.h) })
	}
	for _, h := range hosts {
		n, err := admin.Nodes().Get(ctx, h.h.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Annotations[ann+"public-ip"] != h.h.IP.String() || n.Annotations[ann+"kube-subnet-manager"] != "true" {
			t.Errorf("%s's annotations %v, want public-ip %s", h.h.Name, n.Annotations, h.h.IP)
		}
		if !networkAvailable(n) {
			t.Errorf("%s's NetworkUnavailable is not False: %+v", h.h.Name, n.Status.Conditions)
		}
	}
	// Over VXLAN: k1's overlay address to k2's, and back.
	testenv.Eventually(t, time.Minute, "k1 to reach k2's overlay address", func() error {
		_, err := lab.Ping(hosts[0].h.NS, hosts[1].overlay, 2*time.Second)
		return err
	})
	if _, err := lab.Ping(hosts[1].h.NS, hosts[0].overlay, 2*time.Second); err != nil {
		t.Errorf("k2 to k1's overlay address: %v", err)
	}
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
	cli := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
		err = lab.Do(h.NS, func() error {
			conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}}}
	resp, err := cli.Get("http://127.0.0.1:9436/readyz")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
