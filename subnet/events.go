package subnet

import (
	"bytes"
	"cmp"
	"net/netip"
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

// Event is one change to the lease set. For Removed, Lease is the last value
// known; for Changed, Old is the previous value.
type Event struct {
	Type  EventType
	Lease Lease
	Old   Lease
}

// SameAttrs reports whether two lease values say the same thing.
func SameAttrs(a, b LeaseAttrs) bool {
	return a.PublicIP == b.PublicIP && a.PublicIPv6 == b.PublicIPv6 && a.BackendType == b.BackendType &&
		a.NodeID == b.NodeID && a.Hostname == b.Hostname &&
		bytes.Equal(bytes.TrimSpace(a.BackendData), bytes.TrimSpace(b.BackendData)) &&
		bytes.Equal(bytes.TrimSpace(a.BackendV6Data), bytes.TrimSpace(b.BackendV6Data))
}

// Diff returns the events that turn the lease set old into cur, sorted by
// subnet. It is how a watcher that lost events (compaction, reconnect) tells
// its consumer exactly what changed, attribute changes included.
func Diff(old, cur map[netip.Prefix]Lease) []Event {
	var events []Event
	for p, l := range cur {
		prev, ok := old[p]
		switch {
		case !ok:
			events = append(events, Event{Type: Added, Lease: l})
		case !SameAttrs(prev.Attrs, l.Attrs) || prev.Reserved != l.Reserved:
			events = append(events, Event{Type: Changed, Lease: l, Old: prev})
		}
	}
	for p, l := range old {
		if _, ok := cur[p]; !ok {
			events = append(events, Event{Type: Removed, Lease: l})
		}
	}
	slices.SortFunc(events, func(a, b Event) int {
		return cmp.Or(a.Lease.Subnet.Addr().Compare(b.Lease.Subnet.Addr()), cmp.Compare(a.Lease.Subnet.Bits(), b.Lease.Subnet.Bits()))
	})
	return events
}
