// Package runtimee2e is the end-to-end suite with real container runtimes:
// Debian's podman (CNI backend, runc) and containerd driven through the
// Kubernetes CRI, on two simulated hosts of internal/lab (real overlayd,
// real etcd), with overlay-cni and the upstream plugins as the runtimes'
// only CNI configuration.
//
// Each runtime process is started from a thread switched into a lab host's
// network namespace, so everything it configures (cni0, veths, portmap's
// rules, its containers' namespaces' peers) lives there; its configuration
// names only overlay's conflist, and its state, storage, locks and sockets
// live in the suite's temporary directory. The suite checks that the root
// namespace's links and routes are the same before and after.
//
// `make runtime-e2e` installs the packages (test/runtime/install-deps.sh)
// and runs it; `make e2e` (and so `make test`) runs that target.
package runtimee2e
