package daemon

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/backend/vxlan"
	"github.com/overlaynet/overlay/subnet"
)

// PlaneSpec is what Kernel.Plane builds one data plane from: the network's
// backend, the family, and this host's side of it. The daemon fills it in
// the same way for `overlayd run` and `overlayd teardown`; only the
// factory knows which backend package makes the plane.
type PlaneSpec struct {
	// Backend is the network config's "Backend" object: the type that
	// chooses the backend, and its parameters (VXLAN: VNI, port,
	// DirectRouting, MTU).
	Backend subnet.BackendConfig
	Family  backend.Family
	// Underlay is the interface encapsulated traffic leaves by; LocalIP
	// this host's address of Family on it (zero in a teardown that found
	// none).
	Underlay string
	LocalIP  netip.Addr
	// OwnSubnet is this host's lease of Family; zero in a teardown.
	OwnSubnet netip.Prefix
	// NodeID is the host's stable identity (VXLAN derives its MAC from it).
	NodeID string
	// Device and MAC, if set, name a device another program left (flanneld's)
	// that the plane takes over with its MAC, instead of its own.
	Device string
	MAC    net.HardwareAddr

	Resync time.Duration // how often the kernel is re-listed (0: the backend's default)
	Logger *slog.Logger
	// OnPeerProgrammed, if set, is called when a peer's current lease is
	// fully in the kernel for the first time (see vxlan.Config).
	OnPeerProgrammed func(backend.Peer, time.Time)
	// OnPass, if set, is called after each of the plane's reconcile passes
	// (see vxlan.Config); it must not block.
	OnPass func()
	// Gate, if set, is the VXLAN guard of Family, which the plane drives
	// in its passes (see backend.Gate).
	Gate backend.Gate
}

// vxlanConfig is spec as the VXLAN backend takes it.
func (spec PlaneSpec) vxlanConfig() vxlan.Config {
	b := spec.Backend
	own := spec.OwnSubnet
	if spec.Family == backend.IPv6 && !own.IsValid() {
		// The VXLAN backend takes its family from its addresses: with no
		// lease (a teardown), any IPv6 prefix says IPv6.
		own = netip.PrefixFrom(netip.IPv6Unspecified(), 128)
	}
	return vxlan.Config{VNI: b.VNI, Port: b.Port, DirectRouting: b.DirectRouting, MTU: b.MTU,
		Underlay: spec.Underlay, LocalIP: spec.LocalIP, OwnSubnet: own, NodeID: spec.NodeID,
		DeviceName: spec.Device, VtepMAC: spec.MAC, ResyncInterval: spec.Resync, Logger: spec.Logger,
		OnPeerProgrammed: spec.OnPeerProgrammed, OnPass: spec.OnPass, Gate: spec.Gate}
}

// ownRouteProtocol is the route protocol number of the routes the planes
// install (the VXLAN backend's, 115), for messages that tell an operator
// how to remove them.
const ownRouteProtocol = vxlan.RouteProtocol

// planeDevice is the name of the device the plane of the network's
// backend b and family fam makes its own (VXLAN: overlay.<VNI>,
// overlay-v6.<VNI>), for what looks for it apart from the plane: start-up
// checking the data path and removing an old IPv6 one, and teardown. Like
// hostKernel.Plane it knows the backends by type.
func planeDevice(b subnet.BackendConfig, fam backend.Family) (string, error) {
	if b.Type != "" && b.Type != subnet.DefaultBackendType {
		return "", fmt.Errorf("no data plane of backend type %q", b.Type)
	}
	if fam == backend.IPv6 {
		return vxlan.DeviceNameV6(b.VNI), nil
	}
	return vxlan.DeviceName(b.VNI), nil
}

// familyPlane is what this run has of one address family's data plane:
// flanneld's device being taken over (found while joining), then the
// plane and its device (startDataPlane). The daemon keeps one per family
// the network carries, IPv4 first.
type familyPlane struct {
	family  backend.Family
	flannel flannelDevice // flanneld's device being taken over; zero if none
	plane   backend.Plane // nil until startDataPlane built it
	guard   Guard         // its VXLAN guard; nil with --vxlan-guard=false
	dev     backend.Device
}

// families are the address families of a network config, IPv4 first.
func families(nc *subnet.Config) []backend.Family {
	var out []backend.Family
	if nc.EnableIPv4 {
		out = append(out, backend.IPv4)
	}
	if nc.EnableIPv6 {
		out = append(out, backend.IPv6)
	}
	return out
}

// localIP is this host's underlay address of fam.
func (u Underlay) localIP(fam backend.Family) netip.Addr {
	if fam == backend.IPv6 {
		return u.PublicIPv6
	}
	return u.PublicIP
}

// ownSubnet is this host's lease of fam.
func ownSubnet(l subnet.Lease, fam backend.Family) netip.Prefix {
	if fam == backend.IPv6 {
		return l.IPv6Subnet
	}
	return l.Subnet
}

// network is the cluster network of fam.
func network(nc *subnet.Config, fam backend.Family) netip.Prefix {
	if fam == backend.IPv6 {
		return nc.IPv6.Network
	}
	return nc.Network
}

// publishedData is the backend data this host writes into its lease for
// its device of fam, by the backend's codec: what the node ID derives,
// or flanneld's device's if one is being taken over (also for a family
// the network does not carry, as before). It is known before the kernel
// is touched.
func (d *daemon) publishedData(fam backend.Family) json.RawMessage {
	var mac net.HardwareAddr
	if fp := d.plane(fam); fp != nil {
		mac = fp.flannel.macOr(nil)
	}
	return d.codec.Publish(d.nodeID, fam, mac)
}

// plane returns this run's plane of fam, nil if the network does not
// carry fam.
func (d *daemon) plane(fam backend.Family) *familyPlane {
	for _, fp := range d.planes {
		if fp.family == fam {
			return fp
		}
	}
	return nil
}
