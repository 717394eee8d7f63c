// Package leasedata is the VXLAN backend's part of a lease value: its
// codec (backend.Codec), with nothing of the kernel. A lease says, besides
// the host's public address, what its backend needs to reach it: for VXLAN
// the VNI and the MAC of the host's VTEP, as flannel writes them:
//
//	"BackendData":{"VNI":1,"VtepMAC":"0e:00:00:00:00:07"}
//
// (and "BackendV6Data" alike for the IPv6 device). subnet keeps that data
// as raw JSON and leaves its reading to this codec, so the control plane
// knows nothing of the data plane's shape. A value is decoded once, where
// the lease enters the daemon, into the comparable backend.Peer the
// planes take.
//
// It is apart from backend/vxlan (the devices, neighbours, FDB entries and
// routes, over netlink) so that what judges leases without touching the
// kernel (the lease-admin rules, `overlayd lease`, the codec picker
// backend/codecs) links no netlink: it imports backend and
// internal/lib/jsonobj only.
package leasedata

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/overlaynet/overlay/backend"
	"github.com/overlaynet/overlay/internal/lib/jsonobj"
)

// MAC is an Ethernet address as a comparable value.
type MAC = backend.MAC

// LeaseData is a VXLAN lease's backend data (BackendData or BackendV6Data).
type LeaseData struct {
	VNI     int
	VtepMAC string
}

// Codec reads and writes the backend data of a network's leases; VNI is
// the network's (Backend.VNI). It implements backend.Codec (and so
// subnet.DataChecker).
type Codec struct{ VNI int }

var _ backend.Codec = Codec{}

// Encode returns the backend data this host publishes for its device of
// MAC mac, byte for byte what flanneld writes.
func (c Codec) Encode(mac net.HardwareAddr) json.RawMessage {
	data, _ := json.Marshal(LeaseData{VNI: c.VNI, VtepMAC: mac.String()}) // cannot fail: two plain fields
	return data
}

// Publish returns the backend data this host publishes for its plane of
// fam (backend.Codec): the VTEP MAC derived from nodeID and the VNI
// (VtepMAC, VtepMACv6), or mac, the MAC of a device another program left
// that the plane takes over (flanneld's), if it is not nil.
func (c Codec) Publish(nodeID string, fam backend.Family, mac net.HardwareAddr) json.RawMessage {
	if mac == nil {
		mac = FamilyVtepMAC(fam, nodeID, c.VNI)
	}
	return c.Encode(mac)
}

// String names a peer's data as logs show it: its VTEP MAC.
func (c Codec) String(data backend.PeerData) string {
	return PeerMAC(backend.Peer{Data: data}).String()
}

// Decode reads one family's backend data of a peer's lease, raw as the
// lease holds it (member names it in errors: "BackendData",
// "BackendV6Data"). misfit says why it does not fit the network (another
// VNI: the lease is orphaned); err why it cannot be used (absent,
// malformed, not a unicast MAC). data is the peer's VTEP MAC as
// backend.Peer carries it (see PeerData), valid when err is nil.
func (c Codec) Decode(member string, raw json.RawMessage) (data backend.PeerData, misfit, err error) {
	if mac, vni, ok := decodePlainMAC(raw); ok {
		return PeerData(mac), c.misfit(vni), nil
	}
	d, err := DecodeLeaseData(member, raw)
	if err != nil {
		return data, nil, err
	}
	misfit = c.misfit(d.VNI)
	mac, err := ParseVtepMAC(d.VtepMAC)
	if err != nil {
		return data, misfit, err
	}
	return PeerData(mac), misfit, nil
}

// CheckData is Decode without the data (subnet.DataChecker).
func (c Codec) CheckData(member string, raw json.RawMessage) (misfit, err error) {
	_, misfit, err = c.Decode(member, raw)
	return misfit, err
}

func (c Codec) misfit(vni int) error {
	if vni != 0 && vni != c.VNI {
		return fmt.Errorf("VNI %d is not the network's Backend.VNI %d", vni, c.VNI)
	}
	return nil
}

// PeerData is a VTEP MAC as backend.Peer carries it.
func PeerData(mac MAC) backend.PeerData {
	var d backend.PeerData
	copy(d[:], mac[:])
	return d
}

// PeerMAC is the VTEP MAC a peer of a VXLAN plane carries (see PeerData).
func PeerMAC(p backend.Peer) MAC { return MAC(p.Data[:len(MAC{})]) }

// The errors of absent backend data, made once: an IPv4-only lease has no
// BackendV6Data, and every check of it would otherwise allocate one.
var missingData = map[string]error{
	"BackendData":   errors.New("BackendData is missing"),
	"BackendV6Data": errors.New("BackendV6Data is missing"),
}

// errCaseTwins is what is left when encoding/json rejects data that
// jsonobj.Decode reads: members that differ only in case, where Decode
// read another one than the one of the wrong type.
var errCaseTwins = errors.New("members that differ only in case, one of them not of its type")

// DecodeLeaseData reads backend data as flanneld does (encoding/json:
// members matched case-insensitively), the plain shape nearly every lease
// has directly; an error names the member as written (prefixed by member,
// e.g. "BackendData.VNI") and what it must be.
func DecodeLeaseData(member string, raw json.RawMessage) (LeaseData, error) {
	var d LeaseData
	if trimmed := bytes.TrimSpace(raw); len(trimmed) == 0 || bytes.Equal(trimmed, []byte("null")) {
		if err, ok := missingData[member]; ok {
			return d, err
		}
		return d, fmt.Errorf("%s is missing", member)
	}
	if fast, ok := decodeFast(raw); ok {
		return fast, nil
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		if _, err := byMember(member, raw); err != nil {
			return LeaseData{}, err
		}
		return LeaseData{}, fmt.Errorf("%q: %w", member, errCaseTwins)
	}
	return d, nil
}

