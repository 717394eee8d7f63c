package subnet

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	"github.com/overlaynet/overlay/internal/lib/jsonobj"
)

// MaxLeaseValueSize bounds a lease value read from etcd; a real one is about
// 200 bytes. Anything larger is hostile or broken and is skipped unparsed.
const MaxLeaseValueSize = 16 << 10

// ErrInvalidLease marks a lease key or value that must not be used.
var ErrInvalidLease = errors.New("invalid lease")

// Lease is one host's claim on a subnet: the key <prefix>/subnets/<a.b.c.d>-<len>
// (with "&<IPv6 subnet>-<len>" appended in a dual-stack network) and its
// value.
type Lease struct {
	Subnet     netip.Prefix
	IPv6Subnet netip.Prefix // zero unless the key names an IPv6 subnet
	Attrs      LeaseAttrs

	// Reserved is true for a key with no etcd lease: it never expires.
	Reserved bool
	// EtcdLease is the etcd lease ID attached to the key (0 when Reserved).
	EtcdLease int64
	// ModRevision is the etcd revision that last wrote the key.
	ModRevision int64
	// Value is the value as read from etcd, which Attrs was decoded
	// from; nil for a lease not read from etcd. The lease journal keeps
	// it as it is instead of encoding Attrs again. Code that changes
	// Attrs builds a new Lease without it.
	Value []byte
}

// LeaseAttrs is the lease value, flannel's LeaseAttrs plus our own optional
// fields (flannel ignores them when it reads our leases).
type LeaseAttrs struct {
	PublicIP string
	// PublicIPv6 is the host's IPv6 underlay address, the endpoint of its
	// IPv6 VXLAN device; set in dual-stack leases only.
	PublicIPv6  string          `json:",omitempty"`
	BackendType string          `json:",omitempty"`
	BackendData json.RawMessage `json:",omitempty"`
	// BackendV6Data is the IPv6 device's backend data, dual-stack leases only.
	BackendV6Data json.RawMessage `json:",omitempty"`
	// NodeID names the overlayd host that owns the lease; absent in leases
	// written by flanneld, where PublicIP is the identity.
	NodeID   string `json:",omitempty"`
	Hostname string `json:",omitempty"`
}

// Unclaimed reports whether l is a reservation no host has adopted yet: a
// key with no etcd lease and no BackendData, as `overlayd lease reserve`
// writes it. It is not a peer until its host adopts it, and not invalid.
func (l Lease) Unclaimed() bool {
	data := bytes.TrimSpace(l.Attrs.BackendData)
	return l.Reserved && (len(data) == 0 || bytes.Equal(data, []byte("null")))
}

// Subnets returns the subnets l's key names.
func (l Lease) Subnets() Subnets { return Subnets{IPv4: l.Subnet, IPv6: l.IPv6Subnet} }

// ID returns l.Subnets().ID().
func (l Lease) ID() ID { return l.Subnets().ID() }

// Key returns l's key suffix, e.g. "10.244.7.0-24".
func (l Lease) Key() string { return l.Subnets().Key() }

// NewAttrs builds the value a host writes for its lease: its public
// address, the backend's type and the backend's data, which the backend's
// codec encoded (backend.Codec.Publish); subnet does not interpret it.
func NewAttrs(publicIP netip.Addr, backendType string, data json.RawMessage, nodeID, hostname string) LeaseAttrs {
	return LeaseAttrs{PublicIP: publicIP.String(), BackendType: backendType, BackendData: data, NodeID: nodeID, Hostname: hostname}
}

// WithIPv6 adds what a dual-stack lease says of the host's IPv6 device:
// its underlay address and the backend's data of it.
func (a LeaseAttrs) WithIPv6(publicIPv6 netip.Addr, data json.RawMessage) LeaseAttrs {
	a.PublicIPv6, a.BackendV6Data = publicIPv6.String(), data
	return a
}

// Marshal encodes the value as stored in etcd.
func (a LeaseAttrs) Marshal() ([]byte, error) { return json.Marshal(a) }

