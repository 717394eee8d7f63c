// Package flannelhost builds, in a network namespace a test made, a host
// as flanneld v0.28 (vxlan backend, --ip-masq) leaves it when it stops:
// what overlayd --adopt-flannel takes over, or a flanneld peer that stays.
// flanneld itself cannot be built here, so every piece reproduces what
// flannel's source writes:
//
//   - in etcd mode (Build), the lease: <prefix>/subnets/<a.b.c.d>-<len>,
//     value {"PublicIP", "BackendType":"vxlan","BackendData":{"VNI",
//     "VtepMAC"}} (no NodeID), on an etcd lease (pkg/subnet/etcd: 24 h
//     TTL);
//   - in kube mode (--kube-subnet-mgr, BuildNode and the Kube* values),
//     no lease: the subnet is the Node's spec.podCIDR, and its lease value
//     is the annotations KubeAnnotations on its Node, which flanneld sends
//     as one strategic-merge patch (KubePatch) to nodes/status, and the
//     NetworkUnavailable=False condition (KubeStatusPatch)
//     (pkg/subnet/kube/kube.go AcquireLease, CompleteLease);
//   - the device flannel.<VNI>: VXLAN, the VNI, destination port 8472,
//     local = the public IP, learning off, MTU = underlay − 50, the lease's
//     VtepMAC, address <subnet network address>/32, up
//     (pkg/backend/vxlan/device.go);
//   - per peer: a permanent neighbour <peer network address> → its
//     VtepMAC, a permanent self FDB entry VtepMAC → its PublicIP, and a
//     route <peer subnet> via <peer network address> dev flannel.<VNI>
//     onlink, with the netlink library's default protocol, boot
//     (pkg/backend/vxlan/vxlan_network.go);
//   - subnet.env: FLANNEL_NETWORK, FLANNEL_SUBNET (the lease's first
//     address), FLANNEL_MTU, FLANNEL_IPMASQ (pkg/subnet/subnet.go);
//   - the masquerade of pkg/trafficmngr/iptables/iptables.go masqRules as
//     iptables-nft stores it: table ip nat, chain POSTROUTING jumping to
//     FLANNEL-POSTRTG, which returns for kube-proxy's mark 0x4000 and for
//     traffic within the cluster network, and masquerades (fully random)
//     the cluster network's traffic to the outside (not multicast) and
//     outside traffic to the cluster network.
package flannelhost

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sys/unix"
)

// Peer is another host flanneld had programmed.
type Peer struct {
	Subnet   netip.Prefix
	PublicIP netip.Addr
	VtepMAC  net.HardwareAddr
}

// Host is what to build.
type Host struct {
	Iface      string       // the underlay interface, e.g. eth0
	PublicIP   netip.Addr   // its address
	Network    netip.Prefix // the cluster network
	Subnet     netip.Prefix // this host's lease (kube mode: its Node's podCIDR)
	VNI        int
	VtepMAC    net.HardwareAddr
	SubnetFile string // where flanneld wrote subnet.env
	Peers      []Peer
}

// DeviceName is flannel's device for vni.
func DeviceName(vni int) string { return fmt.Sprintf("flannel.%d", vni) }

// LeaseTTL is the TTL flanneld gives its lease.
const LeaseTTL = 24 * 60 * 60

// Build writes the lease under prefix through cli and builds the rest in
// ns. It returns the etcd lease ID.
func (h Host) Build(ctx context.Context, ns netns.NsHandle, cli *clientv3.Client, prefix string) (clientv3.LeaseID, error) {
	id, err := h.writeLease(ctx, cli, prefix)
	if err != nil {
		return 0, err
	}
	return id, h.BuildNode(ns)
}

// BuildNode builds in ns what flanneld leaves on the host itself, in
// either mode: the device with its peers, subnet.env, the masquerade.
// Build adds the etcd lease; in kube mode the test puts KubePatch and
// KubeStatusPatch on the Node instead.
func (h Host) BuildNode(ns netns.NsHandle) error {
	if err := h.buildDataPath(ns); err != nil {
		return err
	}
	if err := h.writeSubnetEnv(); err != nil {
		return err
	}
	return InstallMasq(ns, h.Network, h.Subnet)
}

// DefaultAnnotationPrefix is flanneld's --kube-annotation-prefix default.
const DefaultAnnotationPrefix = "flannel.alpha.coreos.com"

// KubeAnnotations are the annotations flanneld in kube mode (IPv4, vxlan)
// puts on its Node, under prefix (its --kube-annotation-prefix, a DNS name):
// backend-type, backend-data (the same JSON as the etcd lease's
// BackendData), public-ip and kube-subnet-manager "true". Without IPv6 its
// v6 backend data marshals to "null", so it writes no backend-v6-data and
// no public-ipv6.
func (h Host) KubeAnnotations(prefix string) map[string]string {
	data, _ := json.Marshal(map[string]any{"VNI": h.VNI, "VtepMAC": h.VtepMAC.String()}) // cannot fail: plain values
	return map[string]string{
		prefix + "/backend-type":        "vxlan",
		prefix + "/backend-data":        string(data),
		prefix + "/public-ip":           h.PublicIP.String(),
		prefix + "/kube-subnet-manager": "true",
	}
}

