package daemon

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/overlaynet/overlay/internal/testing/testenv"
	"github.com/overlaynet/overlay/subnet"
)

// With the flannel format the keeper writes, checks and repairs
// flanneld's file, byte for byte what flanneld writes.
func TestEnvKeeperFlannelFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "flannel", "subnet.env")
	env := subnet.NewEnv(netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.244.7.0/24"), 1450, true)
	k := newEnvKeeper(path, subnet.FormatFlannel, env)
	if _, err := k.ensure(); err != nil || k.problem() != "" {
		t.Fatalf("ensure: %v, problem %q", err, k.problem())
	}
	want := "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.7.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
	if got, _ := os.ReadFile(path); string(got) != want {
		t.Fatalf("wrote %q, want %q", got, want)
	}
	// The same values in overlayd's format are not what it keeps.
	if err := os.WriteFile(path, env.Marshal(), 0o644); err != nil {
		t.Fatal(err)
	}
	if p := k.problem(); !strings.Contains(p, "does not hold this host's lease") {
		t.Errorf("overlay format in a flannel-format file: problem %q", p)
	}
	k.set(func(e *subnet.Env) { e.MTU = 1400 })
	if _, err := k.ensure(); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != strings.Replace(want, "1450", "1400", 1) {
		t.Errorf("after a new MTU: %q", got)
	}
}

// An unknown format is never written: ensure fails naming it, and so does
// start-up.
func TestEnvKeeperUnknownFormat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "subnet.env")
	env := subnet.NewEnv(netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.244.7.0/24"), 1450, true)
	k := newEnvKeeper(path, "yaml", env)
	if _, err := k.ensure(); err == nil || !strings.Contains(err.Error(), `unknown subnet.env format "yaml"`) {
		t.Errorf("ensure with format yaml = %v, want an error naming it", err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Error("a file was written in an unknown format")
	}
}

// TestSubnetEnvOnAFullDisk: when subnet.env cannot be written for lack of
// space, the error names the file once, not its temporary file (it said
// "write X: write .X.tmp-N: write .X.tmp-N: no space left on device"),
// wraps ENOSPC, and no temporary file is left in the directory.
func TestSubnetEnvOnAFullDisk(t *testing.T) {
	env := subnet.NewEnv(netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.244.7.0/24"), 1450, true)
	var werr error
	var left []string
	var path string
	err := testenv.InFullFS(t, func(dir string) error {
		path = filepath.Join(dir, "subnet.env")
		_, werr = newEnvKeeper(path, "", env).ensure()
		entries, err := os.ReadDir(dir)
		for _, e := range entries {
			left = append(left, e.Name())
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(werr, syscall.ENOSPC) || werr.Error() != "write "+path+": no space left on device" {
		t.Errorf("ensure = %v, want \"write %s: no space left on device\" wrapping ENOSPC", werr, path)
	}
	if len(left) != 0 {
		t.Errorf("files left beside subnet.env: %q", left)
	}
}
