package codecs_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/codecs"
	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/subnet"
)

// The network's Backend.Type picks the codec: vxlan (or no type, as
// flannel's default) reads VXLAN data of the network's VNI; any other
// type is an error naming it, never a VXLAN codec reading another
// backend's data.
func TestForPicksByBackendType(t *testing.T) {
	for _, typ := range []string{"vxlan", ""} {
		c, err := codecs.For(subnet.BackendConfig{Type: typ, VNI: 7})
		if err != nil {
			t.Fatalf("For(Type %q): %v", typ, err)
		}
		if c != (leasedata.Codec{VNI: 7}) {
			t.Errorf("For(Type %q) = %#v, want the VXLAN codec of VNI 7", typ, c)
		}
	}
	for _, typ := range []string{"wireguard", "host-gw", "VXLAN"} {
		c, err := codecs.For(subnet.BackendConfig{Type: typ, VNI: 1})
		if err == nil || c != nil {
			t.Errorf("For(Type %q) = %v, %v; want an error", typ, c, err)
			continue
		}
		if !strings.Contains(err.Error(), `Backend.Type "`+typ+`"`) || !strings.Contains(err.Error(), `"vxlan"`) {
			t.Errorf("For(Type %q): %q does not name the type and what is known", typ, err)
		}
	}
}

// A dual-stack lease becomes one peer per family, each with its own
// subnet, public address and data; a lease the network cannot program
// becomes none, with CheckPeer's error.
func TestPeersOfALease(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56"}`))
	if err != nil {
		t.Fatal(err)
	}
	codec, err := codecs.For(cfg.Backend)
	if err != nil {
		t.Fatal(err)
	}
	l := subnet.Lease{Subnet: netip.MustParsePrefix("10.244.7.0/24"), IPv6Subnet: netip.MustParsePrefix("fd00:10:244:7::/64"),
		Attrs: subnet.LeaseAttrs{PublicIP: "198.18.0.7", PublicIPv6: "2001:db8::7", BackendType: "vxlan",
			BackendData:   []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"}`),
			BackendV6Data: []byte(`{"VNI":1,"VtepMAC":"0e:00:00:00:06:07"}`)}}
	v4, v6, is4, is6, err := codecs.Peers(cfg, codec, l)
	if err != nil || !is4 || !is6 {
		t.Fatalf("Peers = %v, %v, %v", is4, is6, err)
	}
	want4 := backend.Peer{Subnet: l.Subnet, PublicIP: netip.MustParseAddr("198.18.0.7"), Data: leasedata.PeerData(backend.MAC{0x0e, 0, 0, 0, 0, 7})}
	want6 := backend.Peer{Subnet: l.IPv6Subnet, PublicIP: netip.MustParseAddr("2001:db8::7"), Data: leasedata.PeerData(backend.MAC{0x0e, 0, 0, 0, 6, 7})}
	if v4 != want4 || v6 != want6 {
		t.Errorf("Peers = %+v, %+v; want %+v, %+v", v4, v6, want4, want6)
	}
	if got := codec.String(v6.Data); got != "0e:00:00:00:06:07" {
		t.Errorf("String(IPv6 data) = %q, want the VTEP MAC", got)
	}

	bad := l
	bad.Attrs.BackendV6Data = []byte(`{"VNI":1,"VtepMAC":"01:00:5e:00:00:01"}`)
	v4, v6, is4, is6, err = codecs.Peers(cfg, codec, bad)
	if !errors.Is(err, subnet.ErrInvalidLease) || is4 || is6 || v4 != (backend.Peer{}) || v6 != (backend.Peer{}) {
		t.Errorf("Peers of a lease with a multicast IPv6 VTEP MAC = %+v, %+v, %v, %v, %v; want no peer and ErrInvalidLease", v4, v6, is4, is6, err)
	}
}

// `overlayd lease list` and the peer events show the MAC as the lease
// writes it; data that cannot be read shows none.
func TestLeaseVtepMAC(t *testing.T) {
	if mac, ok := codecs.LeaseVtepMAC([]byte(`{"VNI":1,"VtepMAC":"0E:00:00:00:00:07"}`), "BackendData"); !ok || mac != "0E:00:00:00:00:07" {
		t.Errorf("LeaseVtepMAC = %q, %v", mac, ok)
	}
	for _, raw := range []string{``, `null`, `{"VNI":1,"VtepMAC":7}`} {
		if mac, ok := codecs.LeaseVtepMAC([]byte(raw), "BackendV6Data"); ok {
			t.Errorf("LeaseVtepMAC(%s) = %q, true; want none", raw, mac)
		}
	}
}
