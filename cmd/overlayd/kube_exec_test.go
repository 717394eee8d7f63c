//go:build !kube

package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/version"
)

// overlayd hands every command in kube mode over to overlayd-kube, however
// kube mode was asked for, before it writes anything; in etcd mode it runs
// the command itself.
func TestKubeModeIsHandedOverToOverlaydKube(t *testing.T) {
	dir := t.TempDir()
	host := []string{"--subnet-file", filepath.Join(dir, "subnet.env"), "--iface", testIface(t), "--node-name", "n1"}
	for _, tc := range []struct {
		name    string
		environ []string
		args    []string
	}{
		{"run --kube-subnet-mgr", nil, []string{"run", "--kube-subnet-mgr"}},
		{"flanneld's -kube-subnet-mgr", nil, []string{"run", "-kube-subnet-mgr"}},
		{"FLANNELD_KUBE_SUBNET_MGR", []string{"FLANNELD_KUBE_SUBNET_MGR=true"}, []string{"run"}},
		{"OVERLAY_KUBE_SUBNET_MGR", []string{"OVERLAY_KUBE_SUBNET_MGR=true"}, []string{"run"}},
		{"doctor --kube-subnet-mgr", nil, []string{"doctor", "--kube-subnet-mgr"}},
		// Even with an environment overlayd would warn about: overlayd-kube
		// reads the same, and warns once.
		{"with a warning", []string{"OVERLAY_NO_SUCH_FLAG=1"}, []string{"run", "--kube-subnet-mgr"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ran := false
			r := runEnvWith(t, func(ctx context.Context, cfg daemon.Config) error { ran = true; return nil }, tc.environ, append(tc.args, host...)...)
			if ran || r.code != exitError || r.out != "" || r.err != "Error: "+errHandedOver.Error()+"\n" {
				t.Errorf("ran the daemon %v, exit %d, stdout %q, stderr %q; want it handed over, nothing else written", ran, r.code, r.out, r.err)
			}
		})
	}
	// etcd mode, and an explicit false, stay here.
	for _, args := range [][]string{{"run"}, {"run", "--kube-subnet-mgr=false"}} {
		if cfg, _ := mustRunConfig(t, nil, append(args, host...)...); cfg.Source != nil {
			t.Errorf("overlayd %s: source %T, want etcd's", strings.Join(args, " "), cfg.Source)
		}
	}
}

// The hand-over runs overlayd-kube from overlayd's own directory, with the
// environment and overlayd's version added (overlayd-kube refuses another
// build's); without it there, it says what to install where.
func TestKubeExecRunsOverlaydKubeBesideOverlayd(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "overlayd")
	environ := []string{"NODE_NAME=n1", "OVERLAY_IFACE=eth0"}

	_, _, err := kubeExec(self, environ)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, KubeProgram)) || !strings.Contains(err.Error(), "install it beside "+self) {
		t.Errorf("without overlayd-kube: %v; want an error naming where it was looked for and what to install", err)
	}
	kubeBin := filepath.Join(dir, KubeProgram)
	if err := os.WriteFile(kubeBin, []byte("#!/bin/false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := kubeExec(self, environ); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("overlayd-kube not executable: %v; want permission denied", err)
	}
	if err := os.Chmod(kubeBin, 0o755); err != nil {
		t.Fatal(err)
	}
	path, env, err := kubeExec(self, environ)
	if err != nil || path != kubeBin {
		t.Fatalf("kubeExec = %q, %v; want %q", path, err, kubeBin)
	}
	if want := append(slices.Clone(environ), handOverVar+"="+version.Version); !slices.Equal(env, want) {
		t.Errorf("environment %q, want %q", env, want)
	}
	if environ[len(environ)-1] != "OVERLAY_IFACE=eth0" || len(environ) != 2 {
		t.Errorf("the caller's environment changed: %q", environ)
	}
}
