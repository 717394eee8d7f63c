package subnet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// MaxLeaseValueSize bounds a lease value read from etcd; a real one is about
// 200 bytes. Anything larger is hostile or broken and is skipped unparsed.
const MaxLeaseValueSize = 16 << 10

// ErrInvalidLease marks a lease key or value that must not be used.
var ErrInvalidLease = errors.New("invalid lease")

// Lease is one host's claim on a subnet: the key <prefix>/subnets/<a.b.c.d>-<len>
// and its value.
type Lease struct {
	Subnet netip.Prefix
	Attrs  LeaseAttrs

	// Reserved is true for a key with no etcd lease: it never expires.
	Reserved bool
	// EtcdLease is the etcd lease ID attached to the key (0 when Reserved).
	EtcdLease int64
	// ModRevision is the etcd revision that last wrote the key.
	ModRevision int64
}

// LeaseAttrs is the lease value, flannel's LeaseAttrs plus our own optional
// fields (flannel ignores them when it reads our leases).
type LeaseAttrs struct {
	PublicIP    string
	BackendType string          `json:",omitempty"`
	BackendData json.RawMessage `json:",omitempty"`
	// NodeID names the overlayd host that owns the lease; absent in leases
	// written by flanneld, where PublicIP is the identity.
	NodeID   string `json:",omitempty"`
	Hostname string `json:",omitempty"`
}

// VXLANData is BackendData for the vxlan backend.
type VXLANData struct {
	VNI     int
	VtepMAC string
}

// Unclaimed reports whether l is a reservation no host has adopted yet: a
// key with no etcd lease and no BackendData, as `overlayd lease reserve`
// writes it. It is not a peer until its host adopts it, and not invalid.
func (l Lease) Unclaimed() bool {
	data := bytes.TrimSpace(l.Attrs.BackendData)
	return l.Reserved && (len(data) == 0 || bytes.Equal(data, []byte("null")))
}

// Key returns the lease key suffix for a subnet, e.g. "10.244.7.0-24".
func Key(p netip.Prefix) string {
	return p.Addr().String() + "-" + strconv.Itoa(p.Bits())
}

// ParseKey decodes a key suffix such as "10.244.7.0-24". It accepts only the
// canonical form that Key produces.
func ParseKey(s string) (netip.Prefix, error) {
	addrPart, bitsPart, ok := strings.Cut(s, "-")
	if !ok {
		return netip.Prefix{}, fmt.Errorf("%w: key %q is not <a.b.c.d>-<len>", ErrInvalidLease, s)
	}
	addr, err := netip.ParseAddr(addrPart)
	if err != nil || !addr.Is4() {
		return netip.Prefix{}, fmt.Errorf("%w: key %q does not start with an IPv4 address", ErrInvalidLease, s)
	}
	bits, err := strconv.Atoi(bitsPart)
	if err != nil || bits < 0 || bits > 32 || strconv.Itoa(bits) != bitsPart {
		return netip.Prefix{}, fmt.Errorf("%w: key %q has no prefix length 0..32 after '-'", ErrInvalidLease, s)
	}
	p := netip.PrefixFrom(addr, bits)
	if p.Masked() != p {
		return netip.Prefix{}, fmt.Errorf("%w: key %q has host bits set", ErrInvalidLease, s)
	}
	return p, nil
}

// NewVXLANAttrs builds the value this host writes for its lease.
func NewVXLANAttrs(publicIP netip.Addr, vni int, mac net.HardwareAddr, nodeID, hostname string) LeaseAttrs {
	data, _ := json.Marshal(VXLANData{VNI: vni, VtepMAC: mac.String()}) // cannot fail: two plain fields
	return LeaseAttrs{PublicIP: publicIP.String(), BackendType: DefaultBackendType, BackendData: data, NodeID: nodeID, Hostname: hostname}
}

// Marshal encodes the value as stored in etcd.
func (a LeaseAttrs) Marshal() ([]byte, error) { return json.Marshal(a) }

// DecodeAttrs parses a lease value. It checks only that it is a bounded JSON
// object; Config.Peer decides whether the lease can be programmed.
func DecodeAttrs(value []byte) (LeaseAttrs, error) {
	var a LeaseAttrs
	if len(value) > MaxLeaseValueSize {
		return a, fmt.Errorf("%w: value of %d bytes exceeds %d", ErrInvalidLease, len(value), MaxLeaseValueSize)
	}
	if trimmed := bytes.TrimSpace(value); len(trimmed) == 0 || trimmed[0] != '{' {
		return a, fmt.Errorf("%w: value is not a JSON object", ErrInvalidLease)
	}
	if err := json.Unmarshal(value, &a); err != nil {
		return a, fmt.Errorf("%w: value is not a JSON lease object: %v", ErrInvalidLease, err)
	}
	if a.PublicIP == "" && a.NodeID == "" {
		return a, fmt.Errorf("%w: value names no host (no PublicIP or NodeID)", ErrInvalidLease)
	}
	return a, nil
}