// DecodeAttrs parses a lease value. It checks only that it is a bounded JSON
// object without two members naming one field (twinMembers); Config.CheckPeer
// decides whether the lease can be programmed. The backend data of a plain
// value shares value's bytes: value must not change while the attributes
// are in use (a lease keeps it as Lease.Value anyway).
func DecodeAttrs(value []byte) (LeaseAttrs, error) {
	if len(value) > MaxLeaseValueSize {
		return LeaseAttrs{}, fmt.Errorf("%w: value of %d bytes exceeds %d", ErrInvalidLease, len(value), MaxLeaseValueSize)
	}
	if trimmed := bytes.TrimSpace(value); len(trimmed) == 0 || trimmed[0] != '{' {
		return LeaseAttrs{}, fmt.Errorf("%w: value is not a JSON object", ErrInvalidLease)
	}
	// Every host decodes every lease at start-up and on each re-list: a
	// plain value (nearly all of them) is read in one pass by
	// decodeAttrsFast, which reads it exactly as encoding/json (and so
	// flanneld) does and never one with twin members. Any other value goes
	// through decodeAttrsSlow.
	a, ok := decodeAttrsFast(value)
	if !ok {
		var err error
		if a, err = decodeAttrsSlow(value); err != nil {
			return LeaseAttrs{}, err
		}
	}
	a.BackendData, a.BackendV6Data = nullIsAbsent(a.BackendData), nullIsAbsent(a.BackendV6Data)
	if a.PublicIP == "" && a.PublicIPv6 == "" && a.NodeID == "" {
		return a, fmt.Errorf("%w: value names no host (no PublicIP, PublicIPv6 or NodeID)", ErrInvalidLease)
	}
	return a, nil
}

// decodeAttrsSlow decodes a value the fast path gave up on with
// encoding/json; one it rejects through attrsByMember, which says which
// member is wrong and why; one with twin members, which readers may read
// two ways, is refused. Apart from DecodeAttrs, so that the attributes of
// a plain value stay off the heap (encoding/json's pointer to them would
// move them there for every lease).
func decodeAttrsSlow(value []byte) (LeaseAttrs, error) {
	if twins := twinsError(value); twins != nil {
		return LeaseAttrs{}, fmt.Errorf("%w: value: %w", ErrInvalidLease, twins)
	}
	var a LeaseAttrs
	if err := json.Unmarshal(value, &a); err != nil {
		if _, err := attrsByMember(value); err != nil {
			return LeaseAttrs{}, err
		}
		return LeaseAttrs{}, fmt.Errorf("%w: value: %w", ErrInvalidLease, errCaseTwins)
	}
	return a, nil
}

// errCaseTwins is what is left when encoding/json rejects a value that
// decodeObject reads: members that differ only in case, where
// decodeObject read another one than the one of the wrong type.
var errCaseTwins = errors.New("members that differ only in case, one of them not of its type")

// attrsByMember reads a lease value member by member, so that an error
// names the member as written and what it must be.
func attrsByMember(value []byte) (LeaseAttrs, error) {
	var a LeaseAttrs
	if err := jsonobj.Decode("", value, []jsonobj.Field{
		{Name: "PublicIP", Dst: &a.PublicIP, Want: wantString + " such as \"198.18.0.7\""},
		{Name: "PublicIPv6", Dst: &a.PublicIPv6, Want: wantString + " such as \"2001:db8::7\""},
		{Name: "BackendType", Dst: &a.BackendType, Want: wantString + " such as \"vxlan\""},
		{Name: "BackendData", Dst: &a.BackendData, Want: "an object"},
		{Name: "BackendV6Data", Dst: &a.BackendV6Data, Want: "an object"},
		{Name: "NodeID", Dst: &a.NodeID, Want: wantString},
		{Name: "Hostname", Dst: &a.Hostname, Want: wantString},
	}); err != nil {
		return LeaseAttrs{}, fmt.Errorf("%w: value: %w", ErrInvalidLease, err)
	}
	return a, nil
}

// nullIsAbsent maps a member written as null to an absent one, as
// decodeObject reads it.
func nullIsAbsent(raw json.RawMessage) json.RawMessage {
	if bytes.Equal(raw, []byte("null")) {
		return nil
	}
	return raw
}

// PublicAddr parses PublicIP; the zero Addr means absent or unparsable.
func (a LeaseAttrs) PublicAddr() netip.Addr { return parseAddr(a.PublicIP) }

