//go:build kube

package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/subnet/kube"
)

// --kube-subnet-mgr builds the daemon with the Kubernetes lease source,
// under overlayd's and flanneld's names alike, with the node's name from
// --node-name, OVERLAY_NODE_NAME or flanneld's NODE_NAME.
func TestKubeModeBuildsTheKubeSource(t *testing.T) {
	subnetFile := filepath.Join(t.TempDir(), "subnet.env")
	base := []string{"--subnet-file", subnetFile, "--iface", testIface(t)}
	for _, tc := range []struct {
		name     string
		environ  []string
		args     []string
		nodeName string
	}{
		{"flags", nil, []string{"run", "--kube-subnet-mgr", "--node-name", "node-1"}, "node-1"},
		{"NODE_NAME", []string{"NODE_NAME=node-2"}, []string{"run", "--kube-subnet-mgr"}, "node-2"},
		{"OVERLAY_NODE_NAME wins over NODE_NAME", []string{"NODE_NAME=node-2", "OVERLAY_NODE_NAME=node-3"}, []string{"run", "--kube-subnet-mgr"}, "node-3"},
		{"FLANNELD_* variables", []string{"FLANNELD_KUBE_SUBNET_MGR=true", "NODE_NAME=node-4", "FLANNELD_NET_CONFIG_PATH=/etc/x/net-conf.json"}, []string{"run"}, "node-4"},
		{"OVERLAY_* variables", []string{"OVERLAY_KUBE_SUBNET_MGR=true", "OVERLAY_NODE_NAME=node-5", "OVERLAY_KUBE_API_URL=https://10.0.0.1:6443"}, []string{"run"}, "node-5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _ := mustRunConfig(t, tc.environ, append(tc.args, base...)...)
			src, ok := cfg.Source.(*kube.Source)
			if !ok {
				t.Fatalf("Source = %T, want *kube.Source", cfg.Source)
			}
			if cfg.NodeName != tc.nodeName || !strings.Contains(src.Where(), tc.nodeName) {
				t.Errorf("node %q (source %s), want %q", cfg.NodeName, src.Where(), tc.nodeName)
			}
		})
	}
	// Without it, the etcd source, and NODE_NAME means nothing.
	cfg, _ := mustRunConfig(t, []string{"NODE_NAME=node-9"}, append([]string{"run"}, base...)...)
	if cfg.Source != nil || cfg.NodeName != "" {
		t.Errorf("etcd mode: Source %T, node %q; want the etcd source and no node name from NODE_NAME", cfg.Source, cfg.NodeName)
	}
}

func TestKubeModeNeedsTheNodeName(t *testing.T) {
	_, r := runConfig(t, nil, "run", "--kube-subnet-mgr", "--subnet-file", filepath.Join(t.TempDir(), "subnet.env"), "--iface", testIface(t))
	if r.code != exitUsage || !strings.Contains(r.err, "NODE_NAME") {
		t.Errorf("exit %d, stderr %q; want a usage error saying to set NODE_NAME", r.code, r.err)
	}
}

// In kube mode the doctor reads the network config file and the Nodes,
// never etcd: a missing file is named with where to mount it, and an API
// server it cannot reach with the request that failed; both exit 1
// before any finding.
func TestDoctorInKubeModeSaysWhatItCouldNotRead(t *testing.T) {
	dir := t.TempDir()
	conf := filepath.Join(dir, "net-conf.json")
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(conf, []byte(`{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	// Nothing listens on port 1 of the loopback.
	if err := os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600); err != nil {
		t.Fatal(err)
	}
	host := []string{"doctor", "--kube-subnet-mgr", "--node-name", "n1", "--iface", testIface(t), "--subnet-file", filepath.Join(dir, "subnet.env"), "--kubeconfig-file", kubeconfig}
	for _, tc := range []struct {
		name, conf string
		want       []string
	}{
		{"no network config", filepath.Join(dir, "missing.json"), []string{"--net-config-path", "missing.json", "mount the ConfigMap's net-conf.json there"}},
		{"API server unreachable", conf, []string{"list the Nodes", "127.0.0.1:1", "check that the API server answers"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, "", "", append(host, "--net-config-path", tc.conf)...)
			if r.code != exitError || r.out != "" {
				t.Errorf("exit %d, stdout %q; want exit 1 and no findings (stderr %q)", r.code, r.out, r.err)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.err, w) {
					t.Errorf("stderr %q does not name %q", r.err, w)
				}
			}
		})
	}
}
