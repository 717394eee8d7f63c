package nodes

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
	"github.com/overlaynet/overlay/subnet"
)

const (
	ipv4Only  = `{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan","VNI":1}}`
	dualStack = `{"EnableIPv6":true,"Network":"10.244.0.0/16","IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan","VNI":1}}`
	goodData  = `{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"}`
	goodData6 = `{"VNI":1,"VtepMAC":"0e:00:00:00:01:07"}`
)

func config(t *testing.T, doc string) *subnet.Config {
	t.Helper()
	cfg, err := subnet.ParseConfig([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func defaultAnnotations(t *testing.T) Annotations {
	t.Helper()
	a, err := NewAnnotations(DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// flannelNode is a node as flanneld v0.28 in kube mode leaves it (IPv4),
// with changes applied to its annotations ("" deletes one).
func flannelNode(name, podCIDR string, changes map[string]string) Node {
	ann := map[string]string{
		"flannel.alpha.coreos.com/kube-subnet-manager": "true",
		"flannel.alpha.coreos.com/backend-type":        "vxlan",
		"flannel.alpha.coreos.com/backend-data":        goodData,
		"flannel.alpha.coreos.com/public-ip":           "198.18.0.7",
		"node.alpha.kubernetes.io/ttl":                 "0", // someone else's
	}
	for k, v := range changes {
		if v == "" {
			delete(ann, k)
		} else {
			ann[k] = v
		}
	}
	return Node{Name: name, PodCIDR: podCIDR, PodCIDRs: []string{podCIDR}, Annotations: ann}
}

func TestNewAnnotations(t *testing.T) {
	for _, tt := range []struct{ prefix, backendData, err string }{
		{DefaultPrefix, "flannel.alpha.coreos.com/backend-data", ""},
		{"example.com/", "example.com/backend-data", ""},
		{"example.com/net", "example.com/net-backend-data", ""},
		{"example.com/net-", "example.com/net-backend-data", ""},
		{"a/b/c", "", "at most one '/'"},
		{"Example.com", "", "want a lower-case DNS name"},
		{"localhost", "", "want a lower-case DNS name"},
		{"", "", "want a lower-case DNS name"},
		{"example.com/ne t", "", "want a lower-case DNS name"},
	} {
		a, err := NewAnnotations(tt.prefix)
		if tt.err != "" {
			if !errors.Is(err, ErrPrefix) || !strings.Contains(err.Error(), tt.err) {
				t.Errorf("NewAnnotations(%q) error = %v, want ErrPrefix saying %q", tt.prefix, err, tt.err)
			}
			continue
		}
		if err != nil || a.BackendData != tt.backendData {
			t.Errorf("NewAnnotations(%q) = %q, %v; want backend-data %q", tt.prefix, a.BackendData, err, tt.backendData)
		}
	}
}

// TestFlannelNodeIsALease: a node as flanneld writes it reads as the lease
// flanneld would have written in etcd for it.
func TestFlannelNodeIsALease(t *testing.T) {
	a := defaultAnnotations(t)
	l, ok, err := a.Check(config(t, ipv4Only), leasedata.Codec{VNI: 1}, flannelNode("node-7", "10.244.7.0/24", nil))
	if err != nil || !ok {
		t.Fatalf("Check = %v, %v; want a lease", ok, err)
	}
	want := subnet.Lease{Subnet: netip.MustParsePrefix("10.244.7.0/24"), Attrs: subnet.LeaseAttrs{
		PublicIP: "198.18.0.7", BackendType: "vxlan", BackendData: json.RawMessage(goodData), Hostname: "node-7"}}
	if diff := cmp.Diff(want, l, cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })); diff != "" {
		t.Errorf("lease (-want +got):\n%s", diff)
	}
}

func TestDualStackNode(t *testing.T) {
	a := defaultAnnotations(t)
	n := flannelNode("node-7", "10.244.7.0/24", map[string]string{
		a.PublicIPv6: "2001:db8::7", a.BackendV6Data: goodData6})
	n.PodCIDRs = []string{"10.244.7.0/24", "fd00:10:244:7::/64"}
	l, _, err := a.Check(config(t, dualStack), leasedata.Codec{VNI: 1}, n)
	if err != nil {
		t.Fatal(err)
	}
	if l.IPv6Subnet != netip.MustParsePrefix("fd00:10:244:7::/64") || l.Attrs.PublicIPv6 != "2001:db8::7" || string(l.Attrs.BackendV6Data) != goodData6 {
		t.Errorf("lease = %+v, want the IPv6 half from podCIDRs[1] and the v6 annotations", l)
	}
	// An IPv4-only network reads the IPv4 half only, as flanneld does.
	l, _, err = a.Check(config(t, ipv4Only), leasedata.Codec{VNI: 1}, n)
	if err != nil || l.IPv6Subnet.IsValid() || l.Attrs.PublicIPv6 != "" {
		t.Errorf("IPv4-only network: lease %+v, %v; want no IPv6 half", l, err)
	}
}

// TestHostileNodes: every node that could misroute traffic is refused
// with an error that names what is wrong; none panics.
func TestHostileNodes(t *testing.T) {
	a := defaultAnnotations(t)
	v4, dual := config(t, ipv4Only), config(t, dualStack)
	ann := func(suffix string) string { return DefaultPrefix + "/" + suffix }
	for _, tt := range []struct {
		name string
		cfg  *subnet.Config
		node Node
		want string
	}{
		{"bad MAC", v4, flannelNode("n", "10.244.7.0/24", map[string]string{ann("backend-data"): `{"VNI":1,"VtepMAC":"zz:00:00:00:00:07"}`}), "VtepMAC"},
		{"multicast MAC", v4, flannelNode("n", "10.244.7.0/24", map[string]string{ann("backend-data"): `{"VNI":1,"VtepMAC":"01:00:5e:00:00:07"}`}), "VtepMAC"},
		{"backend data not JSON", v4, flannelNode("n", "10.244.7.0/24", map[string]string{ann("backend-data"): `{"VNI":1,`}), "BackendData"},
		{"backend data of another VNI", v4, flannelNode("n", "10.244.7.0/24", map[string]string{ann("backend-data"): `{"VNI":9,"VtepMAC":"0e:00:00:00:00:07"}`}), "VNI 9"},
		{"no backend data", v4, flannelNode("n", "10.244.7.0/24", map[string]string{ann("backend-data"): ""}), "annotation flannel.alpha.coreos.com/backend-data is missing"},
		{"huge backend data", v4, flannelNode("n", "10.244.7.0/24", map[string]string{ann("backend-data"): `{"VNI":1,"x":"` + strings.Repeat("a", 20<<10) + `"}`}), "more than"},
		{"public IP inside the network", v4, flannelNode("n", "10.244.7.0/24", map[string]string{ann("public-ip"): "10.244.9.1"}), "inside the overlay network"},
		{"public IP loopback", v4, flannelNode("n", "10.244.7.0/24", map[string]string{ann("public-ip"): "127.0.0.1"}), "loopback"},
		{"public IP not an address", v4, flannelNode("n", "10.244.7.0/24", map[string]string{ann("public-ip"): "host-7"}), "not an IPv4 address"},
		{"public IP of the other family", v4, flannelNode("n", "10.244.7.0/24", map[string]string{ann("public-ip"): "2001:db8::7"}), "not an IPv4 address"},
		{"no public IP", v4, flannelNode("n", "10.244.7.0/24", map[string]string{ann("public-ip"): ""}), "public-ip is missing"},
		{"podCIDR outside the network", v4, flannelNode("n", "10.99.7.0/24", nil), "outside Network 10.244.0.0/16"},
		{"podCIDR of the wrong length", v4, flannelNode("n", "10.244.0.0/23", nil), "is not a /24"},
		{"podCIDR not a network address", v4, flannelNode("n", "10.244.7.1/24", nil), "not a network address"},
		{"podCIDR garbage", v4, flannelNode("n", "ten/24", nil), "not a subnet"},
		{"annotations without a podCIDR", v4, Node{Name: "n", Annotations: flannelNode("n", "", nil).Annotations}, "no IPv4 podCIDR"},
		{"three podCIDRs", v4, Node{Name: "n", PodCIDRs: []string{"10.244.7.0/24", "10.244.8.0/24", "fd00::/64"}, Annotations: flannelNode("n", "", nil).Annotations}, "at most two"},
		{"two IPv4 podCIDRs", v4, Node{Name: "n", PodCIDRs: []string{"10.244.7.0/24", "10.244.8.0/24"}, Annotations: flannelNode("n", "", nil).Annotations}, "two subnets of one address family"},
		{"another backend", v4, flannelNode("n", "10.244.7.0/24", map[string]string{ann("backend-type"): "host-gw"}), `BackendType "host-gw"`},
		{"dual stack without an IPv6 podCIDR", dual, flannelNode("n", "10.244.7.0/24", map[string]string{ann("public-ipv6"): "2001:db8::7", ann("backend-v6-data"): goodData6}), "no IPv6 podCIDR"},
		{"dual stack without v6 data", dual, func() Node {
			n := flannelNode("n", "10.244.7.0/24", map[string]string{ann("public-ipv6"): "2001:db8::7"})
			n.PodCIDRs = []string{"10.244.7.0/24", "fd00:10:244:7::/64"}
			return n
		}(), "backend-v6-data is missing"},
		{"dual stack IPv6 podCIDR outside", dual, func() Node {
			n := flannelNode("n", "10.244.7.0/24", map[string]string{ann("public-ipv6"): "2001:db8::7", ann("backend-v6-data"): goodData6})
			n.PodCIDRs = []string{"10.244.7.0/24", "fd00:99::/64"}
			return n
		}(), "outside IPv6Network"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, ok, err := a.Check(tt.cfg, leasedata.Codec{VNI: 1}, tt.node)
			if !ok {
				t.Fatal("Check says the node does not take part; it does")
			}
			if !errors.Is(err, subnet.ErrInvalidLease) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Check error = %v, want an invalid lease saying %q", err, tt.want)
			}
		})
	}
}

// TestNotTakingPart: a node without kube-subnet-manager "true" is nobody's
// lease: not a peer, not invalid (its overlay has not started yet).
func TestNotTakingPart(t *testing.T) {
	a := defaultAnnotations(t)
	for _, v := range []string{"", "false", "TRUE"} {
		n := flannelNode("n", "10.244.7.0/24", map[string]string{a.Managed: v})
		if _, ok, err := a.Check(config(t, ipv4Only), leasedata.Codec{VNI: 1}, n); ok || err != nil {
			t.Errorf("kube-subnet-manager %q: Check = %v, %v; want not taking part", v, ok, err)
		}
	}
}

func TestPublish(t *testing.T) {
	a := defaultAnnotations(t)
	cfg := config(t, ipv4Only)
	attrs := subnet.LeaseAttrs{PublicIP: "198.18.0.7", BackendType: "vxlan", BackendData: json.RawMessage(goodData)}
	bare := Node{Name: "node-7", PodCIDR: "10.244.7.0/24", Annotations: map[string]string{"other": "x"}}

	changed, pub, err := a.Publish(cfg, attrs, bare)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{a.Managed: "true", a.BackendType: "vxlan", a.BackendData: goodData, a.PublicIP: "198.18.0.7"}
	if diff := cmp.Diff(want, changed); diff != "" {
		t.Errorf("first publish (-want +got):\n%s", diff)
	}
	if pub.PublicIP != "198.18.0.7" {
		t.Errorf("published PublicIP %q", pub.PublicIP)
	}
	// What was published reads back as the lease, and nothing is left to
	// patch.
	bare.Annotations = want
	if changed, _, _ := a.Publish(cfg, attrs, bare); changed != nil {
		t.Errorf("second publish changes %v, want nothing", changed)
	}
	if _, _, err := a.Check(cfg, leasedata.Codec{VNI: 1}, bare); err != nil {
		t.Errorf("published node does not read back: %v", err)
	}
	// An operator's public-ip-overwrite is what peers are told.
	bare.Annotations[a.PublicIPOverwrite] = "203.0.113.7"
	changed, pub, err = a.Publish(cfg, attrs, bare)
	if err != nil || changed[a.PublicIP] != "203.0.113.7" || pub.PublicIP != "203.0.113.7" || len(changed) != 1 {
		t.Errorf("with public-ip-overwrite: changed %v, published %q, %v; want public-ip 203.0.113.7 alone", changed, pub.PublicIP, err)
	}
	for _, bad := range []string{"not-an-ip", "0.0.0.0", "2001:db8::1"} {
		bare.Annotations[a.PublicIPOverwrite] = bad
		if _, _, err := a.Publish(cfg, attrs, bare); err == nil || !strings.Contains(err.Error(), a.PublicIPOverwrite) {
			t.Errorf("public-ip-overwrite %q: error = %v, want one naming the annotation", bad, err)
		}
	}
}

func TestMergePatch(t *testing.T) {
	got := string(MergePatch(map[string]string{"a/b": `{"VNI":1}`}))
	if want := `{"metadata":{"annotations":{"a/b":"{\"VNI\":1}"}}}`; got != want {
		t.Errorf("MergePatch = %s, want %s", got, want)
	}
}