// PublicAddrV6 parses PublicIPv6 the same way.
func (a LeaseAttrs) PublicAddrV6() netip.Addr { return parseAddr(a.PublicIPv6) }

func parseAddr(s string) netip.Addr {
	addr, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}
	}
	return addr
}

// OwnedBy reports whether the lease names this host: by NodeID when the lease
// has one, else by a public address of the host's (PublicIP is the identity
// flanneld uses; PublicIPv6 names an IPv6-only host's reservation).
func (a LeaseAttrs) OwnedBy(nodeID string, publicIPs ...netip.Addr) bool {
	if a.NodeID != "" {
		return a.NodeID == nodeID
	}
	for _, ip := range publicIPs {
		if ip.IsValid() && (ip.Is4() && a.PublicAddr() == ip || ip.Is6() && a.PublicAddrV6() == ip) {
			return true
		}
	}
	return false
}

// NamesAHost reports whether the value could be some host's claim: it has a
// node ID or a usable public address. A value that names no host (garbage,
// a multicast or zero address) is nobody's claim, and the lease's owner may
// overwrite it.
func (a LeaseAttrs) NamesAHost() bool {
	return a.NodeID != "" || checkPublicIP(ipv4, a.PublicIP) == nil || checkPublicIP(ipv6, a.PublicIPv6) == nil
}

// orphanError marks a lease that does not fit the network config; it is
// also an invalid lease.
type orphanError struct{ msg string }

func (e *orphanError) Error() string { return e.msg }
func (e *orphanError) Unwrap() error { return ErrInvalidLease }

// ErrOrphaned marks a lease that does not fit the current network config:
// its subnet is outside Network or of another length, its key names an
// address family the network does not carry (or lacks one it does), or its
// VNI is not the network's (the config changed after it was written). No
// host can use it; `overlayd lease revoke` removes it. A key that differs
// from the network only in naming an IPv6 subnet or not, while both carry
// IPv4, is not orphaned: its IPv4 half is used (see IPv4Only).
// errors.Is(err, ErrInvalidLease) holds too.
var ErrOrphaned error = &orphanError{"lease does not fit the network config"}

func orphaned(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrOrphaned}, args...)...)
}

// DataChecker is a backend's reading of the backend data of leases: the
// member BackendData, and BackendV6Data for the IPv6 device, which subnet
// keeps as raw JSON and does not interpret. Each backend owns its codec
// (backend/vxlan/leasedata.Codec); the checks that need it take it.
type DataChecker interface {
	// CheckData reads one family's backend data as the lease holds it
	// (member names it in errors) and says why it does not fit this
	// network (misfit: the lease is orphaned, e.g. VXLAN data of another
	// VNI) and why it cannot be used (err: absent, malformed, a bad MAC).
	// Neither error wraps ErrInvalidLease: the caller marks them.
	CheckData(member string, raw json.RawMessage) (misfit, err error)
}

// DataCheck is what a backend's codec found in one family's backend data
// of a lease (see DataChecker), for CheckPeer.
type DataCheck struct{ Misfit, Err error }

// dataChecks reads l's backend data of each family with data.
func dataChecks(l Lease, data DataChecker) (d4, d6 DataCheck) {
	d4.Misfit, d4.Err = data.CheckData("BackendData", l.Attrs.BackendData)
	d6.Misfit, d6.Err = data.CheckData("BackendV6Data", l.Attrs.BackendV6Data)
	return d4, d6
}

// Orphaned says why l does not fit this network config, or nil: the
// checks of CheckPeer that depend on the config rather than on the lease
// alone. data reads the backend's data (its VNI must be the network's).
func (c *Config) Orphaned(l Lease, data DataChecker) error {
	d4, d6 := dataChecks(l, data)
	return c.orphaned(l, d4, d6)
}

func (c *Config) orphaned(l Lease, d4, d6 DataCheck) error {
	if err := c.fits(ipv4, c.EnableIPv4, &c.Pool, l.Subnet); err != nil {
		return err
	}
	half := c.IPv4Half(l)
	if err := c.fits(ipv6, c.EnableIPv6, &c.IPv6, l.IPv6Subnet); err != nil && !half {
		return err
	}
	if d4.Misfit != nil {
		return orphaned("its %v", d4.Misfit)
	}
	if d6.Misfit != nil && !half {
		return orphaned("its IPv6 %v", d6.Misfit)
	}
	return nil
}

