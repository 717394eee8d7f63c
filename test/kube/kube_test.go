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
	"github.com/overlaynet/overlay/subnet"
)

// networkConfig is the overlay network the lab stores in the overlay's
// etcd before applying the manifest (its step 2); dual-stack with
// EnableIPv6 and an IPv6Network, IPv6-only with EnableIPv4 false too
// (Documentation/configuration.md).
func networkConfig(families stack) string {
	switch families {
	case stackDual, stackDualIPv6First:
		return `{"Network":"` + podNetwork + `","EnableIPv6":true,"IPv6Network":"` + podNetwork6 + `","Backend":{"Type":"vxlan"}}`
	case stackIPv6:
		return `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"` + podNetwork6 + `","Backend":{"Type":"vxlan"}}`
	}
	return `{"Network":"` + podNetwork + `","Backend":{"Type":"vxlan"}}`
}

// pass is one run of the matrix on a cluster of its own.
type pass struct {
	name      string
	proxyMode string // kube-proxy's
	// forward: "" leaves the nodes' forwarding alone (a new namespace
	// forwards everything); "drop+accept" gives each node iptables'
	// FORWARD policy drop (as Docker leaves it) and the accept rules for
	// the cluster network that Documentation/operations.md prescribes
	// (on a dual-stack cluster ip6tables' too, with the IPv6 network's).
	forward string
	rolling bool // also roll the DaemonSet to a new image under traffic
	// dualStack: a dual-stack cluster (the overlay, the service ranges,
	// kubelet and kube-proxy in both families) whose matrix runs twice on
	// the same pods: with IPv4 and with IPv6 Services, pod and node
	// addresses.
	dualStack bool
	// services: on a dual-stack cluster, "SingleStack" (a Service of
	// each family) or "RequireDualStack" (each Service of both families,
	// reached by the rows of each).
	services string
	// ipv6Only: Kubernetes and the overlay in IPv6 alone (the matrix runs
	// its IPv6 rows).
	ipv6Only bool
	// ipv6First: a dual-stack cluster whose Kubernetes lists IPv6 first
	// (a node's status.hostIP, which the DaemonSet passes to overlayd as
	// its public address, is then its IPv6 address).
	ipv6First bool
	// kubeMode: overlay in kube mode (deploy/kubernetes/overlay-kube.yaml):
	// kube-controller-manager allocates the nodes' podCIDRs, and there is
	// no etcd for the overlay.
	kubeMode bool
}

// stack is the families of the pass's cluster.
func (p pass) stack() stack {
	switch {
	case p.dualStack && p.ipv6First:
		return stackDualIPv6First
	case p.dualStack:
		return stackDual
	case p.ipv6Only:
		return stackIPv6
	}
	return stackIPv4
}

// networks are the overlay's networks of the pass's cluster.
func (p pass) networks() []string {
	switch {
	case p.dualStack:
		return []string{podNetwork, podNetwork6}
	case p.ipv6Only:
		return []string{podNetwork6}
	}
	return []string{podNetwork}
}

var passes = []pass{
	{name: "iptables", proxyMode: "iptables", rolling: true},
	{name: "nftables", proxyMode: "nftables"},
	{name: "iptables-forward-drop", proxyMode: "iptables", forward: "drop+accept"},
	{name: "iptables-dual-stack", proxyMode: "iptables", dualStack: true, services: "SingleStack"},
	{name: "nftables-dual-stack", proxyMode: "nftables", dualStack: true, services: "RequireDualStack"},
	{name: "iptables-dual-stack-forward-drop", proxyMode: "iptables", forward: "drop+accept", dualStack: true, services: "RequireDualStack"},
	{name: "iptables-dual-stack-ipv6-first", proxyMode: "iptables", dualStack: true, ipv6First: true, services: "RequireDualStack"},
	{name: "iptables-ipv6-only", proxyMode: "iptables", ipv6Only: true},
	{name: "iptables-kube-mode", proxyMode: "iptables", kubeMode: true},
	{name: "nftables-dual-stack-kube-mode", proxyMode: "nftables", dualStack: true, services: "RequireDualStack", kubeMode: true},
}

