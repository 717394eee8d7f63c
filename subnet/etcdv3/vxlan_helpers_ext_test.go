package etcdv3_test

import (
	"encoding/json"
	"net"
	"net/netip"

	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/subnet"
)

// The VXLAN backend's part of the tests' lease values (as in
// vxlan_helpers_test.go, for the external tests).

func vxlanData(mac net.HardwareAddr) json.RawMessage { return leasedata.Codec{VNI: 1}.Encode(mac) }

func vxlanAttrs(publicIP netip.Addr, vni int, mac net.HardwareAddr, nodeID, hostname string) subnet.LeaseAttrs {
	return subnet.NewAttrs(publicIP, subnet.DefaultBackendType, leasedata.Codec{VNI: vni}.Encode(mac), nodeID, hostname)
}

func leaseData(raw json.RawMessage) (leasedata.LeaseData, error) {
	return leasedata.DecodeLeaseData("BackendData", raw)
}
