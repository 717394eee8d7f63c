package main

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/subnet/kube"
	"github.com/overlaynet/overlay/subnet/kube/nodes"
)

// kubeFlags are run's flags of kube mode (--kube-subnet-mgr), under
// flanneld's names: the subnets come from the Kubernetes API instead of
// etcd (subnet/kube).
type kubeFlags struct {
	enabled, setUnavailable          bool
	kubeconfig, apiURL, prefix, conf string
}

// DefaultNetConfPath is flanneld's --net-config-path default, where
// kube-flannel's DaemonSet mounts its ConfigMap.
const DefaultNetConfPath = "/etc/kube-flannel/net-conf.json"

// kubeOnlyFlags are the flags that mean something in kube mode only.
var kubeOnlyFlags = []string{"kubeconfig-file", "kube-api-url", "kube-annotation-prefix", "net-config-path", "set-node-network-unavailable"}

// etcdOnlyFlags are the flags that mean something with etcd only.
var etcdOnlyFlags = []string{"endpoints", "prefix", "cacert", "cert", "key", "user", "password", "lease-ttl", "lease-resync"}

func (k *kubeFlags) register(c *cobra.Command) {
	f := c.Flags()
	f.BoolVar(&k.enabled, "kube-subnet-mgr", false, "take this node's subnet from its Node's spec.podCIDRs and publish its VTEP in the Node's annotations, as flanneld --kube-subnet-mgr does: no etcd (Documentation/kubernetes.md, \"Kube mode\")")
	f.StringVar(&k.kubeconfig, "kubeconfig-file", "", "kube mode: kubeconfig to reach the API server (default: the pod's service account)")
	f.StringVar(&k.apiURL, "kube-api-url", "", "kube mode: the API server's URL (default: the kubeconfig's, or in-cluster)")
	f.StringVar(&k.prefix, "kube-annotation-prefix", nodes.DefaultPrefix, "kube mode: prefix of the Node annotations (flanneld's)")
	f.StringVar(&k.conf, "net-config-path", DefaultNetConfPath, "kube mode: the network config file (net-conf.json), checked as `overlayd config put` checks one")
	f.BoolVar(&k.setUnavailable, "set-node-network-unavailable", true, "kube mode: set the Node's NetworkUnavailable condition to false once the data path is up")
	checkFlag(f, "kube-subnet-mgr", boolean)
	checkFlag(f, "kubeconfig-file", readableFile)
	checkFlag(f, "kube-api-url", apiURL)
	checkFlag(f, "kube-annotation-prefix", func(s string) error { _, err := nodes.NewAnnotations(s); return err })
	checkFlag(f, "net-config-path", absFile)
	checkFlag(f, "set-node-network-unavailable", boolean)
	fromEnv(f, append([]string{"kube-subnet-mgr"}, kubeOnlyFlags...)...)
}

// source sets cfg.Source to the Kubernetes lease source in kube mode; in
// etcd mode it refuses kube mode's flags, and in kube mode etcd's.
func (k *kubeFlags) source(fs *pflag.FlagSet, cfg *daemon.Config) error {
	if !k.enabled {
		for _, name := range kubeOnlyFlags {
			if fs.Lookup(name).Changed {
				return usagef("--%s is kube mode's: add --kube-subnet-mgr, or drop it (with etcd the network config is <prefix>/config: `overlayd config put -f FILE`)%s", name, envNote(fs, name))
			}
		}
		return nil
	}
	var etcd []string
	for _, name := range etcdOnlyFlags {
		if fs.Lookup(name).Changed {
			etcd = append(etcd, name)
		}
	}
	if len(etcd) > 0 {
		return usagef("--%s: etcd's settings, but --kube-subnet-mgr takes the subnets from the Kubernetes API: drop them, or --kube-subnet-mgr%s",
			strings.Join(etcd, ", --"), envNote(fs, append(etcd, "kube-subnet-mgr")...))
	}
	if cfg.NodeName == "" {
		return usagef("--kube-subnet-mgr needs this node's name: set NODE_NAME (from the pod's spec.nodeName) or --node-name")
	}
	cfg.Source = kube.NewSource(kube.Config{Kubeconfig: k.kubeconfig, APIURL: k.apiURL, NodeName: cfg.NodeName,
		AnnotationPrefix: k.prefix, NetConfPath: k.conf, SetNetworkUnavailable: k.setUnavailable, Logger: cfg.Logger})
	return nil
}

// nodeNameVar is flanneld's variable for the node's name in kube mode.
const nodeNameVar = "NODE_NAME"

// applyNodeName sets --node-name from NODE_NAME in kube mode when neither
// the command line nor OVERLAY_NODE_NAME set it (flanneld reads NODE_NAME;
// kube-flannel's DaemonSet sets it from spec.nodeName).
func applyNodeName(fs *pflag.FlagSet, vars map[string]string) error {
	mgr, name := fs.Lookup("kube-subnet-mgr"), fs.Lookup("node-name")
	if mgr == nil || name == nil || mgr.Value.String() != "true" || name.Changed || vars[nodeNameVar] == "" {
		return nil
	}
	return setFlagFromEnv(name, nodeNameVar, vars[nodeNameVar])
}

// readableFile is a file this process can read.
func readableFile(s string) error {
	f, err := os.Open(s)
	if err != nil {
		return fmt.Errorf("want a readable file: %w", errors.Unwrap(err))
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil || st.IsDir() {
		return errors.New("want a readable file, not a directory")
	}
	return nil
}

// apiURL is an API server's URL.
func apiURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return errors.New("want the API server's URL such as https://10.0.0.1:6443")
	}
	return nil
}
