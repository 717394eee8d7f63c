package etcdv3

import (
	"encoding/json"
	"net"
	"net/netip"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/codecs"
	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/subnet"
)

// The VXLAN backend's part of the tests' lease values, written and read
// by its codec as the daemon does (the registry keeps it as raw JSON).

// vxlanData is the backend data of a host of VNI 1 whose VTEP MAC is mac.
func vxlanData(mac net.HardwareAddr) json.RawMessage { return leasedata.Codec{VNI: 1}.Encode(mac) }

// vxlanAttrs is the lease value of a host of the VXLAN network of VNI vni.
func vxlanAttrs(publicIP netip.Addr, vni int, mac net.HardwareAddr, nodeID, hostname string) subnet.LeaseAttrs {
	return subnet.NewAttrs(publicIP, subnet.DefaultBackendType, leasedata.Codec{VNI: vni}.Encode(mac), nodeID, hostname)
}

// leaseData reads backend data as the daemon does.
func leaseData(raw json.RawMessage) (leasedata.LeaseData, error) {
	return leasedata.DecodeLeaseData("BackendData", raw)
}

// hostMAC is the VTEP MAC h publishes.
func hostMAC(h Host) string {
	d, _ := leaseData(h.BackendData)
	return d.VtepMAC
}

// peers is what the daemon makes of a lease: its peer of each family the
// network carries (codecs.Peers, the daemon's own reading).
func peers(cfg *subnet.Config, l subnet.Lease) (v4, v6 backend.Peer, err error) {
	codec, err := codecs.For(cfg.Backend)
	if err != nil {
		return v4, v6, err
	}
	v4, v6, _, _, err = codecs.Peers(cfg, codec, l)
	return v4, v6, err
}
