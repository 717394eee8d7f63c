package vxlan

import (
	"encoding/json"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
)

// The VXLAN backend's part of a lease value is backend/vxlan/leasedata's,
// which links no netlink (the lease-admin rules and `overlayd lease` read
// leases with it). These names forward to it for the backend's own code
// its tests, and the tests of subnet/etcdv3.

// Codec is leasedata.Codec.
type Codec = leasedata.Codec

// LeaseData is leasedata.LeaseData.
type LeaseData = leasedata.LeaseData

// DecodeLeaseData is leasedata.DecodeLeaseData.
func DecodeLeaseData(member string, raw json.RawMessage) (LeaseData, error) {
	return leasedata.DecodeLeaseData(member, raw)
}

// PeerData is a VTEP MAC as backend.Peer carries it (leasedata.PeerData).
func PeerData(mac MAC) backend.PeerData { return leasedata.PeerData(mac) }

// PeerMAC is the VTEP MAC a peer of a VXLAN plane carries (leasedata.PeerMAC).
func PeerMAC(p backend.Peer) MAC { return leasedata.PeerMAC(p) }
