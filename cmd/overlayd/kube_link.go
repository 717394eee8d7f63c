//go:build kube

package main

import (
	"context"

	"github.com/overlaynet/overlay/internal/daemon"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/kube"
)

// This is overlayd-kube: the Kubernetes client is linked in, and a command
// in kube mode runs here.

// linkedKube is this program's Kubernetes client.
var linkedKube kubeClient = client{}

// handOverToKube is nil: overlayd-kube hands over to nothing.
var handOverToKube handOver

type client struct{}

func (client) source(k *kubeFlags, cfg *daemon.Config) subnet.Source {
	return kube.NewSource(k.config(cfg))
}

func (client) read(ctx context.Context, k *kubeFlags, cfg *daemon.Config) (*subnet.Config, subnet.Snapshot, error) {
	return kube.Read(ctx, k.config(cfg))
}

// config is the Kubernetes lease source's configuration for cfg's node.
func (k *kubeFlags) config(cfg *daemon.Config) kube.Config {
	return kube.Config{Kubeconfig: k.kubeconfig, APIURL: k.apiURL, NodeName: cfg.NodeName,
		AnnotationPrefix: k.prefix, NetConfPath: k.conf, SetNetworkUnavailable: k.setUnavailable, Logger: cfg.Logger}
}
