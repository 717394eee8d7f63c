package kubee2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/overlaynet/overlay/internal/testing/lab"
	"github.com/overlaynet/overlay/internal/testing/testenv"
)

// The matrix's fixed addresses and ports.
const (
	aHostPort   = 9001 // every a-<node> pod's hostPort
	bHostPort   = 9002 // every b-<node> pod's hostPort
	probePort   = lab.ProbePort
	internetNet = "203.0.113.0/24"
	internetIP  = "203.0.113.10"
	metadataIP  = "169.254.169.254"
	// The IPv6 pass's: the "internet" behind the router in the
	// documentation prefix, and the metadata server on the IPv6 address
	// clouds use for it (EC2's fd00:ec2::254).
	internetNet6    = "2001:db8:113::/64"
	internetRouter6 = "2001:db8:113::1"
	internetIP6     = "2001:db8:113::10"
	metadataIP6     = "fd00:ec2::254"
)

// matrix is the network test matrix of issue 30: clients are the pod
// a-k1, the node k1 and the namespace "pub" on the underlay; servers are
// kube-echo pods (a-kN and b-kN on every node), Services of every kind in
// front of them, and probe responders on the nodes, the "internet" behind
// the router and the metadata address. It runs in one family: IPv4, or
// (ipv6, on a dual-stack cluster) IPv6 Services, pod, node, public,
// internet and metadata addresses, row for row the same. On a
// dual-stack cluster it runs in both families, one after the other, on
// the same pods.
type matrix struct {
	c    *cluster
	mode string // kube-proxy's
	// services is how the Services are made: "" on an IPv4 cluster; on a
	// dual-stack cluster "SingleStack" (two Services of each spec, one
	// of each family, the IPv6 one named <name>-6) or "RequireDualStack"
	// (one Service with a cluster IP of each family, reached by each).
	services string
	ipv6     bool // the family of the rows being run
	pods     map[string]podInfo
	svcs     map[string]service // by svcKey
	internet netns.NsHandle
	results  []result // of the last run
}

// service is what a row needs of a Service.
type service struct {
	ClusterIP netip.Addr
	NodePort  map[string]int // by port name: same, remap
	LB        netip.Addr
}

// result is one row's outcome.
type result struct {
	Row      string `json:"row"`
	Expected string `json:"expected"` // the source address the server must see, and whose it is
	Observed string `json:"observed"`
	Pass     bool   `json:"pass"`
	Detail   string `json:"detail,omitempty"`
}

func newMatrix(c *cluster, proxyMode, services string) *matrix {
	return &matrix{c: c, mode: proxyMode, services: services, svcs: map[string]service{}}
}

// families are the address families the matrix runs in (false: IPv4,
// true: IPv6): both on a dual-stack cluster.
func (m *matrix) families() []bool {
	switch {
	case m.c.dualStack:
		return []bool{false, true}
	case m.c.ipv6Only:
		return []bool{true}
	}
	return []bool{false}
}

// svcFamilies are the families of which each spec gets a Service object
// of its own (false alone: one object, of the cluster's family or, with
// RequireDualStack, of both).
func (m *matrix) svcFamilies() []bool {
	switch {
	case m.services == "SingleStack":
		return []bool{false, true}
	case m.c.ipv6Only:
		return []bool{true}
	}
	return []bool{false}
}

// svcKey names the Service spec name as the rows of a family reach it.
func svcKey(name string, ipv6 bool) string {
	if ipv6 {
		return name + "/IPv6"
	}
	return name + "/IPv4"
}

func familyName(ipv6 bool) string {
	if ipv6 {
		return "IPv6"
	}
	return "IPv4"
}

// family is the matrix's address family, as the table names it.
func (m *matrix) family() string { return familyName(m.ipv6) }

// pick is v4 or v6, by the matrix's family.
func (m *matrix) pick(v4, v6 string) string { return pickFamily(m.ipv6, v4, v6) }

func pickFamily(ipv6 bool, v4, v6 string) string {
	if ipv6 {
		return v6
	}
	return v4
}

// podIP is a pod's address in the matrix's family.
func (m *matrix) podIP(name string) netip.Addr { return m.podAddr(name, m.ipv6) }

// nodeIP is a node's underlay address in the matrix's family.
func (m *matrix) nodeIP(h *lab.Host) netip.Addr { return hostIP(h, m.ipv6) }

