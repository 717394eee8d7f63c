package vxlan

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan/leasedata"
)

// RouteProtocol tags every route this backend installs (rtm_protocol). The
// reconciler lists routes by it, so it removes exactly its own routes and
// never another program's. 115 is in none of the kernel's RTPROT_* values nor
// iproute2's rt_protos (0-4 are the kernel's, 8-18, 42, 99, 186-192 are
// routing daemons'), nor used by calico (80) or bird (12). Operators can name
// it with
//
//	echo "115 overlay" > /etc/iproute2/rt_protos.d/overlay.conf
//
// and then `ip route show proto overlay`.
const RouteProtocol = 115

// Our routes' metrics spread over [RouteMetricBase, RouteMetricBase+4096),
// chosen by a hash of the destination (see RouteMetric). Forwarding does not
// notice: our routes all have distinct destinations, and a metric only
// orders routes to the same one. The kernel does: it keys the shared
// next-hop records of IPv4 routes (fib_info) by protocol, scope, preferred
// source, metric and output device but not by gateway, so N routes that
// differ only in their gateway land in one hash chain and inserting them
// costs O(N²); spread, each chain stays short (Documentation/design.md,
// "Route ownership").
// Kernel nexthop objects (RTA_NH_ID) would avoid it too; the netlink
// package does not speak them yet.
//
// A route of another program to the same destination with a lower or equal
// metric wins or would be overwritten; the reconciler reports it as a
// conflict and leaves both alone.
const (
	RouteMetricBase   = 4096
	routeMetricSpread = 4096
)

// RouteMetric is the metric of our route to a peer's subnet.
func RouteMetric(subnet netip.Prefix) int {
	// FNV-1a over the address and length.
	var b [17]byte
	n := 0
	if a := subnet.Addr(); a.IsValid() {
		n = copy(b[:], a.AsSlice())
	}
	b[n] = byte(subnet.Bits())
	h := uint32(2166136261)
	for _, c := range b[:n+1] {
		h ^= uint32(c)
		h *= 16777619
	}
	return RouteMetricBase + int(h%routeMetricSpread)
}

// Defaults, compatible with flannel's VXLAN backend.
const (
	DefaultVNI            = 1
	DefaultPort           = 8472
	DefaultResyncInterval = 30 * time.Second
	// Overhead is what VXLAN over IPv4 adds to every packet: outer IPv4
	// (20) + UDP (8) + VXLAN (8) + inner Ethernet (14).
	Overhead = 50
	// OverheadV6 is what VXLAN over IPv6 adds: outer IPv6 (40) + UDP (8)
	// + VXLAN (8) + inner Ethernet (14).
	OverheadV6 = 70
)

// Config is the data plane's configuration. The zero values of VNI, Port,
// MTU and the timers select the defaults.
//
// The family of LocalIP and OwnSubnet chooses the overlay: both IPv4 for
// the IPv4 one (device overlay.<VNI>), both IPv6 for the IPv6 one
// (overlay-v6.<VNI>); a dual-stack host runs one Backend of each, with the
// same VNI and port. Mixed families are a configuration error. A Config
// with only one of them (as for Teardown) takes that one's family; with
// neither, IPv4.
type Config struct {
	VNI           int  // VXLAN network identifier; 0 means DefaultVNI
	Port          int  // UDP destination port; 0 means DefaultPort
	DirectRouting bool // route straight over the underlay to peers on a connected subnet
	// MTU is the overlay device's MTU; 0 means the underlay's MTU minus
	// Overhead (IPv4) or OverheadV6 (IPv6).
	MTU int

	// The underlay: the link encapsulated packets leave by, given by name
	// or by index (name wins if both are set), and our public address on it.
	Underlay      string
	UnderlayIndex int
	LocalIP       netip.Addr

	OwnSubnet netip.Prefix // this host's lease, e.g. 10.244.7.0/24
	NodeID    string       // stable host identity; seeds the VTEP MAC

	// DeviceName and VtepMAC, if set, replace the device's name
	// (overlay.<VNI>, overlay-v6.<VNI>) and the MAC derived from NodeID:
	// a host taken over from flanneld keeps flannel's device and MAC, so
	// that the other hosts' entries for it stay valid.
	DeviceName string
	VtepMAC    net.HardwareAddr

	// ResyncInterval is how often the kernel is listed and repaired even
	// when nothing was notified (jittered by ±10%). 0 means
	// DefaultResyncInterval; negative disables periodic resyncs.
	ResyncInterval time.Duration
	// RetryMin and RetryMax bound the exponential backoff after a failed
	// pass (defaults 100ms and 10s).
	RetryMin, RetryMax time.Duration
	// DisableWatch turns off the kernel notifications that trigger prompt
	// repair, leaving only SetPeers and the periodic resync (for tests).
	DisableWatch bool

	// Logger receives the backend's logs; nil discards them.
	Logger *slog.Logger
	// OnPeerProgrammed, if set, is called from the reconciler goroutine
	// when a peer's current lease (subnet, public IP, MAC) is fully in the
	// kernel for the first time: after the pass that wrote it, or the first
	// pass that found it already there. It must not block.
	OnPeerProgrammed func(p backend.Peer, at time.Time)
	// OnPass, if set, is called after every pass, successful or not, from
	// the goroutine that ran it (Run's, or a caller of Reconcile). It must
	// not block.
	OnPass func()
	// Gate, if set, is told the desired peers' public addresses in every
	// pass: Admit before the pass writes (a failure holds back the peers
	// it may not have admitted: AdmitError), Settle after a pass whose
	// writes all succeeded (see backend.Gate). The VXLAN guard is one.
	Gate backend.Gate

	fam Family // set by withDefaults from LocalIP and OwnSubnet
}