// TestKubernetes builds the lab, deploys overlay with the shipped
// manifest and runs the network matrix, once per pass, each on a cluster
// of its own: kube-proxy in iptables mode (with a rolling update of the
// DaemonSet under traffic), in nftables mode, in iptables mode on nodes
// whose FORWARD policy is drop, and on dual-stack clusters in both
// families (single-stack Services of each family with kube-proxy in
// iptables mode, RequireDualStack Services in nftables mode, and
// RequireDualStack Services on nodes whose FORWARD policy is drop in both
// families), on an IPv6-only cluster, and in kube mode (overlay-kube.yaml,
// no overlay etcd: IPv4 with kube-proxy in iptables mode, and dual-stack
// with RequireDualStack Services in nftables mode), where checkKubeMode
// also checks each Node as flanneld leaves it. Every matrix is logged as a
// table and written as JSON to $KUBE_MATRIX.
func TestKubernetes(t *testing.T) {
	var out []map[string]any
	for _, p := range passes {
		t.Run(p.name, func(t *testing.T) {
			c := deploy(t, p)
			if p.kubeMode {
				c.checkKubeMode(t)
			}
			m := newMatrix(c, p.name, p.services)
			m.setup()
			if p.rolling {
				m.rollingUpdate(t)
			}
			for _, v6 := range m.families() {
				m.run(t, v6)
				out = append(out, map[string]any{"pass": p.name, "family": familyName(v6), "services": p.services,
					"proxyMode": p.proxyMode, "forward": p.forward, "rows": m.results})
			}
			c.doctor(t)
			if p.forward == "drop+accept" {
				for _, network := range p.networks() {
					k1 := c.node("k1")
					n, err := forwardAccepted(k1.NS, netip.MustParsePrefix(network))
					switch {
					case err != nil:
						t.Errorf("k1: %v", err)
					case n == 0:
						t.Errorf("k1: the FORWARD accept rules for %s counted no packet: the matrix did not cross the policy drop", network)
					default:
						t.Logf("k1: the FORWARD accept rules for %s let %d packets through the policy drop", network, n)
					}
				}
			}
		})
	}
	if path := os.Getenv("KUBE_MATRIX"); path != "" {
		data, err := json.MarshalIndent(map[string]any{"passes": out}, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
			t.Errorf("write %s: %v", path, err)
		}
	}
}