// hostIP is a lab host's underlay address of a family.
func hostIP(h *lab.Host, ipv6 bool) netip.Addr {
	if ipv6 {
		return h.IPv6
	}
	return h.IP
}

// Services: a port "same" (8080 -> 8080), a port "remap" (80 -> 8080)
// and a UDP port "udp" (81 -> kube-echo's 8081, remapped).
// selector nil: no selector, the EndpointSlice is written by the test.
type svcSpec struct {
	name     string
	selector map[string]string
	typ      string // NodePort or LoadBalancer
	local    bool   // externalTrafficPolicy: Local
	lb, lb6  string // the ingress IP the lab sets (LoadBalancer), IPv4 and IPv6
	manual   string // pod whose address a hand-written EndpointSlice names
}

// The matrix's Services. "own" ones select the client a-k1 too.
var svcSpecs = []svcSpec{
	{name: "self", selector: map[string]string{"app": "a-k1"}, typ: "NodePort"},
	{name: "own-same", selector: map[string]string{"own-same": "y"}, typ: "NodePort"},
	{name: "own-other", selector: map[string]string{"own-other": "y"}, typ: "NodePort"},
	{name: "own-same-local", selector: map[string]string{"own-same": "y"}, typ: "NodePort", local: true},
	{name: "own-other-local", selector: map[string]string{"own-other": "y"}, typ: "NodePort", local: true},
	{name: "b1", selector: map[string]string{"app": "b-k1"}, typ: "NodePort"},
	{name: "b2", selector: map[string]string{"app": "b-k2"}, typ: "NodePort"},
	{name: "b1-local", selector: map[string]string{"app": "b-k1"}, typ: "NodePort", local: true},
	{name: "b2-local", selector: map[string]string{"app": "b-k2"}, typ: "NodePort", local: true},
	{name: "lb-b1-local", selector: map[string]string{"app": "b-k1"}, typ: "LoadBalancer", local: true, lb: "198.18.5.1", lb6: "fd18:5::1"},
	{name: "lb-b1", selector: map[string]string{"app": "b-k1"}, typ: "LoadBalancer", lb: "198.18.5.2", lb6: "fd18:5::2"},
	{name: "lb-b2", selector: map[string]string{"app": "b-k2"}, typ: "LoadBalancer", lb: "198.18.5.3", lb6: "fd18:5::3"},
	{name: "manual", typ: "NodePort", manual: "b-k2"},
	{name: "lb-manual", typ: "LoadBalancer", lb: "198.18.5.4", lb6: "fd18:5::4", manual: "b-k2"},
}

// objectName is the name of the spec's Service object of family ipv6
// under the matrix's services policy.
func (s svcSpec) objectName(services string, ipv6 bool) string {
	if services == "SingleStack" && ipv6 {
		return s.name + "-6"
	}
	return s.name
}

// yaml is the Service object of family ipv6 under the matrix's services
// policy ("": the cluster's one family).
func (s svcSpec) yaml(services string, ipv6 bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: v1\nkind: Service\nmetadata: {name: %s}\nspec:\n  type: %s\n", s.objectName(services, ipv6), s.typ)
	switch services {
	case "SingleStack":
		fmt.Fprintf(&b, "  ipFamilyPolicy: SingleStack\n  ipFamilies: [%s]\n", familyName(ipv6))
	case "RequireDualStack":
		b.WriteString("  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n")
	}
	if s.local {
		b.WriteString("  externalTrafficPolicy: Local\n")
	}
	if s.selector != nil {
		b.WriteString("  selector:\n")
		keys := make([]string, 0, len(s.selector))
		for k := range s.selector {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "    %s: %q\n", k, s.selector[k])
		}
	}
	b.WriteString("  ports:\n  - {name: same, port: 8080, targetPort: 8080, protocol: TCP}\n  - {name: remap, port: 80, targetPort: 8080, protocol: TCP}\n  - {name: udp, port: 81, targetPort: 8081, protocol: UDP}\n")
	return b.String()
}

// podLabels are the labels of the matrix's pods beyond app=<name>.
var podLabels = map[string]map[string]string{
	"a-k1": {"own-same": "y", "own-other": "y"},
	"b-k1": {"own-same": "y"},
	"b-k2": {"own-other": "y"},
}

