package kubee2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// containerdConfig is a node's containerd 1.6 (version 2 configuration):
// its root in the node's directory, its state under the node's own /run
// (shim sockets and runc's state are fixed there), its socket in the
// node's directory (so the test reaches it too), the native snapshotter,
// runc, no negative OOM score (the sandbox lacks CAP_SYS_RESOURCE), the
// lab's pause image, and the CNI directories a node has: /opt/cni/bin and
// /etc/cni/net.d, which the DaemonSet fills.
const containerdConfig = `version = 2
root = "%[1]s/root"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.overlayfs"]

[grpc]
  address = %[2]q
[ttrpc]
  address = "%[2]s.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "%[1]s/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[3]q
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
`

// criClient connects to the node's containerd.
func (n *kubeNode) criClient() (cri.RuntimeServiceClient, *grpc.ClientConn, error) {
	conn, err := grpc.NewClient("unix://"+n.sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, nil, err
	}
	return cri.NewRuntimeServiceClient(conn), conn, nil
}

// removeSandboxes stops and removes every pod sandbox of the node (CNI DEL
// for each), after kubelet has stopped.
func (n *kubeNode) removeSandboxes() error {
	rt, conn, err := n.criClient()
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(time.Minute))
	defer cancel()
	list, err := rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("%s: list sandboxes: %w", n.Name, err)
	}
	var errs []error
	for _, sb := range list.Items {
		if _, err := rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("%s: stop sandbox %s: %w", n.Name, sb.Metadata.GetName(), err))
		}
		if _, err := rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
			errs = append(errs, fmt.Errorf("%s: remove sandbox %s: %w", n.Name, sb.Metadata.GetName(), err))
		}
	}
	return errors.Join(errs...)
}

// waitContainerd waits until the node's containerd answers the CRI.
func (c *cluster) waitContainerd(n *kubeNode) {
	testenv.Eventually(c.t, time.Minute, "containerd on "+n.Name+" to answer", func() error {
		c.procsAlive(n.sup)
		rt, conn, err := n.criClient()
		if err != nil {
			return err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = rt.Version(ctx, &cri.VersionRequest{})
		return err
	})
}

// importImages loads the lab's images into the node's containerd.
func (c *cluster) importImages(n *kubeNode, archive string) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(2*time.Minute))
	defer cancel()
	if out, err := c.runIn(ctx, n.NS, nil, "ctr", "--address", n.sock, "--namespace", "k8s.io",
		"images", "import", "--snapshotter", "native", archive); err != nil {
		c.t.Fatalf("%s: import the lab's images: %v\n%s", n.Name, err, out)
	}
}

// kubeletConfig is a node's KubeletConfiguration: cgroupfs under the
// node's own cgroupRoot (cgroup v1 allowed), no swap check, the CRI at the
// node's containerd, the kernel settings checked, not changed (see
// kubeletSysctls), no image garbage collection (nothing can be pulled
// again) and eviction thresholds that a busy shared machine never reaches.
const kubeletConfig = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %[1]s
failSwapOn: false
containerRuntimeEndpoint: unix://%[2]s
address: %[3]s
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
resolvConf: %[4]s
protectKernelDefaults: true
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "1Mi", nodefs.available: "1%%", imagefs.available: "1%%", nodefs.inodesFree: "1%%"}
serializeImagePulls: false
nodeStatusUpdateFrequency: 4s
`

// kubeProxyConfig is a node's kube-proxy: iptables mode, the pod network
// as the cluster CIDR, no conntrack sysctl (nf_conntrack_max is global to
// the machine).
const kubeProxyConfig = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: %[1]s
clientConnection: {kubeconfig: %[2]s}
hostnameOverride: %[3]s
bindAddress: 0.0.0.0
clusterCIDR: %[4]s
healthzBindAddress: 0.0.0.0:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
`

