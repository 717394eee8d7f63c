package kubee2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// networkConfig is the overlay network the lab stores in the overlay's
// etcd before applying the manifest (its step 2).
const networkConfig = `{"Network":"` + podNetwork + `","Backend":{"Type":"vxlan"}}`

// TestKubernetes builds the lab, deploys overlay with the shipped
// manifest and runs the network matrix.
func TestKubernetes(t *testing.T) {
	c := newCluster(t, 3)
	archive := c.buildImages(t)
	for _, n := range c.nodes {
		c.waitContainerd(n)
		c.importImages(n, archive)
	}
	netFile := filepath.Join(c.dir, "net.json")
	if err := os.WriteFile(netFile, []byte(networkConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := c.overlayCLI(context.Background(), "config", "put", "-f", netFile); err != nil {
		t.Fatalf("store the network config: %v\n%s", err, out)
	}
	for _, n := range c.nodes {
		c.startKube(n, "iptables")
	}
	c.waitNodes(false)
	c.applyManifest()
	c.waitNodes(true)
	c.waitDaemonSet()
	t.Logf("all %d nodes Ready with overlayd", len(c.nodes))

	m := newMatrix(c)
	m.setup()
	m.run(t)
}

// manifest is deploy/kubernetes/overlay.yaml with what a user sets: the
// etcd endpoints, the Secret's CA and the image name. Each must be found
// exactly where the manifest says, or the test fails: the lab applies the
// shipped manifest, never a second one.
func (c *cluster) manifest() []byte {
	t := c.t
	data, err := os.ReadFile(filepath.Join(c.root, "deploy", "kubernetes", "overlay.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := os.ReadFile(c.etcdCA)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	replace := func(old, new string, count int) {
		t.Helper()
		if n := strings.Count(text, old); n != count {
			t.Fatalf("deploy/kubernetes/overlay.yaml: %q found %d times, want %d (the lab sets it)", old, n, count)
		}
		text = strings.ReplaceAll(text, old, new)
	}
	replace(`OVERLAY_ENDPOINTS: "https://10.0.0.11:2379,https://10.0.0.12:2379,https://10.0.0.13:2379"`,
		fmt.Sprintf(`OVERLAY_ENDPOINTS: "https://%s:%d"`, c.cp.IP, overlayEtcd), 1)
	placeholder := "    -----BEGIN CERTIFICATE-----\n    replace with the CA that signed etcd's server certificate\n    -----END CERTIFICATE-----\n"
	var indented strings.Builder
	for _, line := range strings.Split(strings.TrimRight(string(ca), "\n"), "\n") {
		indented.WriteString("    " + line + "\n")
	}
	replace(placeholder, indented.String(), 1)
	replace("image: ghcr.io/overlaynet/overlay:latest", "image: "+overlayImage, 2)
	return []byte(text)
}

func (c *cluster) applyManifest() {
	out, err := c.kubectl(context.Background(), c.manifest(), "apply", "-f", "-")
	if err != nil {
		c.t.Fatalf("kubectl apply -f deploy/kubernetes/overlay.yaml: %v\n%s", err, out)
	}
	c.t.Logf("kubectl apply:\n%s", strings.TrimSpace(out))
}

// kubeGet runs kubectl get ... -o json into v.
func (c *cluster) kubeGet(v any, args ...string) error {
	out, err := c.kubectl(context.Background(), nil, append([]string{"get", "-o", "json"}, args...)...)
	if err != nil {
		return err
	}
	return json.Unmarshal([]byte(out), v)
}

type condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

type nodeList struct {
	Items []struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Status struct {
			Conditions []condition `json:"conditions"`
		} `json:"status"`
	} `json:"items"`
}

// waitNodes waits until every node is registered, and Ready if ready.
func (c *cluster) waitNodes(ready bool) {
	what := "every node to register"
	if ready {
		what = "every node to turn Ready"
	}
	testenv.Eventually(c.t, 3*time.Minute, what, func() error {
		for _, n := range c.nodes {
			c.procsAlive(n.sup)
		}
		var nl nodeList
		if err := c.kubeGet(&nl, "nodes"); err != nil {
			return err
		}
		state := map[string]string{}
		for _, item := range nl.Items {
			for _, cond := range item.Status.Conditions {
				if cond.Type == "Ready" {
					state[item.Metadata.Name] = cond.Status + " " + cond.Message
				}
			}
		}
		for _, n := range c.nodes {
			s, ok := state[n.Name]
			if !ok {
				return fmt.Errorf("node %s not registered", n.Name)
			}
			if ready && !strings.HasPrefix(s, "True") {
				return fmt.Errorf("node %s: Ready %s", n.Name, s)
			}
		}
		return nil
	})
}

// waitDaemonSet waits until overlayd's pod is ready on every node.
func (c *cluster) waitDaemonSet() {
	testenv.Eventually(c.t, 2*time.Minute, "the overlayd DaemonSet to be ready on every node", func() error {
		var ds struct {
			Status struct {
				Desired int `json:"desiredNumberScheduled"`
				Ready   int `json:"numberReady"`
				Updated int `json:"updatedNumberScheduled"`
			} `json:"status"`
		}
		if err := c.kubeGet(&ds, "-n", "overlay-system", "daemonset", "overlayd"); err != nil {
			return err
		}
		if ds.Status.Desired != len(c.nodes) || ds.Status.Ready != len(c.nodes) {
			return fmt.Errorf("desired %d, ready %d", ds.Status.Desired, ds.Status.Ready)
		}
		return nil
	})
}

// podInfo is what the tests read of a pod.
type podInfo struct {
	Name   string
	Node   string
	IP     netip.Addr
	HostIP netip.Addr
	Phase  string
	Ready  bool
}

type podJSON struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Spec struct {
		NodeName string `json:"nodeName"`
	} `json:"spec"`
	Status struct {
		Phase      string      `json:"phase"`
		PodIP      string      `json:"podIP"`
		HostIP     string      `json:"hostIP"`
		Conditions []condition `json:"conditions"`
	} `json:"status"`
}

func (p podJSON) info() podInfo {
	i := podInfo{Name: p.Metadata.Name, Node: p.Spec.NodeName, Phase: p.Status.Phase}
	i.IP, _ = netip.ParseAddr(p.Status.PodIP)
	i.HostIP, _ = netip.ParseAddr(p.Status.HostIP)
	for _, cond := range p.Status.Conditions {
		if cond.Type == "Ready" && cond.Status == "True" {
			i.Ready = true
		}
	}
	return i
}

// pods lists the pods of a namespace.
func (c *cluster) pods(namespace string) (map[string]podInfo, error) {
	var pl struct {
		Items []podJSON `json:"items"`
	}
	if err := c.kubeGet(&pl, "-n", namespace, "pods"); err != nil {
		return nil, err
	}
	out := map[string]podInfo{}
	for _, p := range pl.Items {
		out[p.Metadata.Name] = p.info()
	}
	return out, nil
}

// node returns the lab node called name.
func (c *cluster) node(name string) *kubeNode {
	for _, n := range c.nodes {
		if n.Name == name {
			return n
		}
	}
	c.t.Fatalf("no node %s", name)
	return nil
}