func (m *matrix) setup() {
	c := m.c
	t := c.t
	var docs []string
	for _, n := range c.nodes {
		for _, p := range []struct {
			name string
			port int
		}{{"a-" + n.Name, aHostPort}, {"b-" + n.Name, bHostPort}} {
			docs = append(docs, echoPod(p.name, n.Name, podLabels[p.name], p.port))
		}
	}
	for _, s := range svcSpecs {
		for _, v6 := range m.svcFamilies() {
			docs = append(docs, s.yaml(m.services, v6))
		}
	}
	if out, err := c.kubectl(context.Background(), []byte(strings.Join(docs, "---\n")), "apply", "-f", "-"); err != nil {
		t.Fatalf("create the matrix's pods and Services: %v\n%s", err, out)
	}
	testenv.Eventually(t, 3*time.Minute, "the echo pods to be Ready", func() error {
		pods, err := c.pods("default")
		if err != nil {
			return err
		}
		for _, n := range c.nodes {
			for _, name := range []string{"a-" + n.Name, "b-" + n.Name} {
				p, ok := pods[name]
				if !ok || !p.Ready || (!c.ipv6Only && !p.IP.IsValid()) || (c.hasIPv6() && !p.IPv6.IsValid()) {
					return fmt.Errorf("pod %s: %+v", name, p)
				}
			}
		}
		m.pods = pods
		return nil
	})
	for _, p := range m.pods {
		var addrs []string
		for _, a := range []netip.Addr{p.IP, p.IPv6} {
			if a.IsValid() {
				addrs = append(addrs, a.String())
			}
		}
		t.Logf("pod %s on %s: %s", p.Name, p.Node, strings.Join(addrs, " "))
	}
	// Hand-written EndpointSlices (one per family: a slice has one
	// address type), and the load balancers' addresses.
	for _, s := range svcSpecs {
		if s.manual != "" {
			for _, v6 := range m.families() {
				obj := s.objectName(m.services, v6)
				slice := fmt.Sprintf(`apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-manual-%[5]s
  labels: {kubernetes.io/service-name: %[1]s, endpointslice.kubernetes.io/managed-by: overlay-lab}
addressType: %[4]s
ports:
- {name: same, port: 8080, protocol: TCP}
- {name: remap, port: 8080, protocol: TCP}
- {name: udp, port: 8081, protocol: UDP}
endpoints:
- addresses: [%[2]s]
  conditions: {ready: true}
  nodeName: %[3]s
`, obj, m.podAddr(s.manual, v6), m.pods[s.manual].Node, familyName(v6), strings.ToLower(familyName(v6)))
				if out, err := c.kubectl(context.Background(), []byte(slice), "apply", "-f", "-"); err != nil {
					t.Fatalf("EndpointSlice of %s: %v\n%s", obj, err, out)
				}
			}
		}
		if s.lb != "" {
			for _, v6 := range m.svcFamilies() {
				var ingress []string
				for _, f := range m.objectFamilies(v6) {
					ingress = append(ingress, fmt.Sprintf(`{"ip":%q,"ipMode":"VIP"}`, pickFamily(f, s.lb, s.lb6)))
				}
				obj := s.objectName(m.services, v6)
				patch := `{"status":{"loadBalancer":{"ingress":[` + strings.Join(ingress, ",") + `]}}}`
				if out, err := c.kubectl(context.Background(), nil, "patch", "service", obj, "--subresource=status", "--type=merge", "-p", patch); err != nil {
					t.Fatalf("load balancer address of %s: %v\n%s", obj, err, out)
				}
			}
		}
	}
	for _, s := range svcSpecs {
		for _, v6 := range m.svcFamilies() {
			m.readService(s, v6)
		}
	}
	m.outside()
}

// objectFamilies are the families of the Service object made for family
// ipv6 (svcFamilies): both for a RequireDualStack Service.
func (m *matrix) objectFamilies(ipv6 bool) []bool {
	if m.services == "RequireDualStack" {
		return []bool{false, true}
	}
	return []bool{ipv6}
}

// podAddr is a pod's address of a family.
func (m *matrix) podAddr(name string, ipv6 bool) netip.Addr {
	if ipv6 {
		return m.pods[name].IPv6
	}
	return m.pods[name].IP
}

