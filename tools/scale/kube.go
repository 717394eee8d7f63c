package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	typedcore "k8s.io/client-go/kubernetes/typed/core/v1"
	typedrbac "k8s.io/client-go/kubernetes/typed/rbac/v1"
	"k8s.io/client-go/rest"

	"github.com/overlaynet/overlay/internal/testing/etcdtest"
	"github.com/overlaynet/overlay/internal/testing/kubepki"
	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/kube"
	"github.com/overlaynet/overlay/subnet/kube/nodes"
)

// The API server's users: the coordinator (system:masters: it plays
// kube-controller-manager, creating the Nodes with their podCIDRs) and
// the hosts, which are deploy/kubernetes/overlay-kube.yaml's service
// account with its ClusterRole's rights only, in the groups the API
// server puts service accounts in (its priority and fairness classes
// them by these).
const (
	adminToken  = "admin-token"
	hostToken   = "overlay-token"
	hostUser    = "system:serviceaccount:overlay-system:overlay"
	hostGroups  = "system:serviceaccounts,system:serviceaccounts:overlay-system"
	kubeNetConf = `{"Network":"10.0.0.0/8","SubnetLen":24,"Backend":{"Type":"vxlan"}}`
)

// kubeAPI is a kube-apiserver and its own etcd from `make kube`'s build
// (bin/kube), started as the Kubernetes lab starts them (test/kube), each
// a process of its own listening on loopback ports only.
type kubeAPI struct {
	dir   string
	procs []*exec.Cmd // etcd, kube-apiserver
	url   string
	admin typedcore.CoreV1Interface
	cfg   *subnet.Config
	ann   nodes.Annotations

	mu     sync.Mutex
	probes map[netip.Prefix]string // probe subnet: its Node
}

func startKubeAPI(bin string) (*kubeAPI, error) {
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return nil, fmt.Errorf("-source kube: %w: run `make kube` (or point -kube-bin at its etcd and kube-apiserver)", err)
		}
	}
	dir, err := os.MkdirTemp("/tmp", "scale-kube")
	if err != nil {
		return nil, err
	}
	k := &kubeAPI{dir: dir, probes: map[netip.Prefix]string{}}
	ok := false
	defer func() {
		if !ok {
			k.close()
		}
	}()
	if k.cfg, err = subnet.ParseConfig([]byte(kubeNetConf)); err != nil {
		return nil, err
	}
	if k.ann, err = nodes.NewAnnotations(nodes.DefaultPrefix); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "net-conf.json"), []byte(kubeNetConf), 0o644); err != nil {
		return nil, err
	}
	pki, err := kubepki.New(filepath.Join(dir, "pki"))
	if err != nil {
		return nil, err
	}
	cert, key, err := pki.Serving("apiserver", []string{"localhost"}, net.IPv4(127, 0, 0, 1))
	if err != nil {
		return nil, err
	}
	tokens := filepath.Join(dir, "pki", "tokens.csv")
	if err := os.WriteFile(tokens, fmt.Appendf(nil, "%s,admin,admin,system:masters\n%s,%s,overlay,%q\n", adminToken, hostToken, hostUser, hostGroups), 0o600); err != nil {
		return nil, err
	}
	ports, err := etcdtest.FreePorts(3)
	if err != nil {
		return nil, err
	}
	etcdURL, peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0]), fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	if err := k.start(filepath.Join(bin, "etcd"), "--name=api", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=api="+peerURL, "--log-level=warn", "--unsafe-no-fsync"); err != nil {
		return nil, err
	}
	k.url = fmt.Sprintf("https://127.0.0.1:%d", ports[2])
	if err := k.start(filepath.Join(bin, "kube-apiserver"),
		"--etcd-servers="+etcdURL, "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
		fmt.Sprintf("--secure-port=%d", ports[2]), "--tls-cert-file="+cert, "--tls-private-key-file="+key,
		"--client-ca-file="+pki.CACert, "--token-auth-file="+tokens, "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+pki.SAPub, "--service-account-signing-key-file="+pki.SAKey,
		"--service-cluster-ip-range=10.96.0.0/16", "--profiling=false", "--cert-dir="+filepath.Join(dir, "apiserver-certs")); err != nil {
		return nil, err
	}
	// The coordinator is not rate-limited (QPS < 0): it creates the Nodes.
	admin := &rest.Config{Host: k.url, BearerToken: adminToken, TLSClientConfig: rest.TLSClientConfig{CAFile: pki.CACert}, QPS: -1}
	if k.admin, err = typedcore.NewForConfig(admin); err != nil {
		return nil, err
	}
	if err := k.waitReady(2 * time.Minute); err != nil {
		return nil, err
	}
	if err := grantHostRole(admin); err != nil {
		return nil, err
	}
	ok = true
	return k, nil
}

