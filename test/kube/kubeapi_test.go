package kubee2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	typedcore "k8s.io/client-go/kubernetes/typed/core/v1"
	typedrbac "k8s.io/client-go/kubernetes/typed/rbac/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/internal/testing/kubepki"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/kube"
	"github.com/overlaynet/overlay/subnet/kube/nodes"
)

// apiServer is a real kube-apiserver (bin/kube, `make kube`) with its
// etcd, on the loopback of a network namespace of its own: nothing of it
// is reachable from anywhere else. Clients dial into the namespace.
type apiServer struct {
	t       *testing.T
	ns      netns.NsHandle
	sup     *nodeSupervisor
	dir     string
	pki     *kubepki.PKI
	tokens  string
	apiProc *proc
	argv    []string
	ip      string // where it serves
}

func (a *apiServer) url() string { return "https://" + net.JoinHostPort(a.ip, strconv.Itoa(apiPort)) }

// rootUnchanged fails t if the root network namespace differs at the end.
func rootUnchanged(t *testing.T) {
	before := testenv.RootNetworkState(t)
	t.Cleanup(func() {
		if after := testenv.RootNetworkState(t); after != before {
			t.Errorf("the root network namespace changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
}

// loopbackNS is a network namespace of the test's own with its loopback
// up, and nothing else.
func loopbackNS(t *testing.T) netns.NsHandle {
	t.Helper()
	nsName := lab.RunPrefix("kapi") + "api"
	ns, err := lab.NewNamedNS(nsName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Close(); _ = netns.DeleteNamed(nsName) })
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err == nil {
		err = h.LinkSetUp(lo)
	}
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

// startAPIServer starts etcd (on ns's loopback) and kube-apiserver (on ip,
// an address of ns) in namespace ns.
func startAPIServer(t *testing.T, ns netns.NsHandle, ip string) *apiServer {
	t.Helper()
	testenv.RequireRoot(t)
	kubeBin := filepath.Join(testenv.RepoRoot(t), "bin", "kube")
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(kubeBin, b)); err != nil {
			testenv.Unavailable(t, "%s is missing: run `make kube`: %v", filepath.Join(kubeBin, b), err)
		}
	}
	a := &apiServer{t: t, ns: ns, ip: ip}
	var err error
	if a.dir, err = os.MkdirTemp("", "ovl-lab-"+strconv.Itoa(os.Getpid())+"-kubeapi-"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(a.dir) })
	if a.pki, err = kubepki.New(filepath.Join(a.dir, "pki")); err != nil {
		t.Fatal(err)
	}
	cert, key, err := a.pki.Serving("apiserver", []string{"localhost"}, net.ParseIP(ip))
	if err != nil {
		t.Fatal(err)
	}
	// The admin (the test) and overlayd's user, which has only what the
	// manifest's ClusterRole grants.
	a.tokens = filepath.Join(a.dir, "pki", "tokens.csv")
	if err := os.WriteFile(a.tokens, []byte("admin-token,admin,admin,system:masters\noverlay-token,overlay,overlay\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if a.sup, err = startSupervisor("kapi", a.ns, nil, filepath.Join(a.dir, "supervisor.log")); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.sup.Stop() })
	if _, err := a.sup.Start("etcd", filepath.Join(a.dir, "etcd.log"), testenv.ProgramEnv(), filepath.Join(kubeBin, "etcd"),
		"--name=api", "--data-dir="+filepath.Join(a.dir, "etcd"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=api=http://127.0.0.1:2380", "--log-level=warn", "--unsafe-no-fsync"); err != nil {
		t.Fatal(err)
	}
	a.argv = []string{filepath.Join(kubeBin, "kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379", "--bind-address=" + ip, "--advertise-address=" + ip, "--endpoint-reconciler-type=none",
		fmt.Sprintf("--secure-port=%d", apiPort), "--tls-cert-file=" + cert, "--tls-private-key-file=" + key,
		"--client-ca-file=" + a.pki.CACert, "--token-auth-file=" + a.tokens, "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + a.pki.SAPub, "--service-account-signing-key-file=" + a.pki.SAKey,
		"--service-cluster-ip-range=" + serviceNetwork, "--profiling=false", "--cert-dir=" + filepath.Join(a.dir, "apiserver-certs")}
	a.startAPI()
	return a
}

// startAPI starts kube-apiserver and waits until it lists nodes.
func (a *apiServer) startAPI() {
	a.t.Helper()
	var err error
	if a.apiProc, err = a.sup.Start("kube-apiserver", filepath.Join(a.dir, "kube-apiserver.log"), testenv.ProgramEnv(), a.argv...); err != nil {
		a.t.Fatal(err)
	}
	admin := a.core("admin-token")
	testenv.Eventually(a.t, 2*time.Minute, "the API server to answer", func() error {
		if done, how := a.apiProc.Exited(); done {
			a.t.Fatalf("kube-apiserver exited (%s):\n%s", how, tail(a.apiProc.Log, 30))
		}
		_, err := admin.Nodes().List(context.Background(), metav1.ListOptions{})
		return err
	})
}

// rest is a client config of the user with token, dialling into the
// API server's namespace.
func (a *apiServer) rest(token string) *rest.Config {
	return &rest.Config{Host: a.url(), BearerToken: token,
		TLSClientConfig: rest.TLSClientConfig{CAFile: a.pki.CACert},
		Dial: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
			err = lab.Do(a.ns, func() error {
				conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		}}
}

func (a *apiServer) core(token string) typedcore.CoreV1Interface {
	cli, err := typedcore.NewForConfig(a.rest(token))
	if err != nil {
		a.t.Fatal(err)
	}
	return cli
}

// grantManifestRole gives user the ClusterRole of
// deploy/kubernetes/overlay-kube.yaml, as it is written there.
func (a *apiServer) grantManifestRole(user string) {
	t := a.t
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(t), "deploy", "kubernetes", "overlay-kube.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var role *rbacv1.ClusterRole
	for _, doc := range strings.Split(string(data), "\n---\n") {
		if strings.Contains(doc, "\nkind: ClusterRole\n") {
			role = &rbacv1.ClusterRole{}
			if err := yaml.Unmarshal([]byte(doc), role); err != nil {
				t.Fatal(err)
			}
		}
	}
	if role == nil {
		t.Fatal("deploy/kubernetes/overlay-kube.yaml has no ClusterRole")
	}
	cli, err := typedrbac.NewForConfig(a.rest("admin-token"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cli.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}}
	if _, err := cli.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// restartAPI stops kube-apiserver and starts it again (etcd keeps the
// objects).
func (a *apiServer) restartAPI() {
	a.t.Helper()
	if err := a.sup.StopProc(a.apiProc, testenv.Deadline(time.Minute)); err != nil {
		a.t.Fatal(err)
	}
	a.startAPI()
}

const ann = nodes.DefaultPrefix + "/"

// flannelAnnotations are what flanneld v0.28 in kube mode writes on its
// node (IPv4), with its MAC.
func flannelAnnotations(publicIP, mac string) map[string]string {
	return map[string]string{ann + "kube-subnet-manager": "true", ann + "backend-type": "vxlan",
		ann + "backend-data": `{"VNI":1,"VtepMAC":"` + mac + `"}`, ann + "public-ip": publicIP}
}

// batchLines renders a batch in the order a consumer applies it.
func batchLines(b subnet.Batch) string {
	var out []string
	for _, ev := range b.Events {
		line := ev.Type.String() + " " + ev.Lease.Subnets().String()
		if ev.Type != subnet.Removed {
			line += " " + ev.Lease.Attrs.PublicIP
		}
		out = append(out, line)
	}
	for _, k := range b.Deleted {
		out = append(out, "deleted "+k)
	}
	for _, inv := range b.Invalid {
		out = append(out, "invalid "+inv.Key)
	}
	return strings.Join(out, "; ")
}

// TestKubeSource runs the Kubernetes lease source against a real
// kube-apiserver, as overlayd's user with the manifest's ClusterRole and
// nothing more: it publishes this node's lease in one patch, sets
// NetworkUnavailable=false, follows every other node (added, changed,
// deleted, recreated with another podCIDR, hostile), re-publishes
// annotations someone removed, and resumes its watch across an API server
// restart, delivering nothing for a node that did not change.
func TestKubeSource(t *testing.T) {
	testenv.RequireRoot(t)
	rootUnchanged(t)
	a := startAPIServer(t, loopbackNS(t), "127.0.0.1")
	a.grantManifestRole("overlay")
	admin := a.core("admin-token")
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(4*time.Minute))
	defer cancel()

	mkNode := func(name, podCIDR string, annotations map[string]string) {
		t.Helper()
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
			Spec: corev1.NodeSpec{PodCIDR: podCIDR, PodCIDRs: []string{podCIDR}}}
		if _, err := admin.Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	annotate := func(name string, annotations map[string]any) {
		t.Helper()
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": annotations}})
		if _, err := admin.Nodes().Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mkNode("self", "10.244.1.0/24", nil)
	mkNode("peer-a", "10.244.2.0/24", flannelAnnotations("198.18.0.2", "0e:00:00:00:00:02"))
	mkNode("peer-b", "10.244.3.0/24", nil)

	netConf := filepath.Join(a.dir, "net-conf.json")
	if err := os.WriteFile(netConf, []byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":1}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	src := kube.NewSource(kube.Config{REST: a.rest("overlay-token"), NodeName: "self", NetConfPath: netConf, SetNetworkUnavailable: true})
	defer src.Close()
	if err := src.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	cfg, err := src.Config(ctx)
	if err != nil {
		t.Fatal(err)
	}
	codec := leasedata.Codec{VNI: 1}
	const selfMAC = "0e:00:00:00:00:01"
	host := subnet.Host{NodeID: "self", PublicIP: netip.MustParseAddr("198.18.0.1")}.
		Publishing(cfg, codec.Encode(net.HardwareAddr{0x0e, 0, 0, 0, 0, 1}), nil)
	if err := src.Claim(ctx, cfg, host, nil); err != nil {
		t.Fatal(err)
	}
	own, snap, err := src.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if own.Subnet != netip.MustParsePrefix("10.244.1.0/24") {
		t.Errorf("own lease %s, want the node's podCIDR 10.244.1.0/24", own.Subnet)
	}
	if len(snap.Leases) != 1 || snap.Leases[0].Subnet != netip.MustParsePrefix("10.244.2.0/24") || len(snap.Invalid) != 0 {
		t.Errorf("snapshot %+v, want peer-a's lease alone (peer-b does not take part)", snap)
	}
	// Published exactly as flanneld publishes.
	self, err := admin.Nodes().Get(ctx, "self", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := flannelAnnotations("198.18.0.1", selfMAC)
	for k, v := range want {
		if self.Annotations[k] != v {
			t.Errorf("self's annotation %s = %q, want %q", k, self.Annotations[k], v)
		}
	}

	kctx, kcancel := context.WithCancel(ctx)
	keepDone := make(chan error, 1)
	go func() { keepDone <- src.Keep(kctx) }()
	defer func() { kcancel(); <-keepDone }()
	testenv.Eventually(t, time.Minute, "NetworkUnavailable=False on self", func() error {
		n, err := admin.Nodes().Get(ctx, "self", metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, c := range n.Status.Conditions {
			if c.Type == corev1.NodeNetworkUnavailable && c.Status == corev1.ConditionFalse {
				return nil
			}
		}
		return fmt.Errorf("conditions %+v", n.Status.Conditions)
	})

	batches := src.Watch(kctx, snap, subnet.WatchOptions{})
	next := func(what string) string {
		t.Helper()
		select {
		case b, ok := <-batches:
			if !ok {
				t.Fatalf("%s: the watch ended", what)
			}
			return batchLines(b)
		case <-time.After(testenv.Deadline(time.Minute)):
			t.Fatalf("%s: no batch within a minute", what)
		}
		return ""
	}
	expect := func(what, want string) {
		t.Helper()
		if got := next(what); got != want {
			t.Errorf("%s: batch %q, want %q", what, got, want)
		}
	}

	annotate("peer-b", toAny(flannelAnnotations("198.18.0.3", "0e:00:00:00:00:03")))
	expect("peer-b takes part", "added 10.244.3.0/24 198.18.0.3")
	// A label on peer-a changes nothing the lease says: nothing is
	// delivered (the next batch is peer-b's change).
	if _, err := admin.Nodes().Patch(ctx, "peer-a", types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	annotate("peer-b", map[string]any{ann + "backend-data": `{"VNI":1,"VtepMAC":"0e:00:00:00:00:33"}`})
	expect("peer-b's MAC", "changed 10.244.3.0/24 198.18.0.3")

	if err := admin.Nodes().Delete(ctx, "peer-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expect("peer-a deleted", "removed 10.244.2.0/24")
	// A podCIDR cannot change in place: a node gets another one by being
	// deleted and registered again.
	mkNode("peer-a", "10.244.4.0/24", flannelAnnotations("198.18.0.2", "0e:00:00:00:00:02"))
	expect("peer-a back on another podCIDR", "added 10.244.4.0/24 198.18.0.2")

	// A hostile node: its public address inside the network.
	mkNode("hostile", "10.244.5.0/24", flannelAnnotations("10.244.9.9", "0e:00:00:00:00:05"))
	expect("a hostile node", "invalid node/hostile")

	// Someone removes this node's annotations: Keep puts them back.
	annotate("self", map[string]any{ann + "backend-data": nil, ann + "public-ip": nil})
	testenv.Eventually(t, time.Minute, "self's annotations re-published", func() error {
		n, err := admin.Nodes().Get(ctx, "self", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Annotations[ann+"backend-data"] != want[ann+"backend-data"] || n.Annotations[ann+"public-ip"] != "198.18.0.1" {
			return fmt.Errorf("annotations %v", n.Annotations)
		}
		return nil
	})

	// The API server restarts: the informer lists again, the watch
	// resumes, and nothing that did not change is delivered.
	a.restartAPI()
	annotate("peer-b", map[string]any{ann + "public-ip": "198.18.0.33"})
	expect("peer-b's address after the restart", "changed 10.244.3.0/24 198.18.0.33")
	testenv.Eventually(t, time.Minute, "liveness after the restart", func() error {
		if alive, err := src.Held().Liveness(); !alive {
			return fmt.Errorf("not alive: %v", err)
		}
		return nil
	})
	select {
	case b := <-batches:
		t.Errorf("a batch nothing asked for: %q", batchLines(b))
	case <-time.After(2 * time.Second):
	}

	// Least privilege: overlayd's user may not read what it does not need.
	if _, err := a.core("overlay-token").Pods("").List(ctx, metav1.ListOptions{}); err == nil {
		t.Error("overlayd's user can list pods; the manifest's ClusterRole grants more than nodes")
	}
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