// deploy builds a three-node lab for pass p, stores the network config in
// the overlay's etcd (in kube mode: none, kube-controller-manager
// allocates the podCIDRs) and applies the shipped manifest of the pass's
// mode; it returns once every node is Ready and overlayd ready on each.
func deploy(t *testing.T, p pass) *cluster {
	start := time.Now()
	var netConf string
	if p.kubeMode {
		netConf = kubeNetConf(t, p.stack())
	}
	c := newCluster(t, 3, p.stack(), netConf)
	archive := c.buildImages(t)
	for _, n := range c.nodes {
		c.waitContainerd(n)
		c.importImages(n, archive)
		if p.forward == "drop+accept" {
			for _, network := range p.networks() {
				if err := forwardDrop(n.NS, netip.MustParsePrefix(network), true); err != nil {
					t.Fatalf("%s: %v", n.Name, err)
				}
			}
		}
	}
	if !p.kubeMode {
		netFile := filepath.Join(c.dir, "net.json")
		if err := os.WriteFile(netFile, []byte(networkConfig(p.stack())), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := c.overlayCLI(context.Background(), "config", "put", "-f", netFile); err != nil {
			t.Fatalf("store the network config: %v\n%s", err, out)
		}
	}
	for _, n := range c.nodes {
		c.startKube(n, p.proxyMode)
	}
	c.waitNodes(false)
	c.applyManifest()
	c.waitNodes(true)
	c.waitDaemonSet(overlayImage)
	t.Logf("all %d nodes Ready with overlayd, %s after the lab's start", len(c.nodes), time.Since(start).Round(time.Second))
	return c
}

// The shipped manifests (deploy/kubernetes), and the image they name.
const (
	etcdManifest  = "overlay.yaml"
	kubeManifest  = "overlay-kube.yaml"
	shippedImage  = "image: ghcr.io/overlaynet/overlay:latest"
	netConfHeader = "  net-conf.json: |\n    "
)

// shippedManifest returns deploy/kubernetes/<name> and a function that
// replaces in it what a user sets: each text must be found exactly count
// times, or the test fails (the lab applies the shipped manifest, never a
// second one).
func shippedManifest(t testing.TB, root, name string) (text *string, replace func(old, new string, count int)) {
	data, err := os.ReadFile(filepath.Join(root, "deploy", "kubernetes", name))
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	return &s, func(old, new string, count int) {
		t.Helper()
		if n := strings.Count(s, old); n != count {
			t.Fatalf("deploy/kubernetes/%s: %q found %d times, want %d (the lab sets it)", name, old, n, count)
		}
		s = strings.ReplaceAll(s, old, new)
	}
}

// kubeNetConf is the network config of a kube-mode pass: overlay-kube.yaml's
// net-conf.json as shipped on an IPv4 cluster (whose Network must be the
// lab's pod network), else the pass's own (networkConfig), which a user
// writes there.
func kubeNetConf(t testing.TB, families stack) string {
	text, _ := shippedManifest(t, testenv.RepoRoot(t), kubeManifest)
	line := shippedNetConf(t, *text)
	if families != stackIPv4 {
		return networkConfig(families)
	}
	nc, err := subnet.ParseConfig([]byte(line))
	if err != nil {
		t.Fatalf("deploy/kubernetes/%s: net-conf.json: %v", kubeManifest, err)
	}
	if nc.Network.String() != podNetwork {
		t.Fatalf("deploy/kubernetes/%s: net-conf.json's Network is %s, the lab's pod network %s", kubeManifest, nc.Network, podNetwork)
	}
	return line
}

// shippedNetConf is the net-conf.json line of overlay-kube.yaml's text.
func shippedNetConf(t testing.TB, text string) string {
	_, rest, ok := strings.Cut(text, netConfHeader)
	line, _, _ := strings.Cut(rest, "\n")
	if !ok || line == "" {
		t.Fatalf("deploy/kubernetes/%s: no net-conf.json line after %q (the lab reads it)", kubeManifest, netConfHeader)
	}
	return line
}

// manifest is the shipped manifest of the cluster's mode with what a user
// sets. etcd mode's overlay.yaml: the etcd endpoints, the Secret's CA and
// the image name; kube mode's overlay-kube.yaml: the image name, and
// net-conf.json where the cluster's is not the shipped one.
func (c *cluster) manifest() []byte {
	t := c.t
	if c.netConf != "" {
		text, replace := shippedManifest(t, c.root, kubeManifest)
		if shipped := shippedNetConf(t, *text); shipped != c.netConf {
			replace(netConfHeader+shipped+"\n", netConfHeader+c.netConf+"\n", 1)
		}
		replace(shippedImage, "image: "+overlayImage, 2)
		return []byte(*text)
	}
	text, replace := shippedManifest(t, c.root, etcdManifest)
	ca, err := os.ReadFile(c.etcdCA)
	if err != nil {
		t.Fatal(err)
	}
	replace(`OVERLAY_ENDPOINTS: "https://10.0.0.11:2379,https://10.0.0.12:2379,https://10.0.0.13:2379"`,
		fmt.Sprintf(`OVERLAY_ENDPOINTS: "https://%s:%d"`, c.cp.IP, overlayEtcd), 1)
	placeholder := "    -----BEGIN CERTIFICATE-----\n    replace with the CA that signed etcd's server certificate\n    -----END CERTIFICATE-----\n"
	var indented strings.Builder
	for _, line := range strings.Split(strings.TrimRight(string(ca), "\n"), "\n") {
		indented.WriteString("    " + line + "\n")
	}
	replace(placeholder, indented.String(), 1)
	replace(shippedImage, "image: "+overlayImage, 2)
	return []byte(*text)
}

func (c *cluster) applyManifest() {
	name := etcdManifest
	if c.netConf != "" {
		name = kubeManifest
	}
	out, err := c.kubectl(context.Background(), c.manifest(), "apply", "-f", "-")
	if err != nil {
		c.t.Fatalf("kubectl apply -f deploy/kubernetes/%s: %v\n%s", name, err, out)
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

// waitDaemonSet waits until overlayd's pod runs image and is ready on
// every node, and the DaemonSet controller has seen its latest spec.
func (c *cluster) waitDaemonSet(image string) {
	testenv.Eventually(c.t, 2*time.Minute, "the overlayd DaemonSet to be ready on every node with "+image, func() error {
		var ds struct {
			Metadata struct {
				Generation int64 `json:"generation"`
			} `json:"metadata"`
			Status struct {
				ObservedGeneration int64 `json:"observedGeneration"`
				Desired            int   `json:"desiredNumberScheduled"`
				Ready              int   `json:"numberReady"`
				Updated            int   `json:"updatedNumberScheduled"`
				Available          int   `json:"numberAvailable"`
			} `json:"status"`
		}
		if err := c.kubeGet(&ds, "-n", "overlay-system", "daemonset", "overlayd"); err != nil {
			return err
		}
		st, want := ds.Status, len(c.nodes)
		if ds.Status.ObservedGeneration != ds.Metadata.Generation || st.Desired != want || st.Ready != want || st.Updated != want || st.Available != want {
			return fmt.Errorf("status %+v, generation %d", st, ds.Metadata.Generation)
		}
		var pl struct {
			Items []struct {
				Metadata struct {
					Name string `json:"name"`
				} `json:"metadata"`
				Spec struct {
					Containers []struct {
						Image string `json:"image"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"items"`
		}
		if err := c.kubeGet(&pl, "-n", "overlay-system", "pods", "-l", "app=overlayd"); err != nil {
			return err
		}
		if len(pl.Items) != want {
			return fmt.Errorf("%d overlayd pods", len(pl.Items))
		}
		for _, p := range pl.Items {
			if p.Spec.Containers[0].Image != image {
				return fmt.Errorf("pod %s runs %s", p.Metadata.Name, p.Spec.Containers[0].Image)
			}
		}
		return nil
	})
}

// podInfo is what the tests read of a pod.
type podInfo struct {
	Name   string
	Node   string
	IP     netip.Addr // its IPv4 address (none on an IPv6-only cluster)
	IPv6   netip.Addr // its IPv6 address, on a cluster that carries IPv6
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
		Phase  string `json:"phase"`
		PodIP  string `json:"podIP"`
		PodIPs []struct {
			IP string `json:"ip"`
		} `json:"podIPs"`
		HostIP     string      `json:"hostIP"`
		Conditions []condition `json:"conditions"`
	} `json:"status"`
}

func (p podJSON) info() podInfo {
	i := podInfo{Name: p.Metadata.Name, Node: p.Spec.NodeName, Phase: p.Status.Phase}
	// Each family's first address: podIP is the first family's, which is
	// IPv6 on an IPv6-first cluster.
	for _, a := range p.Status.PodIPs {
		ip, err := netip.ParseAddr(a.IP)
		switch {
		case err != nil:
		case ip.Is4() && !i.IP.IsValid():
			i.IP = ip
		case ip.Is6() && !i.IPv6.IsValid():
			i.IPv6 = ip
		}
	}
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
