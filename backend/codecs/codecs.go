// Package codecs picks the codec of a network's backend (backend.Codec:
// the backend's part of a lease value) from the network config, for
// everything that reads or writes leases: the daemon, the lease-admin
// rules, `overlayd lease`. It links no netlink: each backend keeps its
// codec in a package apart from its kernel code (VXLAN's is
// backend/vxlan/leasedata), so the pure rules stay pure.
//
// A new backend adds its codec here, beside its case in the daemon's plane
// factory (daemon.hostKernel.Plane), and its type to what
// subnet.ParseConfig accepts.
package codecs

import (
	"cmp"
	"encoding/json"
	"fmt"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/subnet"
)

// For returns the codec of the network's backend b. subnet.ParseConfig
// accepts vxlan only; any other Backend.Type is an error here too, never a
// VXLAN codec reading another backend's data.
func For(b subnet.BackendConfig) (backend.Codec, error) {
	switch t := cmp.Or(b.Type, subnet.DefaultBackendType); t {
	case subnet.DefaultBackendType:
		return leasedata.Codec{VNI: b.VNI}, nil
	default:
		return nil, fmt.Errorf("no lease codec for Backend.Type %q: this overlayd knows %q only; set the network config's Backend.Type to %[2]q (overlayd config put)", t, subnet.DefaultBackendType)
	}
}

// Peers is what lease l is as peers of the network cfg, read with codec
// (subnet.Peers, in the backend's Peer): the one place the daemon turns a
// lease into the peers it programs.
func Peers(cfg *subnet.Config, codec backend.Codec, l subnet.Lease) (v4, v6 backend.Peer, is4, is6 bool, err error) {
	p4, p6, is4, is6, err := subnet.Peers[backend.PeerData](cfg, codec, l)
	return backend.Peer(p4), backend.Peer(p6), is4, is6, err
}

// LeaseVtepMAC is the VTEP MAC a lease's VXLAN backend data raw (its
// member member, e.g. "BackendData") names, as the lease writes it, if it
// can be read: for the peer events' logs and `overlayd lease list`.
func LeaseVtepMAC(raw json.RawMessage, member string) (string, bool) {
	d, err := leasedata.DecodeLeaseData(member, raw)
	return d.VtepMAC, err == nil
}
