package subnet

import (
	"net/netip"
	"testing"
)

func BenchmarkConfigPeer(b *testing.B) {
	for _, tc := range []struct {
		name, cfg string
		l         Lease
	}{
		{"ipv4", `{"Network":"10.244.0.0/16"}`, Lease{Subnet: netip.MustParsePrefix("10.244.7.0/24"), Attrs: LeaseAttrs{PublicIP: "198.18.0.7", BackendType: "vxlan", BackendData: []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"}`), NodeID: "n7"}}},
		{"dual", `{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/48"}`, Lease{Subnet: netip.MustParsePrefix("10.244.7.0/24"), IPv6Subnet: netip.MustParsePrefix("fd00:10:244:7::/64"), Attrs: LeaseAttrs{PublicIP: "198.18.0.7", PublicIPv6: "2001:db8::7", BackendType: "vxlan", BackendData: []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"}`), BackendV6Data: []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:06:07"}`), NodeID: "n7"}}},
	} {
		cfg, err := ParseConfig([]byte(tc.cfg))
		if err != nil {
			b.Fatal(err)
		}
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := peers(cfg, tc.l); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeAttrs: every host decodes every lease value at start-up and
// at each re-list.
func BenchmarkDecodeAttrs(b *testing.B) {
	value := []byte(`{"PublicIP":"198.18.0.7","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"},"NodeID":"n7","Hostname":"host-7"}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeAttrs(value); err != nil {
			b.Fatal(err)
		}
	}
}
