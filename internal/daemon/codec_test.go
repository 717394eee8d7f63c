package daemon

import (
	"net"
	"testing"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/codecs"
	"github.com/overlaynet/overlay/subnet"
)

// testCodec is the codec of the network's backend b, as start-up picks it.
func testCodec(t testing.TB, b subnet.BackendConfig) backend.Codec {
	t.Helper()
	c, err := codecs.For(b)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// What this host publishes in its lease, through the backend's codec: the
// MAC its node ID derives for each family, flanneld's for a family whose
// device is being taken over, byte for byte as flanneld writes it.
func TestPublishedDataIsDerivedOrTakenOver(t *testing.T) {
	cfg, err := subnet.ParseConfig([]byte(`{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan","VNI":5}}`))
	if err != nil {
		t.Fatal(err)
	}
	flannelMAC := net.HardwareAddr{0x0e, 0xf1, 0, 0, 0, 5}
	d := &daemon{nodeID: "node-a", netCfg: cfg, codec: testCodec(t, cfg.Backend)}
	d.planes = []*familyPlane{{family: backend.IPv4}, {family: backend.IPv6}}
	// The MACs node-a gets for VNI 5 (the values running hosts publish:
	// they must never change).
	if got, want := string(d.publishedData(backend.IPv4)), `{"VNI":5,"VtepMAC":"`+macOfNode(t, "node-a", backend.IPv4)+`"}`; got != want {
		t.Errorf("IPv4 data published = %s, want %s", got, want)
	}
	if got, want := string(d.publishedData(backend.IPv6)), `{"VNI":5,"VtepMAC":"`+macOfNode(t, "node-a", backend.IPv6)+`"}`; got != want {
		t.Errorf("IPv6 data published = %s, want %s", got, want)
	}
	d.planes[0].flannel = flannelDevice{name: "flannel.5", mac: flannelMAC}
	if got, want := string(d.publishedData(backend.IPv4)), `{"VNI":5,"VtepMAC":"0e:f1:00:00:00:05"}`; got != want {
		t.Errorf("IPv4 data published while taking flannel.5 over = %s, want %s", got, want)
	}
	if got, want := string(d.publishedData(backend.IPv6)), `{"VNI":5,"VtepMAC":"`+macOfNode(t, "node-a", backend.IPv6)+`"}`; got != want {
		t.Errorf("IPv6 data published while taking only flannel.5 over = %s, want %s", got, want)
	}
}

// macOfNode is the VTEP MAC node-a's device of fam gets for VNI 5: what
// vxlan.VtepMAC/VtepMACv6 derived before the derivation moved to the
// lease data (sha256 of salt, node ID and VNI; locally administered).
func macOfNode(t *testing.T, node string, fam backend.Family) string {
	t.Helper()
	want := map[backend.Family]string{backend.IPv4: "ba:f8:12:2d:08:85", backend.IPv6: "de:39:96:73:89:a1"}
	if node != "node-a" {
		t.Fatalf("no recorded MAC for %s", node)
	}
	return want[fam]
}
