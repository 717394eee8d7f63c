package vxlan

import (
	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
)

// The VXLAN backend's part of a lease value is backend/vxlan/leasedata's,
// which links no netlink (the lease-admin rules and `overlayd lease` read
// leases with it). The backend reads its peers' data with these.

// PeerData is a VTEP MAC as backend.Peer carries it (leasedata.PeerData).
func PeerData(mac MAC) backend.PeerData { return leasedata.PeerData(mac) }

// PeerMAC is the VTEP MAC a peer of a VXLAN plane carries (leasedata.PeerMAC).
func PeerMAC(p backend.Peer) MAC { return leasedata.PeerMAC(p) }
