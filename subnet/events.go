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

// Diff returns the events that turn the lease set known (each lease's
// Fingerprint by the subnets its key names) into cur, sorted by key, and
// cur's fingerprints. It is how a watcher that lost events (compaction,
// reconnect) tells its consumer exactly what changed, attribute changes
// included.
func Diff(known map[ID]uint64, cur []Lease) ([]Event, map[ID]uint64) {
	var events []Event
	next := make(map[ID]uint64, len(cur))
	for _, l := range cur {
		fp := Fingerprint(l)
		id := l.ID()
		next[id] = fp
		prev, ok := known[id]
		switch {
		case !ok:
			events = append(events, Event{Type: Added, Lease: l})
		case prev != fp:
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
