package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// TestSubnetEnvWithBothFormats: a subnet.env with keys of overlayd's format
// and of flanneld's is unusable (ADD: 11, STATUS: 50), and the error names
// the keys of each, so the operator sees which file mixes them.
func TestSubnetEnvWithBothFormats(t *testing.T) {
	dir := t.TempDir()
	env := filepath.Join(dir, "subnet.env")
	mixed := "OVERLAY_NETWORK=10.244.0.0/16\nOVERLAY_SUBNET=10.244.7.1/24\nOVERLAY_MTU=1450\nOVERLAY_IPMASQ=true\nFLANNEL_MTU=1450\n"
	if err := os.WriteFile(env, []byte(mixed), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"cbr0","type":"overlay-cni","subnetFile":%q,"dataDir":%q,"healthAddr":""}`,
		env, filepath.Join(dir, "cache"))
	pod := testenv.NewNS(t) // ADD needs a network namespace before it reads subnet.env
	for verb, code := range map[string]uint{"ADD": types.ErrTryAgainLater, "STATUS": types.ErrPluginNotAvailable} {
		args := &invoke.Args{Command: verb, ContainerID: "c1", NetNS: pod.Path(), IfName: "eth0", Path: dir}
		err := invoke.ExecPluginWithoutResult(context.Background(), binary(t), []byte(conf), args, testenv.CNIExec(os.Stderr))
		var te *types.Error
		if !errors.As(err, &te) || te.Code != code || !strings.Contains(te.Details, "(FLANNEL_MTU)") ||
			!strings.Contains(te.Details, "(OVERLAY_NETWORK, OVERLAY_SUBNET, OVERLAY_MTU, OVERLAY_IPMASQ)") {
			t.Errorf("%s = %v (details %q), want code %d naming the keys of both formats", verb, err, detailsOf(te), code)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "cache")); !errors.Is(err, os.ErrNotExist) {
		t.Error("ADD with an unusable subnet.env wrote a cache entry")
	}
}

func detailsOf(te *types.Error) string {
	if te == nil {
		return ""
	}
	return te.Details
}
