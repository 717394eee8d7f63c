package runtimee2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// podman runs Debian's podman on one host: rootful, CNI backend, runc,
// cgroupfs, with every directory it writes (storage, run root, tmp dir,
// locks, events) in the suite's directory and overlay's conflist as its
// only network configuration (also its default network, so podman's own
// "podman" network is never set up).
type podman struct {
	h   *host
	dir string
	env []string
}

func newPodman(t *testing.T, h *host, cniBin string) *podman {
	t.Helper()
	dir := filepath.Join(h.Dir, "podman")
	for _, d := range []string{"storage", "runroot", "tmp", "static", "volumes"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	conf := fmt.Sprintf(`[containers]
default_ulimits = []
pids_limit = 0
log_driver = "k8s-file"
netns = "bridge"

[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = %[1]q
runtime = "runc"
lock_type = "file"
tmp_dir = %[2]q
static_dir = %[3]q
volume_path = %[4]q

[network]
network_backend = "cni"
cni_plugin_dirs = [%[5]q]
network_config_dir = %[6]q
default_network = "overlay"
`, filepath.Join(dir, "events.log"), filepath.Join(dir, "tmp"), filepath.Join(dir, "static"),
		filepath.Join(dir, "volumes"), cniBin, h.netDir)
	storage := fmt.Sprintf("[storage]\ndriver = \"vfs\"\nrunroot = %q\ngraphroot = %q\n",
		filepath.Join(dir, "runroot"), filepath.Join(dir, "storage"))
	files := map[string]string{"containers.conf": conf, "storage.conf": storage, "registries.conf": "unqualified-search-registries = []\n"}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := append(testenv.ProgramEnv(),
		"CONTAINERS_CONF="+filepath.Join(dir, "containers.conf"),
		"CONTAINERS_STORAGE_CONF="+filepath.Join(dir, "storage.conf"),
		"CONTAINERS_REGISTRIES_CONF="+filepath.Join(dir, "registries.conf"),
		"TMPDIR="+filepath.Join(dir, "tmp"),
	)
	return &podman{h: h, dir: dir, env: env}
}

// run runs podman args on the host.
func (p *podman) run(ctx context.Context, args ...string) (string, error) {
	out, err := p.h.command(ctx, p.env, "podman", args...)
	return strings.TrimSpace(out), err
}

func (p *podman) must(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, err := p.run(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// container is what podman inspect says of a running container's network.
type container struct {
	ID      string
	IP      netip.Addr
	Sandbox string // its network namespace
}

func (p *podman) inspect(t *testing.T, ctx context.Context, name string) container {
	t.Helper()
	out := p.must(t, ctx, "inspect", name)
	var vs []struct {
		ID              string `json:"Id"`
		NetworkSettings struct {
			SandboxKey string
			Networks   map[string]struct{ IPAddress string }
		}
	}
	if err := json.Unmarshal([]byte(out), &vs); err != nil || len(vs) != 1 {
		t.Fatalf("podman inspect %s: %v\n%s", name, err, out)
	}
	v := vs[0]
	c := container{ID: v.ID, Sandbox: v.NetworkSettings.SandboxKey}
	if n, ok := v.NetworkSettings.Networks["overlay"]; ok {
		c.IP, _ = netip.ParseAddr(n.IPAddress)
	}
	if !c.IP.IsValid() {
		t.Fatalf("podman inspect %s: no address on network overlay: %s", name, out)
	}
	return c
}
