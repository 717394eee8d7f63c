package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/internal/testenv"
)

// These tests exec the built binary (bin/overlay-cni) for the answers that
// need no network: they create nothing, so they need no namespace and no
// root. The verbs themselves are tested in package delegate.

func binary(t *testing.T) string {
	t.Helper()
	return testenv.Binary(t, "overlay-cni")
}

func TestVersion(t *testing.T) {
	info, err := invoke.GetVersionInfo(context.Background(), binary(t), nil)
	if err != nil {
		t.Fatalf("VERSION: %v", err)
	}
	want := []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}
	if diff := cmp.Diff(want, info.SupportedVersions()); diff != "" {
		t.Errorf("supported versions (-want +got):\n%s", diff)
	}
}

func TestAbout(t *testing.T) {
	cmd := exec.Command(binary(t))
	cmd.Env = []string{}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run without CNI_COMMAND: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "CNI plugin overlay-cni") {
		t.Errorf("about = %q", out)
	}
}

// TestStatusAndGCAreImplemented: with a nil Status or GC the CNI library
// would answer success; ours must answer 50 without subnet.env, and refuse
// a GC without a valid list.
func TestStatusAndGCAreImplemented(t *testing.T) {
	dir := t.TempDir()
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"overlay","type":"overlay-cni","subnetFile":%q,"dataDir":%q}`,
		filepath.Join(dir, "subnet.env"), filepath.Join(dir, "cache"))
	for verb, code := range map[string]uint{"STATUS": types.ErrPluginNotAvailable, "GC": types.ErrInvalidNetworkConfig} {
		t.Run(verb, func(t *testing.T) {
			err := invoke.ExecPluginWithoutResult(context.Background(), binary(t), []byte(conf),
				&invoke.Args{Command: verb, Path: dir}, nil)
			var te *types.Error
			if !errors.As(err, &te) || te.Code != code {
				t.Errorf("%s = %v, want CNI error code %d", verb, err, code)
			}
		})
	}
}