// PublicAddr parses PublicIP; the zero Addr means absent or unparsable.
func (a LeaseAttrs) PublicAddr() netip.Addr {
	addr, err := netip.ParseAddr(a.PublicIP)
	if err != nil {
		return netip.Addr{}
	}
	return addr
}

// VXLAN parses BackendData as vxlan data.
func (a LeaseAttrs) VXLAN() (VXLANData, error) {
	var d VXLANData
	if len(bytes.TrimSpace(a.BackendData)) == 0 || bytes.Equal(bytes.TrimSpace(a.BackendData), []byte("null")) {
		return d, fmt.Errorf("%w: BackendData is missing", ErrInvalidLease)
	}
	if err := json.Unmarshal(a.BackendData, &d); err != nil {
		return d, fmt.Errorf("%w: BackendData is not vxlan data: %v", ErrInvalidLease, err)
	}
	return d, nil
}

// OwnedBy reports whether the lease names this host: by NodeID when the lease
// has one, else by PublicIP (the identity flanneld uses).
func (a LeaseAttrs) OwnedBy(nodeID string, publicIP netip.Addr) bool {
	if a.NodeID != "" {
		return a.NodeID == nodeID
	}
	return publicIP.IsValid() && a.PublicAddr() == publicIP
}

// NamesAHost reports whether the value could be some host's claim: it has a
// node ID or a usable public address. A value that names no host (garbage,
// a multicast or zero address) is nobody's claim, and the lease's owner may
// overwrite it.
func (a LeaseAttrs) NamesAHost() bool {
	return a.NodeID != "" || checkPublicIP(a.PublicAddr(), a.PublicIP) == nil
}

// Peer is a lease checked for programming: everything the data plane needs,
// every value validated.
type Peer struct {
	Subnet   netip.Prefix
	PublicIP netip.Addr
	VtepMAC  net.HardwareAddr
	NodeID   string
}

// Peer validates a lease read from etcd for programming into the kernel. The
// lease is untrusted: anything that could misroute traffic is rejected with
// an error naming the field.
func (c *Config) Peer(l Lease) (Peer, error) {
	if !c.Contains(l.Subnet) {
		return Peer{}, fmt.Errorf("%w: subnet %s is not a /%d inside network %s", ErrInvalidLease, l.Subnet, c.SubnetLen, c.Network)
	}
	ip := l.Attrs.PublicAddr()
	if err := checkPublicIP(ip, l.Attrs.PublicIP); err != nil {
		return Peer{}, err
	}
	if c.Network.Contains(ip) {
		return Peer{}, fmt.Errorf("%w: PublicIP %s is inside the overlay network %s", ErrInvalidLease, ip, c.Network)
	}
	if l.Attrs.BackendType != DefaultBackendType {
		return Peer{}, fmt.Errorf("%w: BackendType %q, this network uses vxlan", ErrInvalidLease, l.Attrs.BackendType)
	}
	data, err := l.Attrs.VXLAN()
	if err != nil {
		return Peer{}, err
	}
	if data.VNI != 0 && data.VNI != c.Backend.VNI {
		return Peer{}, fmt.Errorf("%w: VNI %d differs from the network's %d", ErrInvalidLease, data.VNI, c.Backend.VNI)
	}
	mac, err := ParseVtepMAC(data.VtepMAC)
	if err != nil {
		return Peer{}, err
	}
	return Peer{Subnet: l.Subnet, PublicIP: ip, VtepMAC: mac, NodeID: l.Attrs.NodeID}, nil
}

func checkPublicIP(ip netip.Addr, raw string) error {
	switch {
	case !ip.IsValid() || !ip.Is4():
		return fmt.Errorf("%w: PublicIP %q is not an IPv4 address", ErrInvalidLease, raw)
	case ip.IsUnspecified(), ip.IsLoopback(), ip.IsMulticast(), ip.IsLinkLocalUnicast(),
		ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}), ip.As4()[0] == 0, ip.As4()[0] >= 240:
		return fmt.Errorf("%w: PublicIP %s cannot be a VTEP address (unspecified, loopback, multicast, broadcast or reserved)", ErrInvalidLease, ip)
	}
	return nil
}

// ParseVtepMAC accepts only a 6-byte unicast MAC that is not all zeros.
func ParseVtepMAC(s string) (net.HardwareAddr, error) {
	mac, err := net.ParseMAC(s)
	if err != nil || len(mac) != 6 {
		return nil, fmt.Errorf("%w: VtepMAC %q is not a 6-byte MAC address", ErrInvalidLease, s)
	}
	if mac[0]&1 == 1 {
		return nil, fmt.Errorf("%w: VtepMAC %s is a multicast address", ErrInvalidLease, mac)
	}
	if bytes.Equal(mac, make([]byte, 6)) {
		return nil, fmt.Errorf("%w: VtepMAC is all zeros", ErrInvalidLease)
	}
	return mac, nil
}
