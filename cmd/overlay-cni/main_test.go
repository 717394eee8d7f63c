package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/internal/testing/testenv"
	ovversion "github.com/overlaynet/overlay/internal/version"
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

// TestAbout: run without CNI_COMMAND, the plugin names itself and the
// build's version, as make stamps it (never Go's "(devel)").
func TestAbout(t *testing.T) {
	cmd := exec.Command(binary(t))
	cmd.Env = []string{}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("run without CNI_COMMAND: %v\n%s", err, out)
	}
	if !strings.HasPrefix(string(out), "CNI plugin overlay-cni ") || strings.Contains(string(out), "(devel)") {
		t.Errorf("about = %q", out)
	}

	old := ovversion.Version
	t.Cleanup(func() { ovversion.Version = old })
	ovversion.Version = "v1.2.3-4-gabcdef"
	if got := about(); !strings.HasPrefix(got, "CNI plugin overlay-cni v1.2.3-4-gabcdef ") {
		t.Errorf("about() = %q, want the version set at link time", got)
	}
}

// TestErrorFormat: errors are the spec's error object, with the request's
// cniVersion (the newest supported one when the request has none).
func TestErrorFormat(t *testing.T) {
	dir := t.TempDir()
	pod := testenv.NewNS(t) // ADD needs a network namespace before it reads subnet.env
	for _, tc := range []struct {
		conf, want string
		code       uint
	}{
		{`{"cniVersion":"0.4.0","name":"overlay","type":"overlay-cni","dataDir":"relative"}`, "0.4.0", types.ErrInvalidNetworkConfig},
		{`{"cniVersion":"1.0.0","name":"overlay","type":"overlay-cni","subnetFile":"` + dir + `/none"}`, "1.0.0", types.ErrTryAgainLater},
		{`{"cniVersion":"0.2.0","name":"overlay","type":"overlay-cni"}`, "0.2.0", types.ErrIncompatibleCNIVersion},
		{`{"name":"overlay"`, "1.1.0", types.ErrDecodingFailure},
	} {
		cmd := exec.Command(binary(t))
		cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=c1", "CNI_NETNS=" + pod.Path(), "CNI_IFNAME=eth0", "CNI_PATH=" + dir}
		cmd.Stdin = strings.NewReader(tc.conf)
		out, err := cmd.Output()
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			t.Fatalf("ADD of %s: %v, want exit status 1", tc.conf, err)
		}
		var got map[string]any
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("ADD of %s printed %q: %v", tc.conf, out, err)
		}
		if got["cniVersion"] != tc.want || got["code"] != float64(tc.code) || got["msg"] == "" {
			t.Errorf("ADD of %s printed %s, want cniVersion %q and code %d", tc.conf, out, tc.want, tc.code)
		}
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
				&invoke.Args{Command: verb, Path: dir}, testenv.CNIExec(os.Stderr))
			var te *types.Error
			if !errors.As(err, &te) || te.Code != code {
				t.Errorf("%s = %v, want CNI error code %d", verb, err, code)
			}
		})
	}
}
