package kubee2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/testing/kubepki"
	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// The lab's addresses. The underlay is lab's 198.18.0.0/24 bridge; its
// namespace is also the router (198.18.0.254) between the nodes, the
// "internet" behind it and the metadata server.
const (
	podNetwork     = "10.244.0.0/16"
	serviceNetwork = "10.96.0.0/16"
	// A dual-stack cluster's second family: the overlay's IPv6Network,
	// the API server's IPv6 service range and the router's IPv6 address
	// on the underlay (lab.UnderlayIPv6).
	podNetwork6     = "fd00:10:244::/56"
	serviceNetwork6 = "fd00:10:96::/112"
	routerIP6       = "fd18::fe"
	apiPort         = 6443
	overlayEtcd     = 2479
	routerIP        = "198.18.0.254"
	cpHostNum       = 10
	publicHostNum   = 100
)

// cluster is the lab: an underlay with a router, the control plane in a
// namespace of its own (the API server's etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, and the overlay's etcd), and
// nodes, each a network namespace and a mount namespace of its own with
// containerd, kubelet and kube-proxy.
type cluster struct {
	t       testing.TB
	dir     string
	root    string // the repository
	kubeBin string // bin/kube
	run     string // namespace prefix
	pki     *kubepki.PKI
	ul      *lab.Underlay
	cp      *lab.Host
	cpSup   *nodeSupervisor
	public  *lab.Host
	nodes   []*kubeNode
	tokens  map[string]string // user -> bearer token
	kcfg    map[string]string // user -> kubeconfig file
	etcdCA  string
	cgroups string // the cgroup name every node's cgroupRoot starts with
	// dualStack: IPv6 on the router, the nodes' routes and forwarding,
	// the API server's service ranges, kubelet's node IPs and
	// kube-proxy's cluster CIDRs, beside IPv4.
	dualStack bool
	// ipv6Only: Kubernetes and the overlay in IPv6 alone (the underlay
	// still carries both families: the control plane is reached by its
	// IPv4 address, as any address of the node's would do).
	ipv6Only bool
	// ipv6First: a dual-stack cluster whose first family is IPv6 (the
	// service ranges, kubelet's node IPs, kube-proxy's cluster CIDRs all
	// list IPv6 first, so a node's status.hostIP is its IPv6 address).
	ipv6First bool

	mu      sync.Mutex
	cleanup []func() error // run in reverse order by close
	closed  bool
}

// kubeNode is one Kubernetes node.
type kubeNode struct {
	*lab.Host
	dir        string
	sup        *nodeSupervisor
	sock       string // containerd's socket (in dir, so visible from the test too)
	containerd *proc
	kubelet    *proc
	proxy      *proc
	cgroupRoot string
}

// interrupted makes the cluster close when the test binary gets SIGINT
// or SIGTERM (main_test.go), so an interrupted run leaves nothing either.
var (
	liveMu       sync.Mutex
	liveClusters = map[*cluster]bool{}
)

// stack is the families of a lab cluster's Kubernetes and overlay networks.
type stack int

const (
	stackIPv4 stack = iota
	stackDual
	stackDualIPv6First
	stackIPv6
)

// hasIPv6: the cluster's networks carry IPv6 (dual-stack or IPv6-only).
func (c *cluster) hasIPv6() bool { return c.dualStack || c.ipv6Only }