// readService reads the Service object of spec s made for family ipv6
// and records, for each family it has, what the rows of that family
// reach it by. A Service whose cluster IPs are not of exactly the
// families its spec asks for stops the test, naming it.
func (m *matrix) readService(s svcSpec, ipv6 bool) {
	t := m.c.t
	obj := s.objectName(m.services, ipv6)
	var sj struct {
		Spec struct {
			ClusterIPs []string `json:"clusterIPs"`
			Ports      []struct {
				Name     string `json:"name"`
				NodePort int    `json:"nodePort"`
			} `json:"ports"`
		} `json:"spec"`
		Status struct {
			LoadBalancer struct {
				Ingress []struct {
					IP string `json:"ip"`
				} `json:"ingress"`
			} `json:"loadBalancer"`
		} `json:"status"`
	}
	if err := m.c.kubeGet(&sj, "service", obj); err != nil {
		t.Fatal(err)
	}
	want := m.objectFamilies(ipv6)
	var got []bool
	for _, a := range sj.Spec.ClusterIPs {
		got = append(got, addrOf(t, a).Is6())
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Service %s: cluster IPs %v, want one of each of %v (ipFamilies in its spec)", obj, sj.Spec.ClusterIPs, familyNames(want))
	}
	nodePorts := map[string]int{}
	for _, p := range sj.Spec.Ports {
		nodePorts[p.Name] = p.NodePort
	}
	for i, f := range want {
		svc := service{ClusterIP: addrOf(t, sj.Spec.ClusterIPs[i]), NodePort: nodePorts}
		for _, in := range sj.Status.LoadBalancer.Ingress {
			if a := addrOf(t, in.IP); a.Is6() == f {
				svc.LB = a
			}
		}
		if s.lb != "" && !svc.LB.IsValid() {
			t.Fatalf("Service %s: no %s load balancer address in its status %+v", obj, familyName(f), sj.Status.LoadBalancer)
		}
		m.svcs[svcKey(s.name, f)] = svc
	}
}

func familyNames(fams []bool) []string {
	var out []string
	for _, f := range fams {
		out = append(out, familyName(f))
	}
	return out
}

