package subnet

import (
	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan"
)

// The tests of lease validation read the backend's part of a lease with
// the VXLAN backend's codec, as the daemon does: subnet itself does not
// interpret it.

// codec is the codec of cfg's backend.
func codec(cfg *Config) vxlan.Codec { return vxlan.Codec{VNI: cfg.Backend.VNI} }

// peers is what the daemon makes of a lease: its peer of each family it
// is one of (CheckPeer over the codec's reading of the data).
func peers(cfg *Config, l Lease) (v4, v6 backend.Peer, err error) {
	c := codec(cfg)
	d4, m4, e4 := c.Decode("BackendData", l.Attrs.BackendData)
	d6, m6, e6 := c.Decode("BackendV6Data", l.Attrs.BackendV6Data)
	is4, is6, err := cfg.CheckPeer(l, DataCheck{Misfit: m4, Err: e4}, DataCheck{Misfit: m6, Err: e6})
	if is4 {
		v4 = backend.Peer{Subnet: l.Subnet, PublicIP: l.Attrs.PublicAddr(), Data: d4}
	}
	if is6 {
		v6 = backend.Peer{Subnet: l.IPv6Subnet, PublicIP: l.Attrs.PublicAddrV6(), Data: d6}
	}
	return v4, v6, err
}