// startKube starts the node's kubelet and kube-proxy.
func (c *cluster) startKube(n *kubeNode, proxyMode string) {
	t := c.t
	t.Helper()
	resolv := filepath.Join(n.dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+routerIP+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	kc := filepath.Join(n.dir, "kubelet.yaml")
	nodeIP := n.IP
	if c.ipv6Only {
		nodeIP = n.IPv6
	}
	if err := os.WriteFile(kc, []byte(fmt.Sprintf(kubeletConfig, n.cgroupRoot, n.sock, nodeIP, resolv)), 0o644); err != nil {
		t.Fatal(err)
	}
	// A dual-stack node: both addresses for kubelet, both pod networks for
	// kube-proxy (which then programs both families).
	nodeIPs, clusterCIDRs := n.IP.String(), podNetwork
	switch {
	case c.ipv6First:
		nodeIPs, clusterCIDRs = n.IPv6.String()+","+nodeIPs, podNetwork6+","+clusterCIDRs
	case c.dualStack:
		nodeIPs += "," + n.IPv6.String()
		clusterCIDRs += "," + podNetwork6
	case c.ipv6Only:
		nodeIPs, clusterCIDRs = n.IPv6.String(), podNetwork6
	}
	pc := filepath.Join(n.dir, "kube-proxy.yaml")
	if err := os.WriteFile(pc, []byte(fmt.Sprintf(kubeProxyConfig, proxyMode, c.kubeconfig("system:kube-proxy"), n.Name, clusterCIDRs)), 0o644); err != nil {
		t.Fatal(err)
	}
	env := testenv.ProgramEnv()
	var err error
	if n.kubelet, err = n.sup.Start("kubelet", filepath.Join(n.dir, "kubelet.log"), env,
		filepath.Join(c.kubeBin, "kubelet"), "--config="+kc, "--kubeconfig="+c.kubeconfig("system:node:"+n.Name),
		"--hostname-override="+n.Name, "--node-ip="+nodeIPs,
		"--root-dir="+filepath.Join(n.dir, "fs", "kubelet"), "--cert-dir="+filepath.Join(n.dir, "kubelet-pki"),
		"--v=1"); err != nil {
		t.Fatal(err)
	}
	if n.proxy, err = n.sup.Start("kube-proxy", filepath.Join(n.dir, "kube-proxy.log"), env,
		filepath.Join(c.kubeBin, "kube-proxy"), "--config="+pc, "--v=1"); err != nil {
		t.Fatal(err)
	}
}

// cgroupDirs are the mounted cgroup hierarchies (v1 and v2).
func cgroupDirs() []string {
	entries, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range entries {
		d := filepath.Join("/sys/fs/cgroup", e.Name())
		if _, err := os.Stat(filepath.Join(d, "cgroup.procs")); err == nil {
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		out = []string{"/sys/fs/cgroup"} // cgroup v2 alone
	}
	return out
}

// makeCgroup creates the cgroup name in every hierarchy (kubelet needs its
// cgroupRoot to exist); a cpuset one gets its parent's CPUs and memory
// nodes.
func makeCgroup(name string) error {
	for _, h := range cgroupDirs() {
		d := filepath.Join(h, name)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %s: %w", d, f, err)
				}
			}
		}
	}
	return nil
}

// removeCgroups removes, deepest first, every cgroup whose top-level name
// starts with prefix (the processes in them are gone by then).
func removeCgroups(prefix string) error {
	var errs []error
	for _, h := range cgroupDirs() {
		tops, _ := filepath.Glob(filepath.Join(h, prefix+"*"))
		for _, top := range tops {
			var dirs []string
			_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
				if err == nil && d.IsDir() {
					dirs = append(dirs, p)
				}
				return nil
			})
			for i := len(dirs) - 1; i >= 0; i-- {
				var err error
				for range 50 {
					if err = os.Remove(dirs[i]); err == nil || errors.Is(err, os.ErrNotExist) {
						err = nil
						break
					}
					time.Sleep(100 * time.Millisecond) // a dying process leaves its cgroup late
				}
				if err != nil {
					errs = append(errs, fmt.Errorf("remove cgroup %s: %w", dirs[i], err))
				}
			}
		}
	}
	return errors.Join(errs...)
}

// removeStaleCgroups removes the cgroups of lab runs whose process is
// gone, after killing what still runs in them: containers of that run
// whose supervisor was killed before it could stop them (SIGKILL), and
// the containerd shims that are their parents. Only processes in the
// lab's own cgroups, and their shims, are signalled.
func removeStaleCgroups() {
	for _, h := range cgroupDirs() {
		tops, _ := filepath.Glob(filepath.Join(h, "ovlkube*"))
		for _, top := range tops {
			rest := strings.TrimPrefix(filepath.Base(top), "ovlkube")
			pid, err := strconv.Atoi(strings.SplitN(rest, "-", 2)[0])
			if err != nil || lab.ProcessAlive(pid) {
				continue
			}
			for _, p := range cgroupProcs(top) {
				if parent := ppid(p); parent > 1 && strings.HasPrefix(comm(parent), "containerd-shim") {
					_ = syscall.Kill(parent, syscall.SIGKILL)
				}
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
			_ = removeCgroups(filepath.Base(top))
		}
	}
}

// cgroupProcs lists the processes in cgroup dir and below it.
func cgroupProcs(dir string) []int {
	var out []int
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		data, _ := os.ReadFile(p)
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
		return nil
	})
	return out
}

func comm(pid int) string {
	data, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(data))
}