// start starts one of bin/kube's programs, logging to a file of the run's
// directory; it dies with this process (Pdeathsig).
func (k *kubeAPI) start(path string, args ...string) error {
	logf, err := os.Create(filepath.Join(k.dir, filepath.Base(path)+".log"))
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(path, args...)
	cmd.Env = testenv.ProgramEnv()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", path, err)
	}
	k.procs = append(k.procs, cmd)
	return nil
}

// waitReady waits until the API server lists Nodes, for at most d.
func (k *kubeAPI) waitReady(d time.Duration) error {
	var err error
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		for _, p := range k.procs {
			if !alive(p.Process.Pid) {
				log, _ := os.ReadFile(filepath.Join(k.dir, filepath.Base(p.Path)+".log"))
				return fmt.Errorf("%s exited; the end of its log:\n%s", p.Path, tailLines(string(log), 20))
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = k.admin.Nodes().List(ctx, metav1.ListOptions{Limit: 1})
		cancel()
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("kube-apiserver did not answer within %s (logs in %s): %w", d, k.dir, err)
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(f) > 0 && f[0] != "Z"
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// grantHostRole gives the hosts' user the rights of the manifest's
// ClusterRole (deploy/kubernetes/overlay-kube.yaml): get, list, watch and
// patch nodes, patch nodes/status.
func grantHostRole(admin *rest.Config) error {
	cli, err := typedrbac.NewForConfig(admin)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "overlay"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}}}}
	if _, err := cli.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the hosts' ClusterRole: %w", err)
	}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "overlay"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "overlay"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: hostUser}}}
	if _, err := cli.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("bind the hosts' ClusterRole: %w", err)
	}
	return nil
}

// close stops the API server, then its etcd (SIGTERM, SIGKILL after 30 s),
// by PID, and removes the run's directory.
func (k *kubeAPI) close() {
	for _, p := range slices.Backward(k.procs) {
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
	k.procs = nil
	_ = os.RemoveAll(k.dir)
}

// usage is each process's CPU seconds and RSS: etcd's, then the API
// server's.
func (k *kubeAPI) usage() (cpu []float64, rss []int64) {
	for _, p := range k.procs {
		cpu = append(cpu, procCPU(p.Process.Pid))
		rss = append(rss, procRSS(p.Process.Pid))
	}
	return cpu, rss
}

// podCIDR is simulated host i's podCIDR, as kube-controller-manager
// would assign it.
func podCIDR(i int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(1 + i>>8), byte(i), 0}), 24)
}

// createNodes registers the N simulated hosts' Nodes, each with its
// podCIDR, as the kubelets and kube-controller-manager would.
func (k *kubeAPI) createNodes(n int) error {
	sem := make(chan struct{}, 32)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			cidr := podCIDR(i).String()
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: simName(i)}, Spec: corev1.NodeSpec{PodCIDR: cidr, PodCIDRs: []string{cidr}}}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if _, err := k.admin.Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
				errs <- fmt.Errorf("create node %s: %w", node.Name, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	return errors.Join(slices.Collect(func(yield func(error) bool) {
		for err := range errs {
			if !yield(err) {
				return
			}
		}
	})...)
}

// writeProbe registers the k-th joining host's Node as it looks once
// it has joined: its podCIDR and the annotations its overlayd publishes
// (nodes.Annotations.Publish), in one create; it returns the subnet and
// when the create began.
func (k *kubeAPI) writeProbe(n int) (netip.Prefix, time.Time, error) {
	name := probeName(n)
	p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(200 + n/10000), byte(n % 256), 0}), 24)
	ann, _, err := k.ann.Publish(k.cfg, probeAttrs(n), nodes.Node{Name: name})
	if err != nil {
		return p, time.Time{}, err
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec: corev1.NodeSpec{PodCIDR: p.String(), PodCIDRs: []string{p.String()}}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	t0 := time.Now()
	if _, err := k.admin.Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		return p, t0, fmt.Errorf("create the joining node %s: %w", name, err)
	}
	k.mu.Lock()
	k.probes[p] = name
	k.mu.Unlock()
	return p, t0, nil
}

// removeProbe deletes the joining host's Node again.
func (k *kubeAPI) removeProbe(ctx context.Context, p netip.Prefix) {
	k.mu.Lock()
	name := k.probes[p]
	delete(k.probes, p)
	k.mu.Unlock()
	if name != "" {
		_ = k.admin.Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	}
}

