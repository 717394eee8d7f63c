package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/lab/labtest"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// TestCNIStatusFollowsOverlayd: CNI STATUS (the shipped conflist, at 1.1.0
// as libcni v1.2+ loads it) succeeds while the host's real overlayd is
// ready, and is code 50 once overlayd is stopped although subnet.env is
// still there (regression: STATUS looked at subnet.env only and succeeded),
// and again once overlayd is back.
func TestCNIStatusFollowsOverlayd(t *testing.T) {
	t.Parallel()
	l := labtest.New(t, lab.Config{})
	h1 := labtest.Hosts(t, l, 1)[0]
	root := testenv.RepoRoot(t)
	data, err := os.ReadFile(filepath.Join(root, "deploy", "cni", "10-overlay.conflist"))
	if err != nil {
		t.Fatal(err)
	}
	var list map[string]any
	if err := json.Unmarshal(data, &list); err != nil {
		t.Fatal(err)
	}
	overlay := list["plugins"].([]any)[0].(map[string]any)
	overlay["subnetFile"] = h1.SubnetFile
	overlay["dataDir"] = filepath.Join(h1.Dir, "cni-cache")
	overlay["ipam"] = map[string]any{"dataDir": filepath.Join(h1.Dir, "ipam")}
	if data, err = json.Marshal(list); err != nil {
		t.Fatal(err)
	}
	conf, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{filepath.Join(root, "bin"), filepath.Join(root, "bin", "cni")},
		filepath.Join(h1.Dir, "libcni"), testenv.CNIExec(os.Stderr))
	status := func() error {
		return lab.Do(h1.NS, func() error { return cni.GetStatusNetworkList(context.Background(), conf) })
	}

	if err := status(); err != nil {
		t.Fatalf("STATUS with overlayd ready: %v", err)
	}
	if err := h1.Stop(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(h1.SubnetFile); err != nil {
		t.Fatalf("subnet.env after stopping overlayd: %v", err)
	}
	var te *types.Error
	if err := status(); !errors.As(err, &te) || te.Code != types.ErrPluginNotAvailable || !strings.Contains(te.Msg, "overlayd") {
		t.Errorf("STATUS with overlayd stopped = %v, want code 50 naming overlayd", err)
	}
	if err := h1.Start(); err != nil {
		t.Fatal(err)
	}
	labtest.WaitReady(t, h1)
	if err := status(); err != nil {
		t.Errorf("STATUS with overlayd ready again: %v", err)
	}
}
