// Package jitter spreads periodic work so that a fleet started together
// (a rolling restart, a power cut) does not list etcd or the kernel in
// lockstep. It is a leaf: it imports only the standard library, so any
// layer may use it.
package jitter

import (
	"math/rand/v2"
	"time"
)

// Spread returns d moved by a random amount within ±10%. Durations too short
// to spread are returned unchanged.
func Spread(d time.Duration) time.Duration {
	spread := int64(d) / 5
	if spread <= 0 {
		return d
	}
	return d - time.Duration(spread/2) + time.Duration(rand.Int64N(spread))
}

// Upto returns a random duration in [0, d): where many hosts react to one
// event (a compaction reaches every watch together), each waits a different
// part of d.
func Upto(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(rand.Int64N(int64(d)))
}

// Wide returns d give or take half of it: a pause many hosts take after the
// same fault (a leader change breaks every watch) does not end for all at once.
func Wide(d time.Duration) time.Duration { return d/2 + Upto(d) }
