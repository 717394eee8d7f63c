// Package backend is the contract between the overlay daemon and its data
// plane.
//
// The daemon owns the control plane: it holds this host's lease and watches
// every other host's lease in etcd. The data plane owns the kernel: it turns
// the set of other hosts ("peers") into whatever devices, neighbour entries,
// forwarding entries and routes make their pod subnets reachable, and keeps
// that kernel state true while peers come and go and while other programs or
// operators disturb it.
//
// The contract is deliberately level-triggered. The daemon never tells the
// data plane "add X" or "remove Y"; it hands over the complete current peer
// set with SetPeers whenever anything changes, and the data plane converges
// the kernel to it. A lost or duplicated event therefore cannot leave stale
// state behind, and the daemon needs no memory of what it sent before.
//
// This package imports neither etcd nor netlink: the daemon depends on the
// small interfaces here (Plane, one per address family, and Codec, the
// backend's part of a lease value); the VXLAN implementation lives in
// backend/vxlan.
package backend

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// Peer is another host's lease as a data plane needs it, in one address
// family: the one shape a peer has from the lease to the kernel. Its
// values are validated once, where the untrusted lease enters the daemon
// (subnet.Config.CheckPeer, and the backend's codec for Data): a subnet
// of the network of the plane's family, a usable unicast PublicIP of
// that family, the backend's data as its codec accepted it. A plane
// checks only what needs the whole set or this host: duplicates, our own
// subnet and address.
// It is a comparable value, so sets of thousands are cheap to keep and to
// compare.
type Peer struct {
	Subnet   netip.Prefix // the peer's lease, e.g. 10.244.7.0/24 or fd00:10:244:7::/64
	PublicIP netip.Addr   // the peer's underlay address, e.g. 198.18.0.7 or 2001:db8::7
	Data     PeerData     // the backend's own data about the peer (VXLAN: its VTEP MAC)
}

// PeerData is a backend's own data about a peer, decoded from the lease's
// backend data by the backend's codec (backend/vxlan/leasedata.Codec), in
// a form only that backend reads: VXLAN keeps the peer's VTEP MAC in it
// (leasedata.PeerData, leasedata.PeerMAC). Fixed bytes rather than an interface
// or a string, so a Peer stays comparable and is made without an
// allocation per peer (thousands at a cold start). Its size is what the
// backends of this tree need; a backend with more to say (a WireGuard
// public key, 32 bytes) grows it, at 24 bytes per peer and copy.
type PeerData [8]byte

// Codec is a backend's part of a lease value: it reads a peer's backend
// data (the lease's BackendData, and BackendV6Data for the IPv6 device,
// raw JSON the control plane does not interpret) into the PeerData the
// backend's planes take, once, where the lease enters the daemon; and it
// writes what this host publishes. backend/vxlan/leasedata.Codec is one;
// backend/codecs picks the network's.
type Codec interface {
	// Publish returns the backend data this host publishes in its lease
	// for its plane of fam, known before the kernel is touched: derived
	// from the host's stable nodeID, or from mac, the hardware address of
	// a device another program left that the plane takes over (nil if
	// none).
	Publish(nodeID string, fam Family, mac net.HardwareAddr) json.RawMessage
	// String names a peer's data in logs (VXLAN: its VTEP MAC).
	String(data PeerData) string
	// Decode reads one family's backend data (member names it in errors)
	// and says why it does not fit the network (misfit: the lease is then
	// orphaned, e.g. VXLAN data of another VNI) and why it cannot be used
	// (err); data is valid when err is nil.
	Decode(member string, raw json.RawMessage) (data PeerData, misfit, err error)
	// CheckData is Decode without the data (subnet.DataChecker).
	CheckData(member string, raw json.RawMessage) (misfit, err error)
}

// MAC is an Ethernet address as a comparable value.
type MAC [6]byte

// MACFrom converts a 6-byte hardware address.
func MACFrom(hw net.HardwareAddr) (MAC, bool) {
	var m MAC
	if len(hw) != len(m) {
		return m, false
	}
	copy(m[:], hw)
	return m, true
}

// HardwareAddr returns a freshly allocated net.HardwareAddr.
func (m MAC) HardwareAddr() net.HardwareAddr { return append(net.HardwareAddr(nil), m[:]...) }

// IsZero reports whether m is 00:00:00:00:00:00.
func (m MAC) IsZero() bool { return m == MAC{} }

func (m MAC) String() string {
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5])
}

// Family is an address family of the overlay: a plane carries either
// the IPv4 overlay or the IPv6 one.
type Family uint8

// The two families. The zero Family means IPv4 wherever one is expected.
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

