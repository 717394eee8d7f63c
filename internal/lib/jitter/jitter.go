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
