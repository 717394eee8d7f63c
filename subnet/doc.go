// Package subnet holds the pure control-plane model of the overlay: the
// network config stored at <prefix>/config, leases and their etcd key
// encoding (wire-compatible with flannel), validation of everything read from
// etcd, subnet allocation, and the subnet.env file handed to the CNI plugin.
//
// It imports neither etcd nor netlink, so the CNI plugin can read subnet.env
// through it without paying for an etcd client at every exec. Source is the
// seam the daemon takes its leases through (source.go); the etcd side
// (registry, lease keeping, watch, journal) implements it in subnet/etcdv3.
package subnet