func byMember(member string, raw json.RawMessage) (LeaseData, error) {
	var d LeaseData
	if err := jsonobj.Decode(member+".", raw, []jsonobj.Field{
		{Name: "VNI", Dst: &d.VNI, Want: jsonobj.WantNumber},
		{Name: "VtepMAC", Dst: &d.VtepMAC, Want: jsonobj.WantString + " such as \"0e:00:00:00:00:07\""},
	}); err != nil {
		return LeaseData{}, err
	}
	return d, nil
}

// decodeFast decodes plain backend data (jsonobj.Plain); false: decode it
// with encoding/json.
func decodeFast(raw []byte) (LeaseData, bool) {
	var d LeaseData
	ok := jsonobj.Plain(raw, 0, func(m jsonobj.Member) bool {
		switch string(m.Name) {
		case "VNI":
			if m.Kind != 'n' {
				return false
			}
			n, err := strconv.Atoi(string(m.Value))
			d.VNI = n
			return err == nil
		case "VtepMAC":
			d.VtepMAC = string(m.Value)
			return m.Kind == 's'
		}
		return !jsonobj.FoldsTo(m.Name, "VNI", "VtepMAC")
	})
	return d, ok
}

// decodePlainMAC is Decode's path for the data nearly every lease has:
// plain (as decodeFast reads it) with a VtepMAC of six colon-separated
// pairs of hex digits that is unicast and not all zeros. It reads the MAC
// in place, with no string made of it; false: anything else, which
// DecodeLeaseData and ParseVtepMAC then read (and explain).
func decodePlainMAC(raw []byte) (mac MAC, vni int, ok bool) {
	var macText []byte
	hasMAC := false
	ok = jsonobj.Plain(raw, 0, func(m jsonobj.Member) bool {
		switch string(m.Name) {
		case "VNI":
			if m.Kind != 'n' {
				return false
			}
			n, err := strconv.Atoi(string(m.Value))
			vni = n
			return err == nil
		case "VtepMAC":
			macText, hasMAC = m.Value, true
			return m.Kind == 's'
		}
		return !jsonobj.FoldsTo(m.Name, "VNI", "VtepMAC")
	})
	if !ok || !hasMAC {
		return MAC{}, 0, false
	}
	mac, ok = parseColonMAC(macText)
	if !ok || mac[0]&1 == 1 || mac.IsZero() {
		return MAC{}, 0, false
	}
	return mac, vni, true
}

// parseColonMAC reads "0e:00:00:00:00:07" (either case), as net.ParseMAC
// reads that form.
func parseColonMAC(b []byte) (MAC, bool) {
	var mac MAC
	if len(b) != 17 {
		return mac, false
	}
	for i := range mac {
		if i > 0 && b[3*i-1] != ':' {
			return mac, false
		}
		hi, ok1 := hexDigit(b[3*i])
		lo, ok2 := hexDigit(b[3*i+1])
		if !ok1 || !ok2 {
			return mac, false
		}
		mac[i] = hi<<4 | lo
	}
	return mac, true
}

func hexDigit(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// ParseVtepMAC accepts only a 6-byte unicast MAC that is not all zeros.
func ParseVtepMAC(s string) (MAC, error) {
	hw, err := net.ParseMAC(s)
	mac, ok := backend.MACFrom(hw)
	if err != nil || !ok {
		return mac, fmt.Errorf("VtepMAC %q is not a 6-byte MAC address", s)
	}
	if mac[0]&1 == 1 {
		return MAC{}, fmt.Errorf("VtepMAC %s is a multicast address", mac)
	}
	if mac.IsZero() {
		return MAC{}, errors.New("VtepMAC is all zeros")
	}
	return mac, nil
}

// VtepMAC derives the MAC of this host's IPv4 VTEP from its node ID and the
// VNI: the first six bytes of a SHA-256, made locally administered and
// unicast. The same host therefore gets the same MAC across daemon
// restarts and reboots, and peers' neighbour entries stay valid when the
// device is recreated.
func VtepMAC(nodeID string, vni int) net.HardwareAddr { return vtepMAC("overlay-vtep", nodeID, vni) }

// VtepMACv6 is VtepMAC for the IPv6 VTEP. It is derived with another salt:
// the host's two devices need distinct MACs (each peer's FDB of a device
// maps a MAC to one remote), and VtepMAC's values, which running hosts
// publish, must not change.
func VtepMACv6(nodeID string, vni int) net.HardwareAddr {
	return vtepMAC("overlay-vtep-v6", nodeID, vni)
}

// FamilyVtepMAC is VtepMAC or VtepMACv6, by fam.
func FamilyVtepMAC(fam backend.Family, nodeID string, vni int) net.HardwareAddr {
	if fam == backend.IPv6 {
		return VtepMACv6(nodeID, vni)
	}
	return VtepMAC(nodeID, vni)
}

func vtepMAC(salt, nodeID string, vni int) net.HardwareAddr {
	sum := sha256.Sum256([]byte(salt + "\x00" + nodeID + "\x00" + strconv.Itoa(vni)))
	mac := net.HardwareAddr(sum[:6:6])
	mac[0] = mac[0]&^0x01 | 0x02
	return mac
}
