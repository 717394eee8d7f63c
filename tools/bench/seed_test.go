package main

import (
	"strings"
	"testing"

	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/subnet"
	"github.com/overlaynet/overlay/subnet/etcdv3"
)

// The synthetic leases are what the daemon programs: each key and value,
// IPv4-only and dual stack, passes the daemon's own validation and yields
// the peers the kernel watcher expects.
func TestSynthLeasesAreValidPeers(t *testing.T) {
	for _, s := range []stack{ipv4Only, dualStack} {
		cfg, err := subnet.ParseConfig([]byte(s.network()))
		if err != nil {
			t.Fatalf("%s network: %v", s, err)
		}
		for _, i := range []int{1, 2, 255, 256, 4097, maxPeers} {
			v4, v6 := synthPeer(i), synthPeer6(i)
			key, value := leaseKey(v4.Subnet), leaseValue(v4)
			if s == dualStack {
				key, value = dualLeaseKey(v4.Subnet, v6.Subnet), dualLeaseValue(v4, v6)
			}
			ids, err := subnet.ParseLeaseKey(strings.TrimPrefix(key, etcdv3.DefaultPrefix+"/subnets/"))
			if err != nil {
				t.Fatalf("%s peer %d: key %q: %v", s, i, key, err)
			}
			attrs, err := subnet.DecodeAttrs([]byte(value))
			if err != nil {
				t.Fatalf("%s peer %d: value %s: %v", s, i, value, err)
			}
			l := subnet.Lease{Subnet: ids.IPv4, IPv6Subnet: ids.IPv6, Attrs: attrs}
			codec := leasedata.Codec{VNI: cfg.Backend.VNI}
			if err := cfg.CheckLease(l, codec); err != nil {
				t.Fatalf("%s peer %d (%s = %s) is not a valid peer: %v", s, i, key, value, err)
			}
			d4, _, _ := codec.Decode("BackendData", attrs.BackendData)
			d6, _, _ := codec.Decode("BackendV6Data", attrs.BackendV6Data)
			if l.Subnet != v4.Subnet || attrs.PublicAddr() != v4.PublicIP || d4 != vxlan.PeerData(v4.MAC) {
				t.Errorf("%s peer %d: IPv4 peer %s %s, want %+v", s, i, l.Subnet, value, v4)
			}
			if s == dualStack && (l.IPv6Subnet != v6.Subnet || attrs.PublicAddrV6() != v6.PublicIP || d6 != vxlan.PeerData(v6.MAC)) {
				t.Errorf("%s peer %d: IPv6 peer %s %s, want %+v", s, i, l.IPv6Subnet, value, v6)
			}
			if s == dualStack && v6.MAC == v4.MAC {
				t.Errorf("peer %d: the same VTEP MAC %v on both devices", i, v4.MAC)
			}
		}
	}
}

// A dual-stack figure is found only by a query naming its family, whatever
// the order the figures were taken in.
func TestFindTellsFamiliesApart(t *testing.T) {
	b := &bench{}
	b.add(result{Measure: "cold_start", Metric: "wall", Params: map[string]any{"k": 1000, "family": "dual"}}, []float64{2})
	b.add(result{Measure: "cold_start", Metric: "wall", Params: map[string]any{"k": 1000}}, []float64{1})
	if r, ok := b.find("cold_start", "wall", "k", 1000); !ok || r.Median != 1 {
		t.Errorf("IPv4-only figure: %+v %v, want median 1", r, ok)
	}
	if r, ok := b.find("cold_start", "wall", "k", 1000, "family", dualStack); !ok || r.Median != 2 {
		t.Errorf("dual-stack figure: %+v %v, want median 2", r, ok)
	}
	if _, ok := b.find("cold_start", "wall", "k", 5000); ok {
		t.Error("found a figure for a K never measured")
	}
}