// outside builds what lies beyond the nodes: the "internet" namespace
// behind the router (203.0.113.0/24), the metadata address on the router,
// probe responders there and on every node, and the public namespace's
// routes to the load balancers' addresses, through k1 (as MetalLB would
// announce them from a node).
func (m *matrix) outside() {
	c := m.c
	t := c.t
	name := c.run + "inet"
	ns, err := lab.NewNamedNS(name)
	if err != nil {
		t.Fatal(err)
	}
	m.internet = ns
	c.onClose(func() error { ns.Close(); return netns.DeleteNamed(name) })
	rh, err := netlink.NewHandleAt(c.ul.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer rh.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "inet"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(ns)}
	if err := rh.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	mustAddr := func(h *netlink.Handle, link, cidr string) {
		t.Helper()
		l, err := h.LinkByName(link)
		if err != nil {
			t.Fatal(err)
		}
		a, err := netlink.ParseAddr(cidr)
		if err != nil {
			t.Fatal(err)
		}
		a.Flags = unix.IFA_F_NODAD // usable at once (IPv6)
		if err := h.AddrAdd(l, a); err != nil {
			t.Fatalf("address %s on %s: %v", cidr, link, err)
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	mustAddr(rh, "inet", "203.0.113.1/24")
	mustAddr(rh, "lo", metadataIP+"/32")
	ih, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer ih.Close()
	mustAddr(ih, "eth0", internetIP+"/24")
	mustAddr(ih, "lo", "127.0.0.1/8")
	if err := ih.RouteAdd(&netlink.Route{Gw: net.ParseIP("203.0.113.1")}); err != nil {
		t.Fatal(err)
	}
	if c.hasIPv6() {
		bits := netip.MustParsePrefix(internetNet6).Bits()
		mustAddr(rh, "inet", fmt.Sprintf("%s/%d", internetRouter6, bits))
		mustAddr(rh, "lo", metadataIP6+"/128")
		mustAddr(ih, "eth0", fmt.Sprintf("%s/%d", internetIP6, bits))
		if err := ih.RouteAdd(&netlink.Route{Gw: net.ParseIP(internetRouter6)}); err != nil {
			t.Fatal(err)
		}
	}
	ph, err := netlink.NewHandleAt(c.public.NS)
	if err != nil {
		t.Fatal(err)
	}
	defer ph.Close()
	k1 := c.node("k1")
	for _, s := range svcSpecs {
		if s.lb == "" {
			continue
		}
		for _, v6 := range m.families() {
			ip := addrOf(t, pickFamily(v6, s.lb, s.lb6))
			dst := &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}
			if err := ph.RouteAdd(&netlink.Route{Dst: dst, Gw: hostIP(k1.Host, v6).AsSlice()}); err != nil {
				t.Fatalf("public: route to %s: %v", ip, err)
			}
		}
	}
	serve := func(ns netns.NsHandle, ip string) {
		r, err := lab.Serve(ns, addrOf(t, ip), probePort)
		if err != nil {
			t.Fatal(err)
		}
		c.onClose(func() error { r.Close(); return nil })
	}
	for _, v6 := range m.families() {
		serve(ns, pickFamily(v6, internetIP, internetIP6))
		serve(c.ul.NS, pickFamily(v6, metadataIP, metadataIP6))
		for _, n := range c.nodes {
			serve(n.NS, hostIP(n.Host, v6).String())
		}
	}
}

// nodeAddrs are a node's own addresses on the pod network: its bridge's
// (cni0, the lease's first address) and its VXLAN device's (the lease's
// network address; overlay.1's, or for IPv6 overlay-v6.1's), from the
// node's subnet.env.
func (c *cluster) nodeAddrs(n *kubeNode, ipv6 bool) (cni0, vtep netip.Addr) {
	data, err := os.ReadFile(n.sup.Path("/run/overlay/subnet.env"))
	if err != nil {
		c.t.Fatalf("%s: subnet.env: %v", n.Name, err)
	}
	key := "OVERLAY_SUBNET="
	if ipv6 {
		key = "OVERLAY_IPV6_SUBNET="
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			p, err := netip.ParsePrefix(v)
			if err != nil {
				c.t.Fatalf("%s: subnet.env: %v", n.Name, err)
			}
			return p.Addr(), p.Masked().Addr()
		}
	}
	c.t.Fatalf("%s: no %s in subnet.env", n.Name, strings.TrimSuffix(key, "="))
	return
}

// row is one line of the matrix.
type row struct {
	name    string
	from    string         // "pod" (a-k1), "vm" (k1) or "public"
	dst     netip.AddrPort // where the client connects
	backend string         // the kube-echo pod that must answer; "" for a probe responder
	want    netip.Addr     // the source address the server must see
	whose   string         // what want is, for the table
}

// udp: a row whose name ends in ", UDP" sends a datagram to kube-echo's
// UDP port; the others make an HTTP request (or a probe responder's TCP
// connection).
func (r row) udp() bool { return strings.HasSuffix(r.name, ", UDP") }

