// Package delegate is the logic of overlay-cni, the CNI plugin of the overlay
// network. It is deliberately thin: the host's lease (subnet.env, written by
// overlayd) decides which addresses pods on this host may use, and the
// upstream bridge and host-local plugins do the actual work.
//
// Data path: a pod's eth0 is one end of a veth pair whose other end is
// enslaved to the host bridge (cni0 by default). The bridge holds the lease's
// first address (the gateway, OVERLAY_SUBNET), host-local hands out the other
// addresses of the lease, and the pod gets a route to the whole cluster
// network (OVERLAY_NETWORK) via that gateway. From there the host routes the
// packet onto the VXLAN device that overlayd programs.
//
// The package is layered so that each layer is testable on its own:
//
//   - conf.go parses overlay-cni's network configuration (pure);
//   - render.go turns a NetConf and a subnet.Env into the delegate's
//     configuration bytes (pure);
//   - cache.go stores the rendered configuration per attachment, atomically,
//     so that DEL can replay exactly what ADD used even when the daemon is
//     gone or the lease changed;
//   - hostlocal.go sweeps host-local reservations during GC;
//   - invoke.go execs the delegate plugin (ExecInvoker) behind the Invoker
//     interface;
//   - plugin.go implements the CNI verbs on top of an Invoker.
//
// Every error returned by a verb is a *types.Error with a spec code (or one of
// ours, 100 and up), so the runtime never sees the catch-all 999.
//
// The package imports neither etcd nor netlink: overlay-cni is exec'd for
// every pod and its start-up cost adds to every pod's creation.
package delegate
