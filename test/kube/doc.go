// Package kubee2e is the Kubernetes lab (issue 30): real Kubernetes
// components (built by `make kube`) in network namespaces the test
// creates and removes. An underlay with a router, the control plane in a
// namespace of its own (the API server's etcd, kube-apiserver,
// kube-controller-manager, kube-scheduler, and in etcd mode the overlay's
// own etcd over TLS), and three nodes, each a network namespace and a mount namespace
// of its own (a tmpfs on /run, the node's directories over /var/lib/cni,
// /var/lib/kubelet, /var/log, /etc/cni and /opt/cni) with Debian's
// containerd, kubelet and kube-proxy. Images are built locally and imported: nothing is pulled.
// overlay is deployed the way users deploy it, `kubectl apply -f
// deploy/kubernetes/overlay.yaml` (or, in kube mode, overlay-kube.yaml,
// with kube-controller-manager allocating the podCIDRs), and the network
// test matrix runs on top
// (Documentation/kubernetes.md). `make kube-e2e` runs it.
package kubee2e