func (f Family) String() string {
	if f == IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

// Plane is one data plane the daemon drives: one backend's overlay of one
// address family on this host (a dual-stack host drives two, one per
// family, each with its own device and kernel state). The daemon builds
// planes through one factory (daemon.Kernel.Plane), for running and for
// `overlayd teardown` alike, and knows no backend by name.
//
// SetPeers may be called from any goroutine at any time, before or while
// Run runs; it never blocks on the kernel. EnsureDevice, AdoptRoutes and
// Teardown touch the kernel at once and may be called while Run runs: a
// plane serialises its kernel work.
type Plane interface {
	// Family is the address family the plane carries.
	Family() Family
	// EnsureDevice creates the plane's device or adopts the one there,
	// fixing what differs, and says what this host publishes (its MAC)
	// and hands pods (its MTU).
	EnsureDevice(ctx context.Context) (Device, error)
	// AdoptRoutes makes the routes another program left on the plane's
	// device ours, so that the first pass replaces each without a gap
	// (taking over from flanneld), and returns how many it adopted.
	AdoptRoutes(ctx context.Context) (int, error)
	// SetPeers replaces the desired peer set and wakes the reconciler. The
	// slice is not kept (the plane copies what it needs); bursts of calls
	// coalesce into one kernel pass.
	SetPeers(peers []Peer)
	// Run reconciles the kernel with the peer set until ctx is cancelled,
	// then returns nil. Failures are retried with backoff and reported
	// through Status, never returned.
	Run(ctx context.Context) error
	// Status is a consistent snapshot for readiness checks and metrics.
	Status() Status
	// Teardown removes everything the plane programs, its device
	// included, and keeps Run from touching the kernel again. The daemon
	// calls it for `overlayd teardown` only: a shutdown leaves the data
	// path in place, so a restart drops no packets.
	Teardown(ctx context.Context) error
}

// Gate is a consumer of a plane's peer set that must move in step with
// the plane's kernel writes: the VXLAN guard (backend/guard), which lets
// encapsulated traffic in only from the peers' public addresses. The
// plane calls it from its reconcile pass, with peers whose public
// addresses (PublicIP) are what the gate admits:
//
//   - Admit before the pass writes anything, with the peers it may write
//     entries for, so a joining peer is admitted
//     before this host has an entry that sends to it (and before its
//     answers come): in a full pass (resync) every desired peer's, and the
//     gate reads its own state back too, repairing drift; in a pass woken
//     by a change of the peers only those that came (the others were
//     admitted by the passes that wrote them). Admit only adds. If it
//     fails, the pass holds back the peers of its argument whose
//     addresses this host does not send VXLAN to yet (nothing of theirs
//     is written or removed), goes on with the others (departures,
//     repairs) and fails (retried with backoff, as a full pass).
//   - Settle after a full pass, or one in which peers left or changed,
//     whose writes all succeeded, with every desired peer (keep) and, in
//     a pass that was not full, the peers that left or changed since the
//     last one (gone; nil after a full pass): every entry of those is gone
//     by then, and the gate removes what it admitted for them that no
//     desired peer still needs (after a full pass, whatever it holds
//     beyond keep). After a pass with a failed write it is not called: a
//     leaving peer stays admitted until a pass has removed its entries.
//
// Both are called from the plane's reconciling goroutine, never at once.
type Gate interface {
	Admit(peers []Peer, resync bool) error
	Settle(keep, gone []Peer) error
}

// Device is a plane's device after EnsureDevice.
type Device struct {
	Name  string
	Index int
	// MAC is the device's hardware address, which this host publishes in
	// its lease (VXLAN's VTEP MAC); nil for a device without one.
	MAC net.HardwareAddr
	MTU int // hand to pods (OVERLAY_MTU)
}

// Status describes the data plane after its most recent reconcile pass.
type Status struct {
	Device        string           // name of the overlay device, e.g. overlay.1
	DevicePresent bool             // the device existed and matched after the last pass
	VtepMAC       net.HardwareAddr // MAC of our VTEP, published in our lease
	MTU           int              // MTU of the overlay device (for pods)

	Peers           int // peers in the desired set (valid ones only)
	PeersProgrammed int // desired peers whose kernel entries were all in place after the last pass
	InvalidPeers    int // peers rejected by SetPeers (bad subnet, address, MAC, duplicate)
	Conflicts       int // desired peers whose route is held by another program's route

	InSync      bool          // the last pass succeeded and left nothing pending
	Pending     bool          // SetPeers changed the peer set after the last pass started
	LastPass    time.Time     // when the last pass finished
	LastSuccess time.Time     // when a pass last succeeded
	LastError   error         // the last pass's error, nil if it succeeded
	PassTime    time.Duration // how long the last pass took

	Passes            uint64 // reconcile passes run
	Errors            uint64 // passes that failed
	Writes            uint64 // netlink writes issued (create, change, delete)
	DriftRepairs      uint64 // entries rewritten although the desired state had not changed
	DeviceRecreations uint64 // times the device was deleted and created again
}

// Ready reports whether the data plane is fit to carry traffic: the device is
// present and the last reconcile pass left the kernel in sync.
func (s Status) Ready() bool { return s.DevicePresent && s.InSync }
