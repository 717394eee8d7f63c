package etcdv3

import (
	"encoding/json"
	"net"
	"net/netip"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/subnet"
)

// The VXLAN backend's part of the tests' lease values, written and read
// by its codec as the daemon does (the registry keeps it as raw JSON).

// vxlanData is the backend data of a host of VNI 1 whose VTEP MAC is mac.
func vxlanData(mac net.HardwareAddr) json.RawMessage { return vxlan.Codec{VNI: 1}.Encode(mac) }

// vxlanAttrs is the lease value of a host of the VXLAN network of VNI vni.
func vxlanAttrs(publicIP netip.Addr, vni int, mac net.HardwareAddr, nodeID, hostname string) subnet.LeaseAttrs {
	return subnet.NewAttrs(publicIP, subnet.DefaultBackendType, vxlan.Codec{VNI: vni}.Encode(mac), nodeID, hostname)
}

// leaseData reads backend data as the daemon does.
func leaseData(raw json.RawMessage) (vxlan.LeaseData, error) {
	return vxlan.DecodeLeaseData("BackendData", raw)
}

// hostMAC is the VTEP MAC h publishes.
func hostMAC(h Host) string {
	d, _ := leaseData(h.BackendData)
	return d.VtepMAC
}

// peers is what the daemon makes of a lease: its peer of each family the
// network carries (subnet.Config.CheckPeer over the codec's reading).
func peers(cfg *subnet.Config, l subnet.Lease) (v4, v6 backend.Peer, err error) {
	codec := vxlan.Codec{VNI: cfg.Backend.VNI}
	d4, m4, e4 := codec.Decode("BackendData", l.Attrs.BackendData)
	d6, m6, e6 := codec.Decode("BackendV6Data", l.Attrs.BackendV6Data)
	is4, is6, err := cfg.CheckPeer(l, subnet.DataCheck{Misfit: m4, Err: e4}, subnet.DataCheck{Misfit: m6, Err: e6})
	if is4 {
		v4 = backend.Peer{Subnet: l.Subnet, PublicIP: l.Attrs.PublicAddr(), Data: d4}
	}
	if is6 {
		v6 = backend.Peer{Subnet: l.IPv6Subnet, PublicIP: l.Attrs.PublicAddrV6(), Data: d6}
	}
	return v4, v6, err
}
