package runtimee2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	cri "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// containerd is Debian's containerd on one host, with its CRI plugin
// configured for overlay's conflist only and every directory (root, state,
// sockets) in the suite's directory; the client speaks the Kubernetes CRI
// to it, as the kubelet does.
type containerd struct {
	h    *host
	dir  string
	sock string
	cmd  *exec.Cmd
	done chan struct{}
	conn *grpc.ClientConn
	rt   cri.RuntimeServiceClient
}

// containerdConfig is containerd 1.6's configuration (version 2): the
// native snapshotter (no overlayfs needed), runc, no OOM score change
// (restrict_oom_score_adj: the suite may run with a lowered limit), the
// test image as the sandbox image, overlay's conflist as the only CNI
// configuration; runc's state under the host's directory too.
const containerdConfig = `version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.overlayfs"]

[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q

[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[6]q
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %[9]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
    max_conf_num = 1
`

func startContainerd(t *testing.T, h *host, cniBin, ociArchive string) *containerd {
	t.Helper()
	dir := filepath.Join(h.Dir, "containerd")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	c := &containerd{h: h, dir: dir, sock: filepath.Join(dir, "containerd.sock"), done: make(chan struct{})}
	conf := fmt.Sprintf(containerdConfig, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.sock, c.sock+".ttrpc",
		filepath.Join(dir, "opt"), imageName, cniBin, h.netDir, filepath.Join(dir, "runc"))
	confFile := filepath.Join(dir, "config.toml")
	if err := os.WriteFile(confFile, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	c.cmd = exec.Command("containerd", "--config", confFile)
	c.cmd.Env = testenv.ProgramEnv()
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := lab.Do(h.NS, c.cmd.Start); err != nil {
		t.Fatalf("start containerd on %s: %v", h.Name, err)
	}
	go func() { _ = c.cmd.Wait(); close(c.done) }()
	t.Cleanup(func() { c.stop(t) })

	if c.conn, err = grpc.NewClient("unix://"+c.sock, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
		t.Fatal(err)
	}
	c.rt = cri.NewRuntimeServiceClient(c.conn)
	// containerd is ready when its CRI answers; the network is ready once
	// the CRI has loaded overlay's conflist.
	testenv.Eventually(t, testenv.Slack, "containerd's CRI on "+h.Name+" to report NetworkReady", func() error {
		select {
		case <-c.done:
			t.Fatalf("containerd on %s exited; see %s", h.Name, filepath.Join(dir, "containerd.log"))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		defer cancel()
		st, err := c.rt.Status(ctx, &cri.StatusRequest{})
		if err != nil {
			return err
		}
		for _, cond := range st.GetStatus().GetConditions() {
			if cond.Type == cri.NetworkReady && !cond.Status {
				return fmt.Errorf("NetworkReady false: %s %s", cond.Reason, cond.Message)
			}
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(time.Minute))
	defer cancel()
	if out, err := h.command(ctx, testenv.ProgramEnv(), "ctr", "--address", c.sock, "--namespace", "k8s.io",
		"images", "import", "--snapshotter", "native", ociArchive); err != nil {
		t.Fatalf("import the test image into containerd: %v\n%s", err, out)
	}
	return c
}

// stop removes every sandbox left (a failed test), closes the client and
// stops containerd (SIGTERM, by the PID this test started).
func (c *containerd) stop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(time.Minute))
	defer cancel()
	if list, err := c.rt.ListPodSandbox(ctx, &cri.ListPodSandboxRequest{}); err == nil {
		for _, sb := range list.Items {
			_, _ = c.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: sb.Id})
			if _, err := c.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: sb.Id}); err != nil {
				t.Errorf("remove leftover sandbox %s on %s: %v", sb.Id, c.h.Name, err)
			}
		}
	}
	if c.conn != nil {
		c.conn.Close()
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(testenv.Deadline(testenv.Slack)):
		_ = c.cmd.Process.Kill()
		<-c.done
		t.Errorf("containerd on %s did not exit on SIGTERM; killed", c.h.Name)
	}
}

// sandbox is a pod sandbox as the CRI reports it.
type sandbox struct {
	ID    string
	IP    netip.Addr
	NetNS string
}

