// Package e2e holds the end-to-end tests: real overlayd processes on
// simulated hosts (network namespaces on a bridged underlay, internal/lab),
// a real etcd, and pods attached through libcni with the real overlay-cni,
// bridge and host-local plugins. They need root and the binaries of
// `make build plugins`; `make e2e` runs them. Nothing is created outside the
// namespaces a test's lab makes, and everything is removed when it ends.
package e2e
