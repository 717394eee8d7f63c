package subnet

import (
	"encoding/json"
	"net/netip"
	"testing"
)

// The lease value a host publishes, per family the network carries: the
// bytes every source writes (etcd's keys, a Kubernetes Node's annotations
// later), so one constructor makes them.
func TestHostPublishingPerFamily(t *testing.T) {
	h := Host{NodeID: "n1", Hostname: "h1", PublicIP: netip.MustParseAddr("198.18.0.1"), PublicIPv6: netip.MustParseAddr("2001:db8::1")}
	data, data6 := json.RawMessage(`{"VNI":1,"VtepMAC":"0e:00:00:00:00:01"}`), json.RawMessage(`{"VNI":1,"VtepMAC":"0e:00:00:00:06:01"}`)
	for _, tc := range []struct {
		name, config, want string
	}{
		{"IPv4", `{"Network":"10.244.0.0/16"}`,
			`{"PublicIP":"198.18.0.1","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:01"},"NodeID":"n1","Hostname":"h1"}`},
		{"dual stack", `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/48"}`,
			`{"PublicIP":"198.18.0.1","PublicIPv6":"2001:db8::1","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:01"},"BackendV6Data":{"VNI":1,"VtepMAC":"0e:00:00:00:06:01"},"NodeID":"n1","Hostname":"h1"}`},
		// (PublicIP "" as etcd's IPv6-only leases have always said.)
		{"IPv6 only", `{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10:244::/48"}`,
			`{"PublicIP":"","PublicIPv6":"2001:db8::1","BackendType":"vxlan","BackendV6Data":{"VNI":1,"VtepMAC":"0e:00:00:00:06:01"},"NodeID":"n1","Hostname":"h1"}`},
	} {
		cfg, err := ParseConfig([]byte(tc.config))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := h.Publishing(cfg, data, data6)
		b, err := got.Attrs.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tc.want {
			t.Errorf("%s: publishes\n%s\nwant\n%s", tc.name, b, tc.want)
		}
		if got.NodeID != h.NodeID || got.PublicIP != h.PublicIP || got.Previous != h.Previous {
			t.Errorf("%s: the host itself changed: %+v", tc.name, got)
		}
	}
}
