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
// machine (this file) and the scheduler (schedule.go, its records found
// through index.go), which bounds the probe rate per host whatever the
// number of peers. The sockets are behind Pinger (icmp.go), with a fake
// in the tests.
package peerhealth

import (
	"bytes"
	"cmp"
	"math"
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

// entry is one peer's record in one family: its schedule, its state
// machine and its counters. A cold start makes thousands, kept for the
// daemon's life, so it holds no pointer (the collector never scans them)
// and nothing twice: its times are nanoseconds of the schedule's clock
// (schedule.at), its addresses packed without netip's zone pointer, its
// counters 32 bits. 104 bytes (TestEntrySize), where one with time.Time,
// netip and 64-bit fields took 224 and a map and a pointer beside it.
type entry struct {
	due   int64 // when its next probe is due, while queued (never: not yet scheduled)
	last  int64 // when its last probe was sent, the one in flight if any (never: none yet)
	since int64 // when state was entered (the peer's arrival while Unknown)

	lastRTT time.Duration
	srtt    time.Duration // smoothed RTT, 0 before the first answer

	// The counters are 32 bits: a peer gets at most Threshold probes in a
	// row within the rate, then one a period, of at least MinSweep (0.1 s,
	// the default 30 s), so about 40 a second at the most aggressive
	// settings: three years of them before 2^32, centuries at the
	// defaults. They stop there (inc) rather than wrap.
	sent, received, lost uint32
	losses               uint32 // consecutive probes lost

	index  int32  // its place in the schedule's due heap; -1 while a probe is in flight
	key    pkey   // its family and subnet
	public addr16 // the peer's underlay address, for reports
	state  State
	mark   uint8 // the parity of the last peer set that named it (setPeers)
}

// inc is n+1, or n at the counters' ceiling.
func inc(n uint32) uint32 {
	if n == math.MaxUint32 {
		return n
	}
	return n + 1
}

// rttGain is the weight of a new sample in the smoothed RTT: 1/8, as
// TCP's SRTT (RFC 6298), so one slow answer moves it by an eighth.
const rttGain = 8

// answered records a reply after rtt at now, and reports whether the peer
// came back (it was Unreachable). A peer seen for the first time is no
// news: at a cold start thousands are.
func (e *entry) answered(rtt time.Duration, now int64) (back bool) {
	e.received = inc(e.received)
	e.losses = 0
	e.lastRTT = rtt
	if e.srtt == 0 {
		e.srtt = rtt
	} else {
		e.srtt += (rtt - e.srtt) / rttGain
	}
	if e.state == Reachable {
		return false
	}
	back = e.state == Unreachable
	e.state, e.since = Reachable, now
	return back
}

// lostOne records a probe that went unanswered (or could not be sent) at
// now, and reports whether the peer just became Unreachable: threshold
// losses in a row.
func (e *entry) lostOne(threshold int, now int64) (down bool) {
	e.lost = inc(e.lost)
	e.losses = inc(e.losses)
	if e.state == Unreachable || int64(e.losses) < int64(threshold) {
		return false
	}
	e.state, e.since = Unreachable, now
	return true
}

// pkey is a Key packed without a pointer: what the schedule finds a peer
// by (index.go).
type pkey struct {
	subnet addr16
	bits   uint8 // the prefix length + 1; 0 for an invalid prefix
	fam    backend.Family
}

func packKey(k Key) pkey {
	return pkey{subnet: packAddr(k.Subnet.Addr()), bits: uint8(k.Subnet.Bits() + 1), fam: k.Family}
}

// Key is k unpacked.
func (k pkey) Key() Key {
	return Key{Family: k.fam, Subnet: netip.PrefixFrom(k.subnet.Addr(), int(k.bits)-1)}
}

// addr16 is a netip.Addr without its zone (the peer set has none: subnet
// rejects addresses with one), and so without a pointer: its 16 bytes
// and its kind, 4, 6, or 0 for the zero Addr.
type addr16 struct {
	b    [16]byte
	kind uint8
}

func packAddr(a netip.Addr) addr16 {
	switch {
	case a.Is4():
		return addr16{b: a.As16(), kind: 4}
	case a.Is6():
		return addr16{b: a.As16(), kind: 6}
	}
	return addr16{}
}

// Addr is a unpacked.
func (a addr16) Addr() netip.Addr {
	switch a.kind {
	case 4:
		return netip.AddrFrom16(a.b).Unmap()
	case 6:
		return netip.AddrFrom16(a.b)
	}
	return netip.Addr{}
}

// compare orders a and b as netip.Addr.Compare orders them.
func (a addr16) compare(b addr16) int {
	return cmp.Or(cmp.Compare(a.kind, b.kind), bytes.Compare(a.b[:], b.b[:]))
}