func (m *matrix) rows() []row {
	c := m.c
	k1, k2 := c.node("k1"), c.node("k2")
	k1cni, k1vtep := c.nodeAddrs(k1, m.ipv6)
	k2cni, k2vtep := c.nodeAddrs(k2, m.ipv6)
	pod := m.podIP("a-k1")
	pub := m.nodeIP(c.public)
	k1ip, k2ip := m.nodeIP(k1.Host), m.nodeIP(k2.Host)
	internet, metadata := addrOf(c.t, m.pick(internetIP, internetIP6)), addrOf(c.t, m.pick(metadataIP, metadataIP6))
	ap := netip.AddrPortFrom
	svc := func(name string) service { return m.svcs[svcKey(name, m.ipv6)] }
	np := func(n *kubeNode, s, port string) netip.AddrPort {
		return ap(m.nodeIP(n.Host), uint16(svc(s).NodePort[port]))
	}
	cip := func(s string, port uint16) netip.AddrPort { return ap(svc(s).ClusterIP, port) }
	lb := func(s string, port uint16) netip.AddrPort { return ap(svc(s).LB, port) }
	const podW, k1W, k1cniW, k2cniW, pubW = "the pod", "k1", "k1 cni0", "k2 cni0", "public"
	k1vtepW, k2vtepW := m.pick("k1 overlay.1", "k1 overlay-v6.1"), m.pick("k2 overlay.1", "k2 overlay-v6.1")
	return []row{
		{"pod -> pod, same VM", "pod", ap(m.podIP("b-k1"), 8080), "b-k1", pod, podW},
		{"pod -> pod, other VM", "pod", ap(m.podIP("b-k2"), 8080), "b-k2", pod, podW},
		{"pod -> own VM, own hostPort", "pod", ap(k1ip, aHostPort), "a-k1", k1cni, k1cniW},
		// portmap (the conflist's second plugin) marks for masquerade what
		// comes to a hostPort from the pod's whole subnet (its hairpin
		// rule takes the pod's address with its prefix length), so every
		// pod of the node reaches a hostPort of the node masqueraded.
		{"pod -> own VM, other hostPort", "pod", ap(k1ip, bHostPort), "b-k1", k1cni, k1cniW},
		{"pod -> other VM, other hostPort", "pod", ap(k2ip, bHostPort), "b-k2", k1ip, k1W},
		{"pod -> own VM", "pod", ap(k1ip, probePort), "", pod, podW},
		{"pod -> other VM", "pod", ap(k2ip, probePort), "", k1ip, k1W},
		{"pod -> internet", "pod", ap(internet, probePort), "", k1ip, k1W},
		{"pod -> http://metadata", "pod", ap(metadata, probePort), "", k1ip, k1W},
		{"VM -> pod, same VM", "vm", ap(m.podIP("b-k1"), 8080), "b-k1", k1cni, k1cniW},
		{"VM -> pod, other VM", "vm", ap(m.podIP("b-k2"), 8080), "b-k2", k1vtep, k1vtepW},
		{"VM -> same VM hostPort", "vm", ap(k1ip, bHostPort), "b-k1", k1ip, k1W},
		{"VM -> other VM hostPort", "vm", ap(k2ip, bHostPort), "b-k2", k1ip, k1W},
		{"pod -> own clusterIP, hairpin", "pod", cip("self", 8080), "a-k1", k1cni, k1cniW},
		{"pod -> own clusterIP, same VM, other pod, no port remap", "pod", cip("own-same", 8080), "b-k1", pod, podW},
		{"pod -> own clusterIP, same VM, other pod, port remap", "pod", cip("own-same", 80), "b-k1", pod, podW},
		{"pod -> own clusterIP, other VM, other pod, no port remap", "pod", cip("own-other", 8080), "b-k2", pod, podW},
		{"pod -> own clusterIP, other VM, other pod, port remap", "pod", cip("own-other", 80), "b-k2", pod, podW},
		{"pod -> other clusterIP, same VM, no port remap", "pod", cip("b1", 8080), "b-k1", pod, podW},
		{"pod -> other clusterIP, same VM, port remap", "pod", cip("b1", 80), "b-k1", pod, podW},
		{"pod -> other clusterIP, other VM, no port remap", "pod", cip("b2", 8080), "b-k2", pod, podW},
		{"pod -> other clusterIP, other VM, port remap", "pod", cip("b2", 80), "b-k2", pod, podW},
		{"pod -> own node, own nodePort, hairpin", "pod", np(k1, "self", "same"), "a-k1", k1cni, k1cniW},
		{"pod -> own node, own nodePort, policy=local", "pod", np(k1, "own-same-local", "same"), "b-k1", pod, podW},
		{"pod -> own node, own nodePort, same VM", "pod", np(k1, "own-same", "same"), "b-k1", k1cni, k1cniW},
		{"pod -> own node, own nodePort, other VM", "pod", np(k1, "own-other", "same"), "b-k2", k1vtep, k1vtepW},
		{"pod -> own node, other nodePort, policy=local", "pod", np(k1, "b1-local", "same"), "b-k1", pod, podW},
		{"pod -> own node, other nodePort, same VM", "pod", np(k1, "b1", "same"), "b-k1", k1cni, k1cniW},
		{"pod -> own node, other nodePort, other VM", "pod", np(k1, "b2", "same"), "b-k2", k1vtep, k1vtepW},
		{"pod -> other node, own nodeport, policy=local", "pod", np(k2, "own-other-local", "same"), "b-k2", k1ip, k1W},
		{"pod -> other node, own nodeport, same VM", "pod", np(k2, "own-same", "same"), "b-k1", k2vtep, k2vtepW},
		{"pod -> other node, own nodeport, other VM", "pod", np(k2, "own-other", "same"), "b-k2", k2cni, k2cniW},
		{"pod -> other node, other nodeport, policy=local", "pod", np(k2, "b2-local", "same"), "b-k2", k1ip, k1W},
		{"pod -> other node, other nodeport, same VM", "pod", np(k2, "b1", "same"), "b-k1", k2vtep, k2vtepW},
		{"pod -> other node, other nodeport, other VM", "pod", np(k2, "b2", "same"), "b-k2", k2cni, k2cniW},
		{"pod -> own external LB, no remap, policy=local", "pod", lb("lb-b1-local", 8080), "b-k1", pod, podW},
		{"pod -> own external LB, no remap, same VM", "pod", lb("lb-b1", 8080), "b-k1", k1cni, k1cniW},
		{"pod -> own external LB, no remap, other VM", "pod", lb("lb-b2", 8080), "b-k2", k1vtep, k1vtepW},
		{"pod -> own external LB, remap, policy=local", "pod", lb("lb-b1-local", 80), "b-k1", pod, podW},
		{"pod -> own external LB, remap, same VM", "pod", lb("lb-b1", 80), "b-k1", k1cni, k1cniW},
		{"pod -> own external LB, remap, other VM", "pod", lb("lb-b2", 80), "b-k2", k1vtep, k1vtepW},
		{"VM -> same VM nodePort, policy=local", "vm", np(k1, "b1-local", "same"), "b-k1", k1cni, k1cniW},
		{"VM -> same VM nodePort, same VM", "vm", np(k1, "b1", "same"), "b-k1", k1cni, k1cniW},
		{"VM -> same VM nodePort, other VM", "vm", np(k1, "b2", "same"), "b-k2", k1vtep, k1vtepW},
		{"VM -> other VM nodePort, policy=local", "vm", np(k2, "b2-local", "same"), "b-k2", k1ip, k1W},
		{"VM -> other VM nodePort, same VM", "vm", np(k2, "b1", "same"), "b-k1", k2vtep, k2vtepW},
		{"VM -> other VM nodePort, other VM", "vm", np(k2, "b2", "same"), "b-k2", k2cni, k2cniW},
		{"VM -> external LB", "vm", lb("lb-b2", 8080), "b-k2", k1vtep, k1vtepW},
		{"public -> nodeport, policy=local", "public", np(k1, "b1-local", "same"), "b-k1", pub, pubW},
		{"public -> nodeport, policy=global", "public", np(k1, "b2", "same"), "b-k2", k1vtep, k1vtepW},
		{"public -> external LB, no remap, policy=local", "public", lb("lb-b1-local", 8080), "b-k1", pub, pubW},
		{"public -> external LB, no remap, policy=global", "public", lb("lb-b2", 8080), "b-k2", k1vtep, k1vtepW},
		{"public -> external LB, remap, policy=local", "public", lb("lb-b1-local", 80), "b-k1", pub, pubW},
		{"public -> external LB, remap, policy=global", "public", lb("lb-b2", 80), "b-k2", k1vtep, k1vtepW},
		{"public -> nodeport, manual backend", "public", np(k1, "manual", "same"), "b-k2", k1vtep, k1vtepW},
		{"public -> external LB, manual backend", "public", lb("lb-manual", 8080), "b-k2", k1vtep, k1vtepW},
		// UDP: a datagram to kube-echo's port 8081 (Services: 81, remapped
		// to it), answered from the address it was sent to.
		{"pod -> pod, other VM, UDP", "pod", ap(m.podIP("b-k2"), 8081), "b-k2", pod, podW},
		{"pod -> other clusterIP, other VM, port remap, UDP", "pod", cip("b2", 81), "b-k2", pod, podW},
		{"VM -> other VM nodePort, other VM, UDP", "vm", np(k2, "b2", "udp"), "b-k2", k2cni, k2cniW},
		{"public -> nodeport, policy=local, UDP", "public", np(k1, "b1-local", "udp"), "b-k1", pub, pubW},
		{"public -> nodeport, policy=global, UDP", "public", np(k1, "b2", "udp"), "b-k2", k1vtep, k1vtepW},
	}
}