func newCluster(t testing.TB, nodes int, families stack) *cluster {
	t.Helper()
	testenv.RequireRoot(t)
	root := testenv.RepoRoot(t)
	c := &cluster{t: t, root: root, kubeBin: filepath.Join(root, "bin", "kube"), tokens: map[string]string{}, kcfg: map[string]string{},
		dualStack: families == stackDual || families == stackDualIPv6First, ipv6First: families == stackDualIPv6First,
		ipv6Only: families == stackIPv6}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kube-proxy", "kubelet", "kubectl"} {
		if _, err := os.Stat(filepath.Join(c.kubeBin, b)); err != nil {
			testenv.Unavailable(t, "%s is missing: run `make kube` (a cold build takes ~30 minutes): %v", filepath.Join(c.kubeBin, b), err)
		}
	}
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "nft"} {
		if _, err := exec.LookPath(b); err != nil {
			testenv.Unavailable(t, "%s is not installed: run `make kube-e2e` (test/kube/install-deps.sh installs the packages): %v", b, err)
		}
	}
	testenv.Binary(t, "overlayd")
	testenv.Binary(t, "overlay-cni")
	testenv.PluginDir(t)
	removeStaleCgroups()

	// Registered first, so it runs last: after the lab is gone.
	before := testenv.RootNetworkState(t)
	t.Cleanup(func() {
		if after := testenv.RootNetworkState(t); after != before {
			t.Errorf("the root network namespace changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
	})
	var err error
	pattern := "ovl-lab-" + strconv.Itoa(os.Getpid()) + "-kube-"
	if c.dir, err = os.MkdirTemp("", pattern); err != nil {
		t.Fatal(err)
	}
	liveMu.Lock()
	liveClusters[c] = true
	liveMu.Unlock()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("kube lab: log tails:\n%s", c.logTails(30))
		}
		if err := c.close(); err != nil {
			t.Errorf("kube lab cleanup: %v", err)
		}
	})
	c.onClose(func() error {
		if os.Getenv("OVERLAY_LAB_KEEP") != "" {
			t.Logf("kube lab: work directory kept: %s", c.dir)
			return nil
		}
		return os.RemoveAll(c.dir)
	})
	if c.pki, err = kubepki.New(filepath.Join(c.dir, "pki")); err != nil {
		t.Fatal(err)
	}
	c.etcdCA = c.pki.CACert

	if c.ul, err = lab.NewUnderlay("kube"); err != nil {
		t.Fatal(err)
	}
	c.run = c.ul.Run
	c.cgroups = "ovlkube" + strconv.Itoa(os.Getpid())
	c.onClose(c.ul.Close)
	c.onClose(func() error { return removeCgroups(c.cgroups + "-") })
	if err := c.router(); err != nil {
		t.Fatal(err)
	}
	if c.cp, err = c.ul.AddHost("cp", cpHostNum); err != nil {
		t.Fatal(err)
	}
	if err := c.hostSetup(c.cp); err != nil {
		t.Fatal(err)
	}
	if c.public, err = c.ul.AddHost("pub", publicHostNum); err != nil {
		t.Fatal(err)
	}
	c.startControlPlane()
	for i := 1; i <= nodes; i++ {
		c.addNode("k"+strconv.Itoa(i), i)
	}
	return c
}

func (c *cluster) onClose(fn func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cleanup = append(c.cleanup, fn)
}

// close stops everything the lab started and removes everything it made,
// in the reverse order. Safe to call twice, and from the signal handler.
func (c *cluster) close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	fns := c.cleanup
	c.mu.Unlock()
	var errs []error
	for i := len(fns) - 1; i >= 0; i-- {
		if err := fns[i](); err != nil {
			errs = append(errs, err)
		}
	}
	liveMu.Lock()
	delete(liveClusters, c)
	liveMu.Unlock()
	return errors.Join(errs...)
}

// router puts the router's address on the underlay bridge and lets the
// underlay's namespace forward (and on a dual-stack cluster the same for
// IPv6).
func (c *cluster) router() error {
	h, err := netlink.NewHandleAt(c.ul.NS)
	if err != nil {
		return err
	}
	defer h.Close()
	br, err := h.LinkByName("ul")
	if err != nil {
		return err
	}
	if err := h.AddrAdd(br, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(routerIP).To4(), Mask: net.CIDRMask(24, 32)}}); err != nil {
		return fmt.Errorf("router address: %w", err)
	}
	if c.hasIPv6() {
		a := &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(routerIP6), Mask: net.CIDRMask(lab.UnderlayIPv6.Bits(), 128)}, Flags: unix.IFA_F_NODAD}
		if err := h.AddrAdd(br, a); err != nil {
			return fmt.Errorf("router IPv6 address: %w", err)
		}
		if err := sysctl(c.ul.NS, "net/ipv6/conf/all/forwarding", "1"); err != nil {
			return err
		}
	}
	return sysctl(c.ul.NS, "net/ipv4/ip_forward", "1")
}

