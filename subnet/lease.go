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

	"github.com/overlaynet/overlay/backend"
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
	if err := decodeObject("", value, []field{
		{"PublicIP", &a.PublicIP, wantString + " such as \"198.18.0.7\"", nil},
		{"BackendType", &a.BackendType, wantString + " such as \"vxlan\"", nil},
		{"BackendData", &a.BackendData, "an object", nil},
		{"NodeID", &a.NodeID, wantString, nil},
		{"Hostname", &a.Hostname, wantString, nil},
	}); err != nil {
		return a, fmt.Errorf("%w: value: %w", ErrInvalidLease, err)
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
	if err := decodeObject("BackendData.", a.BackendData, []field{
		{"VNI", &d.VNI, wantNumber, nil},
		{"VtepMAC", &d.VtepMAC, wantString + " such as \"0e:00:00:00:00:07\"", nil},
	}); err != nil {
		return d, fmt.Errorf("%w: %w", ErrInvalidLease, err)
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

// orphanError marks a lease that does not fit the network config; it is
// also an invalid lease.
type orphanError struct{ msg string }

func (e *orphanError) Error() string { return e.msg }
func (e *orphanError) Unwrap() error { return ErrInvalidLease }

// ErrOrphaned marks a lease that does not fit the current network config:
// its subnet is outside Network or of another length, or its VNI is not the
// network's (the config changed after it was written). No host can use it;
// `overlayd lease revoke` removes it. errors.Is(err, ErrInvalidLease)
// holds too.
var ErrOrphaned error = &orphanError{"lease does not fit the network config"}

func orphaned(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrOrphaned}, args...)...)
}

// Orphaned says why l does not fit this network config, or nil: the
// checks of Peer that depend on the config rather than on the lease alone.
func (c *Config) Orphaned(l Lease) error {
	switch {
	case !l.Subnet.IsValid() || !l.Subnet.Addr().Is4():
		return orphaned("subnet %s is not an IPv4 subnet", l.Subnet)
	case !c.Network.Contains(l.Subnet.Addr()):
		return orphaned("subnet %s is outside Network %s", l.Subnet, c.Network)
	case !c.Contains(l.Subnet):
		return orphaned("subnet %s is not a /%d (SubnetLen %d)", l.Subnet, c.SubnetLen, c.SubnetLen)
	}
	if d, err := l.Attrs.VXLAN(); err == nil && d.VNI != 0 && d.VNI != c.Backend.VNI {
		return orphaned("its VNI %d is not the network's Backend.VNI %d", d.VNI, c.Backend.VNI)
	}
	return nil
}

// CheckClaim validates what every lease and reservation says about its host
// and subnet: the subnet fits this network, PublicIP is a usable VTEP
// address outside the network, NodeID (if any) is one overlayd accepts.
// Peer applies it to what the daemon reads; `overlayd lease reserve`
// applies it to what it writes, so the CLI never writes what a daemon
// would skip.
func (c *Config) CheckClaim(l Lease) error {
	if err := c.Orphaned(l); err != nil {
		return err
	}
	// A reservation may name only its node, whose address is not known yet:
	// that host adopts it by NodeID.
	if !(l.Unclaimed() && l.Attrs.PublicIP == "" && l.Attrs.NodeID != "") {
		ip := l.Attrs.PublicAddr()
		if err := checkPublicIP(ip, l.Attrs.PublicIP); err != nil {
			return err
		}
		if c.Network.Contains(ip) {
			return fmt.Errorf("%w: PublicIP %s is inside the overlay network %s", ErrInvalidLease, ip, c.Network)
		}
	}
	if l.Attrs.NodeID != "" {
		if err := CheckNodeID(l.Attrs.NodeID); err != nil {
			return fmt.Errorf("%w: NodeID %w", ErrInvalidLease, err)
		}
	}
	return nil
}

// Peer validates a lease read from etcd for programming into the kernel. The
// lease is untrusted: anything that could misroute traffic is rejected with
// an error naming the field. This is the one place peers are validated: the
// backends take the result as it is.
func (c *Config) Peer(l Lease) (backend.Peer, error) {
	if err := c.CheckClaim(l); err != nil {
		return backend.Peer{}, err
	}
	if l.Attrs.BackendType != DefaultBackendType {
		return backend.Peer{}, fmt.Errorf("%w: BackendType %q, this network uses vxlan", ErrInvalidLease, l.Attrs.BackendType)
	}
	data, err := l.Attrs.VXLAN()
	if err != nil {
		return backend.Peer{}, err
	}
	hw, err := ParseVtepMAC(data.VtepMAC)
	if err != nil {
		return backend.Peer{}, err
	}
	mac, _ := backend.MACFrom(hw) // ParseVtepMAC checked the length
	return backend.Peer{Subnet: l.Subnet, PublicIP: l.Attrs.PublicAddr(), VtepMAC: mac}, nil
}

func checkPublicIP(ip netip.Addr, raw string) error {
	if !ip.IsValid() {
		return fmt.Errorf("%w: PublicIP %q is not an IPv4 address", ErrInvalidLease, raw)
	}
	if err := CheckVTEPAddr(ip); err != nil {
		return fmt.Errorf("%w: PublicIP %w", ErrInvalidLease, err)
	}
	return nil
}

// CheckVTEPAddr says why ip cannot be a host's underlay (VXLAN endpoint)
// address, or returns nil. The daemon applies it to every lease it reads
// and the CLI to every --public-ip.
func CheckVTEPAddr(ip netip.Addr) error {
	var what string
	switch {
	case !ip.Is4():
		return fmt.Errorf("%s is not an IPv4 address", ip)
	case ip.IsUnspecified():
		what = "the unspecified address"
	case ip.IsLoopback():
		what = "a loopback address"
	case ip.IsMulticast():
		what = "a multicast address"
	case ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		what = "the broadcast address"
	case ip.IsLinkLocalUnicast():
		what = "a link-local address"
	case ip.As4()[0] == 0 || ip.As4()[0] >= 240:
		what = "a reserved address"
	default:
		return nil
	}
	return fmt.Errorf("%s is %s and cannot be a host's VXLAN endpoint: use the host's unicast address on the underlay", ip, what)
}

// MaxNodeIDLen bounds a node ID: it becomes an etcd key segment.
const MaxNodeIDLen = 253

// CheckNodeID says why id cannot be a node ID, or returns nil: letters,
// digits, '-', '_' and '.', at most MaxNodeIDLen. It must stay the rule of
// overlayd run's --node-name (internal/daemon).
func CheckNodeID(id string) error {
	if id == "" {
		return errors.New("is empty")
	}
	if len(id) > MaxNodeIDLen {
		return fmt.Errorf("%q is longer than %d characters", id[:32]+"...", MaxNodeIDLen)
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("%q may hold only letters, digits, '-', '_' and '.'", id)
		}
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