// DeviceName is the name of the IPv4 VXLAN device for a VNI: overlay.<VNI>.
func DeviceName(vni int) string { return "overlay." + strconv.Itoa(vni) }

// DeviceNameV6 is the name of the IPv6 VXLAN device for a VNI:
// overlay-v6.<VNI> (flannel's is flannel-v6.<VNI>).
func DeviceNameV6(vni int) string { return "overlay-v6." + strconv.Itoa(vni) }

// VtepMAC derives the MAC of this host's IPv4 VTEP from its node ID and
// the VNI (leasedata.VtepMAC: the MAC a host publishes is the lease
// data's to say).
func VtepMAC(nodeID string, vni int) net.HardwareAddr { return leasedata.VtepMAC(nodeID, vni) }

// VtepMACv6 is VtepMAC for the IPv6 VTEP (leasedata.VtepMACv6).
func VtepMACv6(nodeID string, vni int) net.HardwareAddr { return leasedata.VtepMACv6(nodeID, vni) }

// deviceName and vtepMAC are the device name and MAC of the overlay of
// family fam.
func famDeviceName(fam Family, vni int) string {
	if fam == IPv6 {
		return DeviceNameV6(vni)
	}
	return DeviceName(vni)
}

func famVtepMAC(fam Family, nodeID string, vni int) net.HardwareAddr {
	return leasedata.FamilyVtepMAC(fam, nodeID, vni)
}

// overhead is what VXLAN over the underlay of family fam adds.
func famOverhead(fam Family) int {
	if fam == IPv6 {
		return OverheadV6
	}
	return Overhead
}

// family picks the overlay's family from LocalIP and OwnSubnet (see
// Config).
func (c Config) family() (Family, error) {
	local, own := c.LocalIP, c.OwnSubnet.Addr()
	switch {
	case local.IsValid() && own.IsValid() && familyOf(local) != familyOf(own):
		return IPv4, fmt.Errorf("LocalIP %v is %v but OwnSubnet %v is %v: give both of one family (IPv4 for %s, IPv6 for %s)",
			local, familyOf(local), c.OwnSubnet, familyOf(own), DeviceName(c.VNI), DeviceNameV6(c.VNI))
	case local.IsValid():
		return familyOf(local), nil
	case own.IsValid():
		return familyOf(own), nil
	}
	return IPv4, nil
}

// withDefaults fills in defaults and checks what every operation needs.
func (c Config) withDefaults() (Config, error) {
	if c.VNI == 0 {
		c.VNI = DefaultVNI
	}
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.ResyncInterval == 0 {
		c.ResyncInterval = DefaultResyncInterval
	}
	if c.RetryMin <= 0 {
		c.RetryMin = 100 * time.Millisecond
	}
	if c.RetryMax <= 0 {
		c.RetryMax = 10 * time.Second
	}
	if c.RetryMax < c.RetryMin {
		c.RetryMax = c.RetryMin
	}
	var errs []error
	if c.VNI < 1 || c.VNI > 1<<24-1 {
		errs = append(errs, fmt.Errorf("VNI %d out of range 1-16777215", c.VNI))
	}
	if c.Port < 1 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("port %d out of range 1-65535", c.Port))
	}
	if c.MTU < 0 {
		errs = append(errs, fmt.Errorf("MTU %d is negative", c.MTU))
	}
	if c.Underlay == "" && c.UnderlayIndex <= 0 {
		errs = append(errs, errors.New("no underlay link: set Underlay (name) or UnderlayIndex"))
	}
	if c.DeviceName != "" && (len(c.DeviceName) > 15 || strings.ContainsAny(c.DeviceName, "/ \x00")) {
		errs = append(errs, fmt.Errorf("device name %q is not a Linux interface name", c.DeviceName))
	}
	if m, ok := backend.MACFrom(c.VtepMAC); c.VtepMAC != nil && (!ok || m.IsZero() || m[0]&1 == 1) {
		errs = append(errs, fmt.Errorf("VTEP MAC %v is not a unicast MAC", c.VtepMAC))
	}
	var err error
	if c.fam, err = c.family(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return c, fmt.Errorf("vxlan config: %w", err)
	}
	return c, nil
}

// has reports whether a is an address of family fam proper: an
// IPv4-mapped IPv6 address is neither family's.
func famHas(fam Family, a netip.Addr) bool {
	if fam == IPv6 {
		return a.Is6() && !a.Is4In6()
	}
	return a.Is4()
}

// checkDevice checks what creating the device needs beyond withDefaults
// (teardown can do without it).
func (c Config) checkDevice() error {
	var errs []error
	if a := c.LocalIP; !famHas(c.fam, a) || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" {
		errs = append(errs, fmt.Errorf("LocalIP %v is not a usable %v address", c.LocalIP, c.fam))
	}
	if !c.OwnSubnet.IsValid() || !famHas(c.fam, c.OwnSubnet.Addr()) || c.OwnSubnet.Masked() != c.OwnSubnet {
		errs = append(errs, fmt.Errorf("OwnSubnet %v is not an %v network prefix", c.OwnSubnet, c.fam))
	}
	if c.NodeID == "" {
		errs = append(errs, errors.New("NodeID is empty (it seeds the VTEP MAC)"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("vxlan config: %w", err)
	}
	return nil
}
