package main

import (
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
