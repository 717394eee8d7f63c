package runtimee2e

import (
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// busybox is busybox-static's binary, the whole test image.
const busybox = "/bin/busybox"

// suite is what every runtime's tests share: two lab hosts with overlayd,
// the CNI plugin directory and the test image.
type suite struct {
	lab    *lab.Lab
	hosts  []*host
	cniBin string
	img    image
}

// TestRuntimes runs podman and containerd (CRI) on two lab hosts.
func TestRuntimes(t *testing.T) {
	testenv.RequireRoot(t)
	for _, bin := range []string{"podman", "conmon", "runc", "containerd", "ctr"} {
		if _, err := exec.LookPath(bin); err != nil {
			testenv.Unavailable(t, "%s is not installed: run `make runtime-e2e` (test/runtime/install-deps.sh installs the packages)", bin)
		}
	}
	if err := checkStatic(busybox); err != nil {
		testenv.Unavailable(t, "%v: install busybox-static (`make runtime-e2e` does)", err)
	}
	root := testenv.RepoRoot(t)
	before, netnsBefore := testenv.RootNetworkState(t), runtimeNetns()
	// Registered first, so it runs last: after the lab and the runtimes
	// are gone.
	t.Cleanup(func() {
		if after := testenv.RootNetworkState(t); after != before {
			t.Errorf("the root network namespace changed:\nbefore:\n%s\nafter:\n%s", before, after)
		}
		if after := runtimeNetns(); !slices.Equal(after, netnsBefore) {
			t.Errorf("runtime network namespaces before %v, after %v", netnsBefore, after)
		}
	})

	s := &suite{lab: labtest.New(t, lab.Config{})}
	shipped, err := os.ReadFile(filepath.Join(root, "deploy", "cni", "10-overlay.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range labtest.Hosts(t, s.lab, 2) {
		s.hosts = append(s.hosts, newHost(t, n, shipped))
	}
	s.cniBin = cniBinDir(t, root, s.lab.Dir)
	if s.img, err = buildImage(busybox, s.lab.Dir); err != nil {
		t.Fatalf("build the test image: %v", err)
	}
	t.Run("podman", s.testPodman)
	t.Run("cri", s.testCRI)
}

// cniBinDir is one directory with overlay-cni and the upstream plugins
// (containerd 1.6 takes a single bin_dir).
func cniBinDir(t *testing.T, root, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "cni-bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	links := map[string]string{"overlay-cni": testenv.Binary(t, "overlay-cni")}
	plugins := testenv.PluginDir(t)
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		links[p] = filepath.Join(plugins, p)
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// checkStatic makes sure bin is a statically linked ELF binary (no
// interpreter): the test image holds nothing else.
func checkStatic(bin string) error {
	f, err := elf.Open(bin)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked", bin)
		}
	}
	return nil
}