// rowDeadline bounds one row: kube-proxy programs a new Service within a
// second or two; a row that needs a given backend of two retries with
// fresh connections until that one answers.
var rowDeadline = 30 * time.Second

// probeRow runs one row: connections until the wanted backend answers
// (or the deadline passes), then compares the source it saw.
func (m *matrix) probeRow(r row, ns netns.NsHandle) result {
	res := result{Row: r.name, Expected: fmt.Sprintf("%s (%s)", r.want, r.whose)}
	deadline := time.Now().Add(testenv.Deadline(rowDeadline))
	var lastErr error
	for time.Now().Before(deadline) {
		var seen netip.Addr
		if r.backend == "" {
			a, err := lab.WhoAmI(ns, r.dst, probeTimeout)
			if err != nil {
				lastErr = err
				time.Sleep(200 * time.Millisecond)
				continue
			}
			seen = a
		} else {
			probe := httpProbe
			if r.udp() {
				probe = udpProbe
			}
			reply, err := probe(ns, r.dst)
			if err != nil {
				lastErr = err
				time.Sleep(200 * time.Millisecond)
				continue
			}
			if reply.Pod != r.backend {
				lastErr = fmt.Errorf("answered by %s, not %s", reply.Pod, r.backend)
				continue
			}
			seen = reply.source()
		}
		res.Observed = seen.String()
		res.Pass = seen == r.want
		if !res.Pass {
			res.Detail = "wrong source"
		}
		return res
	}
	res.Observed = "no answer"
	res.Detail = fmt.Sprintf("%s: %v", r.dst, lastErr)
	return res
}

