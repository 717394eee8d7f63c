// Package peerhealth tells whether every peer carries packets through the
// overlay, as seen from this host.
//
// Every table of the data plane can be right while a peer is still cut
// off: an underlay firewall dropping UDP 8472, a peer holding a stale
// MAC, the VXLAN checksum-offload bug. So the prober sends
// an ICMP echo through the overlay to each peer's VTEP address (the
// network address of its subnet, e.g. 10.244.7.0, which overlayd and
// flanneld alike put on their VXLAN device, so both answer) from this
// host's own VTEP address, and keeps, per peer and address family, whether
// it answers.
//
// The prober is one more consumer of the peer set (SetPeers, like a data
// plane's): the daemon hands it the same peers it hands the planes. Its
// pure parts, apart from the sockets and the clock, are the per-peer state
// machine (this file) and the scheduler (schedule.go), which bounds the
// probe rate per host whatever the number of peers. The sockets are behind
// Pinger (icmp.go), with a fake in the tests.
package peerhealth

import (
	"net/netip"
	"time"

	"github.com/overlaynet/overlay/backend"
)

// State is what the prober knows of a peer's path.
type State uint8

// The states of a peer. A new peer is Unknown until its first probe is
// answered (Reachable) or Threshold probes in a row are lost (Unreachable).
const (
	Unknown State = iota
	Reachable
	Unreachable
)

func (s State) String() string {
	switch s {
	case Reachable:
		return "reachable"
	case Unreachable:
		return "unreachable"
	}
	return "unknown"
}

// MarshalText makes a State a JSON string ("reachable").
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads what MarshalText writes.
func (s *State) UnmarshalText(b []byte) error {
	switch string(b) {
	case "reachable":
		*s = Reachable
	case "unreachable":
		*s = Unreachable
	default:
		*s = Unknown
	}
	return nil
}

// Key names one peer in one address family: a dual-stack peer is probed
// in each family on its own (its IPv6 path may be broken while its IPv4
// one works).
type Key struct {
	Family backend.Family
	Subnet netip.Prefix
}

// Target is the address a peer is probed at: its VTEP address, the
// network address of its subnet.
func (k Key) Target() netip.Addr { return k.Subnet.Masked().Addr() }

// health is one peer's record: the state machine and its counters.
type health struct {
	state    State
	since    time.Time // when state was entered (the peer's arrival while Unknown)
	lastRTT  time.Duration
	srtt     time.Duration // smoothed RTT, 0 before the first answer
	losses   int           // consecutive probes lost
	sent     uint64
	received uint64
	lost     uint64
	last     time.Time // when the last probe was sent
}

// rttGain is the weight of a new sample in the smoothed RTT: 1/8, as
// TCP's SRTT (RFC 6298), so one slow answer moves it by an eighth.
const rttGain = 8

// answered records a reply after rtt at now, and reports whether the peer
// came back (it was Unreachable). A peer seen for the first time is no
// news: at a cold start thousands are.
func (h *health) answered(rtt time.Duration, now time.Time) (back bool) {
	h.received++
	h.losses = 0
	h.lastRTT = rtt
	if h.srtt == 0 {
		h.srtt = rtt
	} else {
		h.srtt += (rtt - h.srtt) / rttGain
	}
	if h.state == Reachable {
		return false
	}
	back = h.state == Unreachable
	h.state, h.since = Reachable, now
	return back
}

// lostOne records a probe that went unanswered (or could not be sent) at
// now, and reports whether the peer just became Unreachable: threshold
// losses in a row.
func (h *health) lostOne(threshold int, now time.Time) (down bool) {
	h.lost++
	h.losses++
	if h.state == Unreachable || h.losses < threshold {
		return false
	}
	h.state, h.since = Unreachable, now
	return true
}