// run creates a pod sandbox (RunPodSandbox: CNI ADD) and reads its address
// and network namespace back (PodSandboxStatus, verbose).
func (c *containerd) run(t *testing.T, ctx context.Context, name string) sandbox {
	t.Helper()
	resp, err := c.rt.RunPodSandbox(ctx, &cri.RunPodSandboxRequest{Config: &cri.PodSandboxConfig{
		Metadata:     &cri.PodSandboxMetadata{Name: name, Uid: name + "-uid", Namespace: "default"},
		Hostname:     name,
		LogDirectory: filepath.Join(c.dir, "logs", name),
		Linux: &cri.LinuxPodSandboxConfig{SecurityContext: &cri.LinuxSandboxSecurityContext{
			NamespaceOptions: &cri.NamespaceOption{Network: cri.NamespaceMode_POD},
		}},
	}})
	if err != nil {
		t.Fatalf("RunPodSandbox %s on %s: %v", name, c.h.Name, err)
	}
	st, err := c.rt.PodSandboxStatus(ctx, &cri.PodSandboxStatusRequest{PodSandboxId: resp.PodSandboxId, Verbose: true})
	if err != nil {
		t.Fatalf("PodSandboxStatus %s: %v", name, err)
	}
	sb := sandbox{ID: resp.PodSandboxId}
	sb.IP, _ = netip.ParseAddr(st.GetStatus().GetNetwork().GetIp())
	var info struct {
		RuntimeSpec struct {
			Linux struct {
				Namespaces []struct{ Type, Path string }
			}
		}
	}
	if err := json.Unmarshal([]byte(st.Info["info"]), &info); err != nil {
		t.Fatalf("PodSandboxStatus %s info: %v", name, err)
	}
	for _, n := range info.RuntimeSpec.Linux.Namespaces {
		if n.Type == "network" {
			sb.NetNS = n.Path
		}
	}
	if !sb.IP.IsValid() || sb.NetNS == "" {
		t.Fatalf("sandbox %s on %s: address %q, network namespace %q", name, c.h.Name, st.GetStatus().GetNetwork().GetIp(), sb.NetNS)
	}
	return sb
}

func (s *suite) testCRI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Deadline(2*time.Minute))
	defer cancel()
	var cs []*containerd
	var sbs []sandbox
	for i, h := range s.hosts {
		c := startContainerd(t, h, s.cniBin, s.img.oci)
		cs = append(cs, c)
		sb := c.run(t, ctx, fmt.Sprintf("pod%d", i+1))
		if !lease(t, h).Contains(sb.IP) {
			t.Fatalf("sandbox on %s got %s, outside its lease %s", h.Name, sb.IP, lease(t, h))
		}
		if v := h.cachedVersion(t, sb.ID); v != libcniBefore12Newest {
			t.Errorf("containerd ran overlay-cni at cniVersion %s, want %s", v, libcniBefore12Newest)
		}
		t.Logf("sandbox %s on %s: %s in %s", sb.ID[:12], h.Name, sb.IP, sb.NetNS)
		sbs = append(sbs, sb)
	}

	nss := make([]netns.NsHandle, len(sbs))
	for i, sb := range sbs {
		var err error
		if nss[i], err = netns.GetFromPath(sb.NetNS); err != nil {
			t.Fatal(err)
		}
		defer nss[i].Close()
	}
	if _, err := lab.Ping(nss[0], sbs[1].IP, probeTimeout); err != nil {
		t.Errorf("sandbox on h1 -> sandbox on h2: %v", err)
	}
	r, err := lab.Serve(nss[1], sbs[1].IP, 7777)
	if err != nil {
		t.Fatal(err)
	}
	seen, err := lab.WhoAmI(nss[0], netip.AddrPortFrom(sbs[1].IP, 7777), probeTimeout)
	r.Close()
	if err != nil || seen != sbs[0].IP {
		t.Errorf("TCP h1 sandbox -> h2 sandbox: seen %s (%v), want %s", seen, err, sbs[0].IP)
	}

	for i, c := range cs {
		if _, err := c.rt.StopPodSandbox(ctx, &cri.StopPodSandboxRequest{PodSandboxId: sbs[i].ID}); err != nil {
			t.Errorf("StopPodSandbox on %s: %v", c.h.Name, err)
		}
		if left := c.h.leftovers(t, nil); len(left) != 0 {
			t.Errorf("%s after StopPodSandbox: %v", c.h.Name, left)
		}
		if _, err := c.rt.RemovePodSandbox(ctx, &cri.RemovePodSandboxRequest{PodSandboxId: sbs[i].ID}); err != nil {
			t.Errorf("RemovePodSandbox on %s: %v", c.h.Name, err)
		}
		if _, err := os.Lstat(sbs[i].NetNS); err == nil {
			t.Errorf("%s: the sandbox's network namespace %s is left after RemovePodSandbox", c.h.Name, sbs[i].NetNS)
		}
	}
}
