package subnet

import (
	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
)

// The tests of lease validation read the backend's part of a lease with
// the VXLAN backend's codec, as the daemon does: subnet itself does not
// interpret it.

// codec is the codec of cfg's backend.
func codec(cfg *Config) leasedata.Codec { return leasedata.Codec{VNI: cfg.Backend.VNI} }

// peers is what the daemon makes of a lease: its peer of each family it
// is one of, by Peers (the function the daemon's peer set calls).
func peers(cfg *Config, l Lease) (v4, v6 backend.Peer, err error) {
	p4, p6, _, _, err := Peers[backend.PeerData](cfg, codec(cfg), l)
	return backend.Peer(p4), backend.Peer(p6), err
}