// IPv4Half reports whether l's key names an IPv6 subnet where the network
// carries no IPv6, or none where it does, while both carry IPv4: the
// network config turned IPv6 on or off after l's host wrote it. Such a key
// is not orphaned: its IPv4 half, which its host's pods hold addresses
// of, is used, and its IPv6 half (if any) ignored, until its host
// restarts and rekeys it for the network's families
// (etcdv3.Registry.Rekey). This is what keeps a roll of the change, host
// by host, free of IPv4 loss: hosts restarted and hosts not yet restarted
// program each other's IPv4 half.
func (c *Config) IPv4Half(l Lease) bool {
	return c.EnableIPv4 && l.Subnet.IsValid() && c.EnableIPv6 != l.IPv6Subnet.IsValid()
}

// IPv4Only says why only the IPv4 half of l is used ("" if l is used as
// its key names it, or not at all): its key names an IPv6 subnet the
// network no longer carries, or lacks the one it now carries. The half is
// still checked as every lease is (Peer, CheckClaim).
func (c *Config) IPv4Only(l Lease) string {
	switch {
	case !c.IPv4Half(l):
		return ""
	case c.EnableIPv6:
		return "its key names no IPv6 subnet (its host has not restarted since the network started carrying IPv6): its IPv4 half is used; it gains an IPv6 subnet when its host restarts"
	}
	return fmt.Sprintf("its key names the IPv6 subnet %s, but the network carries no IPv6 (its host has not restarted since): its IPv4 half is used; it drops the IPv6 subnet when its host restarts", l.IPv6Subnet)
}

// fits says why a lease's subnet s of family f does not fit pool, which
// the network carries if enabled.
func (c *Config) fits(f family, enabled bool, pool *Pool, s netip.Prefix) error {
	switch {
	case !enabled && !s.IsValid():
		return nil
	case !enabled:
		return orphaned("its key names the %s subnet %s, but the network carries no %s", f.name(), s, f.name())
	case !s.IsValid():
		return orphaned("its key names no %s subnet, but the network carries %s", f.name(), f.name())
	case !f.is(s.Addr()):
		return orphaned("subnet %s is not an %s subnet", s, f.name())
	case !pool.Network.Contains(s.Addr()):
		return orphaned("subnet %s is outside %s %s", s, f.network, pool.Network)
	case !pool.Contains(s):
		return orphaned("subnet %s is not a /%d (%s %d)", s, pool.SubnetLen, f.subnetLen, pool.SubnetLen)
	}
	return nil
}

// CheckClaim validates what every lease and reservation says about its host
// and subnets: they fit this network, each public address (PublicIP,
// and PublicIPv6 in a network that carries IPv6) is a usable VTEP address
// outside the network, NodeID (if any) is one overlayd accepts.
// CheckPeer applies it to what the daemon reads; `overlayd lease reserve`
// applies it to what it writes, so the CLI never writes what a daemon
// would skip. data reads the backend's data (see Orphaned).
func (c *Config) CheckClaim(l Lease, data DataChecker) error {
	d4, d6 := dataChecks(l, data)
	return c.checkClaim(l, d4, d6)
}

func (c *Config) checkClaim(l Lease, d4, d6 DataCheck) error {
	if err := c.orphaned(l, d4, d6); err != nil {
		return err
	}
	// A reservation may name only its node, whose addresses are not known
	// yet: that host adopts it by NodeID.
	if !(l.Unclaimed() && l.Attrs.PublicIP == "" && l.Attrs.PublicIPv6 == "" && l.Attrs.NodeID != "") {
		if err := c.checkVTEP(ipv4, c.EnableIPv4, &c.Pool, l.Attrs.PublicIP); err != nil {
			return err
		}
		if err := c.checkVTEP(ipv6, c.EnableIPv6 && !c.IPv4Half(l), &c.IPv6, l.Attrs.PublicIPv6); err != nil {
			return err
		}
	}
	if l.Attrs.NodeID != "" {
		if err := CheckNodeID(l.Attrs.NodeID); err != nil {
			return fmt.Errorf("%w: NodeID %w", ErrInvalidLease, err)
		}
	}
	return nil
}