// KubePatch is the patch flanneld sends (strategic merge, to the Node's
// status subresource) with KubeAnnotations under prefix.
func (h Host) KubePatch(prefix string) []byte {
	p, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": h.KubeAnnotations(prefix)}}) // cannot fail
	return p
}

// KubeStatusPatch is the patch of the Node's status with which flanneld
// marks its network up once its backend runs (a strategic-merge patch of
// status.conditions, merged by type, to nodes/status), at time now.
func KubeStatusPatch(now time.Time) []byte {
	ts := now.UTC().Format(time.RFC3339)
	p, _ := json.Marshal(map[string]any{"status": map[string]any{"conditions": []map[string]string{{
		"type": "NetworkUnavailable", "status": "False", "reason": "FlannelIsUp", "message": "Flannel is running on this node",
		"lastTransitionTime": ts, "lastHeartbeatTime": ts,
	}}}}) // cannot fail: plain values
	return p
}

// LeaseValue is flanneld's lease value for h.
func (h Host) LeaseValue() string {
	v, _ := json.Marshal(map[string]any{ // cannot fail: plain values
		"PublicIP":    h.PublicIP.String(),
		"BackendType": "vxlan",
		"BackendData": map[string]any{"VNI": h.VNI, "VtepMAC": h.VtepMAC.String()},
	})
	return string(v)
}

// LeaseKey is the key of h's lease under prefix.
func (h Host) LeaseKey(prefix string) string {
	return fmt.Sprintf("%s/subnets/%s-%d", prefix, h.Subnet.Addr(), h.Subnet.Bits())
}

func (h Host) writeLease(ctx context.Context, cli *clientv3.Client, prefix string) (clientv3.LeaseID, error) {
	grant, err := cli.Grant(ctx, LeaseTTL)
	if err != nil {
		return 0, fmt.Errorf("grant flanneld's etcd lease: %w", err)
	}
	if _, err := cli.Put(ctx, h.LeaseKey(prefix), h.LeaseValue(), clientv3.WithLease(grant.ID)); err != nil {
		return 0, fmt.Errorf("write flanneld's lease: %w", err)
	}
	return grant.ID, nil
}

func (h Host) buildDataPath(ns netns.NsHandle) error {
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer nl.Close()
	ul, err := nl.LinkByName(h.Iface)
	if err != nil {
		return fmt.Errorf("underlay %s: %w", h.Iface, err)
	}
	vx := &netlink.Vxlan{
		LinkAttrs:    netlink.LinkAttrs{Name: DeviceName(h.VNI), MTU: ul.Attrs().MTU - 50, HardwareAddr: h.VtepMAC},
		VxlanId:      h.VNI,
		VtepDevIndex: ul.Attrs().Index,
		SrcAddr:      h.PublicIP.AsSlice(),
		Port:         8472,
		Learning:     false,
	}
	if err := nl.LinkAdd(vx); err != nil {
		return fmt.Errorf("create %s: %w", vx.Name, err)
	}
	dev, err := nl.LinkByName(vx.Name)
	if err != nil {
		return err
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: h.Subnet.Addr().AsSlice(), Mask: net.CIDRMask(32, 32)}}
	if err := nl.AddrAdd(dev, addr); err != nil {
		return fmt.Errorf("address of %s: %w", vx.Name, err)
	}
	if err := nl.LinkSetUp(dev); err != nil {
		return err
	}
	for _, p := range h.Peers {
		if err := addPeer(nl, dev.Attrs().Index, p); err != nil {
			return fmt.Errorf("peer %s: %w", p.Subnet, err)
		}
	}
	return nil
}

// AddPeer programs p on the device BuildNode made in ns, as flanneld does
// when a peer's lease (kube mode: its Node's annotations) appears.
func (h Host) AddPeer(ns netns.NsHandle, p Peer) error {
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer nl.Close()
	dev, err := nl.LinkByName(DeviceName(h.VNI))
	if err != nil {
		return fmt.Errorf("flanneld's device: %w", err)
	}
	if err := addPeer(nl, dev.Attrs().Index, p); err != nil {
		return fmt.Errorf("peer %s: %w", p.Subnet, err)
	}
	return nil
}

// addPeer programs p as flanneld does: neighbour, FDB entry, route.
func addPeer(nl *netlink.Handle, dev int, p Peer) error {
	hop := p.Subnet.Addr().AsSlice()
	if err := nl.NeighSet(&netlink.Neigh{LinkIndex: dev, State: netlink.NUD_PERMANENT, Type: unix.RTN_UNICAST, IP: hop, HardwareAddr: p.VtepMAC}); err != nil {
		return err
	}
	if err := nl.NeighSet(&netlink.Neigh{LinkIndex: dev, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF,
		IP: p.PublicIP.AsSlice(), HardwareAddr: p.VtepMAC}); err != nil {
		return err
	}
	return nl.RouteReplace(&netlink.Route{LinkIndex: dev, Scope: netlink.SCOPE_UNIVERSE, Flags: int(netlink.FLAG_ONLINK),
		Dst: &net.IPNet{IP: p.Subnet.Addr().AsSlice(), Mask: net.CIDRMask(p.Subnet.Bits(), 32)}, Gw: hop})
}