// run runs the rows in one family (ipv6) and reports them.
func (m *matrix) run(t *testing.T, ipv6 bool) {
	c := m.c
	m.ipv6, m.results = ipv6, nil
	podNS, err := c.podNS(m.pods["a-k1"])
	if err != nil {
		t.Fatal(err)
	}
	defer podNS.Close()
	from := map[string]netns.NsHandle{"pod": podNS, "vm": c.node("k1").NS, "public": c.public.NS}
	for _, r := range m.rows() {
		res := m.probeRow(r, from[r.from])
		m.results = append(m.results, res)
		if !res.Pass {
			t.Errorf("%s: server saw %s, want %s %s", r.name, res.Observed, res.Expected, res.Detail)
		}
	}
	m.report(t)
}

// report prints the matrix as a table.
func (m *matrix) report(t *testing.T) {
	var b strings.Builder
	head := "row (" + m.family() + ", " + m.mode + ")"
	if m.services != "" {
		head = "row (" + m.family() + ", " + m.mode + ", " + m.services + " Services)"
	}
	w, we, wo := len(head), 28, 16 // IPv6 addresses widen the columns
	for _, r := range m.results {
		w, we, wo = max(w, len(r.Row)), max(we, len(r.Expected)), max(wo, len(r.Observed))
	}
	pass := 0
	fmt.Fprintf(&b, "\n%-*s  %-*s  %-*s  %s\n", w, head, we, "expected source", wo, "observed source", "pass")
	for _, r := range m.results {
		mark := "FAIL"
		if r.Pass {
			mark, pass = "ok", pass+1
		}
		fmt.Fprintf(&b, "%-*s  %-*s  %-*s  %s\n", w, r.Row, we, r.Expected, wo, r.Observed, mark)
	}
	fmt.Fprintf(&b, "%d of %d rows pass\n", pass, len(m.results))
	t.Log(b.String())
}

// echoPod is a kube-echo pod on node, labelled app=name plus labels, with
// hostPort (if not 0) mapped to its port 8080.
func echoPod(name, node string, labels map[string]string, hostPort int) string {
	var l strings.Builder
	fmt.Fprintf(&l, "app: %s", name)
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&l, ", %s: %q", k, labels[k])
	}
	ports := "[{containerPort: 8080, name: http}]"
	if hostPort != 0 {
		ports = fmt.Sprintf("[{containerPort: 8080, name: http, hostPort: %d}]", hostPort)
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  labels: {%s}
spec:
  nodeSelector: {kubernetes.io/hostname: %s}
  terminationGracePeriodSeconds: 1
  containers:
  - name: echo
    image: %s
    imagePullPolicy: Never
    args: [serve]
    ports: %s
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
`, name, l.String(), node, echoImage, ports)
}
