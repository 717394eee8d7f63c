package daemon

import (
	"cmp"
	"encoding/binary"
	"net/netip"
	"slices"
	"time"
)

// listedArrivals are the arrivals of a cold start's listing for the
// event-to-programmed latency: every listed peer arrived at one moment, so
// the set keeps that moment once and each peer's subnet as a sorted,
// pointer-free key with one bit for "still pending" — 24 bytes a peer,
// where an entry of the map of later events takes about 130. At 10,000
// peers that map was 1.3 MB, resident through the first pass, which is the
// start-up's peak of memory (issue 33). Empty once every peer was
// programmed or superseded, and then released.
type listedArrivals struct {
	at   time.Time
	keys []arrivalKey // sorted, distinct
	done []uint64     // bit i set: keys[i] is no longer pending
	left int          // keys still pending
}

// arrivalKey is a subnet as a value without pointers (netip.Prefix holds
// one), ordered by family, address and length.
type arrivalKey struct{ hi, lo, bits uint64 }

func arrivalKeyOf(p netip.Prefix) arrivalKey {
	a := p.Addr().As16()
	k := arrivalKey{hi: binary.BigEndian.Uint64(a[:8]), lo: binary.BigEndian.Uint64(a[8:]), bits: uint64(p.Bits())}
	if p.Addr().Is4() {
		k.bits |= 1 << 8 // an IPv4 prefix is not its IPv4-mapped IPv6 form
	}
	return k
}

func compareArrivalKeys(a, b arrivalKey) int {
	if c := cmp.Compare(a.hi, b.hi); c != 0 {
		return c
	}
	if c := cmp.Compare(a.lo, b.lo); c != 0 {
		return c
	}
	return cmp.Compare(a.bits, b.bits)
}

// newListedArrivals is the arrivals of subnets at at; keys is taken over
// (sorted in place) and may repeat a subnet.
func newListedArrivals(keys []arrivalKey, at time.Time) listedArrivals {
	slices.SortFunc(keys, compareArrivalKeys)
	keys = slices.Compact(keys)
	if len(keys) == 0 {
		return listedArrivals{}
	}
	return listedArrivals{at: at, keys: keys, done: make([]uint64, (len(keys)+63)/64), left: len(keys)}
}

// take ends subnet's pending arrival and returns when it was, if it was
// pending.
func (a *listedArrivals) take(subnet netip.Prefix) (time.Time, bool) {
	if a.left == 0 {
		return time.Time{}, false
	}
	i, found := slices.BinarySearchFunc(a.keys, arrivalKeyOf(subnet), compareArrivalKeys)
	if !found || a.done[i/64]&(1<<(i%64)) != 0 {
		return time.Time{}, false
	}
	a.done[i/64] |= 1 << (i % 64)
	at := a.at
	if a.left--; a.left == 0 {
		*a = listedArrivals{}
	}
	return at, true
}