// metricLine is one sample of the API server's /metrics: its name, its
// labels and its value.
var (
	metricLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)$`)
	labelPair  = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
)

// sample is a counter's value by series.
type sample map[string]series

type series struct {
	name   string
	labels map[string]string
	value  float64
}

// counters reads the API server's /metrics and keeps the series of the
// named counters.
func (k *kubeAPI) counters(names ...string) (sample, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw, err := k.admin.RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("read the API server's /metrics: %w", err)
	}
	return parseCounters(string(raw), names...), nil
}

func parseCounters(text string, names ...string) sample {
	out := sample{}
	for _, line := range strings.Split(text, "\n") {
		m := metricLine.FindStringSubmatch(line)
		if m == nil || !slices.Contains(names, m[1]) {
			continue
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			continue
		}
		s := series{name: m[1], labels: map[string]string{}, value: v}
		for _, l := range labelPair.FindAllStringSubmatch(m[2], -1) {
			s.labels[l[1]] = l[2]
		}
		out[m[1]+"{"+m[2]+"}"] = s
	}
	return out
}

// delta sums what the series of name that keep accepts grew by between a
// and b, by the key each one's labels give (by).
func delta(a, b sample, name string, keep func(map[string]string) bool, by func(map[string]string) string) (total float64, parts map[string]float64) {
	parts = map[string]float64{}
	for id, s := range b {
		if s.name != name || !keep(s.labels) {
			continue
		}
		d := s.value - a[id].value
		if d > 0 {
			total += d
			parts[by(s.labels)] += d
		}
	}
	return total, parts
}

// nodesResource: a series about Nodes (the core group's nodes, any
// subresource; watch events name the kind or the resource by version).
func nodesResource(l map[string]string) bool {
	return l["group"] == "" && (l["resource"] == "nodes" || l["kind"] == "Node")
}

// steadyKube samples the steady state of the hosts alone and measures
// joins, then the same with every Node's status reported every
// -kubelet-status (kubeletReports, which go on until ctx ends).
func (m *atN) steadyKube(ctx context.Context) error {
	if err := m.settle(); err != nil {
		return err
	}
	if err := m.window("steady"); err != nil {
		return err
	}
	s, err := stats(m.ws)
	if err != nil {
		return err
	}
	m.addSimMemory(s)
	if err := m.joins(); err != nil {
		return err
	}
	if m.c.cfg.KubeletStatus <= 0 {
		return nil
	}
	go m.kapi.kubeletReports(ctx, m.n, m.c.cfg.KubeletStatus)
	what := "kubelet status " + m.c.cfg.KubeletStatus.String()
	if err := m.window(what); err != nil {
		return err
	}
	return m.joinsNamed("join seen by all, "+what, 10100)
}

// kubeletReports updates each simulated Node's Ready condition (its
// heartbeat time) every period, spread evenly over it, as each Node's
// kubelet reports its status, until ctx ends.
func (k *kubeAPI) kubeletReports(ctx context.Context, n int, period time.Duration) {
	tick := time.NewTicker(period / time.Duration(n))
	defer tick.Stop()
	for i := 0; ; i = (i + 1) % n {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := metav1.Now()
		cond := corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady",
			Message: "kubelet is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now}
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := k.admin.Nodes().PatchStatus(rctx, simName(i), patch)
		cancel()
		if err != nil && ctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "scale: report node %s's status: %v\n", simName(i), err)
		}
	}
}

// window samples, over -steady, the requests the API server served for
// Nodes and the watch events it sent, per simulated host, its CPU and
// memory and its etcd's; each figure is named after what.
func (m *atN) window(what string) error {
	names := []string{"apiserver_request_total", "apiserver_watch_events_total"}
	c0, err := m.kapi.counters(names...)
	if err != nil {
		return err
	}
	cpu0, _ := m.kapi.usage()
	sim0 := m.workersCPU()
	time.Sleep(m.c.cfg.Steady)
	c1, err := m.kapi.counters(names...)
	if err != nil {
		return err
	}
	cpu1, rss := m.kapi.usage()
	sim1 := m.workersCPU()
	secs, n := m.c.cfg.Steady.Seconds(), float64(m.n)
	reqs, byVerb := delta(c0, c1, names[0], nodesResource, func(l map[string]string) string {
		return strings.TrimSuffix(strings.ToLower(l["verb"])+" "+l["subresource"], " ") + " " + l["code"]
	})
	events, _ := delta(c0, c1, names[1], nodesResource, func(map[string]string) string { return "" })
	var detail []string
	for k, v := range byVerb {
		detail = append(detail, fmt.Sprintf("%s=%.4f", strings.ReplaceAll(k, " ", "/"), v/secs/n))
	}
	slices.Sort(detail)
	m.add(what+": api requests per host", "1/s", []float64{reqs / secs / n}, strings.Join(detail, " "))
	m.add(what+": watch events per host", "1/s", []float64{events / secs / n}, "")
	m.add(what+": apiserver cpu", "cores", []float64{(cpu1[1] - cpu0[1]) / secs}, "")
	m.add(what+": apiserver rss", "MB", mb(rss[1:]), "")
	m.add(what+": apiserver's etcd cpu", "cores", []float64{(cpu1[0] - cpu0[0]) / secs}, "")
	m.add(what+": apiserver's etcd rss", "MB", mb(rss[:1]), "")
	m.add(what+": simulated hosts' cpu", "cores", []float64{(sim1 - sim0) / secs}, "")
	return nil
}

// workersCPU is the CPU seconds the worker processes used so far.
func (m *atN) workersCPU() float64 {
	var s float64
	for _, w := range m.ws {
		s += procCPU(w.cmd.Process.Pid)
	}
	return s
}

// settle waits until the hosts' start has died down: the API server sends
// fewer than 0.05 Node watch events per host per second over 5 s (each
// host's annotations and condition are one or two updates of its Node for
// every other host's informer), for at most 5 minutes.
func (m *atN) settle() error {
	prev, err := m.kapi.counters("apiserver_watch_events_total")
	if err != nil {
		return err
	}
	for end := time.Now().Add(5 * time.Minute); time.Now().Before(end); {
		time.Sleep(5 * time.Second)
		cur, err := m.kapi.counters("apiserver_watch_events_total")
		if err != nil {
			return err
		}
		ev, _ := delta(prev, cur, "apiserver_watch_events_total", nodesResource, func(map[string]string) string { return "" })
		if ev/5/float64(m.n) < 0.05 {
			return nil
		}
		fmt.Printf("   settling: %.0f Node watch events a second\n", ev/5)
		prev = cur
	}
	fmt.Println("   not settled after 5 minutes: measuring anyway")
	return nil
}

// measureKube runs the hosts' start, the steady state and joins at N
// hosts against a fresh API server.
func (c *coordinator) measureKube(n int) error {
	fmt.Printf("== N=%d: starting kube-apiserver and its etcd (%s)\n", n, c.cfg.KubeBin)
	k, err := startKubeAPI(c.cfg.KubeBin)
	if err != nil {
		return err
	}
	defer k.close()
	m := &atN{c: c, n: n, eps: []string{k.url}, dir: k.dir, kapi: k, probe: 20000}
	t0 := time.Now()
	if err := k.createNodes(n); err != nil {
		return err
	}
	fmt.Printf("   %d Nodes registered with their podCIDRs in %s\n", n, time.Since(t0).Round(time.Millisecond))
	defer m.stopWorkers()
	cpu0, _ := k.usage()
	t0 = time.Now()
	if err := m.startHosts(); err != nil {
		return err
	}
	cpu1, _ := k.usage()
	m.add("start: apiserver cpu", "cores", []float64{(cpu1[1] - cpu0[1]) / time.Since(t0).Seconds()}, "")
	reports, stop := context.WithCancel(context.Background())
	defer stop()
	if err := m.steadyKube(reports); err != nil {
		return err
	}
	if c.cfg.Scenarios != "" {
		fmt.Println("   -scenarios are etcd's (members, proxies): not run with -source kube")
	}
	return nil
}

// kubeSource builds each host's kube.Source as overlayd's --kube-subnet-mgr
// does (cmd/overlayd), reaching the API server at url as the manifest's
// service account, with the CA and net-conf.json of the run's directory.
// Each host gets a dialer of its own: with none, client-go would share one
// connection among every host of the worker, where each overlayd has its
// own.
func kubeSource(url, dir string) func(*simHost) subnet.Source {
	return func(h *simHost) subnet.Source {
		rc := &rest.Config{Host: url, BearerToken: hostToken, TLSClientConfig: rest.TLSClientConfig{CAFile: filepath.Join(dir, "pki", "ca.pem")},
			Dial: (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext}
		return kube.NewSource(kube.Config{REST: rc, NodeName: simName(h.idx), NetConfPath: filepath.Join(dir, "net-conf.json"),
			SetNetworkUnavailable: true, Logger: h.log})
	}
}
