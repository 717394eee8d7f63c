package subnet

import (
	"encoding/json"
	"net/netip"
)

// PeerOf is a lease as a peer of one address family: its subnet of that
// family, its public address of that family, and the backend's data about
// it as the backend's codec decoded it (D: backend.PeerData; subnet does
// not import backend, so the type is the caller's).
type PeerOf[D any] struct {
	Subnet   netip.Prefix
	PublicIP netip.Addr
	Data     D
}

// DataDecoder is a backend's codec as Peers reads it (backend.Codec is
// one): Decode reads one family's backend data (member names it in
// errors) and says why it does not fit the network (misfit) and why it
// cannot be used (err).
type DataDecoder[D any] interface {
	Decode(member string, raw json.RawMessage) (data D, misfit, err error)
}

// Peers is what a lease read from the store is as a peer: its peer of
// each family it is one of (is4, is6), or why it is none (err, from
// CheckPeer). The backend's data of each family is decoded once, here,
// with codec, CheckPeer judges what the codec found, and the peers keep
// the decoded data. It is the one place a lease becomes peers: the
// daemon's peer set and the tests of lease validation both call it.
func Peers[D any, C DataDecoder[D]](c *Config, codec C, l Lease) (v4, v6 PeerOf[D], is4, is6 bool, err error) {
	data4, misfit4, err4 := codec.Decode("BackendData", l.Attrs.BackendData)
	data6, misfit6, err6 := codec.Decode("BackendV6Data", l.Attrs.BackendV6Data)
	is4, is6, err = c.CheckPeer(l, DataCheck{Misfit: misfit4, Err: err4}, DataCheck{Misfit: misfit6, Err: err6})
	if err != nil {
		return v4, v6, false, false, err
	}
	if is4 {
		v4 = PeerOf[D]{Subnet: l.Subnet, PublicIP: l.Attrs.PublicAddr(), Data: data4}
	}
	if is6 {
		v6 = PeerOf[D]{Subnet: l.IPv6Subnet, PublicIP: l.Attrs.PublicAddrV6(), Data: data6}
	}
	return v4, v6, is4, is6, nil
}