// checkVTEP checks a lease's public address of family f, raw as written,
// if the network carries f.
func (c *Config) checkVTEP(f family, enabled bool, pool *Pool, raw string) error {
	if !enabled {
		return nil
	}
	if err := checkPublicIP(f, raw); err != nil {
		return err
	}
	if ip := parseAddr(raw); pool.Network.Contains(ip) {
		return fmt.Errorf("%w: %s %s is inside the overlay network %s", ErrInvalidLease, f.publicIP(), ip, pool.Network)
	}
	return nil
}

// CheckLease is CheckPeer with the backend data read by data: why a lease
// read from etcd cannot be a peer, or nil.
func (c *Config) CheckLease(l Lease, data DataChecker) error {
	d4, d6 := dataChecks(l, data)
	_, _, err := c.CheckPeer(l, d4, d6)
	return err
}

// CheckPeer validates a lease read from etcd for programming into the
// kernel, given what the backend's codec found in its data of each family
// (d4 of BackendData, d6 of BackendV6Data: the caller decodes each once,
// and keeps what it decoded for the peer). The lease is untrusted:
// anything that could misroute traffic is rejected with an error naming
// the field. This is the one place peers are validated: the data planes
// take the result as it is. It reports the families the lease is a peer
// of: IPv4 if the network carries it, IPv6 if the network carries it and
// it is not the half IPv4Only explains.
func (c *Config) CheckPeer(l Lease, d4, d6 DataCheck) (v4, v6 bool, err error) {
	if err := c.checkClaim(l, d4, d6); err != nil {
		return false, false, err
	}
	if want := cmp.Or(c.Backend.Type, DefaultBackendType); l.Attrs.BackendType != want {
		return false, false, fmt.Errorf("%w: BackendType %q, this network uses %s", ErrInvalidLease, l.Attrs.BackendType, want)
	}
	v4, v6 = c.EnableIPv4, c.EnableIPv6 && !c.IPv4Half(l)
	if v4 && d4.Err != nil {
		return false, false, fmt.Errorf("%w: %w", ErrInvalidLease, d4.Err)
	}
	if v6 && d6.Err != nil {
		return false, false, fmt.Errorf("%w: %w", ErrInvalidLease, d6.Err)
	}
	return v4, v6, nil
}

// checkPublicIP checks a lease's public address of family f, raw as
// written in the lease.
func checkPublicIP(f family, raw string) error {
	ip := parseAddr(raw)
	if !f.is(ip.WithZone("")) { // a zone gets its own message below
		return fmt.Errorf("%w: %s %q is not an %s address", ErrInvalidLease, f.publicIP(), raw, f.name())
	}
	if err := CheckVTEPAddr(ip); err != nil {
		return fmt.Errorf("%w: %s %w", ErrInvalidLease, f.publicIP(), err)
	}
	return nil
}

// CheckVTEPAddr says why ip cannot be a host's underlay (VXLAN endpoint)
// address, or returns nil. The daemon applies it to every lease it reads
// and the CLI to every --public-ip.
func CheckVTEPAddr(ip netip.Addr) error {
	var what string
	switch {
	case !ip.IsValid():
		return errors.New("is not an IP address")
	case ip.Zone() != "":
		what = "an address with a zone"
	case ip.Is4In6():
		what = "an IPv4-mapped IPv6 address"
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
	case ip.Is4() && (ip.As4()[0] == 0 || ip.As4()[0] >= 240):
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

// ShownName is a name read from etcd (a node ID, a hostname) as messages
// show it: as it is if it is a plain name (CheckNodeID's characters), else
// quoted — anyone with write access to etcd chose it, and it must not
// reach a terminal or a log line raw.
func ShownName(s string) string {
	if CheckNodeID(s) != nil {
		return strconv.Quote(s)
	}
	return s
}

// ShownAddr is an address read from etcd as messages show it: in its
// canonical form if it is one (without a zone, which is free text), else
// quoted.
func ShownAddr(s string) string {
	if ip, err := netip.ParseAddr(s); err == nil && ip.Zone() == "" {
		return ip.String()
	}
	return strconv.Quote(s)
}