// hostSetup gives a host the router as its default route (of each family
// on a dual-stack cluster).
func (c *cluster) hostSetup(h *lab.Host) error {
	nh, err := netlink.NewHandleAt(h.NS)
	if err != nil {
		return err
	}
	defer nh.Close()
	if err := nh.RouteAdd(&netlink.Route{Gw: net.ParseIP(routerIP).To4()}); err != nil {
		return err
	}
	if c.hasIPv6() {
		if err := nh.RouteAdd(&netlink.Route{Gw: net.ParseIP(routerIP6)}); err != nil {
			return fmt.Errorf("%s: IPv6 default route: %w", h.Name, err)
		}
	}
	return nil
}

// sysctl writes a network sysctl (a path under /proc/sys) in namespace ns.
func sysctl(ns netns.NsHandle, key, value string) error {
	return lab.Do(ns, func() error {
		return os.WriteFile("/proc/sys/"+key, []byte(value), 0o644)
	})
}

func (c *cluster) token(user string) string {
	if tok, ok := c.tokens[user]; ok {
		return tok
	}
	tok := rand.Text()
	c.tokens[user] = tok
	return tok
}

// kubeconfig writes a kubeconfig for user (a bearer token from the API
// server's token file) and returns its path.
func (c *cluster) kubeconfig(user string) string {
	if p, ok := c.kcfg[user]; ok {
		return p
	}
	p := filepath.Join(c.dir, "pki", strings.ReplaceAll(user, ":", "_")+".kubeconfig")
	data := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: lab
  cluster:
    server: https://%s:%d
    certificate-authority: %s
users:
- name: u
  user:
    token: %s
contexts:
- name: lab
  context: {cluster: lab, user: u}
current-context: lab
`, c.cp.IP, apiPort, c.pki.CACert, c.token(user))
	if err := os.WriteFile(p, []byte(data), 0o600); err != nil {
		c.t.Fatal(err)
	}
	c.kcfg[user] = p
	return p
}

// startControlPlane starts, in the control plane's namespace: the API
// server's etcd (loopback only), the overlay's etcd (TLS, on the underlay
// for the nodes), kube-apiserver, kube-controller-manager and
// kube-scheduler, and waits for the API to answer.
func (c *cluster) startControlPlane() {
	t := c.t
	t.Helper()
	dir := filepath.Join(c.dir, "cp")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var err error
	if c.cpSup, err = startSupervisor("cp", c.cp.NS, nil, filepath.Join(dir, "supervisor.log")); err != nil {
		t.Fatal(err)
	}
	c.onClose(c.cpSup.Stop)
	cpIP := c.cp.IP.String()
	apiCert, apiKey, err := c.pki.Serving("apiserver",
		[]string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
		net.ParseIP(cpIP), net.ParseIP("10.96.0.1"), net.ParseIP("127.0.0.1"),
		c.cp.IPv6.AsSlice(), net.ParseIP("fd00:10:96::1"))
	if err != nil {
		t.Fatal(err)
	}
	etcdCert, etcdKey, err := c.pki.Serving("overlay-etcd", nil, net.ParseIP(cpIP))
	if err != nil {
		t.Fatal(err)
	}
	// Users: the admin (the test's kubectl), the controller-manager (as an
	// admin too: one identity for all its controllers), the scheduler,
	// kube-proxy, and each node as the Node authorizer knows it.
	var tokens strings.Builder
	fmt.Fprintf(&tokens, "%s,admin,admin,system:masters\n", c.token("admin"))
	fmt.Fprintf(&tokens, "%s,system:kube-controller-manager,kcm,system:masters\n", c.token("system:kube-controller-manager"))
	fmt.Fprintf(&tokens, "%s,system:kube-scheduler,sched\n", c.token("system:kube-scheduler"))
	fmt.Fprintf(&tokens, "%s,system:kube-proxy,kube-proxy\n", c.token("system:kube-proxy"))
	for i := 1; i <= 9; i++ {
		user := "system:node:k" + strconv.Itoa(i)
		fmt.Fprintf(&tokens, "%s,%s,k%d,system:nodes\n", c.token(user), user, i)
	}
	tokenFile := filepath.Join(c.dir, "pki", "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(tokens.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	// The API server advertises an address of its service range's
	// (first) family, and listens on every address of its namespace: the
	// components reach it by its IPv4 address in every kind of cluster.
	serviceRanges, advertise, bind := serviceNetwork, cpIP, cpIP
	switch {
	case c.ipv6First:
		serviceRanges, advertise, bind = serviceNetwork6+","+serviceNetwork, c.cp.IPv6.String(), "::"
	case c.dualStack:
		serviceRanges += "," + serviceNetwork6
	case c.ipv6Only:
		serviceRanges, advertise, bind = serviceNetwork6, c.cp.IPv6.String(), "::"
	}
	env := testenv.ProgramEnv()
	start := func(name string, argv ...string) {
		t.Helper()
		if _, err := c.cpSup.Start(name, filepath.Join(dir, name+".log"), env, argv...); err != nil {
			t.Fatal(err)
		}
	}
	bin := func(name string) string { return filepath.Join(c.kubeBin, name) }
	start("etcd-api", bin("etcd"), "--name=api", "--data-dir="+filepath.Join(dir, "etcd-api"),
		"--listen-client-urls=http://127.0.0.1:2379", "--advertise-client-urls=http://127.0.0.1:2379",
		"--listen-peer-urls=http://127.0.0.1:2380", "--initial-advertise-peer-urls=http://127.0.0.1:2380",
		"--initial-cluster=api=http://127.0.0.1:2380", "--log-level=warn", "--unsafe-no-fsync")
	start("etcd-overlay", bin("etcd"), "--name=overlay", "--data-dir="+filepath.Join(dir, "etcd-overlay"),
		fmt.Sprintf("--listen-client-urls=https://%s:%d", cpIP, overlayEtcd),
		fmt.Sprintf("--advertise-client-urls=https://%s:%d", cpIP, overlayEtcd),
		"--cert-file="+etcdCert, "--key-file="+etcdKey,
		"--listen-peer-urls=http://127.0.0.1:2480", "--initial-advertise-peer-urls=http://127.0.0.1:2480",
		"--initial-cluster=overlay=http://127.0.0.1:2480", "--log-level=warn", "--unsafe-no-fsync")
	start("kube-apiserver", bin("kube-apiserver"),
		"--etcd-servers=http://127.0.0.1:2379",
		"--bind-address="+bind, "--advertise-address="+advertise, fmt.Sprintf("--secure-port=%d", apiPort),
		"--tls-cert-file="+apiCert, "--tls-private-key-file="+apiKey, "--client-ca-file="+c.pki.CACert,
		"--token-auth-file="+tokenFile, "--authorization-mode=Node,RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+c.pki.SAPub, "--service-account-signing-key-file="+c.pki.SAKey,
		"--service-cluster-ip-range="+serviceRanges,
		"--kubelet-preferred-address-types=InternalIP", "--allow-privileged=true",
		"--profiling=false", "--cert-dir="+filepath.Join(dir, "apiserver-certs"))
	start("kube-controller-manager", bin("kube-controller-manager"),
		"--kubeconfig="+c.kubeconfig("system:kube-controller-manager"), "--leader-elect=false",
		"--service-account-private-key-file="+c.pki.SAKey, "--root-ca-file="+c.pki.CACert,
		"--cluster-signing-cert-file="+c.pki.CACert, "--cluster-signing-key-file="+c.pki.CAKey,
		"--allocate-node-cidrs=false", "--bind-address=127.0.0.1", "--profiling=false")
	start("kube-scheduler", bin("kube-scheduler"),
		"--kubeconfig="+c.kubeconfig("system:kube-scheduler"), "--leader-elect=false",
		"--bind-address=127.0.0.1", "--profiling=false")
	testenv.Eventually(t, 2*time.Minute, "the API server to answer", func() error {
		c.procsAlive(c.cpSup)
		_, err := c.kubectl(context.Background(), nil, "get", "--raw", "/readyz")
		return err
	})
	testenv.Eventually(t, time.Minute, "the overlay's etcd to answer", func() error {
		c.procsAlive(c.cpSup)
		_, err := c.overlayCLI(context.Background(), "config", "get")
		if err != nil && strings.Contains(err.Error(), "no network config") {
			return nil
		}
		return err
	})
}

// procsAlive fails the test if a program of sup has exited.
func (c *cluster) procsAlive(sup *nodeSupervisor) {
	sup.mu.Lock()
	defer sup.mu.Unlock()
	for _, p := range sup.procs {
		if done, how := p.Exited(); done {
			c.t.Fatalf("%s on %s exited (%s); its log %s:\n%s", p.Name, sup.name, how, p.Log, tail(p.Log, 30))
		}
	}
}

// kubectl runs bin/kube/kubectl as the admin, in the control plane's
// namespace, with stdin as its input (nil: none), and returns its output.
func (c *cluster) kubectl(ctx context.Context, stdin []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, testenv.Deadline(time.Minute))
	defer cancel()
	return c.runIn(ctx, c.cp.NS, stdin, filepath.Join(c.kubeBin, "kubectl"), append([]string{"--kubeconfig=" + c.kubeconfig("admin")}, args...)...)
}

// overlayCLI runs bin/overlayd's management commands against the
// overlay's etcd, from the control plane's namespace.
func (c *cluster) overlayCLI(ctx context.Context, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, testenv.Deadline(30*time.Second))
	defer cancel()
	return c.runIn(ctx, c.cp.NS, nil, filepath.Join(c.root, "bin", "overlayd"),
		append([]string{fmt.Sprintf("--endpoints=https://%s:%d", c.cp.IP, overlayEtcd), "--cacert=" + c.etcdCA}, args...)...)
}

// runIn runs a program to its end in network namespace ns.
func (c *cluster) runIn(ctx context.Context, ns netns.NsHandle, stdin []byte, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = testenv.ProgramEnv()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := lab.Do(ns, cmd.Start); err != nil {
		return "", err
	}
	if err := cmd.Wait(); err != nil {
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// The kernel settings kubelet insists on (protectKernelDefaults): global
// to the machine, so each node's mount namespace gets files of its own over
// them, holding the values kubelet wants, and kubelet changes nothing.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// nodeDirs are the directories each node's mount namespace has of its
// own (bound from the node's directory). /var/lib/kubelet is among them
// although kubelet's --root-dir is elsewhere: kubelet opens its device
// plugin socket at the fixed /var/lib/kubelet/device-plugins/kubelet.sock,
// which in a shared directory one node's kubelet (or another lab run's)
// holds while the next fails to start with "bind: address already in use".
var nodeDirs = []string{"/var/lib/cni", "/var/lib/kubelet", "/var/log", "/etc/cni", "/opt/cni"}

// addNode creates node name (underlay address 198.18.0.<n>), its mount
// namespace and its containerd, kubelet and kube-proxy.
func (c *cluster) addNode(name string, num int) *kubeNode {
	t := c.t
	t.Helper()
	h, err := c.ul.AddHost(name, num)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.hostSetup(h); err != nil {
		t.Fatal(err)
	}
	// What a node needs of its network namespace (Documentation/kubernetes.md).
	need := map[string]string{"net/ipv4/ip_forward": "1"}
	if c.hasIPv6() {
		need["net/ipv6/conf/all/forwarding"] = "1"
	}
	for key, v := range need {
		if err := sysctl(h.NS, key, v); err != nil {
			t.Fatalf("%s: %s: %v", name, key, err)
		}
	}
	n := &kubeNode{Host: h, dir: filepath.Join(c.dir, name)}
	n.sock = filepath.Join(n.dir, "containerd.sock")
	n.cgroupRoot = "/" + c.cgroups + "-" + name
	dirs := map[string]string{} // mount target -> source
	for _, d := range nodeDirs {
		src := filepath.Join(n.dir, "fs", strings.ReplaceAll(strings.TrimPrefix(d, "/"), "/", "-"))
		if err := os.MkdirAll(src, 0o755); err != nil {
			t.Fatal(err)
		}
		dirs[d] = src
	}
	for _, d := range []string{"opt-cni/bin", "etc-cni/net.d", "sysctl", "kubelet", "containerd"} {
		if err := os.MkdirAll(filepath.Join(n.dir, "fs", d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// The node's CNI plugins, as a distribution's package would install
	// them; the DaemonSet adds overlay-cni.
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		data, err := os.ReadFile(filepath.Join(c.root, "bin", "cni", p))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(n.dir, "fs", "opt-cni", "bin", p), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mounts := []mount{{Target: "/run"}}
	for _, d := range nodeDirs {
		if err := c.mountPoint(d); err != nil {
			t.Fatal(err)
		}
		mounts = append(mounts, mount{Source: dirs[d], Target: d})
	}
	keys := make([]string, 0, len(kubeletSysctls))
	for k := range kubeletSysctls {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		f := filepath.Join(n.dir, "fs", "sysctl", strings.ReplaceAll(k, "/", "."))
		if err := os.WriteFile(f, []byte(kubeletSysctls[k]+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		mounts = append(mounts, mount{Source: f, Target: "/proc/sys/" + k})
	}
	if err := makeCgroup(n.cgroupRoot); err != nil {
		t.Fatal(err)
	}
	if n.sup, err = startSupervisor(name, h.NS, mounts, filepath.Join(n.dir, "supervisor.log")); err != nil {
		t.Fatal(err)
	}
	c.onClose(n.sup.Stop)
	c.onClose(func() error { return n.stop(c) })
	c.nodes = append(c.nodes, n)

	env := testenv.ProgramEnv()
	// containerd.
	conf := filepath.Join(n.dir, "containerd.toml")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(containerdConfig,
		filepath.Join(n.dir, "fs", "containerd"), n.sock, pauseImage)), 0o644); err != nil {
		t.Fatal(err)
	}
	if n.containerd, err = n.sup.Start("containerd", filepath.Join(n.dir, "containerd.log"), env, "containerd", "--config", conf); err != nil {
		t.Fatal(err)
	}
	return n
}

// mountPoint makes sure dir exists in the root filesystem, for a node's
// mount namespace to mount over it; a directory it had to create is
// removed when the lab closes (if it is still empty).
func (c *cluster) mountPoint(dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	missing := dir
	for {
		parent := filepath.Dir(missing)
		if _, err := os.Stat(parent); err == nil {
			break
		}
		missing = parent
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("mount point %s: %w", dir, err)
	}
	c.onClose(func() error {
		// Only what is empty: never anything someone else put there.
		for d := dir; ; d = filepath.Dir(d) {
			_ = os.Remove(d)
			if d == missing {
				return nil
			}
		}
	})
	return nil
}

// stop removes the node's pods in order (kubelet first, so nothing comes
// back; then every sandbox through the CRI, which runs CNI DEL) and stops
// its programs by PID; the supervisor then kills whatever is left.
func (n *kubeNode) stop(c *cluster) error {
	var errs []error
	grace := testenv.Deadline(30 * time.Second)
	for _, p := range []*proc{n.kubelet, n.proxy} {
		if p != nil {
			errs = append(errs, n.sup.StopProc(p, grace))
		}
	}
	if n.containerd != nil {
		if done, _ := n.containerd.Exited(); !done {
			errs = append(errs, n.removeSandboxes())
			errs = append(errs, n.sup.StopProc(n.containerd, grace))
		}
	}
	return errors.Join(errs...)
}

func tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

// logTails is the end of every log of the lab, for a failure report.
func (c *cluster) logTails(lines int) string {
	var b strings.Builder
	logs, _ := filepath.Glob(filepath.Join(c.dir, "*", "*.log"))
	for _, l := range logs {
		fmt.Fprintf(&b, "---- %s ----\n%s\n", l, tail(l, lines))
	}
	return b.String()
}

// addrOf parses an address or fails the test.
func addrOf(t testing.TB, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatalf("address %q: %v", s, err)
	}
	return a
}

// runHere runs a program to its end in the test's own namespaces, from the
// repository's root.
func (c *cluster) runHere(ctx context.Context, env []string, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = env
	cmd.Dir = c.root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w", name, strings.Join(args, " "), err)
	}
	return string(out), nil
}
