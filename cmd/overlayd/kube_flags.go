package main

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/internal/version"
	"github.com/overlaynet/overlay/subnet"
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

// register adds kube mode's flags to run (daemon) or doctor (!daemon,
// which writes nothing, so it has no --set-node-network-unavailable).
func (k *kubeFlags) register(c *cobra.Command, daemon bool) {
	f := c.Flags()
	f.BoolVar(&k.enabled, "kube-subnet-mgr", false, "take this node's subnet from its Node's spec.podCIDRs and publish its VTEP in the Node's annotations, as flanneld --kube-subnet-mgr does: no etcd (Documentation/kubernetes.md, \"Kube mode\")")
	f.StringVar(&k.kubeconfig, "kubeconfig-file", "", "kube mode: kubeconfig to reach the API server (default: the pod's service account)")
	f.StringVar(&k.apiURL, "kube-api-url", "", "kube mode: the API server's URL (default: the kubeconfig's, or in-cluster)")
	f.StringVar(&k.prefix, "kube-annotation-prefix", nodes.DefaultPrefix, "kube mode: prefix of the Node annotations (flanneld's)")
	f.StringVar(&k.conf, "net-config-path", DefaultNetConfPath, "kube mode: the network config file (net-conf.json), checked as `overlayd config put` checks one")
	checkFlag(f, "kube-subnet-mgr", boolean)
	checkFlag(f, "kubeconfig-file", readableFile)
	checkFlag(f, "kube-api-url", apiURL)
	checkFlag(f, "kube-annotation-prefix", func(s string) error { _, err := nodes.NewAnnotations(s); return err })
	checkFlag(f, "net-config-path", absFile)
	names := []string{"kube-subnet-mgr", "kubeconfig-file", "kube-api-url", "kube-annotation-prefix", "net-config-path"}
	if daemon {
		f.BoolVar(&k.setUnavailable, "set-node-network-unavailable", true, "kube mode: set the Node's NetworkUnavailable condition to false once the data path is up")
		checkFlag(f, "set-node-network-unavailable", boolean)
		names = append(names, "set-node-network-unavailable")
	}
	fromEnv(f, names...)
}

// kubeClient is kube mode's Kubernetes client (subnet/kube, client-go):
// linked into overlayd-kube only (kube_link.go, build tag kube), so that a
// host in etcd mode maps none of it. overlayd, without it, hands a command
// in kube mode over to overlayd-kube (kube_exec.go) before it runs.
type kubeClient interface {
	// source is run's lease source in kube mode.
	source(k *kubeFlags, cfg *daemon.Config) subnet.Source
	// read is what doctor reads in kube mode: the network config file and
	// one listing of the Nodes.
	read(ctx context.Context, k *kubeFlags, cfg *daemon.Config) (*subnet.Config, subnet.Snapshot, error)
}

// KubeProgram is the program of kube mode: overlayd with the Kubernetes
// client linked, installed beside overlayd (make build builds both, the
// image has both).
const KubeProgram = "overlayd-kube"

// handOver runs a command in kube mode in overlayd-kube instead of this
// program, with environ; it returns only if it cannot.
type handOver func(environ []string) error

// handOverVar is set by overlayd for overlayd-kube when it hands a command
// over: overlayd's version, which must be overlayd-kube's too (checkHandOver).
const handOverVar = "OVERLAYD_HANDED_OVER_BY"

// checkHandOver refuses to run a command overlayd handed over from another
// build: the two programs' flags and files must agree.
func checkHandOver(environ []string) error {
	for _, kv := range environ {
		if v, ok := strings.CutPrefix(kv, handOverVar+"="); ok && v != version.Version {
			return fmt.Errorf("%s is version %s, but the overlayd that ran it is %s: install both from one build", KubeProgram, version.Version, v)
		}
	}
	return nil
}

// kubeMode reports whether cmd (run or doctor) runs in kube mode, its
// flags and the environment applied.
func kubeMode(cmd *cobra.Command) bool {
	f := cmd.Flags().Lookup("kube-subnet-mgr")
	return f != nil && f.Value.String() == "true"
}

// source sets cfg.Source to the Kubernetes lease source in kube mode; in
// etcd mode it refuses kube mode's flags, and in kube mode etcd's.
func (k *kubeFlags) source(fs *pflag.FlagSet, cfg *daemon.Config, client kubeClient) error {
	if err := k.check(fs, cfg.NodeName); err != nil || !k.enabled {
		return err
	}
	if client == nil {
		return errNoKubeClient
	}
	cfg.Source = client.source(k, cfg)
	return nil
}

// errNoKubeClient: a command in kube mode reached a program without the
// Kubernetes client (only in tests: overlayd hands such a command over to
// overlayd-kube before it runs).
var errNoKubeClient = errors.New("--kube-subnet-mgr: this program links no Kubernetes client: run " + KubeProgram)

// changed: the command has flag name and it was set.
func changed(fs *pflag.FlagSet, name string) bool {
	f := fs.Lookup(name)
	return f != nil && f.Changed
}

// check refuses, in etcd mode, kube mode's flags; in kube mode, etcd's
// and a missing node name.
func (k *kubeFlags) check(fs *pflag.FlagSet, nodeName string) error {
	if !k.enabled {
		for _, name := range kubeOnlyFlags {
			if changed(fs, name) {
				return usagef("--%s is kube mode's: add --kube-subnet-mgr, or drop it (with etcd the network config is <prefix>/config: `overlayd config put -f FILE`)%s", name, envNote(fs, name))
			}
		}
		return nil
	}
	var etcd []string
	for _, name := range etcdOnlyFlags {
		if changed(fs, name) {
			etcd = append(etcd, name)
		}
	}
	if len(etcd) > 0 {
		return usagef("--%s: etcd's settings, but --kube-subnet-mgr takes the subnets from the Kubernetes API: drop them, or --kube-subnet-mgr%s",
			strings.Join(etcd, ", --"), envNote(fs, append(etcd, "kube-subnet-mgr")...))
	}
	if nodeName == "" {
		return usagef("--kube-subnet-mgr needs this node's name: set NODE_NAME (from the pod's spec.nodeName) or --node-name")
	}
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
