// Package faults proves that overlay loses and corrupts nothing under the
// faults a fleet meets (issue #8, parts 1 and 2), with real overlayd
// processes on simulated hosts (internal/lab), real etcd servers and real
// kernel state:
//
//   - crash consistency: overlayd killed with SIGKILL at random points while
//     it converges 500 peers; after every restart the kernel holds exactly
//     the lease set, and subnet.env is only ever the old or the new file;
//   - datastore faults: members of a 3-member etcd cluster stopped one and
//     then two at a time (quorum loss); a single etcd stopped for 60 s,
//     restarted with its data, compacted over and over while the daemons are
//     cut off; watch streams that stall silently; connections that go dead
//     without closing. Leases changed meanwhile are all applied afterwards,
//     no lease is lost and no packet dropped.
//
// Every check compares the full kernel state of every host (routes of
// protocol 115, permanent neighbours and FDB entries on overlay.1) with the
// lease set in etcd, line by line. Seeds are printed; loops are bounded.
// Like test/e2e, it needs root and the binaries of `make build plugins`;
// `make e2e` runs it.
package faults