func (h Host) writeSubnetEnv() error {
	first := h.Subnet.Addr().Next()
	env := fmt.Sprintf("FLANNEL_NETWORK=%s\nFLANNEL_SUBNET=%s/%d\nFLANNEL_MTU=%d\nFLANNEL_IPMASQ=true\n", h.Network, first, h.Subnet.Bits(), 1450)
	if err := os.MkdirAll(filepath.Dir(h.SubnetFile), 0o755); err != nil {
		return err
	}
	return os.WriteFile(h.SubnetFile, []byte(env), 0o644)
}

// PodConfig is the network config flannel's CNI plugin (v1.x) hands the
// bridge plugin for a pod on h, and caches: its conflist's name and
// cniVersion, kube-flannel's delegate keys, ipMasq the opposite of
// FLANNEL_IPMASQ, the MTU, isGateway, host-local on the lease with a route
// to the network (plus ipamDataDir, which a lab needs: the real default is
// /var/lib/cni/networks). Compact JSON with sorted keys, as it writes it.
func (h Host) PodConfig(name, ipamDataDir string) []byte {
	conf, _ := json.Marshal(map[string]any{ // cannot fail: plain values
		"cniVersion": "0.3.1", "name": name, "type": "bridge",
		"hairpinMode": true, "isDefaultGateway": true, "isGateway": true, "ipMasq": false, "mtu": 1450,
		"ipam": map[string]any{"type": "host-local", "dataDir": ipamDataDir,
			"ranges": [][]map[string]string{{{"subnet": h.Subnet.String()}}},
			"routes": []map[string]string{{"dst": h.Network.String()}}},
	})
	return conf
}

// PodConfList is podConf, a config PodConfig made, as a runtime runs it
// when flannel's plugin hands it on: a conflist of that one plugin, with
// its name and cniVersion.
func PodConfList(podConf []byte) (*libcni.NetworkConfigList, error) {
	var conf map[string]any
	if err := json.Unmarshal(podConf, &conf); err != nil {
		return nil, fmt.Errorf("flannel's pod config: %w", err)
	}
	raw, err := json.Marshal(map[string]any{"cniVersion": conf["cniVersion"], "name": conf["name"], "plugins": []any{conf}})
	if err != nil {
		return nil, err
	}
	return libcni.ConfListFromBytes(raw)
}

// WriteCache writes flannel's cache entry of a pod, conf as PodConfig
// made it, to <dir>/<containerID> as its plugin does (directory 0700, file
// 0600).
func WriteCache(dir, containerID string, conf []byte) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, containerID), conf, 0o600)
}

// Chain is flanneld's masquerade chain.
const Chain = "FLANNEL-POSTRTG"

// InstallMasq installs flanneld's masquerade for network and subnet in ns,
// as iptables-nft stores the rules of masqRules (see the package comment).
func InstallMasq(ns netns.NsHandle, network, subnet netip.Prefix) error {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return err
	}
	nat := c.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "nat"})
	post := c.AddChain(&nftables.Chain{Name: "POSTROUTING", Table: nat, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	flannel := c.AddChain(&nftables.Chain{Name: Chain, Table: nat})
	c.AddRule(&nftables.Rule{Table: nat, Chain: post, Exprs: []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: Chain}}})
	add := func(exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: nat, Chain: flannel, Exprs: all})
	}
	ret := []expr.Any{&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictReturn}}
	masq := []expr.Any{&expr.Counter{}, &expr.Masq{FullyRandom: true}}
	markSet := []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{0, 0x40, 0, 0}, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
	multicast := netip.MustParsePrefix("224.0.0.0/4")
	add(markSet, ret)
	add(match(12, subnet, false), match(16, network, false), ret)
	add(match(12, network, false), match(16, subnet, false), ret)
	add(match(12, network, true), match(16, subnet, false), ret)
	add(match(12, network, false), match(16, multicast, true), masq)
	add(match(12, network, true), match(16, network, false), masq)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("install flanneld's masquerade: %w", err)
	}
	return nil
}

// match compares the IPv4 address at offset of the network header with p
// (or, negated, its complement).
func match(offset uint32, p netip.Prefix, negate bool) []expr.Any {
	mask := net.CIDRMask(p.Bits(), 32)
	op := expr.CmpOpEq
	if negate {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: op, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

// MasqPresent reports whether flanneld's chain, or a jump to it, is still
// in ns's ip nat table.
func MasqPresent(ns netns.NsHandle) (bool, error) {
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		return false, err
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		return false, err
	}
	for _, ch := range chains {
		if ch.Table.Name != "nat" {
			continue
		}
		if ch.Name == Chain {
			return true, nil
		}
		rules, err := c.GetRules(ch.Table, ch)
		if err != nil {
			return false, err
		}
		for _, r := range rules {
			for _, e := range r.Exprs {
				if v, ok := e.(*expr.Verdict); ok && v.Chain == Chain {
					return true, nil
				}
			}
		}
	}
	return false, nil
}
