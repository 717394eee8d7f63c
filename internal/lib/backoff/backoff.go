// Package backoff paces the retries of a step that a whole fleet may run
// against one etcd at once (every overlayd restarting after an upgrade).
// A fixed timeout and pause turn such a herd into a livelock: when etcd is
// slow because everyone asks at once, every attempt runs out of time, its
// work is thrown away, and everyone asks again together. So an attempt that
// ran out of time gets twice as long the next time, and the pause after any
// failure doubles and is drawn at random around its value. It is a leaf: it
// imports only the standard library and jitter.
package backoff

import (
	"context"
	"errors"
	"time"

	"github.com/overlaynet/overlay/internal/lib/jitter"
)

// WarnEvery is how often a failure that keeps repeating is logged again:
// during an etcd outage the retry loops (the daemon's start-up steps, the
// lease source's watches and keepers) fail every few seconds, and one line
// per loop every 30 s says as much (Documentation/operations.md).
const WarnEvery = 30 * time.Second

// Backoff is the schedule of one step's attempts. The zero value has no
// timeout and no pause; use New.
type Backoff struct {
	timeout, maxTimeout time.Duration
	pause, maxPause     time.Duration
}

// New returns a schedule whose first attempt may take timeout (0: no
// bound) and whose first pause is about pause; both double as described
// above, up to maxTimeout and maxPause.
func New(timeout, maxTimeout, pause, maxPause time.Duration) *Backoff {
	return &Backoff{timeout: timeout, maxTimeout: max(timeout, maxTimeout), pause: pause, maxPause: max(pause, maxPause)}
}

// Timeout is the bound of the next attempt (0: none).
func (b *Backoff) Timeout() time.Duration { return b.timeout }

// Failed records that an attempt failed with err and returns how long to
// wait before the next: half to one and a half times the current pause.
func (b *Backoff) Failed(err error) time.Duration {
	if b.timeout > 0 && errors.Is(err, context.DeadlineExceeded) {
		b.timeout = min(2*b.timeout, b.maxTimeout)
	}
	wait := jitter.Wide(b.pause)
	b.pause = min(2*b.pause, b.maxPause)
	return wait
}
