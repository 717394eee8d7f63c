package subnet

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"slices"
)

// EventType says what happened to a lease.
type EventType int

const (
	// Added: a subnet is newly leased.
	Added EventType = iota + 1
	// Removed: the lease key is gone (revoked, expired, deleted).
	Removed
	// Changed: same subnet, different value (a new VtepMAC or PublicIP).
	Changed
)

func (t EventType) String() string {
	switch t {
	case Added:
		return "added"
	case Removed:
		return "removed"
	case Changed:
		return "changed"
	}
	return "unknown"
}

// Event is one change to the lease set. For Removed, Lease names the
// subnet only: the value is gone, and a watcher does not keep values (see
// Fingerprint).
type Event struct {
	Type  EventType
	Lease Lease
}

// SameAttrs reports whether two lease values say the same thing.
func SameAttrs(a, b LeaseAttrs) bool {
	return a.PublicIP == b.PublicIP && a.PublicIPv6 == b.PublicIPv6 && a.BackendType == b.BackendType &&
		a.NodeID == b.NodeID && a.Hostname == b.Hostname &&
		bytes.Equal(bytes.TrimSpace(a.BackendData), bytes.TrimSpace(b.BackendData)) &&
		bytes.Equal(bytes.TrimSpace(a.BackendV6Data), bytes.TrimSpace(b.BackendV6Data))
}

// fingerprintSeed is drawn per process, so a lease value cannot be crafted
// to collide with another and hide a change.
var fingerprintSeed = maphash.MakeSeed()

// Fingerprint sums up what a lease's value says (as SameAttrs compares it,
// and whether it is a reservation) in 64 bits. A watcher keeps a
// fingerprint per lease key (its subnets' ID) instead of the lease: at thousands
// of leases the values would be most of a host's memory. Leases that
// SameAttrs finds equal have equal fingerprints; others differ but with
// probability 2^-64.
func Fingerprint(l Lease) uint64 {
	var h maphash.Hash
	h.SetSeed(fingerprintSeed)
	var reserved byte
	if l.Reserved {
		reserved = 1
	}
	h.WriteByte(reserved)
	for _, field := range [...]string{l.Attrs.PublicIP, l.Attrs.PublicIPv6, l.Attrs.BackendType,
		l.Attrs.NodeID, l.Attrs.Hostname} {
		writeField(&h, []byte(field))
	}
	writeField(&h, bytes.TrimSpace(l.Attrs.BackendData))
	writeField(&h, bytes.TrimSpace(l.Attrs.BackendV6Data))
	return h.Sum64()
}

// writeField writes b with its length first, so that no two sequences of
// fields hash the same bytes.
func writeField(h *maphash.Hash, b []byte) {
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

// Known is what a watcher keeps of each lease: its Fingerprint, to tell a
// change, and the revision that wrote it, to tell without decoding the
// value that a listed key is the one it has (a key's ModRevision names one
// write of it).
type Known struct {
	Fingerprint uint64
	ModRevision int64
}

// KnownOf returns what a watcher keeps of l.
func KnownOf(l Lease) Known { return Known{Fingerprint(l), l.ModRevision} }

// Diff returns the events that turn the lease set known (by the subnets each
// key names) into the listed one, sorted by key, and the listed set's Known.
// The listing is cur, the leases it decoded, and unchanged, the leases it
// found at the revision known has for them and did not decode. It is how a
// watcher that lost events (compaction, reconnect) tells its consumer
// exactly what changed, attribute changes included.
func Diff(known map[ID]Known, cur []Lease, unchanged []ID) ([]Event, map[ID]Known) {
	var events []Event
	next := make(map[ID]Known, len(cur)+len(unchanged))
	for _, id := range unchanged {
		next[id] = known[id]
	}
	for _, l := range cur {
		k := KnownOf(l)
		id := l.ID()
		next[id] = k
		prev, ok := known[id]
		switch {
		case !ok:
			events = append(events, Event{Type: Added, Lease: l})
		case prev.Fingerprint != k.Fingerprint:
			events = append(events, Event{Type: Changed, Lease: l})
		}
	}
	for id := range known {
		if _, ok := next[id]; !ok {
			s := id.Subnets()
			events = append(events, Event{Type: Removed, Lease: Lease{Subnet: s.IPv4, IPv6Subnet: s.IPv6}})
		}
	}
	slices.SortFunc(events, func(a, b Event) int { return a.Lease.Subnets().Compare(b.Lease.Subnets()) })
	return events, next
}
